"""One command for every benchmark: `python -m bench.run [--smoke] [--runtimes runc,runsc]
[--sections a,b] [--reps N] [--compare REV] [--out DIR]`.

Writes `<out>/results.{md,json}` (smoke mode: `<out>/smoke.{md,json}`; with `--compare`,
`<out>/compare.{md,json}`):
each section run in repetitions, the runtimes interleaved within each repetition; every figure the median
of the per-repetition medians with its spread, ratios to floors measured in the same run, the load around
each section, machine facts, and each target met, missed or unstable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench._drive import drive, say
from bench._plan import FULL, SECTION_NAMES, SMOKE, Plan, parse_sections
from bench._roots import IMAGE_ROOT, REPO
from bench._sections import measure_one
from bench._state import BenchState
from bench.report.compare import render_compare
from bench.report.machine import machine_facts
from bench.report.results import finish, render
from host.engine.image import build_image
from host.engine.sdk import connect


def new_results(plan: Plan, runtimes: list[str], sections: tuple[str, ...], mode: str,
                command: str) -> dict[str, Any]:
    return {"mode": mode, "command": command, "plan": plan.to_json(), "runtimes": runtimes,
            "sections": list(sections), "raw": {}, "errors": [], "load_by_section": {}, "measurements": []}


def run_all(plan: Plan, runtimes: list[str], mode: str, command: str,
            sections: tuple[str, ...] = parse_sections(None)) -> dict[str, Any]:
    """Every section in this process: for section, for repetition, for runtime, one measurement."""
    client = connect()
    results = new_results(plan, runtimes, sections, mode, command)
    try:
        results["machine"] = machine_facts(client)
        say("pinned image (built only if its inputs changed)")
        image = build_image(client, repo_root=IMAGE_ROOT, progress=lambda _line: None).image_id
        results["machine"]["image"] = image
        state = BenchState(client, image)
        try:
            def measure(section: str, runtime: str) -> dict[str, Any]:
                return measure_one(state, plan, section, runtime)

            drive(plan, sections, runtimes, sides={"": measure}, stores={"": results}, log=results)
            results["leftovers"] = len(state.leftovers())
        finally:
            state.close()
        results["machine"]["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        client.close()
    return finish(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny counts, 2 repetitions, runc unless --runtimes: proves the code runs")
    parser.add_argument("--runtimes", default=None, help="comma-separated (default: runc,runsc; smoke: runc)")
    parser.add_argument("--sections", default=None,
                        help=f"comma-separated subset of: {', '.join(SECTION_NAMES)} (default: all, in that "
                             "order)")
    parser.add_argument("--reps", type=int, default=None,
                        help="repetitions of each section (default: full 3, smoke 2)")
    parser.add_argument("--compare", metavar="REV", default=None,
                        help="measure git revision REV (base) and this working tree (candidate) side by "
                             "side; writes compare.{md,json}")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    args = parser.parse_args(argv)
    try:
        sections = parse_sections(args.sections)
    except ValueError as exc:
        parser.error(str(exc))
    runtimes = [r.strip() for r in (args.runtimes or ("runc" if args.smoke else "runc,runsc")).split(",")
                if r.strip()]
    plan = SMOKE if args.smoke else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error("--reps must be at least 1")
        plan = replace(plan, reps=args.reps)
    mode = "smoke" if args.smoke else "full"
    command = ".venv/bin/python -m bench.run" + "".join((
        f" --compare {args.compare}" if args.compare else "",
        " --smoke" if args.smoke else "",
        f" --runtimes {','.join(runtimes)}" if args.runtimes else "",
        f" --sections {','.join(sections)}" if args.sections else "",
        f" --reps {plan.reps}" if args.reps is not None else "",
    ))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compare:
        from bench._compare import run_compare  # noqa: PLC0415 (only --compare needs git worktrees)

        data = run_compare(args.compare, plan, runtimes, sections, mode=mode, command=command)
        (args.out / "compare.json").write_text(json.dumps(data, indent=2) + "\n")
        (args.out / "compare.md").write_text(render_compare(data))
        say(f"wrote {args.out / 'compare'}.md and .json")
        return 0
    results = run_all(plan, runtimes, mode, command, sections)
    stem = "smoke" if args.smoke else "results"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(render(results))
    say(f"wrote {args.out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
