"""One repetition of one section on one runtime: the unit `bench.run` interleaves (and, with `--compare`,
what each revision's worker process is asked for)."""

from __future__ import annotations

from typing import Any

from bench._plan import Plan
from bench._state import BenchState
from bench.measure.broker import broker
from bench.measure.broker_tools import broker_tools
from bench.measure.calls import calls
from bench.measure.cli import cli
from bench.measure.cold import cold
from bench.measure.concurrency import levels
from bench.measure.egress import egress
from bench.measure.files import files
from bench.measure.tool_sandbox import tool_sandbox
from bench.measure.warm import warm


def measure_one(state: BenchState, plan: Plan, section: str, runtime: str) -> dict[str, Any]:
    """One repetition's result. A concurrency level that fails is named under "errors" and the other
    levels still run; any other failure raises."""
    if section == "broker_tools":
        return broker_tools(state, plan.calls, plan.calls_warmup)
    if section == "cold":
        return cold(state, runtime, plan.cold)
    if section == "cli":
        return cli(state, runtime, plan.cold)
    if section == "calls":
        return calls(state, runtime, plan.calls, plan.calls_warmup)
    if section == "tool_sandbox":
        return tool_sandbox(state, runtime, plan.calls, plan.calls_warmup)
    if section == "broker":
        return broker(state, runtime, plan.broker, plan.broker_warmup)
    if section == "egress":
        return egress(state, runtime, plan.egress, plan.calls_warmup, plan.downloads)
    if section == "files":
        return files(state, runtime, count=plan.files_count, mib=plan.files_mib, warm=plan.files_warm)
    if section == "warm":
        return warm(state, runtime, reps=plan.warm, pool_size=plan.pool, settle=plan.settle,
                    filler=plan.filler)
    if section == "concurrency":
        return levels(state, runtime, plan.levels, quiet=plan.quiet)
    raise ValueError(f"unknown section {section!r}")


__all__ = ["measure_one"]
