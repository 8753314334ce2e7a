"""One command for every benchmark: `python -m bench.run [--smoke] [--runtimes runc,runsc] [--out DIR]`.

Writes `<out>/results.{md,json}` (smoke mode: `<out>/smoke.{md,json}`): medians and p95 over repeated runs,
ratios to floors measured in the same run, machine facts, and each target met or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _measure
from bench._concurrency import concurrency
from bench._report import REPO, machine_facts, render, targets
from bench._state import BenchState
from host._engine import connect
from host._image import build_image


@dataclass(frozen=True)
class Plan:
    """Repetition counts: smoke proves the code runs, full gives stable medians and p95s."""

    cold: int
    calls: int
    calls_warmup: int
    broker: int
    broker_warmup: int
    levels: tuple[int, ...]
    level_reps: int
    warm: int
    pool: int
    settle: float


SMOKE = Plan(cold=2, calls=20, calls_warmup=3, broker=3, broker_warmup=1, levels=(2,), level_reps=1,
             warm=2, pool=2, settle=0.2)
FULL = Plan(cold=20, calls=300, calls_warmup=30, broker=50, broker_warmup=5, levels=(16, 32, 64),
            level_reps=2, warm=30, pool=4, settle=0.3)


def _log(message: str, loads: dict[str, float]) -> None:
    """Progress on stderr, and the 1-minute load average as each section starts (for the report)."""
    loads[message.split(" (", maxsplit=1)[0]] = round(os.getloadavg()[0], 2)
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_all(plan: Plan, runtimes: list[str], mode: str, command: str) -> dict[str, Any]:
    client = connect()
    results: dict[str, Any] = {"mode": mode, "command": command, "plan": plan.__dict__,
                               "cold": {}, "calls": {}, "broker": {}, "concurrency": {}, "warm": {},
                               "load_by_section": {}}
    loads: dict[str, float] = results["load_by_section"]
    try:
        results["machine"] = machine_facts(client)
        _log("pinned image (built only if its inputs changed)", loads)
        image = build_image(client, repo_root=REPO, progress=lambda _line: None).image_id
        results["machine"]["image"] = image
        state = BenchState(client, image)
        try:
            for rt in runtimes:
                _log(f"{rt}: cold start vs docker floor ({plan.cold} runs each)", loads)
                results["cold"][rt] = cold = _measure.cold(state, rt, plan.cold)
                _log(f"{rt}: per-call transports ({plan.calls} calls each)", loads)
                results["calls"][rt] = _measure.calls(state, rt, plan.calls, plan.calls_warmup)
                _log(f"{rt}: broker ({plan.broker} calls each)", loads)
                results["broker"][rt] = _measure.broker(state, rt, plan.broker, plan.broker_warmup)
                results["concurrency"][rt] = {}
                for n in plan.levels:
                    _log(f"{rt}: {n} concurrent runs x{plan.level_reps}", loads)
                    results["concurrency"][rt][str(n)] = concurrency({
                        "env": state.env, "slug": state.trivial, "runtime": rt, "n": n,
                        "reps": plan.level_reps, "image": image, "tag": state.tag})
                _log(f"{rt}: warm pool ({plan.warm} runs)", loads)
                results["warm"][rt] = _measure.warm(state, rt, reps=plan.warm, pool_size=plan.pool,
                                                    settle=plan.settle,
                                                    cold_to_result=cold["stages_ms"]["to_result"])
            results["leftovers"] = len(state.leftovers())
        finally:
            state.close()
        results["machine"]["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        client.close()
    results["targets"] = targets(results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny counts, one runtime: proves the code runs")
    parser.add_argument("--runtimes", default="runc,runsc", help="comma-separated (default: runc,runsc)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    args = parser.parse_args(argv)
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if args.smoke:
        runtimes = runtimes[:1]
    command = ".venv/bin/python -m bench.run" + (" --smoke" if args.smoke else "") + (
        f" --runtimes {','.join(runtimes)}" if runtimes != ["runc", "runsc"] else "")
    results = run_all(SMOKE if args.smoke else FULL, runtimes, "smoke" if args.smoke else "full", command)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "smoke" if args.smoke else "results"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(render(results))
    print(f"[bench] wrote {args.out / stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
