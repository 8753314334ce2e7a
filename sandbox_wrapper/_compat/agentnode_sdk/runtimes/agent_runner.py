"""`AgentContext` and its types and exceptions, where agents import them from (agentnode-format §4).

In an agent's sandbox these are the sandbox wrapper's own classes, so `isinstance(context, AgentContext)`
holds and `except AgentLimitExceeded` catches what the context raises. Where the wrapper is not loaded (the
host's tool worker) they are minimal stand-ins with the SDK's names and fields, so importing never fails;
`ToolContext` and `RetryConfig` are the wrapper's own there too, from its standard-library file
(sandbox_wrapper/_types.py). The SDK's `run_agent` is the host's job: it is not provided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._runtime import from_wrapper, from_wrapper_types
from ..models import RunToolResult


class _AgentLimitExceeded(RuntimeError):
    """An agent exceeded a hard limit (tool calls, iterations)."""


class _AgentTerminated(RuntimeError):
    """A termination condition stopped the agent (consecutive tool errors)."""


class _AgentContext:
    """The runtime's context; only the sandbox host constructs one and passes it to the entrypoint."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError("AgentContext is constructed by the sandbox host and passed to the agent")


@dataclass
class _LLMResult:
    """The result of `AgentContext.call_llm`."""

    content: str
    tool_calls: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None


_STANDINS = (_AgentLimitExceeded, _AgentTerminated, _AgentContext, _LLMResult)
for _standin in _STANDINS:
    _standin.__name__ = _standin.__qualname__ = _standin.__name__.lstrip("_")

AgentLimitExceeded = from_wrapper("AgentLimitExceeded", _AgentLimitExceeded)
AgentTerminated = from_wrapper("AgentTerminated", _AgentTerminated)
AgentContext = from_wrapper("AgentContext", _AgentContext)
LLMResult = from_wrapper("LLMResult", _LLMResult)
ToolContext = from_wrapper_types("ToolContext")
RetryConfig = from_wrapper_types("RetryConfig")

__all__ = [
    "AgentContext",
    "AgentLimitExceeded",
    "AgentTerminated",
    "LLMResult",
    "RetryConfig",
    "RunToolResult",
    "ToolContext",
]
