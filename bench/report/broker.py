"""The broker section's report: each overhead against the direct call and its relayed floor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import TargetRows, mid, mp, show, table

_BROKER = (
    "The same local fake provider (its own process on 127.0.0.1) called directly with the openai SDK, "
    "through the host's `LlmSession.call`, and by an agent's `call_llm` inside the sandbox; time to the "
    "first streamed chunk likewise. A repetition takes its samples in rounds: the direct and LlmSession "
    "paths in turn, then one sandbox run doing the same number of calls, so drift reaches both sides. "
    "median / p95 in ms; overhead = sandbox median - direct median, per repetition; beyond the hop = that "
    "overhead minus the sandbox RPC floor (ListTools on the same socket). relayed: the same direct SDK call "
    "made by the handler of a bare gRPC server that the sandbox calls over the same kind of socket (no "
    "broker, no session; for the first chunk, text chunks relayed as they come): the floor of a brokered "
    "call, since a handler that waits milliseconds on the provider costs more than ListTools' instant "
    "answer (the threads on both sides wake from idle); beyond the relay = sandbox median - relayed "
    "median, the broker's own share."
)

_BROKER_SANDBOX_TOOLS = (
    "The same call (8 tool definitions from `allowed_tool_context()`, a ~2 KiB JSON-schema response format) "
    "made by an agent in the sandbox with `call_llm` / `stream_llm`, through the socket and the broker, "
    "against the openai SDK sending the broker's request straight to the provider (interleaved with the "
    "section's other direct paths). overhead = sandbox median - direct median. sandbox RPC floor: the "
    "smallest call on the same socket and run server (ListTools, answered from the run's cached catalog), "
    "the share of the overhead that is the sandbox-to-host hop itself rather than the broker."
)


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The broker section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, b in results.get("broker", {}).items():
        row("broker overhead: sandbox call_llm - direct SDK (median)", rt, b.get("overhead_ms"),
            goal="<= 1 ms", ok=lambda v: v <= 1, unit=" ms",
            floor=f"direct {mid(b, 'direct_ms')} ms, sandbox {mid(b, 'sandbox_ms')} ms; sandbox RPC floor "
                  f"(ListTools) {mid(b, 'sandbox_rpc_floor_ms')} ms, overhead beyond it "
                  f"{mid(b, 'overhead_beyond_hop_ms')} ms; {_relayed(b, 'ms')}")
        row("first streamed chunk: sandbox - direct provider (median)", rt, b.get("first_chunk_overhead_ms"),
            goal="<= 1 ms", ok=lambda v: v <= 1, unit=" ms",
            floor=f"direct {mid(b, 'direct_first_chunk_ms')} ms, sandbox "
                  f"{mid(b, 'sandbox_first_chunk_ms')} ms; {_relayed(b, 'first_chunk_ms')}")
        # Issue 15: the same with 8 installed tool definitions and a 2 KiB JSON-schema response format.
        row("broker overhead, 8 tools + 2 KiB schema: sandbox call_llm - direct SDK", rt,
            b.get("tools_overhead_ms"), goal="<= 2 ms", ok=lambda v: v <= 2, unit=" ms",
            floor=f"direct {mid(b, 'direct_tools_ms')} ms, sandbox {mid(b, 'sandbox_tools_ms')} ms; "
                  f"sandbox RPC floor (ListTools) {mid(b, 'sandbox_rpc_floor_ms')} ms, overhead beyond it "
                  f"{mid(b, 'tools_overhead_beyond_hop_ms')} ms; {_relayed(b, 'tools_ms')}")
        row("first streamed chunk, 8 tools + 2 KiB schema: sandbox - direct", rt,
            b.get("tools_first_chunk_overhead_ms"), goal="<= 5 ms", ok=lambda v: v <= 5, unit=" ms",
            floor=f"direct {mid(b, 'direct_tools_first_chunk_ms')} ms, sandbox "
                  f"{mid(b, 'sandbox_tools_first_chunk_ms')} ms; {_relayed(b, 'tools_first_chunk_ms')}")
    return row.rows


def _relayed(b: Mapping[str, Any], what: str) -> str:
    """The floor of a broker overhead: the same direct call behind a bare gRPC hop from the sandbox."""
    return (f"the direct call behind a bare hop from the sandbox (no broker) {mid(b, f'relay_{what}')} ms, "
            f"{mid(b, f'relay_{what}_over_direct')} ms over direct; the broker's own beyond it "
            f"{mid(b, f'sandbox_{what}_over_relay')} ms")


def tables(results: Mapping[str, Any]) -> list[str]:
    """The broker section's tables, from the combined results."""
    out: list[str] = []
    broker: Mapping[str, Any] = results.get("broker", {})
    out += table("Broker", _BROKER,
                 ("runtime", "direct SDK", "host LlmSession.call", "sandbox call_llm", "overhead",
                  "beyond the hop", "relayed", "beyond the relay", "first chunk: direct",
                  "first chunk: LlmSession", "first chunk: sandbox", "first chunk overhead",
                  "first chunk: relayed", "first chunk beyond the relay"),
                 [(rt, mp(b.get("direct_ms")), mp(b.get("session_ms")), mp(b.get("sandbox_ms")),
                   show(b.get("overhead_ms"), " ms"), show(b.get("overhead_beyond_hop_ms"), " ms"),
                   mp(b.get("relay_ms")), show(b.get("sandbox_ms_over_relay"), " ms"),
                   mp(b.get("direct_first_chunk_ms")),
                   mp(b.get("session_first_chunk_ms")), mp(b.get("sandbox_first_chunk_ms")),
                   show(b.get("first_chunk_overhead_ms"), " ms"), mp(b.get("relay_first_chunk_ms")),
                   show(b.get("sandbox_first_chunk_ms_over_relay"), " ms")) for rt, b in broker.items()])
    out += table("", _BROKER_SANDBOX_TOOLS,
                 ("runtime", "direct SDK", "sandbox call_llm", "overhead", "sandbox RPC floor",
                  "beyond the hop", "relayed", "beyond the relay", "first chunk: direct",
                  "first chunk: sandbox", "first chunk overhead", "first chunk: relayed",
                  "first chunk beyond the relay"),
                 [(rt, mp(b.get("direct_tools_ms")), mp(b.get("sandbox_tools_ms")),
                   show(b.get("tools_overhead_ms"), " ms"), mp(b.get("sandbox_rpc_floor_ms")),
                   show(b.get("tools_overhead_beyond_hop_ms"), " ms"),
                   mp(b.get("relay_tools_ms")), show(b.get("sandbox_tools_ms_over_relay"), " ms"),
                   mp(b.get("direct_tools_first_chunk_ms")), mp(b.get("sandbox_tools_first_chunk_ms")),
                   show(b.get("tools_first_chunk_overhead_ms"), " ms"),
                   mp(b.get("relay_tools_first_chunk_ms")),
                   show(b.get("sandbox_tools_first_chunk_ms_over_relay"), " ms"))
                  for rt, b in broker.items() if "sandbox_tools_ms" in b])
    return out


__all__ = ["tables", "targets"]
