"""What every section's report is made of: numbers, figures with their spread, tables, target rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bench._stats import med


def fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, int):
        return f"{x}{unit}"
    text = f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
    return text + unit


def pct(spread: float | None) -> str:
    return " ±n/a" if spread is None else f" ±{spread * 100:.0f}%"


def spread_text(fig: Mapping[str, Any], which: str = "median") -> str:
    """` ±8%` (and ` ⚠` above UNSTABLE_SPREAD) when the figure has two repetitions or more."""
    prefix = "" if which == "median" else "p95_"
    reps = fig.get("rep_medians" if which == "median" else "rep_p95s") or []
    if len(reps) < 2:
        return ""
    text = pct(fig.get(f"{prefix}spread"))
    return text + (" ⚠" if fig.get(f"{prefix}unstable") else "")


def show(fig: Any, unit: str = "") -> str:
    """A figure's median (median of the repetitions' medians) with its spread: `13.0 ms ±8%`."""
    if isinstance(fig, int | float) and not isinstance(fig, bool):
        return fmt(fig, unit)
    if not isinstance(fig, Mapping) or not fig.get("n") or fig.get("median") is None:
        return "n/a"
    return fmt(fig["median"], unit) + spread_text(fig)


def mp(fig: Any) -> str:
    """`median ±spread / p95 ±spread` of a combined summary, in ms."""
    if not isinstance(fig, Mapping) or not fig.get("n") or "p95" not in fig:
        return show(fig)
    return f"{fmt(fig['median'])}{spread_text(fig)} / {fmt(fig['p95'])}{spread_text(fig, 'p95')}"


def at(tree: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(tree, Mapping):
            return None
        tree = tree.get(key)
    return tree


def mid(tree: Any, *keys: str) -> str:
    """The median of the figure at `keys`, formatted, without its spread (for breakdowns)."""
    return fmt(med(at(tree, *keys)))


def table(title: str, prose: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return ["", f"## {title}" if title else prose, "", *([prose, ""] if title else []), *lines]


def reps_text(reps: Sequence[float]) -> str:
    return " / ".join(fmt(v) for v in reps) if len(reps) > 1 else ""


def at_most(limit: float) -> Callable[[float], bool]:
    return lambda value: value <= limit


class TargetRows:
    """A section's target rows, one per call: the figure, its repetitions, the goal, and met / missed /
    unstable (the repetitions disagree by more than UNSTABLE_SPREAD, so neither verdict can be trusted) / not
    measured; where it is not met, the measured floor or breakdown beside it."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __call__(self, target: str, rt: str, fig: Any, *, goal: str, ok: Callable[[float], bool],
                 unit: str = "", floor: str = "") -> None:
        value: float | None = None
        unstable, reps = False, []
        if isinstance(fig, Mapping):
            value = med(fig)
            unstable, reps = bool(fig.get("unstable")), list(fig.get("rep_medians") or [])
        elif isinstance(fig, int | float) and not isinstance(fig, bool):
            value = fig
        if value is None:
            status = "not measured"
        elif unstable:
            status = "unstable"
        else:
            status = "met" if ok(value) else "missed"
        self.rows.append({"target": target, "runtime": rt, "measured": show(fig, unit), "value": value,
                          "reps": reps, "goal": goal, "status": status,
                          "floor": floor if status in ("missed", "unstable") else ""})


__all__ = [
    "TargetRows", "at", "at_most", "fmt", "mid", "mp", "pct", "reps_text", "show", "spread_text", "table",
]
