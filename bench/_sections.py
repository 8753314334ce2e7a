"""One repetition of one section on one runtime: the unit `bench.run` interleaves (and, with `--compare`,
what each revision's worker process is asked for)."""

from __future__ import annotations

from typing import Any

from bench import _measure
from bench._concurrency import concurrency
from bench._drive import quiesce
from bench._plan import Plan
from bench._state import BenchState


def measure_one(state: BenchState, plan: Plan, section: str, runtime: str) -> dict[str, Any]:
    """One repetition's result. A concurrency level that fails is named under "errors" and the other
    levels still run; any other failure raises."""
    if section == "broker_tools":
        return _measure.broker_tools(state, plan.calls, plan.calls_warmup)
    if section == "cold":
        return _measure.cold(state, runtime, plan.cold)
    if section == "cli":
        return _measure.cli(state, runtime, plan.cold)
    if section == "calls":
        return _measure.calls(state, runtime, plan.calls, plan.calls_warmup)
    if section == "tool_sandbox":
        return _measure.tool_sandbox(state, runtime, plan.calls, plan.calls_warmup)
    if section == "broker":
        return _measure.broker(state, runtime, plan.broker, plan.broker_warmup)
    if section == "warm":
        return _measure.warm(state, runtime, reps=plan.warm, pool_size=plan.pool, settle=plan.settle,
                             filler=plan.filler)
    if section == "concurrency":
        out: dict[str, Any] = {}
        errors: list[str] = []
        for i, n in enumerate(plan.levels):
            if i:
                quiesce(plan.quiet)  # the previous level's teardowns must not be charged to this one
            job = {"env": state.env, "slug": state.trivial, "runtime": runtime, "n": n, "image": state.image,
                   "tag": state.tag, "volume": state.volume}
            try:
                out[str(n)] = concurrency(job)
            except Exception as exc:  # noqa: BLE001 (one failed level must not discard the others)
                errors.append(f"{n} concurrent: {type(exc).__name__}: {str(exc)[:300]}")
        if errors:
            out["errors"] = errors
        return out
    raise ValueError(f"unknown section {section!r}")


__all__ = ["measure_one"]
