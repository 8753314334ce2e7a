"""The cold section: cold runs against the docker floor, per stage; the boot probe; the teardown steps."""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from bench._state import BENCH_LABEL, BenchState
from bench._stats import med, ratio, summary
from bench.measure.shared import MS, bench_container, cli_floor, since, succeeded, timed
from host.engine.contract import SANDBOX_GID, SANDBOX_UID
from host.engine.engine import remove_and_verify
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.backends.container import Sandbox
from host.runtime.rundir import make_run_dir
from host.runtime.runner import RunResult, SandboxHost
from host.runtime.session import RunSession, RunTask
from host.tools.gate import ToolGate


def _floor_sdk(state: BenchState, runtime: str) -> dict[str, float]:
    """`containers.run(..., remove=True)` step by step (create, start, wait, remove; no log fetch)."""
    t = time.perf_counter()
    container = state.client.containers.create(
        state.image, ["-c", "import grpc"], entrypoint=["/usr/bin/python3"], network_mode="none",
        runtime=runtime, labels={BENCH_LABEL: state.tag},
    )
    created = since(t)
    container.start()
    started = since(t)
    status = container.wait(timeout=300)
    exited = since(t)
    container.remove()
    if status.get("StatusCode") != 0:
        raise RuntimeError(f"the floor container failed: {status}")
    return {"create": created, "start": started - created, "run": exited - started,
            "remove": since(t) - exited, "total": since(t)}


def _stages(result: RunResult, wall0: float) -> dict[str, float]:
    """Per-stage durations (ms) of one cold run; the agent's wall-clock mark splits boot from report."""
    s = result.stages
    launch = s["verified"]  # the sandbox's own marks count from its launch, which follows verification
    entered = (result.result["entered"] - wall0) * MS
    out = {
        "route": s["routed"],
        "verify": s["verified"] - s["routed"],
        "socket": s["sandbox_socket_ready"],
        "create": s["sandbox_created"] - s["sandbox_socket_ready"],
        # docker start, plus starting the exit watcher and log drain threads
        "start": s["started"] - launch - s["sandbox_created"],
        "boot": entered - s["started"],
        "report": s["agent_done"] - entered,
        "teardown": s["teardown"] - s["agent_done"],
        "audit": s["done"] - s["teardown"],
        "total": s["done"],
        "to_result": s["done"] - (s["teardown"] - s["agent_done"]),
    }
    if result.result.get("age") is not None:
        out["python"] = result.result["age"] * MS
    return out


def _teardown_steps(state: BenchState, host: SandboxHost, runtime: str, *,
                    wait_exit: bool) -> dict[str, float]:
    """A real sandbox runs the trivial agent; then Sandbox.destroy's steps, timed one by one, either at
    once or after waiting for the wrapper to exit by itself (it does right after reporting)."""
    entry = host.lockfile.get(state.trivial)
    assert entry is not None
    policy = RunPolicy(allowed_packages=(), max_tool_calls=1, max_runtime_seconds=60, max_iterations=1,
                       llm=LlmPolicy(), clamped=())
    gate = ToolGate(allowed_packages=(), max_tool_calls=1, lookup=lambda _slug: None, runner=host.tool_runner,
                    deadline=time.monotonic() + 60)
    run_id = uuid.uuid4().hex
    session = RunSession(task=RunTask(run_id=run_id, entrypoint="agent:run", goal="", kwargs_json="{}",
                                      policy=policy, system_prompt=""),
                         tools=gate, llm=host.broker.session(LlmPolicy()))
    box = Sandbox.launch(host.client(), host.docker.spec_for(entry, runtime), run_id=run_id, owner=host.owner,
                         env=state.env, session=session)
    out: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while session.outcome is None and not box.exited and time.monotonic() < deadline:
            session.reported.wait(0.01)
        t = time.perf_counter()
        while wait_exit and not box.exited and time.monotonic() < deadline:
            time.sleep(0.001)
        out["exit_wait"] = since(t)
        session.cancel()
        server = box.server
        assert server is not None  # a sandbox always serves its socket
        out["server_stop"] = timed(lambda: server.stop(grace=None))
        cid = box.container_id or box.name
        out["remove_verify"] = timed(lambda: remove_and_verify(host.client(), cid, box.name))
        out["rundir"] = timed(box.rundir.remove)
        out["total"] = since(t)
    finally:
        box.destroy()  # a no-op for what is already gone
    return out


