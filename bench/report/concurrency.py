"""The concurrency section's report: throughput against docker's, memory and CPU per run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import TargetRows, at, mid, show, table

THROUGHPUT_LEVELS = ("16", "32", "64")
"""Concurrency levels whose throughput is held against docker's at the same N."""

CPU_PARTS = ("machine", "process", "engine", "rest")
"""The concurrency section's CPU split per run (bench/measure/concurrency._cpu_per_run)."""

_CONCURRENCY = (
    "N trivial runs submitted at once to one host (a fresh process per level and repetition), then N "
    "bare `docker run --rm ... python3 -c 'import grpc'` at once through the SDK in the same process "
    "(docker's own throughput at that moment); ratio = ours / docker's, per repetition. Memory per active "
    "run at the peak: host process RSS growth over its baseline; the containers' memory as `docker stats` "
    "counts it (cgroup); the containerd shims' RSS. Failures and leftovers add up over the repetitions, "
    "peak active is the lowest; failures, if any, are listed below the table. CPU per run (ms, the batch's "
    "whole duration over N): the machine's busy time (/proc/stat), of it the process submitting the runs "
    "(all its threads: for ours the host, for docker's the SDK client), the engine's daemons (dockerd, "
    "containerd), and the rest (the containers themselves, their shims and runtime, the kernel). On two "
    "cores throughput follows the machine's CPU per run, so the CPU split says where a throughput gap is "
    "spent. Hardened floor: the same N containers created from a run's own spec (read-only root, no "
    "capabilities, init, limits, tmpfs mounts, the pack volume, a socket directory) running the same "
    "command, through the same SDK calls: the engine's own cost of our hardening, none of our code."
)


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The concurrency section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, levels in results.get("concurrency", {}).items():
        for n in THROUGHPUT_LEVELS:
            c = levels.get(n) or {}
            row(f"{n} concurrent: throughput / docker's at {n}", rt, c.get("throughput_over_floor"),
                goal=">= 0.95x", ok=lambda v: v >= 0.95, unit="x",
                floor=f"ours {mid(c, 'throughput')} runs/s, docker alone "
                      f"{mid(c, 'floor', 'throughput')} runs/s, docker with a run's hardened spec "
                      f"{mid(c, 'hardened_floor', 'throughput')} runs/s (ours / that "
                      f"{mid(c, 'throughput_over_hardened_floor')}x); CPU per run (ms) ours / docker's: "
                      + ", ".join(f"{part} {mid(c, 'cpu_ms_per_run', part)} / "
                                  f"{mid(c, 'floor', 'cpu_ms_per_run', part)}" for part in CPU_PARTS))
        top: Mapping[str, Any] = levels.get("64") or {}
        row("64 concurrent: failures", rt, top.get("failures"), goal="0", ok=lambda v: v == 0)
        row("64 concurrent: leftovers", rt, top.get("leftovers"), goal="0", ok=lambda v: v == 0)
        row("64 concurrent: host memory per active run", rt, top.get("host_mb_per_run"), goal="<= 1 MB",
            ok=lambda v: v <= 1, unit=" MB",
            floor=f"containers {mid(top, 'container_mb_per_run')} MB/run, shims "
                  f"{mid(top, 'shim_mb_per_run')} MB/run (engine side)")
    return row.rows


def tables(results: Mapping[str, Any]) -> list[str]:
    """The concurrency section's tables, from the combined results."""
    out: list[str] = []
    levels_by_rt: Mapping[str, Any] = results.get("concurrency", {})
    out += table("Concurrency", _CONCURRENCY,
                 ("runtime", "N", "runs/s", "docker floor runs/s", "ours / docker",
                  "hardened floor runs/s", "ours / hardened", "wall s", "failures", "leftovers",
                  "peak active", "host MB/run", "container MB/run", "shim MB/run"),
                 [(rt, n, show(c.get("throughput")), show(at(c, "floor", "throughput")),
                   show(c.get("throughput_over_floor"), "x"), show(at(c, "hardened_floor", "throughput")),
                   show(c.get("throughput_over_hardened_floor"), "x"), show(c.get("wall_s")),
                   show(c.get("failures")),
                   show(c.get("leftovers")), show(c.get("peak_active")), show(c.get("host_mb_per_run")),
                   show(c.get("container_mb_per_run")), show(c.get("shim_mb_per_run")))
                  for rt, levels in levels_by_rt.items() for n, c in levels.items()
                  if isinstance(c, Mapping)])
    out += table("", "CPU per run (median ms): ours / docker's alone / docker's with the hardened spec, "
                 "split as above.",
                 ("runtime", "N", *(f"{part}: ours / docker / hardened" for part in CPU_PARTS)),
                 [(rt, n, *(f"{mid(c, 'cpu_ms_per_run', part)} / "
                            f"{mid(c, 'floor', 'cpu_ms_per_run', part)} / "
                            f"{mid(c, 'hardened_floor', 'cpu_ms_per_run', part)}" for part in CPU_PARTS))
                  for rt, levels in levels_by_rt.items() for n, c in levels.items()
                  if isinstance(c, Mapping) and "cpu_ms_per_run" in c])
    reasons = [f"- {rt} x{n}: {reason}" for rt, levels in levels_by_rt.items() for n, c in levels.items()
               if isinstance(c, Mapping)
               for reason in [*(c.get("failure_reasons") or []),
                              *(f"docker floor: {e}" for e in at(c, "floor", "errors") or []),
                              *(f"hardened floor: {e}" for e in at(c, "hardened_floor", "errors") or [])]]
    out += ["", "Failures:", "", *reasons] if reasons else []
    return out


__all__ = ["CPU_PARTS", "THROUGHPUT_LEVELS", "tables", "targets"]
