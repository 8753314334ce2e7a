"""The tool_sandbox section's report: trusted against community packs, the first call's start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import at, mp, show, table

TOOL_SANDBOX_STAGES = ("verified", "socket_ready", "created", "started", "connected", "first_reply")

_TOOL_SANDBOX = (
    "One sandboxed agent calls the same no-op tool installed twice, as a trusted pack (run by a host worker "
    "process) and as an unverified one (run in the run's tool sandbox), interleaved, timed around "
    "`context.run_tool` inside the agent: median / p95 in ms of the calls after the first. The community "
    "pack's first call starts its tool sandbox: its total as the agent saw it, then the host's stages of "
    "that start, cumulative ms from the call: verified (engine, image pin, the pack's volume), socket "
    "ready, docker create, docker start, connected (the tool server said hello), first reply."
)


def tables(results: Mapping[str, Any]) -> list[str]:
    """The tool_sandbox section's tables, from the combined results."""
    out: list[str] = []
    out += table("Tool sandboxes", _TOOL_SANDBOX,
                 ("runtime", "trusted (host worker)", "community (tool sandbox)", "ratio", "first call",
                  *TOOL_SANDBOX_STAGES),
                 [(rt, mp(t.get("trusted_ms")), mp(t.get("community_ms")), show(t.get("ratio"), "x"),
                   show(t.get("first_call_ms")),
                   *(show(at(t, "first_start_ms", k)) for k in TOOL_SANDBOX_STAGES))
                  for rt, t in results.get("tool_sandbox", {}).items()])
    return out


__all__ = ["TOOL_SANDBOX_STAGES", "tables"]
