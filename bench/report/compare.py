"""The `--compare` report: two revisions' results side by side, figure by figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench._plan import SECTION_NAMES
from bench._stats import figure, med, ratio, rep_value, walk_figures
from bench.report.format import at, fmt, show, table
from bench.report.results import (
    BUSY_LOAD,
    LOAD,
    LOAD_HEADER,
    aggregate,
    load_rows,
    method_text,
    targets,
    unstable_list,
)

SIDES = ("base", "candidate")

SECTION_TITLES = {
    "broker_tools": "Broker, 8 tools + 2 KiB schema (host side)", "cold": "Cold start",
    "cli": "Process to process",
    "calls": "Per-call overhead", "tool_sandbox": "Tool sandboxes", "broker": "Broker", "egress": "Egress",
    "files": "Files",
    "warm": "Warm",
    "concurrency": "Concurrency",
}


def _brief(fig: Any, which: str) -> dict[str, Any]:
    """One side's figure (its median, or its p95) shaped as a figure: n, median, spread, unstable, reps."""
    if isinstance(fig, int | float) and not isinstance(fig, bool):
        return {"n": 1, "median": fig, "spread": None, "unstable": False, "rep_medians": [fig]}
    if not isinstance(fig, Mapping) or not fig.get("n"):
        return {"n": 0}
    if which == "median":
        return {k: fig.get(k) for k in ("n", "median", "spread", "unstable", "rep_medians")}
    return {"n": fig["n"], "median": fig.get("p95"), "spread": fig.get("p95_spread"),
            "unstable": bool(fig.get("p95_unstable")), "rep_medians": fig.get("rep_p95s") or []}


