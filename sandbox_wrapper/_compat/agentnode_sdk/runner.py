"""`agentnode_sdk.runner.run_tool`, which only the sandbox host can provide: agents use `context.run_tool`."""

from __future__ import annotations

from typing import Any, NoReturn

from ._unavailable import message


def run_tool(
    slug: str,
    tool_name: str | None = None,
    *,
    mode: str = "auto",
    timeout: float = 30.0,
    lockfile_path: str | None = None,
    **kwargs: Any,
) -> NoReturn:
    """The SDK's signature (agentnode-format §3.1); always raises NotImplementedError."""
    instead = "context.run_tool(slug, tool_name, **kwargs)"
    raise NotImplementedError(message("agentnode_sdk.run_tool", instead))


__all__ = ["run_tool"]
