"""A run's report: repetitions combined, every section's targets, the Markdown around the tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench._plan import SECTION_NAMES
from bench._stats import UNSTABLE_SPREAD, combine, unstable_figures
from bench.report import (
    broker,
    broker_tools,
    calls,
    cli,
    cold,
    concurrency,
    egress,
    files,
    tool_sandbox,
    warm,
)
from bench.report.format import at, fmt, pct, reps_text, table

SECTIONS = ("Targets", "Load", "Cold start", "Per-call overhead", "Tool sandboxes", "Broker", "Egress",
            "Files", "Concurrency", "Warm")
"""The Markdown sections every report has, in order (smoke mode included)."""

BUSY_LOAD = 1.5
"""A 1-minute load average above this means other work competed with the benchmark."""

MAX_UNSTABLE_LISTED = 60


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every target, per runtime: the figure, its repetitions, the goal, and met / missed / unstable (the
    repetitions disagree by more than UNSTABLE_SPREAD, so neither verdict can be trusted) / not measured;
    where it is not met, the measured floor or breakdown beside it."""
    return [*warm.targets(results), *cli.targets(results), *concurrency.targets(results),
            *calls.targets(results), *broker.targets(results), *egress.targets(results),
            *files.targets(results)]


def aggregate(raw: Mapping[str, Mapping[str, Sequence[Any]]]) -> dict[str, dict[str, Any]]:
    """section -> runtime -> the repetitions combined (bench._stats.combine); a runtime none of whose
    repetitions succeeded is left out. Then the figures derived across sections (the warm speed-up)."""
    out: dict[str, dict[str, Any]] = {}
    for section, by_runtime in raw.items():
        combined = {rt: combine(list(reps)) for rt, reps in by_runtime.items()}
        out[section] = {rt: c for rt, c in combined.items() if c is not None}
    warm.derive(out)
    calls.derive(out)
    return out


def unstable_list(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every figure of every section whose repetitions disagree by more than UNSTABLE_SPREAD."""
    return [u for section in SECTION_NAMES for rt, tree in results.get(section, {}).items()
            for u in unstable_figures(tree, f"{section} {rt}")]


def finish(results: dict[str, Any]) -> dict[str, Any]:
    """A run's raw repetitions -> each section combined, the targets, the unstable figures (in place)."""
    combined = aggregate(results.get("raw", {}))
    for section in SECTION_NAMES:
        results[section] = combined.get(section, {})
    results["targets"] = targets(results)
    results["unstable"] = unstable_list(results)
    return results


LOAD = (
    "The 1-minute load average and the processes runnable or blocked at that instant, before and after "
    "each section; its duration; the seconds spent before its measurements waiting for a calm machine "
    "(full mode: at most one process per core runnable or blocked for 3 s, bounded at 180 s each)."
)


def load_rows(loads: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [(name, fmt(at(x, "before", "load1")), str(at(x, "before", "busy")),
             fmt(at(x, "after", "load1")), str(at(x, "after", "busy")), fmt(x.get("seconds")),
             fmt(x.get("quiesce_s"))) for name, x in loads.items()]


LOAD_HEADER = ("section", "load before", "runnable before", "load after", "runnable after", "seconds",
               "waited s")


def _unstable_lines(unstable: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per unstable figure (its median and p95 together): value ±spread (the repetitions)."""
    grouped: dict[str, list[str]] = {}
    for u in unstable:
        grouped.setdefault(u["figure"], []).append(
            f"{u['which']} {fmt(u['value'])}{pct(u['spread'])} ("
            + " / ".join(fmt(v) for v in u["reps"]) + ")")
    if not grouped:
        return []
    lines = [f"- {name}: {'; '.join(parts)}" for name, parts in list(grouped.items())[:MAX_UNSTABLE_LISTED]]
    if len(grouped) > MAX_UNSTABLE_LISTED:
        lines.append(f"- ... and {len(grouped) - MAX_UNSTABLE_LISTED} more (the JSON's `unstable`)")
    return ["", f"⚠ unstable: figures whose repetitions disagree by more than {UNSTABLE_SPREAD:.0%} "
            "(spread = (max - min) / median of the per-repetition values, shown with the repetitions); a "
            "target read from one says `unstable`, not met or missed:", "", *lines]


def method_text(plan: Mapping[str, Any]) -> str:
    return (f"Each section ran {plan.get('reps')} repetition(s), the runtimes interleaved within each "
            "(repetition 1 runc, repetition 1 runsc, repetition 2 runc, ...). Every figure is the median of "
            "the per-repetition medians (p95: of the per-repetition p95s; ratios and overheads: of the "
            "per-repetition values), ±spread = (max - min) / median of those per-repetition values; ⚠ marks "
            f"a spread above {UNSTABLE_SPREAD:.0%}.")


def render(results: Mapping[str, Any]) -> str:
    """The Markdown report; every section in SECTIONS appears even when a part was not measured."""
    m = results["machine"]
    facts = [m["date"], f"rev `{m['git_revision']}`", m["cpu_model"], f"{m['cores']} cores",
             f"{m['memory_gib']} GiB", f"kernel {m['kernel']}", f"Docker {m['docker_server']}",
             m["runsc"] or "no runsc", f"mode **{results['mode']}**",
             f"load average at start {m['load_at_start']}, at end {m.get('load_at_end')}"]
    out = ["# agentnode-sandbox benchmarks", "", " · ".join(facts), "", method_text(results.get("plan", {}))]
    # The sections' own load (64 sandboxes at once) shows in the lagging average; only the load found at
    # the start says whether something else was running.
    if m["load_at_start"][0] > BUSY_LOAD:
        out += ["", f"**The machine was busy when the run began (1-minute load above {BUSY_LOAD}): absolute "
                    "numbers are noisy.**"]
    if results.get("errors"):
        out += ["", "**Measurements that failed (their repetitions are missing below):**", "",
                *(f"- {e}" for e in results["errors"])]
    out += table("Targets", "Each target, per runtime; where one is not met, the measured floor or "
                 "breakdown beside it.",
                 ("target", "runtime", "measured", "repetitions", "goal", "status", "floor / breakdown"),
                 [(t["target"], t["runtime"], t["measured"], reps_text(t.get("reps", [])), t["goal"],
                   f"**{t['status']}**", t.get("floor", "")) for t in results["targets"]])
    out += _unstable_lines(results.get("unstable", []))
    out += table("Load", LOAD, LOAD_HEADER, load_rows(results.get("load_by_section", {})))
    out += _body(results)
    out += ["", f"Reproduce: `{results['command']}`", ""]
    return "\n".join(out)


def _body(results: Mapping[str, Any]) -> list[str]:
    """The per-section tables, from the combined results."""
    out: list[str] = []
    for section in (cold, cli, calls, tool_sandbox, broker, broker_tools, egress, files, concurrency, warm):
        out += section.tables(results)
    return out


__all__ = [
    "BUSY_LOAD", "LOAD", "LOAD_HEADER", "SECTIONS", "aggregate", "finish", "load_rows", "method_text",
    "render", "targets", "unstable_list",
]
