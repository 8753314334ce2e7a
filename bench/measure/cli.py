"""The cli section: `run --json` process to process against `docker run`, alone and with a serve host."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from typing import Any

from bench._roots import CODE_ROOT, flat_layout
from bench._state import BenchState
from bench._stats import med, ratio, summary
from bench.measure.shared import cli_floor, pool_ready, serve_running, since


def _cli_run(state: BenchState, runtime: str, *, path: str = "local") -> tuple[float, float, str]:
    """`agentnode-sandbox run SLUG --json` as a script runs it, a new process of this revision's host (its
    interpreter start and imports, the run, the synchronous teardown, exit): (process ms, the run's own
    duration_ms and its run id, from its JSON). `path` is the one it must have taken (`serve` while a host
    is running)."""
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "host", "run", state.trivial, "--json", "--runtime", runtime],
        env=state.env, cwd=CODE_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    wall = since(t)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        out = {}
    if proc.returncode != 0 or not out.get("success"):
        raise RuntimeError(f"run --json failed ({proc.returncode}): {out.get('error_code')} "
                           f"{proc.stderr[-500:]}")
    if out.get("path", "local") != path:  # (a revision before `path` only ever ran here)
        where = state.env.get("AGENTNODE_CONFIG")
        raise RuntimeError(f"run --json took the {out.get('path', 'local')} path, not {path} ({where})")
    return wall, float(out["duration_ms"]), str(out.get("run_id", ""))


def _early_modules() -> str:
    """What the revision measured imports before it asks the engine for the run's container: the head
    start's light modules (host/runtime/headstart.py) where it has one, else the prelaunch's (only flat
    revisions lack a head start)."""
    if not flat_layout() or (CODE_ROOT / "host" / "_headstart.py").is_file():
        return "host._entry"
    return "host._cli, host._prelaunch"


def _has_prelaunch() -> bool:
    """Does the revision measured start a run's container before its other imports (runtime/prelaunch.py)?"""
    return not flat_layout() or (CODE_ROOT / "host" / "_prelaunch.py").is_file()


def _cli_imports(modules: str = "") -> float:
    """A new interpreter importing `modules` (by default what `run` imports) and exiting."""
    run_imports = "host._cli, host._runner" if flat_layout() else "host.cli.main, host.runtime.runner"
    modules = modules or run_imports
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], cwd=CODE_ROOT, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return since(t)


def _cli_served(state: BenchState, runtime: str, reps: int) -> tuple[list[float], list[float]]:
    """The same command while `serve` runs for the config (its default socket, a pool of one for the trivial
    agent): `run` finds it and submits there. (process ms of each, docker run's interleaved with them);
    nothing when this revision's `run` does not look for a serve host."""
    state.configure(runtime, pool={"size": 1, "idle_ttl_seconds": 3600})
    out: list[float] = []
    floor: list[float] = []
    used: set[str] = set()
    with serve_running(state, runtime, "--warm", state.trivial):
        for i in range(reps + 1):
            if i:
                floor.append(cli_floor(state, runtime))
            pool_ready(state, used, 1)
            try:
                wall, _, run_id = _cli_run(state, runtime, path="serve")
            except RuntimeError as exc:
                if "not serve" in str(exc):
                    return [], []
                raise
            used.add(run_id)  # a warm member's run id is its label's: the pool's next member is another
            if i:
                out.append(wall)  # the first also opened the host's pool for this runtime
    return out, floor


def cli(state: BenchState, runtime: str, reps: int) -> dict[str, Any]:
    """Process to process, as a user meets it: `agentnode-sandbox run --json` of the trivial agent against
    `docker run --rm ... python3 -c 'import grpc'` (the docker CLI floor), interleaved; then, a quarter as
    often, a new interpreter doing only the command's imports, one doing only those made before the run's
    container is asked for (host/runtime/headstart.py, else host/runtime/prelaunch.py: the rest overlap the
    engine's work), and one importing only the library any host of this design needs (gRPC); then the same
    command while a `serve` host runs."""
    ours: list[float] = []
    runs: list[float] = []
    floor: list[float] = []
    _cli_run(state, runtime)  # the engine's image and volume caches, the page cache of our modules
    for _ in range(reps):
        floor.append(cli_floor(state, runtime))
        wall, duration, _ = _cli_run(state, runtime)
        ours.append(wall)
        runs.append(duration)
    quarter = max(1, math.ceil(reps / 4))
    imports = [_cli_imports() for _ in range(quarter)]
    libraries = [_cli_imports("grpc") for _ in range(quarter)]
    early = [_cli_imports(_early_modules()) for _ in range(quarter)] if _has_prelaunch() else []
    served, served_floor = _cli_served(state, runtime, reps)
    return {
        "process_ms": summary(ours),
        "docker_cli_ms": summary(floor),
        "ratio": ratio(med(summary(ours)), med(summary(floor))),
        "run_duration_ms": summary(runs),
        "imports_ms": summary(imports),
        "library_imports_ms": summary(libraries),
        "prelaunch_imports_ms": summary(early),
        "served_process_ms": summary(served),
        "served_docker_cli_ms": summary(served_floor),
        "served_ratio": ratio(med(summary(served)), med(summary(served_floor))) if served else None,
    }


__all__ = ["cli"]