BOOT_PROBE = """
import json, os, time
t0 = time.perf_counter()
with open("/proc/self/stat") as fh:
    start = int(fh.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as fh:
    age = float(fh.read().split()[0]) - start / os.sysconf("SC_CLK_TCK")
import grpc
t1 = time.perf_counter()
import sandbox_wrapper._runner
t2 = time.perf_counter()
print(json.dumps({"interpreter": age * 1000, "import_grpc": (t1 - t0) * 1000,
                  "import_wrapper": (t2 - t1) * 1000}))
"""


def _boot_probe(state: BenchState, runtime: str) -> dict[str, float]:
    """Where the wrapper's boot goes, in a container hardened like a run's: the interpreter's start-up
    (process age at the first line, 10 ms resolution), `import grpc`, then the wrapper's own imports."""
    rundir = make_run_dir(uuid.uuid4().hex, state.owner, state.env)
    container = None
    try:
        rundir.grant(SANDBOX_UID, SANDBOX_GID)
        command = ["/usr/bin/python3", "-s", "-c", BOOT_PROBE]
        container = bench_container(state, runtime, rundir.path, command)
        container.start()
        container.wait(timeout=120)
        logs = container.logs().decode("utf-8", "replace").strip().splitlines()
        return {k: float(v) for k, v in json.loads(logs[-1]).items()}
    finally:
        if container is not None:
            container.remove(force=True)
        rundir.remove()


def cold(state: BenchState, runtime: str, reps: int) -> dict[str, Any]:
    """Cold runs and both floors, interleaved so load drift hits all three alike; then the boot probe and
    the teardown steps, a quarter as often (at least once)."""
    host = SandboxHost(env=state.env)
    runs: list[float] = []
    cli: list[float] = []
    sdk: dict[str, list[float]] = {}
    stages: dict[str, list[float]] = {}
    try:
        succeeded(host.run(state.trivial, runtime=runtime))  # warm the image cache and the host's clients
        _floor_sdk(state, runtime)
        for _ in range(reps):
            for key, value in _floor_sdk(state, runtime).items():
                sdk.setdefault(key, []).append(value)
            cli.append(cli_floor(state, runtime))
            wall0 = time.time()
            t = time.perf_counter()
            result = succeeded(host.run(state.trivial, runtime=runtime))
            runs.append(since(t))
            for key, value in _stages(result, wall0).items():
                stages.setdefault(key, []).append(value)
    finally:
        host.close()
    aside = max(1, math.ceil(reps / 4))
    boots = [_boot_probe(state, runtime) for _ in range(aside)]
    host = SandboxHost(env=state.env)
    try:
        steps = {mode: [_teardown_steps(state, host, runtime, wait_exit=mode == "after exit")
                        for _ in range(aside)] for mode in ("at once", "after exit")}
    finally:
        host.close()
    floor_sdk, floor_cli = summary(sdk["total"]), summary(cli)
    floor = min(med(floor_sdk) or float("inf"), med(floor_cli) or float("inf"))
    return {
        "floor_sdk_ms": floor_sdk,
        "floor_cli_ms": floor_cli,
        "floor": "sdk" if floor == med(floor_sdk) else "cli",
        "floor_stages_ms": {k: summary(v) for k, v in sdk.items()},
        "run_ms": summary(runs),
        "ratio": ratio(med(summary(runs)), floor),
        "stages_ms": {k: summary(v) for k, v in stages.items()},
        "boot_probe_ms": {k: summary([b[k] for b in boots]) for k in boots[0]},
        "teardown_steps_ms": {mode: {k: summary([x[k] for x in v]) for k in v[0]}
                              for mode, v in steps.items()},
    }


__all__ = ["cold"]
