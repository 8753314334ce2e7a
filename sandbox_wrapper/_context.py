"""AgentContext v1: the API existing agentnode agents already use, carried over the run's gRPC socket."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from sandbox_wrapper._client import refusal
from sandbox_wrapper._errors import AgentLimitExceeded, LlmAccessError
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


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call, shaped like agentnode's in-process tool result."""

    success: bool
    result: Any = None
    error: str | None = None
    mode_used: str = ""


@dataclass(frozen=True)
class LlmResult:
    """One completion; `model` is always "" because the host never reveals its model."""

    content: str
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    model: str = ""


class AgentContext:
    """What an agent's entrypoint receives: its task, its limits, and brokered tools and LLM calls.

    Every decision stays on the host; the counters here only mirror what the host last reported.
    """

    def __init__(self, channel: Any, task: session_pb2.FetchTaskResponse) -> None:
        self._tools = tools_pb2_grpc.ToolServiceStub(channel)  # type: ignore[no-untyped-call]
        self._llm = llm_pb2_grpc.LlmServiceStub(channel)  # type: ignore[no-untyped-call]
        self.goal: str = task.goal
        self.run_id: str = task.run_id
        self.system_prompt: str = task.system_prompt
        self.iteration = 0
        self.max_iterations: int = task.limits.max_iterations
        self.max_tool_calls: int = task.limits.max_tool_calls
        self.tool_calls_made = 0
        self.tools_remaining: int = task.limits.max_tool_calls
        self._allowed_packages: tuple[str, ...] = tuple(task.allowed_packages)

    @property
    def allowed_packages(self) -> list[str]:
        """The effective tool allowlist (a copy, so the agent cannot mistake it for a lever)."""
        return list(self._allowed_packages)

    def next_iteration(self) -> int:
        """Count one more iteration of the agent's loop; refuse past the run's max_iterations."""
        if self.iteration >= self.max_iterations:
            raise AgentLimitExceeded(f"iteration limit reached ({self.max_iterations})")
        self.iteration += 1
        return self.iteration

    def is_tool_available(self, slug: str) -> bool:
        """Whether `slug` is on the run's allowlist (the host may still refuse, e.g. when untrusted)."""
        return slug in self._allowed_packages

    def run_tool(self, slug: str, tool_name: str | None = None, **kwargs: Any) -> ToolResult:
        """Run a host tool; disallowed packages raise PermissionError, the call cap AgentLimitExceeded.

        Every other refusal comes back as a failed ToolResult whose error starts with the reason.
        """
        try:
            arguments = json.dumps(kwargs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return ToolResult(False, error=f"INVALID_REQUEST: tool arguments are not JSON: {exc}")
        request = tools_pb2.RunToolRequest(
            package_slug=slug, tool_name=tool_name or "", arguments_json=arguments
        )
        try:
            response = self._tools.RunTool(request)
        except grpc.RpcError as err:
            reason, message = refusal(err)
            if reason in _PERMISSION_REASONS:
                raise PermissionError(message) from None
            if reason == "TOOL_CALL_LIMIT":
                self.tools_remaining = 0
                raise AgentLimitExceeded(message) from None
            return ToolResult(False, error=message)
        self.tool_calls_made = response.tool_calls_made
        self.tools_remaining = response.tools_remaining
        try:
            result = loads_finite(response.result_json) if response.result_json else None
        except (ValueError, RecursionError):
            return ToolResult(False, error="HOST_ERROR: the tool result is not strict JSON", mode_used="")
        return ToolResult(
            response.success,
            result=result,
            error=response.error or None,
            mode_used=response.mode_used,
        )

    def try_tool(self, slug: str, tool_name: str | None = None, **kwargs: Any) -> ToolResult | None:
        """Like run_tool, but None instead of PermissionError or AgentLimitExceeded."""
        try:
            return self.run_tool(slug, tool_name, **kwargs)
        except (PermissionError, AgentLimitExceeded):
            return None

    def call_llm(self, messages: Messages) -> LlmResult:
        """One completion from the host's broker; any refusal raises LlmAccessError with its reason."""
        try:
            response = self._llm.CallLlm(llm_pb2.CallLlmRequest(messages=self._chat(messages)))
        except grpc.RpcError as err:
            raise _llm_error(err) from None
        return LlmResult(
            content=response.content,
            finish_reason=_FINISH_REASONS.get(response.finish_reason, ""),
            usage={
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
            },
        )

    def call_llm_text(self, messages: Messages) -> str:
        """The completion text alone, for agents that need nothing else."""
        return self.call_llm(messages).content

    def stream_llm(self, messages: Messages) -> Iterator[str]:
        """Yield completion text as it arrives; at the output cap, raise after the chunks that fit."""
        stream = self._llm.StreamLlm(llm_pb2.StreamLlmRequest(messages=self._chat(messages)))
        try:
            for chunk in stream:
                if chunk.delta:
                    yield chunk.delta
        except grpc.RpcError as err:
            raise _llm_error(err) from None

    def _chat(self, messages: Messages) -> list[llm_pb2.ChatMessage]:
        """Wire messages with the manifest's system prompt first, unless the agent supplied its own."""
        items = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        if not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in items
        ):
            raise TypeError("each LLM message must be a mapping with str 'role' and 'content'")
        chat = [llm_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in items]
        if self.system_prompt and not (chat and chat[0].role == "system"):
            chat.insert(0, llm_pb2.ChatMessage(role="system", content=self.system_prompt))
        return chat


def _llm_error(err: Any) -> LlmAccessError:
    """The LlmAccessError for a refused LLM RPC (HostUnavailableError propagates from refusal)."""
    reason, message = refusal(err)
    return LlmAccessError(message, reason=reason)
