"""The benchmark's loop: for each section, for each repetition, for each runtime (and with `--compare`,
each revision, in alternating order), one measurement on a calm machine, with the load around it logged.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._plan import HOST_ONLY, Plan

QUIET_SAMPLES, QUIET_MAX_S = 6, 180.0

Measure = Callable[[str, str], dict[str, Any]]
"""(section, runtime) -> one repetition's result; raises when the measurement failed."""


def busy() -> int:
    """Processes runnable or in uninterruptible sleep right now (not the lagging load average)."""
    fields = dict(line.split(maxsplit=1) for line in Path("/proc/stat").read_text().splitlines()
                  if line.startswith("procs_"))
    return int(fields.get("procs_running", "0")) + int(fields.get("procs_blocked", "0"))


def load_now() -> dict[str, float]:
    """The 1-minute load average and the instantaneous runnable + blocked count."""
    return {"load1": round(os.getloadavg()[0], 2), "busy": busy()}


def quiesce(quiet: bool) -> float:
    """Wait until the machine has calmed down after the previous measurement (teardowns of up to 64
    sandboxes keep it busy for a while), so one measurement's aftermath is not charged to the next;
    bounded. Returns the seconds waited."""
    if not quiet:
        return 0.0
    t, calm, cores = time.monotonic(), 0, os.cpu_count() or 1
    while calm < QUIET_SAMPLES and time.monotonic() - t < QUIET_MAX_S:
        calm = calm + 1 if busy() <= cores else 0
        time.sleep(0.5)
    return round(time.monotonic() - t, 1)


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def order(sides: Sequence[str], rep: int, position: int) -> list[str]:
    """The sides (revisions) of one measurement slot, the order reversed every other slot so neither
    always goes first."""
    return list(sides) if (rep + position) % 2 == 0 else list(reversed(sides))


def drive(plan: Plan, sections: Sequence[str], runtimes: Sequence[str], *, sides: Mapping[str, Measure],
          stores: Mapping[str, dict[str, Any]], log: dict[str, Any]) -> None:
    """for section: for repetition: for runtime: for side (alternating): measure.

    Each side's results go to `stores[side]`: "raw" (section -> runtime -> one entry per repetition,
    None where it failed) and "errors"; `log` gets "load_by_section" and "measurements". A failure is
    recorded and the loop goes on."""
    for section in sections:
        runtimes_here = ["host"] if section in HOST_ONLY else list(runtimes)
        before, started, waited = load_now(), time.monotonic(), 0.0
        say(f"{section}: {plan.reps} repetitions x {', '.join(runtimes_here)}"
            + (f" x {', '.join(sides)}" if len(sides) > 1 else "")
            + f" (load {before['load1']}, {before['busy']} runnable)")
        for rep in range(plan.reps):
            for position, runtime in enumerate(runtimes_here):
                for side in order(list(sides), rep, position):
                    title = f"{section} {rep + 1}/{plan.reps} {runtime}" + (f" [{side}]" if side else "")
                    wait = quiesce(plan.quiet)
                    waited += wait
                    at_start, t = load_now(), time.monotonic()
                    say(title)
                    store = stores[side]
                    data: dict[str, Any] | None = None
                    try:
                        data = sides[side](section, runtime)
                        store["errors"].extend(f"{title}: {e}" for e in data.pop("errors", []))
                    except Exception as exc:  # noqa: BLE001 (one failed measurement must not end the run)
                        data = None
                        store["errors"].append(f"{title}: {type(exc).__name__}: {str(exc)[:600]}")
                        say(f"{title} failed: {type(exc).__name__}: {str(exc)[:200]}")
                    store["raw"].setdefault(section, {}).setdefault(runtime, []).append(data)
                    log["measurements"].append({
                        "section": section, "rep": rep + 1, "runtime": runtime, "side": side,
                        "ok": data is not None, "seconds": round(time.monotonic() - t, 1), "quiesce_s": wait,
                        "before": at_start, "after": load_now(),
                    })
        log["load_by_section"][section] = {"before": before, "after": load_now(),
                                           "seconds": round(time.monotonic() - started, 1),
                                           "quiesce_s": round(waited, 1)}


__all__ = ["Measure", "busy", "drive", "load_now", "order", "quiesce", "say"]
