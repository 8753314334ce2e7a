"""The warm section's report: the warm run's targets, its speed-up over a cold run, its tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench._stats import figure, med
from bench.report.format import TargetRows, at, at_most, fmt, mid, mp, show, table

WARM_P50_MS = {"runc": 6.0, "runsc": 15.0}
"""The warm run's server-side p50 goal per runtime (another runtime gets runsc's)."""

_WARM = (
    "`serve` (its own process) with a warm pool, one persistent `RunnerClient` over the admin socket, runs "
    "submitted one "
    "at a time after the pool refilled and its members are ready (their wrappers wait for a task: serve's "
    "`agentnode_warm_pool_ready`), then a short settle. Server side = `stages['done']` (request received -> "
    "result); "
    "client side = around `submit`; the host.aio client (`AsyncRunnerClient.submit`, awaited, timed in its "
    "event loop) takes every "
    "other run, interleaved with the blocking one; host.aio over blocking = the difference of their client "
    "medians, and the Targets table's host.aio row the difference of each client's share of its runs "
    "(client side - server side, run by run), from which the server's own spread cancels out. Cold = the "
    "cold runs above up to their result (teardown "
    "excluded, as `serve` tears down after answering); speed-up = that over each repetition's warm median. "
    "median / p95 in ms; p95 / p50 per repetition; then medians of the server-side parts, and one audit "
    "append timed alone (median / p95)."
)


def derive(out: dict[str, dict[str, Any]]) -> None:
    """The speed-up over a cold run (the cold section's to_result) into the combined warm section."""
    for rt, w in out.get("warm", {}).items():
        to_result = at(out, "cold", rt, "stages_ms", "to_result")
        cold_ms = med(to_result)
        if cold_ms is None:
            continue
        w["cold_to_result_ms"] = to_result
        warm_ms = at(w, "server_ms", "rep_medians") or []
        w["speedup"] = figure([round(cold_ms / m, 2) for m in warm_ms if m])


def _warm_floor(w: Mapping[str, Any]) -> str:
    return (f"stages (median ms): claim {mid(w, 'stages_ms', 'claim')} · task fetched "
            f"{mid(w, 'stages_ms', 'handover')} · agent done {mid(w, 'stages_ms', 'agent')} · result "
            f"{mid(w, 'stages_ms', 'finish')}; audit append alone {mid(w, 'audit_append_ms')}")


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The warm section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, w in results.get("warm", {}).items():
        goal = WARM_P50_MS.get(rt, WARM_P50_MS["runsc"])
        row("warm run p50 (server side)", rt, w.get("server_ms"), goal=f"<= {goal:g} ms",
            ok=at_most(goal), unit=" ms", floor=_warm_floor(w))
        row("warm run p95 / p50 (server side)", rt, w.get("p95_over_p50"), goal="<= 2x", ok=lambda v: v <= 2,
            unit="x", floor=f"p50 {mid(w, 'server_ms')} ms, p95 {fmt(at(w, 'server_ms', 'p95'))} ms")
        if w.get("aio_share_over_sync_ms") is not None:
            row("warm run through host.aio - blocking client (each client's share of its runs)", rt,
                w.get("aio_share_over_sync_ms"), goal="<= 1 ms", ok=at_most(1), unit=" ms",
                floor=f"client p50 {mid(w, 'aio_client_ms')} (host.aio) vs {mid(w, 'client_ms')} ms "
                      f"(blocking), their share {mid(w, 'aio_client_share_ms')} vs "
                      f"{mid(w, 'sync_client_share_ms')} ms")
    return row.rows


def tables(results: Mapping[str, Any]) -> list[str]:
    """The warm section's tables, from the combined results."""
    out: list[str] = []
    warm: Mapping[str, Any] = results.get("warm", {})
    out += table("Warm", _WARM,
                 ("runtime", "warm, server", "warm, client", "warm, host.aio client",
                  "host.aio over blocking",
                  "cold to result", "speed-up", "p95 / p50", "warm / submitted", "claim",
                  "claimed -> task fetched", "fetched -> agent done", "agent done -> result",
                  "audit append alone"),
                 [(rt, mp(w.get("server_ms")), mp(w.get("client_ms")), mp(w.get("aio_client_ms")),
                   show(w.get("aio_over_sync_ms"), " ms"), mp(w.get("cold_to_result_ms")),
                   show(w.get("speedup"), "x"), show(w.get("p95_over_p50"), "x"),
                   f"{show(w.get('warm_runs'))} / {show(w.get('submitted'))}",
                   *(show(at(w, "stages_ms", k)) for k in ("claim", "handover", "agent", "finish")),
                   mp(w.get("audit_append_ms")))
                  for rt, w in warm.items()])
    out += table("", "Is the pool filler in the way? Warm runs on an in-process host with serve's "
                 "settings (no admin socket), server side, median / p95 ms: the filler refilling during "
                 "each run (as serve does) against the filler paused.",
                 ("runtime", "filler refilling", "filler paused"),
                 [(rt, mp(at(w, "filler_probe_ms", "refilling")),
                   mp(at(w, "filler_probe_ms", "paused")))
                  for rt, w in warm.items()])
    return out


__all__ = ["WARM_P50_MS", "derive", "tables", "targets"]
