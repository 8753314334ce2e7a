"""`RunToolResult`, the outcome of one tool call (agentnode-format §3.5).

Where the sandbox wrapper runs (an agent's sandbox), this is the wrapper's RunToolResult: the class of what
`context.run_tool` returns, with the same fields, readable as attributes and as a mapping. Elsewhere it is
the SDK's plain dataclass, below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._runtime import from_wrapper


@dataclass
class _RunToolResult:
    """The SDK's RunToolResult: `error` is a string, `duration_ms` in ms, `run_id` set by agent runs."""

    success: bool
    result: Any = None
    error: str | None = None
    mode_used: str = "direct"
    duration_ms: float = 0.0
    timed_out: bool = False
    run_id: str | None = None


_RunToolResult.__name__ = _RunToolResult.__qualname__ = "RunToolResult"

RunToolResult = from_wrapper("RunToolResult", _RunToolResult)

__all__ = ["RunToolResult"]
