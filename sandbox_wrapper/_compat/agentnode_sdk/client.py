"""The SDK's registry clients, which have no place in a sandbox: calling one raises NotImplementedError.

The sandbox host installs packs and runs their tools; an agent reaches them through its context.
"""

from __future__ import annotations

from ._unavailable import unavailable

_INSTEAD = "context.run_tool(slug, tool_name, **kwargs) in an agent (the host installs packs)"

AgentNodeClient = unavailable("agentnode_sdk.AgentNodeClient", _INSTEAD)
AgentNode = unavailable("agentnode_sdk.AgentNode", _INSTEAD)

__all__ = ["AgentNode", "AgentNodeClient"]
