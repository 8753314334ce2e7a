"""The agentnode SDK's names that pack code imports, provided by the sandbox host (standard library only).

Packs written against the agentnode SDK import it: tools raise `AgentNodeToolError` (alias `ToolError`),
agents import `AgentContext` and its types from `agentnode_sdk.runtimes.agent_runner`. The host never
installs the real SDK into a pack's environment (it is the runtime, and it is a network client), so this
small package stands in for it. A pack that bundles its own `agentnode_sdk` gets that one instead.

The SDK's runtime entry points (`run_tool`, `load_tool`, the registry clients, ...) can be imported but raise
NotImplementedError when used: the host runs tools for an agent through `context.run_tool(...)`.
"""

from __future__ import annotations

from ._unavailable import unavailable
from .client import AgentNode, AgentNodeClient
from .exceptions import (
    AgentNodeError,
    AgentNodeToolError,
    AuthError,
    NotFoundError,
    RateLimitError,
    ValidationError,
)
from .installer import load_tool
from .models import RunToolResult
from .runner import run_tool

ToolError = AgentNodeToolError
"""The SDK's top-level alias: `agentnode_sdk.ToolError is AgentNodeToolError`."""
Client = AgentNodeClient
AsyncAgentNode = unavailable("agentnode_sdk.AsyncAgentNode", "context.run_tool(slug, tool_name, **kwargs)")
AgentNodeRuntime = unavailable("agentnode_sdk.AgentNodeRuntime", "the agent's context (run_tool, call_llm)")

__version__ = "0.12.0+agentnode-sandbox"

__all__ = [
    "AgentNode",
    "AgentNodeClient",
    "AgentNodeError",
    "AgentNodeRuntime",
    "AgentNodeToolError",
    "AsyncAgentNode",
    "AuthError",
    "Client",
    "NotFoundError",
    "RateLimitError",
    "RunToolResult",
    "ToolError",
    "ValidationError",
    "__version__",
    "load_tool",
    "run_tool",
]