def compare_figures(results: Mapping[str, Mapping[str, Any]],
                    raw: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every figure of either revision, side by side: each side's median ±spread and candidate / base as
    the median of the per-repetition ratios (repetition i of both sides ran back to back), with the
    ratio of the medians beside it (the only ratio for figures combined across sections)."""
    rows: list[dict[str, Any]] = []
    base, candidate = results.get("base") or {}, results.get("candidate") or {}
    for section in SECTION_NAMES:
        b_section, c_section = base.get(section) or {}, candidate.get(section) or {}
        for rt in dict.fromkeys([*b_section, *c_section]):
            b_figs, c_figs = dict(walk_figures(b_section.get(rt))), dict(walk_figures(c_section.get(rt)))
            b_reps = at(raw, "base", section, rt) or []
            c_reps = at(raw, "candidate", section, rt) or []
            for path in dict.fromkeys([*b_figs, *c_figs]):
                for which in ("median", "p95"):
                    bf, cf = b_figs.get(path), c_figs.get(path)
                    if which == "p95" and not any(isinstance(f, Mapping) and "p95" in f for f in (bf, cf)):
                        continue
                    b, c = _brief(bf, which), _brief(cf, which)
                    pairs = zip([rep_value(r, path, which) for r in b_reps],
                                [rep_value(r, path, which) for r in c_reps], strict=False)
                    paired = figure([round(cv / bv, 4) for bv, cv in pairs if bv and cv is not None])
                    rows.append({
                        "section": section, "runtime": rt,
                        "figure": ".".join(path) + (" p95" if which == "p95" else ""),
                        "base": b, "candidate": c, "ratio": paired,
                        "ratio_of_medians": ratio(med(c), med(b)),
                        "unstable": bool(b.get("unstable") or c.get("unstable") or paired.get("unstable")),
                    })
    return rows


def finish_compare(data: dict[str, Any]) -> dict[str, Any]:
    """A comparison's raw repetitions per side -> combined, targets per side, the figures side by side."""
    raw: Mapping[str, Any] = data.get("raw") or {}
    data["results"] = {side: aggregate(raw.get(side) or {}) for side in SIDES}
    data["targets"] = {side: targets(data["results"][side]) for side in SIDES}
    data["unstable"] = {side: unstable_list(data["results"][side]) for side in SIDES}
    data["figures"] = compare_figures(data["results"], raw)
    return data


def _ratio_cell(row: Mapping[str, Any]) -> str:
    paired, of_medians = row.get("ratio") or {}, row.get("ratio_of_medians")
    text = show(paired, "x") if paired.get("n") else ("n/a" if of_medians is None else f"{fmt(of_medians)}x")
    return text + (" ⚠" if row.get("unstable") and "⚠" not in text else "")


def _side_line(name: str, side: Mapping[str, Any]) -> str:
    facts = [f"**{name}**: {side.get('label', '')} (`{side.get('commit', '')}`)",
             f"image `{side.get('image') or 'not built'}`", f"host from `{side.get('host_module') or '?'}`"]
    if side.get("error"):
        facts.append(f"**did not start: {side['error']}**")
    return "- " + ", ".join(facts)


def render_compare(data: Mapping[str, Any]) -> str:
    """compare.md: two revisions measured side by side in one run, figure by figure."""
    m = data["machine"]
    facts = [m["date"], m["cpu_model"], f"{m['cores']} cores", f"{m['memory_gib']} GiB",
             f"kernel {m['kernel']}", f"Docker {m['docker_server']}", m["runsc"] or "no runsc",
             f"mode **{data['mode']}**",
             f"load average at start {m['load_at_start']}, at end {m.get('load_at_end')}"]
    out = ["# agentnode-sandbox benchmarks: base vs candidate", "", " · ".join(facts), "",
           _side_line("base", data.get("base") or {}),
           _side_line("candidate", data.get("candidate") or {}), "",
           method_text(data.get("plan", {})) + " Within each runtime of a repetition, base and candidate ran "
           "back to back in alternating order, each in its own worker process that imports `host` and "
           "`sandbox_wrapper` from its revision and runs its revision's image (this checkout's `bench` "
           "measures both). candidate / base = the median of the per-repetition ratios ±spread (the ratio "
           "of the medians where a figure is combined across sections)."]
    if m["load_at_start"][0] > BUSY_LOAD:
        out += ["", f"**The machine was busy when the run began (1-minute load above {BUSY_LOAD}): absolute "
                    "numbers are noisy.**"]
    errors: Mapping[str, Sequence[str]] = data.get("errors") or {}
    for side in SIDES:
        if errors.get(side):
            out += ["", f"**{side}: measurements that failed:**", "", *(f"- {e}" for e in errors[side])]
    by_key: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for side in SIDES:
        for t in (data.get("targets") or {}).get(side, []):
            by_key.setdefault((t["target"], t["runtime"]), {})[side] = t
    rows = []
    for (target, rt), sides in by_key.items():
        b, c = sides.get("base") or {}, sides.get("candidate") or {}
        r = ratio(c.get("value"), b.get("value"))
        rows.append((target, rt, str((b or c).get("goal", "")), str(b.get("measured", "n/a")),
                     f"**{b.get('status', 'not measured')}**", str(c.get("measured", "n/a")),
                     f"**{c.get('status', 'not measured')}**", "n/a" if r is None else f"{fmt(r)}x"))
    out += table("Targets", "Each target per runtime, for both revisions.",
                 ("target", "runtime", "goal", "base", "base status", "candidate", "candidate status",
                  "candidate / base"), rows)
    out += table("Load", LOAD, LOAD_HEADER, load_rows(data.get("load_by_section", {})))
    figures: Sequence[Mapping[str, Any]] = data.get("figures") or []
    for section in SECTION_NAMES:
        mine = [f for f in figures if f["section"] == section]
        if not mine:
            continue
        out += table(SECTION_TITLES[section], "median ±spread of each revision (ms unless named "
                     "otherwise); ⚠: a side or the ratio is unstable.",
                     ("figure", "runtime", "base", "candidate", "candidate / base"),
                     [(f"`{f['figure']}`", f["runtime"], show(f["base"]), show(f["candidate"]),
                       _ratio_cell(f)) for f in mine])
    out += ["", f"Reproduce: `{data['command']}`", ""]
    return "\n".join(out)


__all__ = ["SIDES", "compare_figures", "finish_compare", "render_compare"]
