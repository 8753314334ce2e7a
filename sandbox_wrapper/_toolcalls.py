"""AgentContext's tool calls: RunTool on the host, the per-slug circuit breakers, retries with backoff and
the consecutive-error termination (the agentnode runtime's rules, which only make the agent call less)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from sandbox_wrapper._client import refusal
from sandbox_wrapper._errors import AgentLimitExceeded, AgentTerminated, ToolAccessError
from sandbox_wrapper._proto.agentnode.sandbox.v1 import tools_pb2
from sandbox_wrapper._strictjson import STRICT_ENCODER, loads_finite
from sandbox_wrapper._types import RetryConfig, ToolResult

_PERMISSION_REASONS = frozenset({"TOOL_NOT_ALLOWED", "TOOL_PACK_UNTRUSTED"})
# Every other reason (INVALID_REQUEST, TOO_LARGE, TOOL_NOT_FOUND, TOOL_ARGUMENTS_INVALID, RUN_DEADLINE,
# TOO_MANY_REFUSALS after a burst of refused calls, and any reason a newer host adds) is a failed
# ToolResult whose error starts with the reason, or an LlmAccessError carrying it.
_TOOL_TIMEOUT_PREFIX = "tool timed out"  # the host's error for a tool that ran past its timeout

DEFAULT_STOP_ON_CONSECUTIVE_ERRORS = 3
"""Failed tool calls in a row (across all slugs) after which the call raises AgentTerminated."""
BREAKER_FAILURE_THRESHOLD = 3
"""Failures of one slug (since its last success) that open its circuit breaker."""
BREAKER_COOLDOWN_SECONDS = 30.0
"""How long an open breaker holds calls before it lets one through again (half-open)."""
MAX_BACKOFF_SECONDS = 15.0
"""Ceiling on any one retry sleep, whatever backoff an agent asks for (the runtime's largest default)."""

class Breaker:
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


class ToolCalls:
    """AgentContext's tools (one of its bases): run_tool and its retry, fallback and health forms. The state
    it reads and keeps is the context's own, set up by AgentContext.__init__ and guarded by its lock."""

    _tools: Any  # tools_pb2_grpc.ToolServiceStub
    _lock: threading.Lock
    _finished: threading.Event
    _sleep: Callable[[float], object]
    _clock: Callable[[], float]
    _allowed_packages: tuple[str, ...] | None
    _max_tool_calls: int
    _deadline: float
    _stop_on_consecutive_errors: int
    _retry: RetryConfig
    _tool_calls_made: int
    _tools_remaining: int
    _consecutive_errors: int
    _breakers: dict[str, Breaker]

    def _allowed(self, slug: str) -> bool:
        return self._allowed_packages is None or slug in self._allowed_packages

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
            breaker = self._breakers.get(slug) or Breaker(self._clock)
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
                breaker = self._breakers[slug] = Breaker(self._clock)
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
            arguments = STRICT_ENCODER.encode(kwargs)
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
