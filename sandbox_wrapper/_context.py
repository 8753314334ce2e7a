"""AgentContext v1: the API existing agentnode agents already use, carried over the run's gRPC socket.

Agents written against the published agentnode runtime (attribute access, PermissionError,
AgentLimitExceeded, AgentTerminated, retries and breakers) and against the seed's sandbox (results as dicts,
every refusal a RuntimeError) both run unchanged. Every decision stays on the host: the counters here
mirror what the host last reported, and the retry, breaker and termination rules only ever make the agent
call less, never more than the host allows.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import grpc

from sandbox_wrapper._client import refusal
from sandbox_wrapper._errors import AgentLimitExceeded, AgentTerminated, LlmAccessError, ToolAccessError
from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    tools_pb2,
    tools_pb2_grpc,
)

_PERMISSION_REASONS = frozenset({"TOOL_NOT_ALLOWED", "TOOL_PACK_UNTRUSTED"})
# Every other reason (INVALID_REQUEST, TOO_LARGE, TOOL_NOT_FOUND, TOOL_ARGUMENTS_INVALID, RUN_DEADLINE,
# TOO_MANY_REFUSALS after a burst of refused calls, and any reason a newer host adds) is a failed
# ToolResult whose error starts with the reason, or an LlmAccessError carrying it.
_FINISH_REASONS = {
    llm_pb2.FINISH_REASON_STOP: "stop",
    llm_pb2.FINISH_REASON_LENGTH: "length",
    llm_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    llm_pb2.FINISH_REASON_OTHER: "other",
}
_TOOL_TIMEOUT_PREFIX = "tool timed out"  # the host's error for a tool that ran past its timeout

DEFAULT_STOP_ON_CONSECUTIVE_ERRORS = 3
"""Failed tool calls in a row (across all slugs) after which the call raises AgentTerminated."""
BREAKER_FAILURE_THRESHOLD = 3
"""Failures of one slug (since its last success) that open its circuit breaker."""
BREAKER_COOLDOWN_SECONDS = 30.0
"""How long an open breaker holds calls before it lets one through again (half-open)."""
MAX_BACKOFF_SECONDS = 15.0
"""Ceiling on any one retry sleep, whatever backoff an agent asks for (the runtime's largest default)."""

Messages = str | Sequence[Mapping[str, str]]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number is out of range (not finite)")
    return value


def loads_finite(text: str) -> Any:
    """json.loads that refuses what JSON has no room for: NaN, ±Infinity and numbers that overflow (1e999).

    The host applies the same rule at its own boundary; this side never turns such text into a value.
    """
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


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

    As a mapping it is also the seed sandbox's completion, `{"role": "assistant", "content": ...}`, so it
    can be appended to the messages of the next call. `model` is always "" (the host never reveals its
    model), `tool_calls` always None (the broker offers no tool calling). `usage` carries the runtime's
    `prompt_tokens`/`completion_tokens` and this wrapper's earlier `input_tokens`/`output_tokens`.
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
    """The tools an LLM may be offered: the allowlist, and no tool specs (the host publishes none)."""

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
        held = self._held_back(slug)
        if held is not None:
            return held
        result, ran = self._attempt(slug, tool_name, kwargs)
        if result.success or not ran or not (self._retry.enabled if retry is None else retry):
            return result
        return self._retry_loop(slug, tool_name, kwargs, result, self._retry)

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
            breaker = self._breakers.setdefault(slug, _Breaker(self._clock))
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
            arguments = json.dumps(kwargs, allow_nan=False)
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
        """The allowlist as a ToolContext for call_llm; never raises. It has no tool specs (the host
        publishes none), so `has_tools` is False and no tools are offered to the model."""
        return ToolContext(allowed_packages=list(self._allowed_packages or ()))

    def call_llm(self, messages: Messages, *, tool_context: ToolContext | None = None) -> LlmResult:
        """One completion from the host's broker; any refusal raises LlmAccessError with its reason.

        `tool_context` is accepted for compatibility and offers the model no tools (see
        allowed_tool_context), so `tool_calls` is always None.
        """
        try:
            response = self._llm.CallLlm(llm_pb2.CallLlmRequest(messages=self._chat(messages)))
        except grpc.RpcError as err:
            raise _llm_error(err) from None
        with self._lock:
            self._llm_calls_made += 1
        return LlmResult(
            content=response.content,
            finish_reason=_FINISH_REASONS.get(response.finish_reason, ""),
            usage=_usage(response.usage),
        )

    def call_llm_text(self, messages: Messages, **kwargs: Any) -> str:
        """The completion text alone, for agents that need nothing else."""
        return self.call_llm(messages, **kwargs).content

    def run_llm_tool_loop(self, messages: Messages, *, max_rounds: int = 8) -> LlmResult:
        """The runtime's tool loop; with no tools offered to the model it is one call_llm."""
        return self.call_llm(messages, tool_context=self.allowed_tool_context())

    def stream_llm(self, messages: Messages) -> Iterator[str]:
        """Yield completion text as it arrives; at the output cap, raise after the chunks that fit."""
        stream = self._llm.StreamLlm(llm_pb2.StreamLlmRequest(messages=self._chat(messages)))
        try:
            for chunk in stream:
                if chunk.delta:
                    yield chunk.delta
                if chunk.done:
                    with self._lock:
                        self._llm_calls_made += 1
        except grpc.RpcError as err:
            raise _llm_error(err) from None

    def _chat(self, messages: Messages) -> list[llm_pb2.ChatMessage]:
        """Wire messages with the manifest's system prompt first, unless the agent sent a system message."""
        items = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        if not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in items
        ):
            raise TypeError("each LLM message must be a mapping with str 'role' and 'content'")
        chat = [llm_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in items]
        if self._system_prompt and not any(m.role == "system" for m in chat):
            chat.insert(0, llm_pb2.ChatMessage(role="system", content=self._system_prompt))
        return chat


def _usage(usage: llm_pb2.Usage) -> dict[str, int]:
    """Token counts under the runtime's names and this wrapper's earlier ones."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


def _llm_error(err: Any) -> LlmAccessError:
    """The LlmAccessError for a refused LLM RPC (HostUnavailableError propagates from refusal)."""
    reason, message = refusal(err)
    return LlmAccessError(message, reason=reason)
