"""In-container side of agentnode-sandbox: the agent's AgentContext over the generated gRPC stubs."""

from __future__ import annotations

from sandbox_wrapper._context import (
    AgentContext,
    AsyncLlmStream,
    LLMResult,
    LlmResult,
    LlmStream,
    RetryConfig,
    RunToolResult,
    ToolContext,
    ToolResult,
)
from sandbox_wrapper._errors import (
    AgentLimitExceeded,
    AgentTerminated,
    HostUnavailableError,
    LlmAccessError,
    ToolAccessError,
)

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
