"""The calls section's report: the tool call against its floors, the gate's own share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench._plan import CALL_ROUNDS
from bench._stats import figure
from bench.report.format import TargetRows, at, mid, mp, show, table

_CALL_KEYS = ("tool_ms", "tool_stub_ms", "cached_lookup_tool_ms", "free_tool_ms", "echo_ms",
              "worker_relay_ms", "stdio_ms")
_HOST_TOOL_KEYS = ("gate_ms", "gate_cached_lookup_ms", "worker_ms")

_CALLS = (
    "Round trips timed inside the container (median / p95 in ms): `context.run_tool` of a no-op trusted "
    "tool; the same RunTool request through the bare generated stub (interleaved with the former); the "
    "same request against the real run server (`build_run_server`) with the gate's toolpack looked up "
    "once instead of from the lockfile per call, then also with tools that cost nothing (no worker); a "
    "bare gRPC unary echo over the same kind of bind-mounted per-run socket; a bare server on such a "
    "socket whose handler makes one round trip to an idle tool worker process (the same tool and pipe "
    "protocol, none of the servicer, gate or pool: the floor of any design with a worker behind a per-run "
    "socket); line-delimited JSON over the container's attached stdio. tool / floor = the tool call against "
    "the bare echo plus the worker's own round trip in a hot loop (below), per repetition. Each repetition "
    f"measures the tool call and every floor in {CALL_ROUNDS} rounds of about 1/{CALL_ROUNDS} of its "
    "calls, in a rotated order, so what a ratio divides spans the same minutes."
)


def derive(out: dict[str, dict[str, Any]]) -> None:
    """The gate's own share of a tool call, per repetition, into the combined calls section."""
    for c in out.get("calls", {}).values():
        # The gate's own share: the host-timed gate call (which includes the worker's round trip) minus
        # the worker's round trip timed alone, per repetition.
        side = c.get("host_side") or {}
        workers = at(side, "worker_ms", "rep_medians") or []
        for key, share in (("gate_ms", "gate_share_ms"), ("gate_cached_lookup_ms", "gate_cached_share_ms")):
            gates = at(side, key, "rep_medians") or []
            if gates and len(gates) == len(workers):
                side[share] = figure([round(g - w, 3) for g, w in zip(gates, workers, strict=True)])


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The calls section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, c in results.get("calls", {}).items():
        if rt == "runc":
            row("tool call / (bare gRPC echo + worker round trip)", rt, c.get("tool_over_floor"),
                goal="<= 1.3x", ok=lambda v: v <= 1.3, unit="x",
                floor=f"tool call {mid(c, 'tool_ms')} ms; echo {mid(c, 'echo_ms')} + worker "
                      f"{mid(c, 'host_side', 'worker_ms')} ms; free tool (no worker) "
                      f"{mid(c, 'free_tool_ms')} ms; floor measured: a bare server relaying to an idle "
                      f"worker {mid(c, 'worker_relay_ms')} ms (itself {mid(c, 'worker_relay_over_floor')}x "
                      f"echo + worker: an idle worker's wake-up), tool call / that "
                      f"{mid(c, 'tool_over_worker_relay')}x")
        # A run's gate looks each tool pack up once per run (host/runtime/wiring.run_services): the gate call
        # with the pack looked up once, minus the worker round trip it includes.
        row("the gate's own share of a tool call (host-timed gate call - worker round trip)", rt,
            at(c, "host_side", "gate_cached_share_ms"),
            goal="<= 0.1 ms", ok=lambda v: v <= 0.1, unit=" ms",
            floor=f"gate call {mid(c, 'host_side', 'gate_cached_lookup_ms')} ms, worker round trip "
                  f"{mid(c, 'host_side', 'worker_ms')} ms; looking the pack up on every call "
                  f"{mid(c, 'host_side', 'gate_share_ms')} ms")
    return row.rows


def tables(results: Mapping[str, Any]) -> list[str]:
    """The calls section's tables, from the combined results."""
    out: list[str] = []
    calls: Mapping[str, Any] = results.get("calls", {})
    out += table("Per-call overhead", _CALLS,
                 ("runtime", "tool call", "same, bare stub", "same, lookup cached", "same, free tool",
                  "bare gRPC echo", "bare relay to a worker", "stdio JSON line", "tool / echo",
                  "stdio / echo", "tool / floor"),
                 [(rt, *(mp(c.get(k)) for k in _CALL_KEYS), show(c.get("tool_over_echo"), "x"),
                   show(c.get("stdio_over_echo"), "x"), show(c.get("tool_over_floor"), "x"))
                  for rt, c in calls.items()])
    out += table("", "The host's share of a tool call (median / p95 ms, timed on the host): the gate "
                 "looking the pack up in the lockfile on every call, the gate with the pack looked up "
                 "once (as a run's gate does), each including the worker round trip, which is also timed "
                 "alone.",
                 ("runtime", "gate, lookup per call", "gate, lookup once per run", "worker round trip"),
                 [(rt, *(mp(at(c, "host_side", k)) for k in _HOST_TOOL_KEYS))
                  for rt, c in calls.items()])
    return out


__all__ = ["derive", "tables", "targets"]
