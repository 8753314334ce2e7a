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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench import _measure
from bench._concurrency import concurrency
from bench._report import REPO, machine_facts, render, targets
from bench._state import LLM_TOOL_COUNT, BenchState
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


QUIET_SAMPLES, QUIET_MAX_S = 6, 180.0


def _busy() -> int:
    """Processes runnable or in uninterruptible sleep right now (not the lagging load average)."""
    fields = dict(line.split(maxsplit=1) for line in Path("/proc/stat").read_text().splitlines()
                  if line.startswith("procs_"))
    return int(fields.get("procs_running", "0")) + int(fields.get("procs_blocked", "0"))


def _quiesce(waits: dict[str, float], title: str, quiet: bool) -> None:
    """Wait until the machine has calmed down after the previous section (teardowns of up to 64 sandboxes
    keep it busy for a while), so one section's aftermath is not charged to the next; bounded, recorded."""
    if not quiet:
        return
    t, calm, cores = time.monotonic(), 0, os.cpu_count() or 1
    while calm < QUIET_SAMPLES and time.monotonic() - t < QUIET_MAX_S:
        calm = calm + 1 if _busy() <= cores else 0
        time.sleep(0.5)
    waits[title.split(" (", maxsplit=1)[0]] = round(time.monotonic() - t, 1)


def _log(message: str, loads: dict[str, float]) -> None:
    """Progress on stderr, and the 1-minute load average as each section starts (for the report)."""
    loads[message.split(" (", maxsplit=1)[0]] = round(os.getloadavg()[0], 2)
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_all(plan: Plan, runtimes: list[str], mode: str, command: str) -> dict[str, Any]:
    client = connect()
    results: dict[str, Any] = {"mode": mode, "command": command, "plan": plan.__dict__,
                               "cold": {}, "calls": {}, "tool_sandbox": {}, "broker": {}, "broker_tools": {},
                               "concurrency": {},
                               "warm": {},
                               "load_by_section": {}, "quiesce_s": {}, "errors": []}
    loads: dict[str, float] = results["load_by_section"]

    def measure(title: str, store: dict[str, Any], key: str, work: Callable[[], Any]) -> None:
        """One section, on a calm machine; a failure is recorded, the other sections still run."""
        _quiesce(results["quiesce_s"], title, plan is FULL)
        _log(title, loads)
        try:
            store[key] = work()
        except Exception as exc:  # noqa: BLE001 (one failed section must not discard the others)
            results["errors"].append(f"{title}: {type(exc).__name__}: {str(exc)[:300]}")
            _log(f"{title} failed: {type(exc).__name__}", loads)

    try:
        results["machine"] = machine_facts(client)
        _log("pinned image (built only if its inputs changed)", loads)
        image = build_image(client, repo_root=REPO, progress=lambda _line: None).image_id
        results["machine"]["image"] = image
        state = BenchState(client, image)
        try:
            # Host-side only (no sandbox): measured once, not per runtime.
            measure(f"host: broker, {LLM_TOOL_COUNT} tools and a 2 KiB schema ({plan.calls} calls each)",
                    results, "broker_tools",
                    partial(_measure.broker_tools, state, plan.calls, plan.calls_warmup))
            for rt in runtimes:
                measure(f"{rt}: cold start vs docker floor ({plan.cold} runs each)", results["cold"], rt,
                        partial(_measure.cold, state, rt, plan.cold))
                measure(f"{rt}: per-call transports ({plan.calls} calls each)", results["calls"], rt,
                        partial(_measure.calls, state, rt, plan.calls, plan.calls_warmup))
                measure(f"{rt}: community tool pack in a tool sandbox vs trusted ({plan.calls} calls each)",
                        results["tool_sandbox"], rt,
                        partial(_measure.tool_sandbox, state, rt, plan.calls, plan.calls_warmup))
                measure(f"{rt}: broker ({plan.broker} calls each)", results["broker"], rt,
                        partial(_measure.broker, state, rt, plan.broker, plan.broker_warmup))
                cold = results["cold"].get(rt, {}).get("stages_ms", {}).get("to_result", {"n": 0})
                measure(f"{rt}: warm pool ({plan.warm} runs)", results["warm"], rt,
                        partial(_measure.warm, state, rt, reps=plan.warm, pool_size=plan.pool,
                                settle=plan.settle, cold_to_result=cold))
                levels = results["concurrency"].setdefault(rt, {})
                for n in plan.levels:
                    job = {"env": state.env, "slug": state.trivial, "runtime": rt, "n": n,
                           "reps": plan.level_reps, "image": image, "tag": state.tag}
                    measure(f"{rt}: {n} concurrent runs x{plan.level_reps}", levels, str(n),
                            partial(concurrency, job))
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
