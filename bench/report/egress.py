"""The egress section's report: one HTTPS request and a 64 MiB download, through the path against direct."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import TargetRows, mid, mp, show, table

_EGRESS = (
    "The same client code (a new TCP connection, a TLS handshake with SNI, one GET, the body read to its "
    "end) against the same local HTTPS origin in its own process on 127.0.0.1: from an agent in the "
    "sandbox through its egress path (the wrapper's loopback relay, the run's egress socket, the host's "
    "CONNECT check, host-side resolution through `egress.hosts` and the ClientHello check), and from a host "
    "process straight to the origin. A repetition takes its samples in rounds, each the direct requests "
    "and then one sandbox run making the same ones, so drift reaches both sides. median / p95 in ms; "
    "added = sandbox median - direct median. The download is 64 MiB read in 1 MiB buffers, MiB/s. "
    "floor: the same client inside the sandbox against a TLS server (same certificate) on the sandbox's own "
    "loopback, in the same run: what the runtime's loopback and the client's TLS cost there with no egress "
    "path (under runsc each of the client's small TLS reads is a gVisor system call)."
)

LATENCY_GOALS = {"runc": 1.0, "runsc": 2.0}
"""The issue's goal for the added latency of one HTTPS request, per runtime (ms)."""


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The egress section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, e in results.get("egress", {}).items():
        goal = LATENCY_GOALS.get(rt, 2.0)

        def within(value: float, most: float = goal) -> bool:
            return value <= most

        row("egress: one HTTPS request, path - direct (median)", rt, e.get("added_ms"),
            goal=f"<= {goal:g} ms", ok=within, unit=" ms",
            floor=f"direct {mid(e, 'direct_ms')} ms, through the path {mid(e, 'sandbox_ms')} ms; the same "
                  f"client on the sandbox's own loopback (no path) {mid(e, 'floor_ms')} ms")
        row("egress: 64 MiB download, path / direct throughput", rt, e.get("throughput_ratio"),
            goal=">= 0.8x", ok=lambda v: v >= 0.8, unit="x",
            floor=f"direct {mid(e, 'direct_mib_s')} MiB/s, through the path {mid(e, 'sandbox_mib_s')} MiB/s; "
                  f"the same client on the sandbox's own loopback (no path) {mid(e, 'floor_mib_s')} MiB/s")
    return row.rows


def tables(results: Mapping[str, Any]) -> list[str]:
    """The egress section's table, from the combined results."""
    return table("Egress", _EGRESS,
                 ("runtime", "direct", "through the path", "added", "floor", "direct MiB/s", "path MiB/s",
                  "ratio", "floor MiB/s"),
                 [(rt, mp(e.get("direct_ms")), mp(e.get("sandbox_ms")), show(e.get("added_ms"), " ms"),
                   mp(e.get("floor_ms")), mp(e.get("direct_mib_s")), mp(e.get("sandbox_mib_s")),
                   show(e.get("throughput_ratio"), "x"), mp(e.get("floor_mib_s")))
                  for rt, e in results.get("egress", {}).items()])


__all__ = ["LATENCY_GOALS", "tables", "targets"]
