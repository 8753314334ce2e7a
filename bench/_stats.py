"""Statistics: per-sample summaries, and figures combined over repetitions (median of the per-repetition
values, their spread, and whether they disagree too much to be trusted). Pure: no Docker, no host."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

UNSTABLE_SPREAD = 0.20
"""Repetitions whose values differ by more than this share of their median make a figure unstable..."""

NEGLIGIBLE = 0.01
"""...unless they differ by less than this in the figure's own unit (ms, x, MB): the reports' finest
precision, below which a relative spread (0.001 against 0.002 ms) says nothing."""

SUMMARY_KEYS = frozenset({"n", "median", "p95", "min", "max"})
"""The keys of one repetition's `summary` of samples."""

SUMMED = frozenset({"failures", "leftovers", "warm_runs", "submitted"})
"""Counts that add up over repetitions (a failure in any repetition counts)."""

LOWEST = frozenset({"peak_active"})
"""Counts of which the lowest repetition is the honest one."""


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, nearest-rank p95, min, max and count; an empty sample has only n = 0."""
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "median": round(statistics.median(v), 3),
        "p95": round(v[max(0, math.ceil(0.95 * len(v)) - 1)], 3),
        "min": round(v[0], 3),
        "max": round(v[-1], 3),
    }


def med(stats: Mapping[str, Any] | None) -> float | None:
    """The median of a summary or a combined figure; None when nothing was measured."""
    if not isinstance(stats, Mapping) or not stats.get("n"):
        return None
    value = stats.get("median")
    return None if value is None else float(value)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / |median| of the per-repetition values; None with fewer than two, or when their
    median is 0 and they still differ (no relative spread exists, and they disagree)."""
    if len(values) < 2:
        return None
    width, middle = max(values) - min(values), abs(statistics.median(values))
    if middle == 0:
        return 0.0 if width == 0 else None
    return round(width / middle, 3)


def _unstable(values: Sequence[float]) -> bool:
    if len(values) < 2 or max(values) - min(values) < NEGLIGIBLE:
        return False
    s = spread(values)
    return s is None or s > UNSTABLE_SPREAD


def figure(values: Sequence[float]) -> dict[str, Any]:
    """One scalar per repetition (a ratio, an overhead, a throughput) combined: their median, spread, and
    the values themselves. `n` counts the repetitions that measured it."""
    v = [float(x) for x in values]
    if not v:
        return {"n": 0}
    return {"n": len(v), "median": round(statistics.median(v), 3), "spread": spread(v),
            "unstable": _unstable(v), "rep_medians": [round(x, 3) for x in v]}


def _combine_summaries(reps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    measured = [r for r in reps if r.get("n")]
    if not measured:
        return {"n": 0}
    medians = [float(r["median"]) for r in measured]
    p95s = [float(r["p95"]) for r in measured]
    return {
        "n": sum(int(r["n"]) for r in measured),
        "median": round(statistics.median(medians), 3),
        "spread": spread(medians),
        "unstable": _unstable(medians),
        "p95": round(statistics.median(p95s), 3),
        "p95_spread": spread(p95s),
        "p95_unstable": _unstable(p95s),
        "min": min(float(r["min"]) for r in measured),
        "max": max(float(r["max"]) for r in measured),
        "rep_medians": medians,
        "rep_p95s": p95s,
    }


def is_summary(value: object) -> bool:
    """A single repetition's `summary` (not yet combined)."""
    return isinstance(value, Mapping) and "n" in value and set(value) <= SUMMARY_KEYS


def is_figure(value: object) -> bool:
    """A combined figure: a summary or a scalar over repetitions (an empty one included)."""
    return isinstance(value, Mapping) and "n" in value and ("rep_medians" in value or value.get("n") == 0)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def combine(reps: Sequence[Any], key: str = "") -> Any:
    """Repetitions of one section's result (same shape each) combined into one of the same shape, where
    every summary and every float becomes a figure (`figure`, or the summary's median and p95 each with
    its spread); counts in SUMMED add up, LOWEST takes the least, other integers stay when every
    repetition agrees; strings take the most common; lists of strings merge; failed repetitions (None)
    are left out."""
    values = [r for r in reps if r is not None]
    if not values:
        return None
    if all(is_summary(v) for v in values):
        return _combine_summaries(values)
    if all(isinstance(v, Mapping) for v in values):
        keys: dict[str, None] = {}
        for v in values:
            keys.update(dict.fromkeys(v))
        return {k: combine([v.get(k) for v in values], k) for k in keys}
    if all(_number(v) for v in values):
        if key in SUMMED:
            return sum(values)
        if key in LOWEST:
            return min(values)
        if all(isinstance(v, int) for v in values) and len(set(values)) == 1:
            return values[0]
        return figure(values)
    if all(isinstance(v, list) for v in values):
        items = [x for v in values for x in v]
        if all(isinstance(x, str) for x in items):
            return sorted(set(items))
        return items
    return Counter(str(v) if isinstance(v, list | dict) else v for v in values).most_common(1)[0][0]


def walk_figures(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every combined figure (and constant or summed count) in a combined result, with its key path."""
    if is_figure(tree):
        yield path, tree
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from walk_figures(value, (*path, str(key)))
    elif _number(tree):
        yield path, tree


def rep_value(rep: Any, path: Sequence[str], which: str = "median") -> float | None:
    """One repetition's raw value at `path`: a summary's median (or p95), or the scalar itself."""
    node = rep
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    if isinstance(node, Mapping):
        return float(node[which]) if node.get("n") and which in node else None
    return float(node) if _number(node) and which == "median" else None


def unstable_figures(tree: Any, prefix: str = "") -> list[dict[str, Any]]:
    """Every figure of a combined result whose repetitions disagree by more than UNSTABLE_SPREAD."""
    out: list[dict[str, Any]] = []
    for path, fig in walk_figures(tree):
        if not isinstance(fig, Mapping):
            continue
        name = " ".join(p for p in (prefix, ".".join(path)) if p)
        if fig.get("unstable"):
            out.append({"figure": name, "which": "median", "value": fig["median"], "spread": fig["spread"],
                        "reps": fig["rep_medians"]})
        if fig.get("p95_unstable"):
            out.append({"figure": name, "which": "p95", "value": fig["p95"], "spread": fig["p95_spread"],
                        "reps": fig["rep_p95s"]})
    return out


__all__ = [
    "UNSTABLE_SPREAD", "combine", "figure", "is_figure", "is_summary", "med", "ratio", "rep_value", "spread",
    "summary", "unstable_figures", "walk_figures",
]
