"""AgentContext v1: the API existing agentnode agents already use, carried over the run's gRPC socket.

Agents written against the published agentnode runtime (attribute access, PermissionError,
AgentLimitExceeded, AgentTerminated, retries and breakers) and against the seed's sandbox (results as dicts,
every refusal a RuntimeError) both run unchanged. Every decision stays on the host: the counters here
mirror what the host last reported, and the retry, breaker and termination rules only ever make the agent
call less, never more than the host allows.

Every call is synchronous, as in the runtime; for `async def` agents each has an awaitable twin (`acall_llm`,
`arun_tool`, ...) that runs it on a worker thread (asyncio.to_thread), so the one gRPC channel is used as by
the sync calls and the agent's event loop never blocks on the host.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import grpc

from sandbox_wrapper import _llm
from sandbox_wrapper._client import refusal
from sandbox_wrapper._errors import AgentLimitExceeded, AgentTerminated, LlmAccessError, ToolAccessError
from sandbox_wrapper._llm import Messages, loads_finite
from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    tools_pb2,
    tools_pb2_grpc,
)

_ARGUMENTS = json.JSONEncoder(allow_nan=False)  # json.dumps(..., allow_nan=False), one encoder for all calls
_PERMISSION_REASONS = frozenset({"TOOL_NOT_ALLOWED", "TOOL_PACK_UNTRUSTED"})
# Every other reason (INVALID_REQUEST, TOO_LARGE, TOOL_NOT_FOUND, TOOL_ARGUMENTS_INVALID, RUN_DEADLINE,
# TOO_MANY_REFUSALS after a burst of refused calls, and any reason a newer host adds) is a failed
# ToolResult whose error starts with the reason, or an LlmAccessError carrying it.
_TOOL_TIMEOUT_PREFIX = "tool timed out"  # the host's error for a tool that ran past its timeout
_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # the tool call ids the host accepts in a conversation
_UNNAMED_CALL = "unnamed"  # the name a nameless model call is sent back under (the host needs one)

DEFAULT_STOP_ON_CONSECUTIVE_ERRORS = 3
"""Failed tool calls in a row (across all slugs) after which the call raises AgentTerminated."""
BREAKER_FAILURE_THRESHOLD = 3
"""Failures of one slug (since its last success) that open its circuit breaker."""
BREAKER_COOLDOWN_SECONDS = 30.0
"""How long an open breaker holds calls before it lets one through again (half-open)."""
MAX_BACKOFF_SECONDS = 15.0
"""Ceiling on any one retry sleep, whatever backoff an agent asks for (the runtime's largest default)."""

# --- results: attributes (the agentnode runtime) and a dict (the seed sandbox) at once -------------------


class _Record(dict[str, Any]):
    """A dict whose known keys are also attributes, so `r.success`, `r["success"]`, `r.get("success")`,
    `"success" in r`, `dict(r)` and `json.dumps(r)` all work, as both runtimes' agents expect."""

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self[name] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={self.get(k)!r}' for k in self._FIELDS)})"


class ToolResult(_Record):
    """The outcome of one tool call: agentnode's RunToolResult, readable as attributes and as a mapping.

    `mode_used` is where the host ran the tool (`host_worker` for a trusted pack, `tool_sandbox` for a
    community one), `circuit_breaker` when the call was held back, or "" when the host refused it (then
    `error` starts with the reason). `run_id` is always None (the runtime sets it only for nested agent
    runs, which never happen here).
    """

    __slots__ = ()
    _FIELDS = ("success", "result", "error", "mode_used", "duration_ms", "timed_out", "run_id")

    def __init__(
        self,
        success: bool,
        result: Any = None,
        error: str | None = None,
        mode_used: str = "",
        *,
        duration_ms: float = 0.0,
        timed_out: bool = False,
        run_id: str | None = None,
    ) -> None:
        super().__init__(
            success=success, result=result, error=error, mode_used=mode_used,
            duration_ms=duration_ms, timed_out=timed_out, run_id=run_id,
        )

    @property
    def success(self) -> bool:
        return bool(self.get("success"))

    @property
    def result(self) -> Any:
        return self.get("result")

    @property
    def error(self) -> str | None:
        return cast("str | None", self.get("error"))

    @property
    def mode_used(self) -> str:
        return cast(str, self.get("mode_used", ""))

    @property
    def duration_ms(self) -> float:
        return cast(float, self.get("duration_ms", 0.0))

    @property
    def timed_out(self) -> bool:
        return bool(self.get("timed_out"))

    @property
    def run_id(self) -> str | None:
        return cast("str | None", self.get("run_id"))


class LlmResult(_Record):
    """One completion: agentnode's LLMResult, readable as attributes and as a mapping.

    As a mapping it is also an assistant message, `{"role": "assistant", "content": ..., "tool_calls":
    ...}` (the seed sandbox's completion), so it can be appended to the messages of the next call, tool
    calls included. `tool_calls` is None when the model called no tool, else a list of `{"id", "name",
    "arguments", "refused"}`: `name` is `<slug>:<tool>` as offered, `arguments` the JSON text of an object
    (as OpenAI-style clients give it, whichever provider the host uses; `json.loads` it), `refused` True
    when the model named a tool it was not offered (the host ran nothing). `finish_reason` is "stop",
    "length", "tool_calls", "content_filter", "other" or "". `model` is always "" (the host never reveals
    its model). `usage` carries the runtime's `prompt_tokens`/`completion_tokens` and this wrapper's
    earlier `input_tokens`/`output_tokens`, and `tokens_remaining` (the run's max_total_tokens left after
    this call) only when the run has such a cap.
    """

    __slots__ = ()
    _FIELDS = ("role", "content", "tool_calls", "usage", "model", "finish_reason")

    def __init__(
        self,
        content: str,
        finish_reason: str = "",
        usage: dict[str, int] | None = None,
        model: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(
            role="assistant", content=content, tool_calls=tool_calls,
            usage={} if usage is None else usage, model=model, finish_reason=finish_reason,
        )

    @property
    def role(self) -> str:
        return cast(str, self.get("role", "assistant"))

    @property
    def content(self) -> str:
        return cast(str, self.get("content", ""))

    @property
    def tool_calls(self) -> list[dict[str, Any]] | None:
        return cast("list[dict[str, Any]] | None", self.get("tool_calls"))

    @property
    def usage(self) -> dict[str, int]:
        return cast("dict[str, int]", self.get("usage"))

    @property
    def model(self) -> str:
        return cast(str, self.get("model", ""))

    @property
    def finish_reason(self) -> str:
        return cast(str, self.get("finish_reason", ""))


RunToolResult = ToolResult
"""The agentnode runtime's name for ToolResult."""
LLMResult = LlmResult
"""The agentnode runtime's name for LlmResult."""


@dataclass
class ToolContext:
    """The tools an LLM may be offered (from `AgentContext.allowed_tool_context()`): the allowlist, and a
    spec `{"name": "<slug>:<tool>", "description", "input_schema"}` for each tool the host lists for the
    run. An agent may pass a filtered copy to call_llm; the host offers only tools of its own list."""

    allowed_packages: list[str] = field(default_factory=list)
    tool_specs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def has_tools(self) -> bool:
        return len(self.tool_specs) > 0


@dataclass
class RetryConfig:
    """Retry settings with the agentnode runtime's defaults (used by `run_tool(..., retry=True)`)."""

    max_retries: int = 2
    backoff_base: float = 1.0
    backoff_max: float = 10.0
    enabled: bool = True


class _Breaker:
    """One slug's circuit breaker: closed → open after BREAKER_FAILURE_THRESHOLD failures → half-open once
    the cooldown has passed (one call may try) → closed on a success. Callers hold the context's lock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.failures = 0
        self._open = False
        self._opened_at = 0.0

    @property
    def state(self) -> str:
        if not self._open:
            return "closed"
        return "half_open" if self._clock() - self._opened_at >= BREAKER_COOLDOWN_SECONDS else "open"

    def success(self) -> None:
        self.failures, self._open = 0, False

    def failure(self) -> None:
        self.failures += 1
        if self.failures >= BREAKER_FAILURE_THRESHOLD:
            self._open, self._opened_at = True, self._clock()

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "failure_count": self.failures,
            "failure_threshold": BREAKER_FAILURE_THRESHOLD,
            "cooldown": BREAKER_COOLDOWN_SECONDS,
        }


def _backoff(attempt: int, base: float, cap: float) -> float:
    """min(base·2^(attempt-1), cap) seconds, never negative, never above MAX_BACKOFF_SECONDS."""
    base = base if math.isfinite(base) and base > 0 else 0.0
    cap = min(cap, MAX_BACKOFF_SECONDS) if not math.isnan(cap) else MAX_BACKOFF_SECONDS
    return max(0.0, min(base * 2.0 ** min(attempt - 1, 64), cap))


def _check_tool_kwargs(kwargs: Mapping[str, Any]) -> None:
    if "entry" in kwargs:
        raise TypeError("'entry' is reserved by the agentnode runtime and cannot be passed to a tool")


class AgentContext:
    """What an agent's entrypoint receives: its task, its limits, and brokered tools and LLM calls.

    Every decision stays on the host; the counters here only mirror what the host last reported. The
    wrapper adds the agentnode runtime's own rules on top (consecutive-error termination, per-slug circuit
    breakers, retries on request), which can only make the agent call less.
    """

    def __init__(
        self,
        channel: Any,
        task: session_pb2.FetchTaskResponse,
        *,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tools = tools_pb2_grpc.ToolServiceStub(channel)  # type: ignore[no-untyped-call]
        self._llm = llm_pb2_grpc.LlmServiceStub(channel)  # type: ignore[no-untyped-call]
        self._finished = threading.Event()
        self._sleep: Callable[[float], object] = sleep or self._finished.wait
        self._clock = clock
        self._lock = threading.Lock()
        limits = task.limits
        self._goal: str = task.goal
        self._run_id: str = task.run_id
        self._system_prompt: str = task.system_prompt
        self._llm_limits = _llm_limits(getattr(task, "llm", None))
        # None: the manifest declared no allowlist, so any installed tool pack may be asked for (the host
        # still decides each call). An older host never sets any_package.
        any_package = bool(getattr(task, "any_package", False))
        self._allowed_packages: tuple[str, ...] | None = None if any_package else tuple(task.allowed_packages)
        self._max_iterations: int = limits.max_iterations
        self._max_tool_calls: int = limits.max_tool_calls
        runtime = limits.max_runtime_seconds
        self._deadline = clock() + runtime if runtime > 0 else math.inf
        # A newer host sends the manifest's termination.stop_on_consecutive_errors here (0/absent: default).
        stop = int(getattr(limits, "stop_on_consecutive_errors", 0) or 0)
        self._stop_on_consecutive_errors = stop if stop > 0 else DEFAULT_STOP_ON_CONSECUTIVE_ERRORS
        # Transparent retry is off unless an agent asks per call (retry=True): see README, AgentContext
        # compatibility. When on, each retry is a real tool call that the host counts against the cap.
        self._retry = RetryConfig(enabled=False)
        self._iteration = 0
        self._tool_calls_made = 0
        self._tools_remaining: int = limits.max_tool_calls
        self._llm_calls_made = 0
        self._consecutive_errors = 0
        self._breakers: dict[str, _Breaker] = {}
        self._tool_specs: list[dict[str, Any]] | None = None  # the host's ListTools answer, once asked
        self._tool_specs_lock = threading.Lock()

    # --- properties (read-only, as in the agentnode runtime) ---------------------------------------------

    @property
    def goal(self) -> str:
        return self._goal

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def system_prompt(self) -> str:
        """The manifest's system prompt, "" when none (call_llm prepends it)."""
        return self._system_prompt

    @property
    def allowed_packages(self) -> list[str] | None:
        """The effective tool allowlist (a copy, so the agent cannot mistake it for a lever); None, as in the
        agentnode runtime, when the manifest declares none and any installed tool pack may be asked for."""
        return None if self._allowed_packages is None else list(self._allowed_packages)

    def _allowed(self, slug: str) -> bool:
        return self._allowed_packages is None or slug in self._allowed_packages

    @property
    def iteration(self) -> int:
        return self._iteration

    @property
    def max_iterations(self) -> int:
        return self._max_iterations

    @property
    def max_tool_calls(self) -> int:
        return self._max_tool_calls

    @property
    def tool_calls_made(self) -> int:
        """Tool calls the host ran for this run so far (retries included), as it last reported."""
        return self._tool_calls_made

    @property
    def tools_remaining(self) -> int:
        return self._tools_remaining

    @property
    def llm_calls_made(self) -> int:
        """Completions this context received (successful call_llm and finished stream_llm calls)."""
        return self._llm_calls_made

    @property
    def llm_limits(self) -> dict[str, Any]:
        """The run's LLM grant (a fresh dict), so an agent can plan within its budgets: `enabled`,
        `max_calls`, `max_input_chars`, `max_output_chars`, and `max_input_tokens`, `max_output_tokens`,
        `max_total_tokens`, `max_cost_usd`, each None when the run has no such cap. The prices and the model
        behind them stay on the host."""
        return dict(self._llm_limits)

    @property
    def llm(self) -> None:
        """Always None: there is no raw LLM binding in the sandbox; use call_llm (the host's broker)."""
        return None

    # --- iterations -------------------------------------------------------------------------------------

    def next_iteration(self) -> int:
        """Count one more iteration of the agent's loop; exactly max_iterations calls succeed."""
        with self._lock:
            if self._iteration >= self._max_iterations:
                raise AgentLimitExceeded(f"iteration limit reached ({self._max_iterations})")
            self._iteration += 1
            return self._iteration

    # --- tools ------------------------------------------------------------------------------------------

    def run_tool(
        self, slug: str, tool_name: str | None = None, *, retry: bool | None = None, **kwargs: Any
    ) -> ToolResult:
        """Run a host tool. Raises PermissionError (ToolAccessError) for a refused package,
        AgentLimitExceeded when the cap is used up, AgentTerminated when this call is the
        stop_on_consecutive_errors-th failure in a row, TypeError for a kwarg named `entry`.

        A slug whose breaker is open is not called: the result is a failure with mode_used
        "circuit_breaker". Every other refusal comes back as a failed ToolResult whose error starts with
        the reason. `retry=True` retries a tool that ran and failed (RetryConfig defaults).
        """
        _check_tool_kwargs(kwargs)
        return self._run(slug, tool_name, kwargs, retry)

    def try_tool(self, slug: str, tool_name: str | None = None, **kwargs: Any) -> ToolResult | None:
        """Like run_tool, but None instead of PermissionError or AgentLimitExceeded (AgentTerminated
        still raises)."""
        try:
            return self.run_tool(slug, tool_name, **kwargs)
        except (PermissionError, AgentLimitExceeded):
            return None

    def run_tool_with_retry(
        self,
        slug: str,
        tool_name: str | None = None,
        *,
        max_retries: int = 3,
        backoff_base: float = 1.0,
        backoff_max: float = 15.0,
        **kwargs: Any,
    ) -> ToolResult:
        """run_tool (the first attempt even when the breaker is open), then up to `max_retries` retries of a
        tool that ran and failed, each after min(backoff_base·2^(n-1), backoff_max) seconds (at most
        MAX_BACKOFF_SECONDS). Retries stop when the cap is used up, the breaker opens or the run's time
        would run out first; each one is a tool call the host counts."""
        _check_tool_kwargs(kwargs)
        result, ran = self._attempt(slug, tool_name, kwargs)
        if result.success or not ran:
            return result
        retry = RetryConfig(max_retries=max_retries, backoff_base=backoff_base, backoff_max=backoff_max)
        return self._retry_loop(slug, tool_name, kwargs, result, retry)

    def run_tool_with_fallback(
        self, slug: str, tool_name: str | None = None, *, fallbacks: list[str] | None = None, **kwargs: Any
    ) -> ToolResult:
        """The primary without retry, then each allowed fallback slug (others skipped) with retry and the
        same tool_name, until one succeeds; the last result otherwise."""
        result = self.run_tool(slug, tool_name, retry=False, **kwargs)
        if result.success or not fallbacks:
            return result
        for fallback in fallbacks:
            if not self._allowed(fallback):
                continue
            result = self.run_tool(fallback, tool_name, retry=True, **kwargs)
            if result.success:
                return result
        return result

    def is_tool_available(self, slug: str) -> bool:
        """Whether `slug` is on the allowlist and its breaker is not open (the host may still refuse it,
        e.g. when it is untrusted or not installed)."""
        if not self._allowed(slug):
            return False
        with self._lock:
            breaker = self._breakers.get(slug)
            return breaker is None or breaker.state != "open"

    def tool_health(self, slug: str) -> dict[str, Any]:
        """`{slug, allowed, circuit_breaker: {state, failure_count, failure_threshold, cooldown}}`."""
        with self._lock:
            breaker = self._breakers.get(slug) or _Breaker(self._clock)
            health = breaker.to_dict()
        return {"slug": slug, "allowed": self._allowed(slug), "circuit_breaker": health}

    def _run(
        self, slug: str, tool_name: str | None, arguments: Mapping[str, Any], retry: bool | None
    ) -> ToolResult:
        """run_tool with the arguments as a mapping (so a tool argument may be named like a parameter)."""
        held = self._held_back(slug)
        if held is not None:
            return held
        result, ran = self._attempt(slug, tool_name, arguments)
        if result.success or not ran or not (self._retry.enabled if retry is None else retry):
            return result
        return self._retry_loop(slug, tool_name, arguments, result, self._retry)

    def _held_back(self, slug: str) -> ToolResult | None:
        """The circuit-breaker result when `slug`'s breaker is open (no call is made), else None."""
        with self._lock:
            breaker = self._breakers.get(slug)
            if breaker is None or breaker.state != "open":
                return None
            failures = breaker.failures
        return ToolResult(
            False,
            error=f"circuit breaker open for '{slug}': it failed {failures} times in a row; calls are held "
            f"back for {BREAKER_COOLDOWN_SECONDS:.0f} s",
            mode_used="circuit_breaker",
        )

    def _attempt(
        self, slug: str, tool_name: str | None, kwargs: Mapping[str, Any]
    ) -> tuple[ToolResult, bool]:
        """One call to the host, then the breaker and consecutive-error bookkeeping; (result, ran)."""
        result, ran = self._dispatch(slug, tool_name, kwargs)
        # A refusal that comes back as a result (not found, bad arguments, ...) is a failed dispatch in the
        # format's arithmetic too (§4.4): it counts towards the breaker and stop_on_consecutive_errors.
        with self._lock:
            breaker = self._breakers.get(slug)
            if breaker is None:
                breaker = self._breakers[slug] = _Breaker(self._clock)
            if result.success:
                breaker.success()
                self._consecutive_errors = 0
                return result, ran
            breaker.failure()
            self._consecutive_errors += 1
            errors = self._consecutive_errors
        if errors >= self._stop_on_consecutive_errors:
            last = (result.error or "")[:200]
            raise AgentTerminated(f"stopped after {errors} consecutive tool errors (last: {last})")
        return result, ran

    def _retry_loop(
        self,
        slug: str,
        tool_name: str | None,
        kwargs: Mapping[str, Any],
        last: ToolResult,
        retry: RetryConfig,
    ) -> ToolResult:
        """Retry a tool that ran and failed; stops quietly at the cap, an open breaker, a refusal, the end
        of the run's time, or when the entrypoint has returned."""
        for attempt in range(1, retry.max_retries + 1):
            with self._lock:
                if self._tools_remaining == 0:
                    break
                breaker = self._breakers.get(slug)
                if breaker is not None and breaker.state == "open":
                    break
            delay = _backoff(attempt, retry.backoff_base, retry.backoff_max)
            if self._finished.is_set() or self._clock() + delay >= self._deadline:
                break
            self._sleep(delay)
            if self._finished.is_set():
                break
            try:
                result, ran = self._attempt(slug, tool_name, kwargs)
            except AgentLimitExceeded:
                break  # other calls used up the cap meanwhile
            if result.success or not ran:
                return result
            last = result
        return last

    def _dispatch(
        self, slug: str, tool_name: str | None, kwargs: Mapping[str, Any]
    ) -> tuple[ToolResult, bool]:
        """One RunTool call; (result, whether the tool ran). Raises for the refusals agents must not miss."""
        try:
            arguments = _ARGUMENTS.encode(kwargs)
        except (TypeError, ValueError, RecursionError) as exc:
            return ToolResult(False, error=f"INVALID_REQUEST: tool arguments are not JSON: {exc}"), False
        request = tools_pb2.RunToolRequest(
            package_slug=slug, tool_name=tool_name or "", arguments_json=arguments
        )
        started = self._clock()
        try:
            response = self._tools.RunTool(request)
        except grpc.RpcError as err:
            reason, message = refusal(err)
            if reason in _PERMISSION_REASONS:
                raise ToolAccessError(message, reason=reason) from None
            if reason == "TOOL_CALL_LIMIT":
                with self._lock:
                    self._tools_remaining = 0
                    self._tool_calls_made = max(self._tool_calls_made, self._max_tool_calls)
                raise AgentLimitExceeded(message) from None
            return ToolResult(False, error=message, duration_ms=self._ms_since(started)), False
        duration_ms = self._ms_since(started)
        with self._lock:  # concurrent calls answer in any order: keep the host's latest numbers
            self._tool_calls_made = max(self._tool_calls_made, response.tool_calls_made)
            self._tools_remaining = min(self._tools_remaining, response.tools_remaining)
        try:
            result = loads_finite(response.result_json) if response.result_json else None
        except (ValueError, RecursionError):
            error = "HOST_ERROR: the tool result is not strict JSON"
            return ToolResult(False, error=error, duration_ms=duration_ms), True
        return ToolResult(
            response.success,
            result=result,
            error=response.error or None,
            mode_used=response.mode_used,
            duration_ms=duration_ms,
            timed_out=not response.success and response.error.startswith(_TOOL_TIMEOUT_PREFIX),
        ), True

    def _ms_since(self, started: float) -> float:
        return round((self._clock() - started) * 1000, 3)

    def _finish(self) -> None:
        """The entrypoint returned: wake retry sleeps in the agent's leftover threads and retry no more."""
        self._finished.set()

    # --- LLM --------------------------------------------------------------------------------------------

    def allowed_tool_context(self) -> ToolContext:
        """The tools this run may offer a model: `tool_specs` from the host's list (ListTools: every declared
        tool of every installed pack on the run's effective allowlist, named `<slug>:<tool>`), asked for once
        per run. Never raises and never returns None: an empty allowlist, an older host without ListTools or
        any failure gives a context without specs (a failure other than an older host is asked again next
        time). `allowed_packages` is the allowlist, or, when the manifest declares none, the slugs of the
        listed tools."""
        try:
            if self._allowed_packages == ():
                return ToolContext()  # the runtime's llm_only case: nothing to ask the host
            specs = copy.deepcopy(self._listed_tools())
            if self._allowed_packages is not None:
                packages = list(self._allowed_packages)
            else:
                packages = list(dict.fromkeys(spec["name"].partition(":")[0] for spec in specs))
            return ToolContext(allowed_packages=packages, tool_specs=specs)
        except Exception:  # noqa: BLE001 - the runtime's contract: never raises
            return ToolContext(allowed_packages=list(self._allowed_packages or ()))

    def _listed_tools(self) -> list[dict[str, Any]]:
        """The host's tool specs for this run, cached after the first answer (an older host's too)."""
        with self._tool_specs_lock:
            if self._tool_specs is None:
                try:
                    response = self._llm.ListTools(llm_pb2.ListToolsRequest())
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self._tool_specs = []  # a host from before ListTools: it never offers tools
                    return []
                self._tool_specs = [_llm.tool_spec(t) for t in response.tools]
            return self._tool_specs

    def call_llm(
        self,
        messages: Messages,
        *,
        tool_context: ToolContext | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> LlmResult:
        """One completion from the host's broker; any refusal raises LlmAccessError with its reason.

        `messages` is a str (one user message) or message dicts: system/user/assistant/tool, an assistant
        message with the `tool_calls` an LlmResult carried (an LlmResult itself is one), a tool message with
        `tool_call_id` and the result as `content` (anything but a str is sent as its JSON). The manifest's
        system prompt goes first unless a system message is there. `tool_context` offers its `tool_specs`
        to the model, by name (see allowed_tool_context: the host offers its own declaration of each and
        refuses a name not on its list); `tool_choice` is "auto", "none", "required" or one offered tool
        (`{"type": "function", "function": {"name": ...}}`); `response_format` is OpenAI's (`{"type":
        "json_object"}`, `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`). Wrong
        types raise TypeError before anything is sent."""
        request = llm_pb2.CallLlmRequest(messages=self._chat(messages))
        _options(request, tool_context, response_format, tool_choice)
        try:
            response = self._llm.CallLlm(request)
        except grpc.RpcError as err:
            raise _llm_error(err) from None
        with self._lock:
            self._llm_calls_made += 1
        return LlmResult(
            content=response.content,
            finish_reason=_llm.FINISH_REASONS.get(response.finish_reason, ""),
            usage=_usage(response.usage),
            tool_calls=[_llm.tool_call_dict(c) for c in response.tool_calls] or None,
        )

    def call_llm_text(self, messages: Messages, **kwargs: Any) -> str:
        """The completion text alone (call_llm's keyword arguments apply)."""
        return self.call_llm(messages, **kwargs).content

    def run_llm_tool_loop(self, messages: Messages, *, max_rounds: int = 8) -> LlmResult:
        """The runtime's tool loop over allowed_tool_context(): call the model; while it calls tools, run
        each call (its name split at the first ':' into slug and tool) through the host's gate as try_tool
        does, feed the results back and call again, at most `max_rounds` calls in all. Returns the first
        result without tool calls, or the last one (its tool calls not run: nothing would read them).

        Each round appends the assistant message with its tool calls and one `tool` message per call with
        its `tool_call_id`, in the providers' wire format (the runtime's messages carry no ids). The host
        takes each id once per conversation, so a call whose id is missing, not `[A-Za-z0-9_-]{1,128}` or
        already used (in `messages` too, or earlier in the same answer) is sent back under a fresh one, in
        both messages. A result is sent as is when it is a str, else as JSON; a failure, a refusal,
        arguments that are not a JSON object, a name that is not `<slug>:<tool>` and a call the model was
        not offered (`refused`, never run) as `{"error": ...}`, whatever the model returned. A call not run
        for its name or arguments is sent back `refused` (arguments `{}`, a nameless one as "unnamed"), as
        the host itself returns such calls. AgentTerminated and LLM refusals raise, as in the runtime;
        `messages` and the results' tool calls are not modified.
        """
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int):
            raise TypeError("max_rounds must be an int")
        if max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        tools = self.allowed_tool_context()
        conversation: list[Mapping[str, Any]] = (
            [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        )
        used = _call_ids(conversation)
        for remaining in range(max_rounds - 1, -1, -1):
            result = self.call_llm(conversation, tool_context=tools)
            calls = result.tool_calls
            if not calls or remaining == 0:
                return result
            planned = [_loop_call(call, used) for call in calls]
            echoed = [sent for sent, _ in planned]
            conversation.append({"role": "assistant", "content": result.content, "tool_calls": echoed})
            for sent, plan in planned:
                output = plan if isinstance(plan, str) else self._loop_run(*plan)
                conversation.append({"role": "tool", "tool_call_id": sent["id"], "content": output})
        raise AssertionError("unreachable: the last round returns")

    def _loop_run(self, slug: str, tool_name: str, arguments: dict[str, Any]) -> str:
        """Run one of the model's calls as try_tool would; the text the model gets back."""
        try:
            result = self._run(slug, tool_name or None, arguments, None)
        except (ToolAccessError, AgentLimitExceeded) as exc:  # where try_tool returns None
            return _error_text(str(exc))
        except (ValueError, TypeError) as exc:  # a slug or tool name that cannot be sent; it was not run
            return _error_text(f"'{slug}:{tool_name}' could not be called: {exc}")
        if not result.success:
            return _error_text(result.error or "the tool failed")
        value = result.result
        return value if isinstance(value, str) else _llm.dumps(value, "the tool result")

    def stream_llm(
        self,
        messages: Messages,
        *,
        tool_context: ToolContext | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> LlmStream:
        """A streamed completion (call_llm's arguments): iterate it for the text as it arrives; when the
        iteration ends, its `result` is the LlmResult call_llm would have returned, with the tool calls the
        model made. At the output cap it raises LlmAccessError after the chunks that fit."""
        request = llm_pb2.StreamLlmRequest(messages=self._chat(messages))
        _options(request, tool_context, response_format, tool_choice)
        return LlmStream(lambda: self._llm.StreamLlm(request), self._count_llm_call)

    def _count_llm_call(self) -> None:
        with self._lock:
            self._llm_calls_made += 1

    def _chat(self, messages: Messages) -> list[llm_pb2.ChatMessage]:
        """Wire messages with the manifest's system prompt first, unless the agent sent a system message."""
        chat = _llm.chat_messages(messages)
        if self._system_prompt and not any(m.role == "system" for m in chat):
            chat.insert(0, llm_pb2.ChatMessage(role="system", content=self._system_prompt))
        return chat

    # --- awaitable twins for `async def` agents: the sync call on a worker thread -------------------------

    async def arun_tool(
        self, slug: str, tool_name: str | None = None, *, retry: bool | None = None, **kwargs: Any
    ) -> ToolResult:
        """`await` form of run_tool."""
        return await asyncio.to_thread(self.run_tool, slug, tool_name, retry=retry, **kwargs)

    async def atry_tool(self, slug: str, tool_name: str | None = None, **kwargs: Any) -> ToolResult | None:
        """`await` form of try_tool."""
        return await asyncio.to_thread(self.try_tool, slug, tool_name, **kwargs)

    async def arun_tool_with_retry(
        self,
        slug: str,
        tool_name: str | None = None,
        *,
        max_retries: int = 3,
        backoff_base: float = 1.0,
        backoff_max: float = 15.0,
        **kwargs: Any,
    ) -> ToolResult:
        """`await` form of run_tool_with_retry (its backoff sleeps on the worker thread)."""
        return await asyncio.to_thread(
            self.run_tool_with_retry, slug, tool_name,
            max_retries=max_retries, backoff_base=backoff_base, backoff_max=backoff_max, **kwargs,
        )

    async def arun_tool_with_fallback(
        self, slug: str, tool_name: str | None = None, *, fallbacks: list[str] | None = None, **kwargs: Any
    ) -> ToolResult:
        """`await` form of run_tool_with_fallback."""
        return await asyncio.to_thread(
            self.run_tool_with_fallback, slug, tool_name, fallbacks=fallbacks, **kwargs
        )

    async def acall_llm(
        self,
        messages: Messages,
        *,
        tool_context: ToolContext | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> LlmResult:
        """`await` form of call_llm."""
        return await asyncio.to_thread(
            self.call_llm, messages,
            tool_context=tool_context, response_format=response_format, tool_choice=tool_choice,
        )

    async def acall_llm_text(self, messages: Messages, **kwargs: Any) -> str:
        """`await` form of call_llm_text."""
        return await asyncio.to_thread(self.call_llm_text, messages, **kwargs)

    async def arun_llm_tool_loop(self, messages: Messages, *, max_rounds: int = 8) -> LlmResult:
        """`await` form of run_llm_tool_loop (the whole loop on one worker thread)."""
        return await asyncio.to_thread(self.run_llm_tool_loop, messages, max_rounds=max_rounds)

    def astream_llm(
        self,
        messages: Messages,
        *,
        tool_context: ToolContext | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> AsyncLlmStream:
        """`async for` form of stream_llm (each chunk is awaited on a worker thread); `result` as there."""
        return AsyncLlmStream(
            self.stream_llm(
                messages, tool_context=tool_context, response_format=response_format, tool_choice=tool_choice
            )
        )


def _options(
    request: llm_pb2.CallLlmRequest | llm_pb2.StreamLlmRequest,
    tool_context: ToolContext | None,
    response_format: Mapping[str, Any] | None,
    tool_choice: str | Mapping[str, Any] | None,
) -> None:
    """Tools, tool choice and response format on a request; with none of them it is a plain text request,
    exactly as hosts before tool calling received it."""
    choice, tools = _llm.tool_choice(tool_choice, _llm.tool_definitions(tool_context))
    fmt = _llm.response_format(response_format)
    request.tools.extend(tools)
    request.tool_choice = choice
    if fmt is not None:
        request.response_format.CopyFrom(fmt)


def _error_text(message: str) -> str:
    return _llm.dumps({"error": message}, "the error")


def _call_ids(messages: list[Mapping[str, Any]]) -> set[str]:
    """Every tool call id a conversation already holds, in assistant calls and tool answers alike."""
    used: set[str] = set()
    for message in messages:
        if not isinstance(message, Mapping):
            continue  # call_llm refuses it with a TypeError
        answer = message.get("tool_call_id")
        if isinstance(answer, str):
            used.add(answer)
        calls = message.get("tool_calls")
        if isinstance(calls, list | tuple):
            used.update(c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str))
    return used


def _loop_call(
    call: Mapping[str, Any], used: set[str]
) -> tuple[dict[str, Any], str | tuple[str, str, dict[str, Any]]]:
    """One of the model's calls in the tool loop: (the copy sent back, then the error text the model gets
    or the (slug, tool, arguments) to run). The copy has a fresh id unless its own is valid and unused (the
    id is then used), and is `refused` when its name or arguments rule it out, so the host takes it back."""
    sent = dict(call)
    call_id = sent.get("id")
    while not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id) or call_id in used:
        call_id = "call_" + os.urandom(12).hex()  # secrets.token_hex, without its imports in every boot
    used.add(call_id)
    sent["id"] = call_id
    name = call.get("name")
    name = name if isinstance(name, str) else ""
    slug, colon, tool_name = name.partition(":")
    if not (slug and colon):
        sent.update(name=name or _UNNAMED_CALL, refused=True)
    try:
        arguments = loads_finite(call.get("arguments") or "{}")
    except (TypeError, ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        sent.update(arguments="{}", refused=True)
    if call.get("refused"):
        return sent, _error_text(f"'{name}' is not one of the tools offered; it was not run")
    if not name:
        return sent, _error_text("the tool call has no name; it was not run")
    if not (slug and colon):
        return sent, _error_text(f"'{name}' is not a '<slug>:<tool>' tool name; it was not run")
    if not isinstance(arguments, dict):
        return sent, _error_text(f"the arguments for '{name}' are not a JSON object; it was not run")
    if "entry" in arguments:
        reserved = "'entry' is reserved by the agentnode runtime and cannot be passed to a tool"
        return sent, _error_text(reserved)
    return sent, (slug, tool_name, arguments)


class LlmStream(Iterator[str]):
    """A streamed completion: iterating it yields the text as it arrives (the request is sent on the
    first step). `result` is None until the host's final chunk, then the whole completion as call_llm
    returns it: content, `tool_calls` (the completed calls; deltas are put together here when the host
    lists none), usage and finish_reason. `close()` (or leaving a `with` block) cancels a stream that has
    not finished. A refusal raises LlmAccessError, at the output cap after the chunks that fit."""

    def __init__(self, start: Callable[[], Any], on_done: Callable[[], None]) -> None:
        self._result: LlmResult | None = None
        self._call: Any = None
        self._closed = False
        self._chunks = self._run(start, on_done)

    @property
    def result(self) -> LlmResult | None:
        return self._result

    def __iter__(self) -> LlmStream:
        return self

    def __next__(self) -> str:
        return next(self._chunks)

    def __enter__(self) -> LlmStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the stream (the host stops the provider's); iterating it afterwards yields nothing."""
        self._closed = True
        if self._call is not None and self._result is None:
            self._call.cancel()
        try:
            self._chunks.close()
        except ValueError:
            pass  # being iterated on another thread: the cancel ends it there

    def _run(self, start: Callable[[], Any], on_done: Callable[[], None]) -> Generator[str, None, None]:
        if self._closed:
            return
        self._call = call = start()
        text: list[str] = []
        deltas = _llm.ToolCallDeltas()
        try:
            for chunk in call:
                for delta in chunk.tool_call_deltas:
                    deltas.add(delta)
                if chunk.delta:
                    text.append(chunk.delta)
                    yield chunk.delta
                if chunk.done:
                    calls = [_llm.tool_call_dict(c) for c in chunk.tool_calls] or deltas.calls()
                    self._result = LlmResult(
                        content="".join(text),
                        finish_reason=_llm.FINISH_REASONS.get(chunk.finish_reason, ""),
                        usage=_usage(chunk.usage),
                        tool_calls=calls or None,
                    )
                    on_done()
        except grpc.RpcError as err:
            if self._closed:
                return
            raise _llm_error(err) from None
        finally:
            if self._result is None:
                call.cancel()


class AsyncLlmStream(AsyncIterator[str]):
    """stream_llm for `async for`: each chunk is awaited on a worker thread; `result` as in LlmStream."""

    def __init__(self, stream: LlmStream) -> None:
        self._stream = stream

    @property
    def result(self) -> LlmResult | None:
        return self._stream.result

    def __aiter__(self) -> AsyncLlmStream:
        return self

    async def __anext__(self) -> str:
        chunk = await asyncio.to_thread(next, self._stream, None)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def __aenter__(self) -> AsyncLlmStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel the stream, as LlmStream.close."""
        self._stream.close()


def _usage(usage: llm_pb2.Usage) -> dict[str, int]:
    """Token counts under the runtime's names and this wrapper's earlier ones, and the run's token budget
    left when the host reports one (a run without max_total_tokens keeps the earlier shape)."""
    counts = {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }
    if usage.HasField("tokens_remaining"):
        counts["tokens_remaining"] = usage.tokens_remaining
    return counts


def _llm_limits(grant: Any) -> dict[str, Any]:
    """AgentContext.llm_limits from the task's LlmGrant (an absent grant reads as an empty one: no calls)."""
    if not isinstance(grant, session_pb2.LlmGrant):
        grant = session_pb2.LlmGrant()
    return {
        "enabled": grant.enabled,
        "max_calls": grant.max_calls,
        "max_input_chars": grant.max_input_chars,
        "max_output_chars": grant.max_output_chars,
        "max_input_tokens": grant.max_input_tokens if grant.HasField("max_input_tokens") else None,
        "max_output_tokens": grant.max_output_tokens if grant.HasField("max_output_tokens") else None,
        "max_total_tokens": grant.max_total_tokens if grant.HasField("max_total_tokens") else None,
        "max_cost_usd": grant.max_cost_usd if grant.HasField("max_cost_usd") else None,
    }


def _llm_error(err: Any) -> LlmAccessError:
    """The LlmAccessError for a refused LLM RPC (HostUnavailableError propagates from refusal)."""
    reason, message = refusal(err)
    return LlmAccessError(message, reason=reason)
