"""In-container side of agentnode-sandbox: the agent's AgentContext over the generated gRPC stubs."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a sandbox imports typing from its boot bundle (see _boot.py)
if TYPE_CHECKING:
    from typing import Any

    from sandbox_wrapper._context import AgentContext
    from sandbox_wrapper._errors import (
        AgentLimitExceeded,
        AgentTerminated,
        HostUnavailableError,
        LlmAccessError,
        ToolAccessError,
    )
    from sandbox_wrapper._llmcalls import AsyncLlmStream, LlmStream
    from sandbox_wrapper._types import (
        LLMResult,
        LlmResult,
        RetryConfig,
        RunToolResult,
        ToolContext,
        ToolResult,
    )

_FROM = {
    "AgentContext": "sandbox_wrapper._context",
    "AsyncLlmStream": "sandbox_wrapper._llmcalls",
    "LlmStream": "sandbox_wrapper._llmcalls",
    **dict.fromkeys(
        ("LLMResult", "LlmResult", "RetryConfig", "RunToolResult", "ToolContext", "ToolResult"),
        "sandbox_wrapper._types",
    ),
    **dict.fromkeys(
        ("AgentLimitExceeded", "AgentTerminated", "HostUnavailableError", "LlmAccessError",
         "ToolAccessError"),
        "sandbox_wrapper._errors",
    ),
}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: the host imports this package for PROTOCOL_VERSION and
    the tool runner (`_tool_exec`), which need neither gRPC stubs nor the AgentContext."""
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


PROTOCOL_VERSION = 1
"""The sandbox protocol version; the host refuses a wrapper (and an image) that carries another one."""

__all__ = [
    "PROTOCOL_VERSION",
    "AgentContext",
    "AgentLimitExceeded",
    "AgentTerminated",
    "AsyncLlmStream",
    "HostUnavailableError",
    "LLMResult",
    "LlmAccessError",
    "LlmResult",
    "LlmStream",
    "RetryConfig",
    "RunToolResult",
    "ToolAccessError",
    "ToolContext",
    "ToolResult",
]
