"""The SDK's `load_tool`, which only the sandbox host can provide: calling it raises NotImplementedError."""

from __future__ import annotations

from ._unavailable import unavailable

load_tool = unavailable("agentnode_sdk.load_tool", "context.run_tool(slug, tool_name, **kwargs) in an agent")

__all__ = ["load_tool"]
