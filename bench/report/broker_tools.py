"""The broker_tools section's report: the broker's own overhead, host side, in one table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import at, mp, show, table

_BROKER_TOOLS = (
    "Host side, no sandbox: a call offering the installed tool definitions of a trusted pack (8 tools, "
    "each a described object schema) and asking for a ~2 KiB JSON-schema response format, through the "
    "host's `LlmSession.call` and `.stream`, against the openai SDK sending the very request the broker "
    "sends (the adapter's `openai_request` of the prepared call, same `max_completion_tokens`) to the same "
    "fake provider, interleaved in one loop. median / p95 in ms; overhead = LlmSession median - direct "
    "median."
)


def tables(results: Mapping[str, Any]) -> list[str]:
    """The broker_tools section's tables, from the combined results."""
    out: list[str] = []
    bt: Mapping[str, Any] = at(results, "broker_tools", "host") or {}
    out += table("", _BROKER_TOOLS,
                 ("tools", "schema bytes", "request bytes", "direct SDK", "host LlmSession.call",
                  "overhead", "first chunk: direct", "first chunk: LlmSession", "first chunk overhead"),
                 [(show(bt.get("tools")), show(bt.get("schema_bytes")), show(bt.get("request_bytes")),
                   mp(bt.get("direct_ms")), mp(bt.get("session_ms")), show(bt.get("overhead_ms"), " ms"),
                   mp(bt.get("direct_first_chunk_ms")), mp(bt.get("session_first_chunk_ms")),
                   show(bt.get("first_chunk_overhead_ms"), " ms"))]
                 if bt else [])
    return out


__all__ = ["tables"]
