"""AgentContext v1: the API existing agentnode agents already use, carried over the run's gRPC socket.

Agents written against the published agentnode runtime (attribute access, PermissionError,
AgentLimitExceeded, AgentTerminated, retries and breakers) and against the seed's sandbox (results as dicts,
every refusal a RuntimeError) both run unchanged. Every decision stays on the host: the counters here
mirror what the host last reported, and the retry, breaker and termination rules only ever make the agent
call less, never more than the host allows.

Every call is synchronous, as in the runtime; for `async def` agents each has an awaitable twin (`acall_llm`,
`arun_tool`, ...) that runs it on a worker thread (asyncio.to_thread), so the one gRPC channel is used as by
the sync calls and the agent's event loop never blocks on the host.

AgentContext is this module's: its task, limits, counters and awaitable twins; its tool calls (breakers,
retries) come from sandbox_wrapper._toolcalls, its LLM calls from sandbox_wrapper._llmcalls, and the values
it hands out from sandbox_wrapper._types.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sandbox_wrapper._errors import AgentLimitExceeded
from sandbox_wrapper._llm import Messages
from sandbox_wrapper._llmcalls import AsyncLlmStream, LlmCalls
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2_grpc, session_pb2, tools_pb2_grpc
from sandbox_wrapper._toolcalls import DEFAULT_STOP_ON_CONSECUTIVE_ERRORS, ToolCalls
from sandbox_wrapper._types import LlmResult, RetryConfig, ToolContext, ToolResult

WORKSPACE_DIR, INPUTS_DIR, OUTPUTS_DIR = "/workspace", "/inputs", "/outputs"
"""Where a run's files are (host/engine/contract.py names the same; a unit test holds them equal)."""


class AgentContext(ToolCalls, LlmCalls):
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
        self._breakers = {}
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
    def workspace(self) -> str | None:
        """The run's workspace (/workspace: a snapshot, read-only unless the pack declares workspace_write),
        None when the run has none."""
        return WORKSPACE_DIR if os.path.isdir(WORKSPACE_DIR) else None

    @property
    def inputs_dir(self) -> str | None:
        """Where the files the caller handed the run are (read-only), None when it handed none."""
        return INPUTS_DIR if os.path.isdir(INPUTS_DIR) else None

    @property
    def outputs_dir(self) -> str | None:
        """Where artifacts for the caller go (read back by the host once the run is over), None when the
        caller takes none."""
        return OUTPUTS_DIR if os.path.isdir(OUTPUTS_DIR) else None

    def write_artifact(self, name: str, data: bytes | str) -> str:
        """Leave one artifact for the caller under `name` (a plain file name): written beside its place
        and renamed into it, so the host never reads a half-written one under that name. Its path."""
        if self.outputs_dir is None:
            raise RuntimeError("this run takes no artifacts (its caller passed no output directory)")
        if not name or "/" in name or name in (".", "..") or "\0" in name:
            raise ValueError("an artifact's name is one plain file name")
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        final = os.path.join(OUTPUTS_DIR, name)
        partial = os.path.join(OUTPUTS_DIR, f".{name}.partial-{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
            os.replace(partial, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        return final

    @property
    def allowed_packages(self) -> list[str] | None:
        """The effective tool allowlist (a copy, so the agent cannot mistake it for a lever); None, as in the
        agentnode runtime, when the manifest declares none and any installed tool pack may be asked for."""
        return None if self._allowed_packages is None else list(self._allowed_packages)

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

    def _finish(self) -> None:
        """The entrypoint returned: wake retry sleeps in the agent's leftover threads and retry no more."""
        self._finished.set()

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
