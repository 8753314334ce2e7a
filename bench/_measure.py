"""The measurements: cold start against the docker floor, per-call transports, broker latency, warm runs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import socket as socket_module
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench._plan import CALL_ROUNDS
from bench._report import CODE_ROOT, TOOL_SANDBOX_STAGES
from bench._state import BENCH_LABEL, FAKE_KEY, LLM_TOOL_COUNT, BenchState
from bench._stats import med, ratio, summary
from host.aio import AsyncRunnerClient
from host.api.client import RunnerClient
from host.audit.log import AuditLog, run_record
from host.engine.contract import SANDBOX_GID, SANDBOX_UID
from host.engine.engine import LABEL_RUN, LABEL_SLUG, container_spec, remove_and_verify
from host.llm.broker import LlmBroker
from host.llm.toolcalls import LlmCall, ToolCatalog, build_catalog, check_tools, openai_request, prepare
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.backends.container import Sandbox
from host.runtime.pool import PoolSettings
from host.runtime.rundir import make_run_dir
from host.runtime.runner import RunResult, SandboxHost
from host.runtime.session import MAX_MESSAGE_BYTES, RunSession, RunTask, build_run_server
from host.runtime.wiring import lookup_toolpack
from host.spec.config import LlmHostConfig, load_config
from host.tools import gate as _tools
from host.tools.gate import InstalledToolpack, ResolvedTool, ToolGate, ToolOutcome, ToolRunner, resolve_tool
from sandbox_wrapper import PROTOCOL_VERSION

RPC_CLIENT = """
import json, os, sys, time
from sandbox_wrapper._client import open_channel
from sandbox_wrapper._proto.agentnode.sandbox.v1 import tools_pb2
n, warmup = int(sys.argv[1]), int(sys.argv[2])
payload = tools_pb2.RunToolRequest(package_slug=sys.argv[3], tool_name="noop", arguments_json="{}")
payload = payload.SerializeToString()
channel = open_channel(os.environ["AGENTNODE_SOCKET"])
if sys.argv[5:] == ["stream"]:  # time to the first message of a server stream, which is then read out
    stream = channel.unary_stream(sys.argv[4])

    def echo(request, **kwargs):
        t = time.perf_counter()
        answers = stream(request, **kwargs)
        next(answers)
        first = time.perf_counter() - t
        for _ in answers:
            pass
        return first
else:
    unary = channel.unary_unary(sys.argv[4])

    def echo(request, **kwargs):
        t = time.perf_counter()
        unary(request, **kwargs)
        return time.perf_counter() - t
for _ in range(warmup):
    echo(payload, wait_for_ready=True, timeout=60)
ms = [echo(payload) * 1000 for _ in range(n)]
print(json.dumps({"ms": ms}))
"""

STDIO_CLIENT = """
import json, sys, time
n, warmup = int(sys.argv[1]), int(sys.argv[2])
request = json.dumps({"type": "run_tool", "package_slug": sys.argv[3], "tool_name": "noop", "arguments": {}})
ms = []
for i in range(warmup + n):
    t = time.perf_counter()
    sys.stdout.write(request + "\\n")
    sys.stdout.flush()
    json.loads(sys.stdin.readline())
    if i >= warmup:
        ms.append((time.perf_counter() - t) * 1000)
sys.stdout.write(json.dumps({"ms": ms}) + "\\n")
sys.stdout.flush()
"""

_ms = 1000.0


def _since(t: float) -> float:
    return (time.perf_counter() - t) * _ms


def _timed(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return _since(t)


def _interleaved(paths: dict[str, Callable[[], float]], *, n: int, warmup: int) -> dict[str, list[float]]:
    """`n` samples of each path (each returns its own ms) after `warmup` rounds, the paths taken in turn
    each round so load drift hits them all alike."""
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for i in range(warmup + n):
        for key, measure in paths.items():
            value = measure()
            if i >= warmup:
                samples[key].append(value)
    return samples


def _ok(result: RunResult) -> RunResult:
    if not result.success:
        raise RuntimeError(f"bench run failed: {result.error_code}: {result.error}\n{result.logs[-2000:]}")
    return result


# -- cold start ------------------------------------------------------------------------------------


def _floor_sdk(state: BenchState, runtime: str) -> dict[str, float]:
    """`containers.run(..., remove=True)` step by step (create, start, wait, remove; no log fetch)."""
    t = time.perf_counter()
    container = state.client.containers.create(
        state.image, ["-c", "import grpc"], entrypoint=["/usr/bin/python3"], network_mode="none",
        runtime=runtime, labels={BENCH_LABEL: state.tag},
    )
    created = _since(t)
    container.start()
    started = _since(t)
    status = container.wait(timeout=300)
    exited = _since(t)
    container.remove()
    if status.get("StatusCode") != 0:
        raise RuntimeError(f"the floor container failed: {status}")
    return {"create": created, "start": started - created, "run": exited - started,
            "remove": _since(t) - exited, "total": _since(t)}


def _floor_cli(state: BenchState, runtime: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--runtime", runtime, "--label",
         f"{BENCH_LABEL}={state.tag}", "--entrypoint", "/usr/bin/python3", state.image, "-c", "import grpc"],
        check=True, capture_output=True, timeout=300,
    )
    return _since(t)


def _stages(result: RunResult, wall0: float) -> dict[str, float]:
    """Per-stage durations (ms) of one cold run; the agent's wall-clock mark splits boot from report."""
    s = result.stages
    launch = s["verified"]  # the sandbox's own marks count from its launch, which follows verification
    entered = (result.result["entered"] - wall0) * _ms
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
        out["python"] = result.result["age"] * _ms
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
        out["exit_wait"] = _since(t)
        session.cancel()
        server = box.server
        assert server is not None  # a sandbox always serves its socket
        out["server_stop"] = _timed(lambda: server.stop(grace=None))
        cid = box.container_id or box.name
        out["remove_verify"] = _timed(lambda: remove_and_verify(host.client(), cid, box.name))
        out["rundir"] = _timed(box.rundir.remove)
        out["total"] = _since(t)
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
        container = _bench_container(state, runtime, rundir.path, command)
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
        _ok(host.run(state.trivial, runtime=runtime))  # warm the image cache and the host's clients
        _floor_sdk(state, runtime)
        for _ in range(reps):
            for key, value in _floor_sdk(state, runtime).items():
                sdk.setdefault(key, []).append(value)
            cli.append(_floor_cli(state, runtime))
            wall0 = time.time()
            t = time.perf_counter()
            result = _ok(host.run(state.trivial, runtime=runtime))
            runs.append(_since(t))
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


# -- process to process ----------------------------------------------------------------------------


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
    wall = _since(t)
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


def _flat_layout() -> bool:
    """Is the revision measured from before host/ became sub-packages (host/_cli.py, host/_runner.py, ...)?
    A --compare against such a revision names its modules by their old, flat names."""
    return (CODE_ROOT / "host" / "_cli.py").is_file()


def _early_modules() -> str:
    """What the revision measured imports before it asks the engine for the run's container: the head
    start's light modules (host/runtime/headstart.py) where it has one, else the prelaunch's (only flat
    revisions lack a head start)."""
    if not _flat_layout() or (CODE_ROOT / "host" / "_headstart.py").is_file():
        return "host._entry"
    return "host._cli, host._prelaunch"


def _has_prelaunch() -> bool:
    """Does the revision measured start a run's container before its other imports (runtime/prelaunch.py)?"""
    return not _flat_layout() or (CODE_ROOT / "host" / "_prelaunch.py").is_file()


def _cli_imports(modules: str = "") -> float:
    """A new interpreter importing `modules` (by default what `run` imports) and exiting."""
    run_imports = "host._cli, host._runner" if _flat_layout() else "host.cli.main, host.runtime.runner"
    modules = modules or run_imports
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], cwd=CODE_ROOT, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return _since(t)


@contextlib.contextmanager
def _serving(state: BenchState, runtime: str, *args: str) -> Iterator[None]:
    """`serve` with `args` in its own process, as an operator runs it (the clients here never share its
    interpreter; its host package is CODE_ROOT's: under --compare, the revision measured), once ready;
    afterwards SIGTERM (drain, destroy the pool, exit) and the host config back to plain `runtime`."""
    served = subprocess.Popen(
        [sys.executable, "-m", "host", "serve", *args, "--json", "--drain-seconds", "10"],
        cwd=CODE_ROOT, env={**state.env, "PYTHONPATH": str(CODE_ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert served.stdout is not None
        if not served.stdout.readline().startswith("{"):
            raise RuntimeError("serve did not become ready")
        yield
    finally:
        served.terminate()
        try:
            served.wait(timeout=300)
        except subprocess.TimeoutExpired:
            served.kill()
            served.wait()
        if served.stdout is not None:
            served.stdout.close()
        state.configure(runtime)


def _cli_served(state: BenchState, runtime: str, reps: int) -> tuple[list[float], list[float]]:
    """The same command while `serve` runs for the config (its default socket, a pool of one for the trivial
    agent): `run` finds it and submits there. (process ms of each, docker run's interleaved with them);
    nothing when this revision's `run` does not look for a serve host."""
    state.configure(runtime, pool={"size": 1, "idle_ttl_seconds": 3600})
    out: list[float] = []
    floor: list[float] = []
    used: set[str] = set()
    with _serving(state, runtime, "--warm", state.trivial):
        for i in range(reps + 1):
            if i:
                floor.append(_floor_cli(state, runtime))
            _pool_ready(state, used, 1)
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
        floor.append(_floor_cli(state, runtime))
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


# -- per-call transports ---------------------------------------------------------------------------


def _bench_container(state: BenchState, runtime: str, socket_dir: Path, command: list[str],
                     **overrides: Any) -> Any:
    """A container hardened exactly like a run's (same spec function), running `command` (a whole argv,
    split into entrypoint and arguments as the spec splits a run's) instead."""
    run_id = uuid.uuid4().hex
    kwargs = container_spec(
        image=state.image, run_id=run_id, name=f"agentnode-bench-{run_id[:16]}", owner=state.owner,
        slug=state.trivial, runtime=runtime, pack_volume=state.volume, import_root="/pack",
        socket_dir=str(socket_dir),
    )
    kwargs["labels"][BENCH_LABEL] = state.tag
    kwargs.update(entrypoint=command[:1], command=command[1:], **overrides)
    return state.client.containers.create(**kwargs)


def _timings(text: str) -> list[float]:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict) and "ms" in value:
                return [float(x) for x in value["ms"]]
    raise RuntimeError(f"no timings in the container's output: {text[-2000:]}")


def _bare_server(socket_path: str, service: str, methods: dict[str, grpc.RpcMethodHandler]) -> grpc.Server:
    """A bare gRPC server on `socket_path`, configured like the run server (same pool size, message caps,
    concurrency cap), serving `methods` (raw bytes in and out) as `service`."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
        maximum_concurrent_rpcs=64,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
    server.add_insecure_port(f"unix:{socket_path}")
    return server


def _echo_server(socket_path: str) -> grpc.Server:
    """A bare echo: the floor of any unary call on a per-run socket."""
    return _bare_server(socket_path, "bench.Echo",
                        {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _ctx: request)})


RELAY_CALL = "/bench.Relay/Call"
RELAY_STREAM = "/bench.Relay/Stream"


def _relay_server(call: Callable[[], Any],
                  stream: Callable[[], Iterable[str | None]]) -> Callable[[str], grpc.Server]:
    """A bare server whose handlers make the direct SDK call: `Call` waits for
    `call()` and answers empty, `Stream` relays `stream()`'s text chunks as they come. From the sandbox,
    it is the hop of a brokered call, waiting on the provider as that one does, without the broker: a
    handler that waits milliseconds costs more than an echo (the threads on both sides wake from idle)."""

    def build(socket_path: str) -> grpc.Server:
        return _bare_server(socket_path, "bench.Relay", {
            "Call": grpc.unary_unary_rpc_method_handler(lambda _request, _ctx: (call(), b"")[1]),
            "Stream": grpc.unary_stream_rpc_method_handler(
                lambda _request, _ctx: (chunk.encode() for chunk in stream() if chunk)),
        })

    return build


WORKER_RELAY_CALL = "/bench.WorkerRelay/Call"


def _worker_relay_server(worker: Any, line: bytes) -> Callable[[str], grpc.Server]:
    """A bare server whose handler makes one round trip to a tool worker process (the same no-op tool,
    the same pipe protocol) and answers empty: from the sandbox, the floor of any design that runs a
    trusted tool in a worker process behind a per-run socket, with none of the servicer, gate or pool.
    The worker waits idle between calls as it does in a run, so its wake-up is in the floor, which a hot
    loop of worker round trips alone leaves out."""

    def build(socket_path: str) -> grpc.Server:
        return _bare_server(socket_path, "bench.WorkerRelay", {
            "Call": grpc.unary_unary_rpc_method_handler(
                lambda _request, _ctx: (worker.call(line, 60), b"")[1]),
        })

    return build


def _worker_relay(state: BenchState, runtime: str, pack: InstalledToolpack, n: int,
                  warmup: int) -> list[float]:
    """Time the worker relay floor from inside a sandbox (see _worker_relay_server)."""
    tool = resolve_tool(pack.slug, pack.manifest, "noop")
    line = (json.dumps({"entrypoint": tool.entrypoint, "fallback": tool.fallback, "arguments": {}}) + "\n")
    worker = _tools._Worker(pack.root, pack.interpreter)
    try:
        return rpc_from_container(state, runtime, _worker_relay_server(worker, line.encode()),
                                  method=WORKER_RELAY_CALL, n=n, warmup=warmup)
    finally:
        worker.dispose()


class _FreeRunner(ToolRunner):
    """Tools that cost nothing: what remains of a call is gRPC, the servicer and the gate's admission."""

    def run(self, pack: InstalledToolpack, tool: ResolvedTool, arguments: dict[str, Any], *,
            timeout: float) -> ToolOutcome:
        return ToolOutcome(success=True, result={}, error="", mode_used="")


def _servicer_server(pack: InstalledToolpack, runner: ToolRunner) -> Callable[[str], grpc.Server]:
    """The real run server (build_run_server) with a fetched task and a gate with its toolpack looked up
    once, running tools with `runner`."""

    def build(socket_path: str) -> grpc.Server:
        policy = RunPolicy(allowed_packages=(pack.slug,), max_tool_calls=10**6, max_runtime_seconds=3600,
                           max_iterations=10, llm=LlmPolicy(), clamped=())
        gate = ToolGate(allowed_packages=(pack.slug,), max_tool_calls=10**6, lookup=lambda _slug: pack,
                        runner=runner, deadline=time.monotonic() + 3600)
        task = RunTask(run_id="bench", entrypoint="agent:run", goal="", kwargs_json="{}", policy=policy,
                       system_prompt="")
        session = RunSession(task=task, tools=gate, llm=LlmBroker(LlmHostConfig(), {}).session(LlmPolicy()))
        session.fetch(PROTOCOL_VERSION)
        return build_run_server(session, socket_path)

    return build


def rpc_from_container(state: BenchState, runtime: str, serve_on: Callable[[str], grpc.Server], *,
                       method: str, n: int, warmup: int, stream: bool = False) -> list[float]:
    """Time `n` unary calls of `method` (a RunTool request as raw bytes) made from inside a sandbox-like
    container over a per-run bind-mounted socket, against the server `serve_on(socket_path)` builds;
    `stream`: server-streaming calls, timed to their first message."""
    rundir = make_run_dir(uuid.uuid4().hex, state.owner, state.env)
    server = serve_on(str(rundir.socket_path))
    container = None
    try:
        server.start()
        rundir.grant(SANDBOX_UID, SANDBOX_GID)
        container = _bench_container(
            state, runtime, rundir.path,
            ["/usr/bin/python3", "-s", "-c", RPC_CLIENT, str(n), str(warmup), state.tools, method,
             *(["stream"] if stream else [])],
        )
        container.start()
        status = container.wait(timeout=600)
        logs = container.logs().decode("utf-8", "replace")
        if status.get("StatusCode") != 0:
            raise RuntimeError(f"the in-container client failed: {logs[-2000:]}")
        return _timings(logs)
    finally:
        if container is not None:
            container.remove(force=True)
        server.stop(grace=None)
        rundir.remove()


def _frames(sock: Any) -> Iterator[bytes]:
    """The stdout payloads of an attached, non-tty container stream (8-byte multiplexing headers)."""
    buf = b""
    while True:
        while len(buf) < 8 or len(buf) < 8 + struct.unpack(">I", buf[4:8])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return
            buf += chunk
        size = struct.unpack(">I", buf[4:8])[0]
        stream, payload, buf = buf[0], buf[8 : 8 + size], buf[8 + size :]
        if stream == 1:
            yield payload


def stdio(state: BenchState, runtime: str, n: int, warmup: int) -> list[float]:
    """Line-delimited JSON over the container's attached stdin/stdout; the host answers each line."""
    rundir = make_run_dir(uuid.uuid4().hex, state.owner, state.env)
    container = None
    try:
        rundir.grant(SANDBOX_UID, SANDBOX_GID)
        container = _bench_container(
            state, runtime, rundir.path,
            ["/usr/bin/python3", "-s", "-c", STDIO_CLIENT, str(n), str(warmup), state.tools],
            stdin_open=True,
        )
        attached = state.client.api.attach_socket(container.id, params={"stdin": 1, "stdout": 1, "stream": 1})
        sock = attached._sock
        try:
            sock.settimeout(600)
            container.start()
            pending = b""
            for payload in _frames(sock):
                pending += payload
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    message = json.loads(line)
                    if "ms" in message:
                        return [float(x) for x in message["ms"]]
                    sock.sendall((json.dumps({"success": True, "result": {}}) + "\n").encode())
        finally:
            attached.close()
            sock.close()
        raise RuntimeError(f"stdio client ended early: {container.logs().decode('utf-8', 'replace')[-2000:]}")
    finally:
        if container is not None:
            container.remove(force=True)
        rundir.remove()


def _host_tool_path(state: BenchState, n: int, warmup: int) -> dict[str, list[float]]:
    """The host's share of a tool call, split: the gate looking the pack up in the lockfile on every call,
    the gate with the pack looked up once (as every run's gate does: host/runtime/wiring.run_services keeps
    one lookup per tool pack per run), and the worker round trip alone."""
    host = SandboxHost(env=state.env)
    def lookup(slug: str) -> InstalledToolpack | None:  # what a run's gate does once per tool pack
        return lookup_toolpack(host.lockfile, slug)

    pack = lookup(state.tools)
    assert pack is not None
    tool = resolve_tool(pack.slug, pack.manifest, "noop")
    runner = ToolRunner()

    def gate(lookup: Callable[[str], InstalledToolpack | None]) -> ToolGate:
        return ToolGate(allowed_packages=(state.tools,), max_tool_calls=n + warmup, lookup=lookup,
                        runner=runner, deadline=time.monotonic() + 600)

    as_run, cached = gate(lookup), gate(lambda _slug: pack)
    paths: dict[str, Callable[[], float]] = {
        "gate_ms": lambda: _timed(lambda: as_run.call(state.tools, "noop", "{}")),
        "gate_cached_lookup_ms": lambda: _timed(lambda: cached.call(state.tools, "noop", "{}")),
        "worker_ms": lambda: _timed(lambda: runner.run(pack, tool, {}, timeout=60)),
    }
    try:
        samples = _interleaved(paths, n=n, warmup=warmup)
    finally:
        runner.close()
        host.close()
    return samples


def calls(state: BenchState, runtime: str, n: int, warmup: int) -> dict[str, Any]:
    """A tool call from inside the sandbox against a bare gRPC echo and stdio JSON lines, each of them and
    every floor measured in CALL_ROUNDS interleaved rounds (fewer when n is smaller) of n calls in all."""
    host = SandboxHost(env=state.env)
    try:
        pack = lookup_toolpack(host.lockfile, state.tools)
    finally:
        host.close()
    assert pack is not None
    rounds = max(1, min(CALL_ROUNDS, n))
    sizes = [n // rounds + (index < n % rounds) for index in range(rounds)]  # n calls in all
    run_tool = "/agentnode.sandbox.v1.ToolService/RunTool"
    runner = ToolRunner()
    samples: dict[str, list[float]] = {}
    host_side: dict[str, list[float]] = {}

    def tool(each: int) -> None:
        run_host = SandboxHost(env=state.env)
        try:
            result = _ok(run_host.run(state.tool_caller, runtime=runtime,
                                      kwargs={"slug": state.tools, "n": each, "warmup": warmup}))
        finally:
            run_host.close()
        samples.setdefault("tool", []).extend(result.result["ms"])
        samples.setdefault("tool_stub", []).extend(result.result["stub_ms"])

    def rpc(key: str, serve_on: Callable[[str], grpc.Server], method: str) -> Callable[[int], None]:
        return lambda each: samples.setdefault(key, []).extend(
            rpc_from_container(state, runtime, serve_on, method=method, n=each, warmup=warmup))

    def host_path(each: int) -> None:
        for key, values in _host_tool_path(state, each, warmup).items():
            host_side.setdefault(key, []).extend(values)

    steps: list[Callable[[int], None]] = [
        tool,
        rpc("echo", _echo_server, "/bench.Echo/Echo"),
        rpc("free", _servicer_server(pack, _FreeRunner()), run_tool),
        rpc("cached", _servicer_server(pack, runner), run_tool),
        lambda each: samples.setdefault("relayed", []).extend(
            _worker_relay(state, runtime, pack, each, warmup)),
        lambda each: samples.setdefault("line", []).extend(stdio(state, runtime, each, warmup)),
        host_path,
    ]
    try:
        for round_, each in enumerate(sizes):
            for step in steps[round_ % len(steps):] + steps[:round_ % len(steps)]:
                step(each)
    finally:
        runner.close()
    tool_ms, bare, relayed, line = (summary(samples[k]) for k in ("tool", "echo", "relayed", "line"))
    worker_side = {key: summary(values) for key, values in host_side.items()}
    echo, worker = med(bare), med(worker_side["worker_ms"])
    return {
        "tool_ms": tool_ms,
        "tool_stub_ms": summary(samples["tool_stub"]),
        "free_tool_ms": summary(samples["free"]),
        "cached_lookup_tool_ms": summary(samples["cached"]),
        "echo_ms": bare,
        "stdio_ms": line,
        "tool_over_echo": ratio(med(tool_ms), med(bare)),
        "stdio_over_echo": ratio(med(line), med(bare)),
        # the tool call against its floor: the bare transport plus the worker's own round trip
        "tool_over_floor": None if echo is None or worker is None else ratio(med(tool_ms), echo + worker),
        # ... and against the measured floor of the same call with none of our code: a bare server
        # relaying to an idle worker process
        "worker_relay_ms": relayed,
        "tool_over_worker_relay": ratio(med(tool_ms), med(relayed)),
        # that floor against the first one: what waking an idle worker adds to any design
        "worker_relay_over_floor": None if echo is None or worker is None
        else ratio(med(relayed), echo + worker),
        "host_side": worker_side,
    }


# -- tool sandboxes ---------------------------------------------------------------------------------

def tool_sandbox(state: BenchState, runtime: str, n: int, warmup: int) -> dict[str, Any]:
    """The same no-op tool as a trusted pack (host worker) and a community pack (tool sandbox), called
    interleaved by one sandboxed agent, timed inside it; the community pack's first call (which starts its
    tool sandbox) apart, with the host's per-stage view of that start."""
    n, warmup = min(n, 200), min(warmup, 20)  # 2 calls a round within the agent's max_tool_calls (500)
    host = SandboxHost(env=state.env)
    try:
        result = _ok(host.run(state.toolbox_caller, runtime=runtime, kwargs={
            "trusted": state.tools, "community": state.community_tools, "n": n, "warmup": warmup}))
    finally:
        host.close()
    r = result.result
    if r["modes"] != ["host_worker", "tool_sandbox"] or not r["first_ok"]:
        raise RuntimeError(f"the calls did not run where expected: {r['modes']}")
    trusted, community = summary(r["trusted_ms"]), summary(r["community_ms"])
    return {
        "trusted_ms": trusted,
        "community_ms": community,
        "ratio": ratio(med(community), med(trusted)),
        "first_call_ms": round(r["first_ms"], 2),
        "first_start_ms": {k: result.stages.get(f"tool_sandbox_{k}") for k in TOOL_SANDBOX_STAGES},
    }


# -- broker ----------------------------------------------------------------------------------------


def _first_chunk(chunks: Callable[[], Iterable[str | None]]) -> float:
    """Milliseconds until the first non-empty text chunk; the stream is then read to its end."""
    t = time.perf_counter()
    first: float | None = None
    for chunk in chunks():
        if chunk and first is None:
            first = _since(t)
    return first if first is not None else _since(t)


@dataclass(frozen=True)
class _ToolsCall:
    """The broker_tools call: LLM_TOOL_COUNT installed tool definitions and a 2 KiB JSON-schema response
    format, as the broker takes it (`call`) and as the openai SDK sends it (`sent`, what the broker sends)."""

    catalog: ToolCatalog
    schema: dict[str, Any]
    call: LlmCall
    sent: dict[str, Any]
    max_output_chars: int = 24000


def _tools_call(state: BenchState) -> _ToolsCall:
    host = SandboxHost(env=state.env)
    try:
        pack = lookup_toolpack(host.lockfile, state.llm_tools)
    finally:
        host.close()
    assert pack is not None
    catalog = build_catalog([(pack.slug, pack.manifest.tools)])
    if len(catalog.definitions) != LLM_TOOL_COUNT:
        raise RuntimeError(f"{len(catalog.definitions)} tool definitions, not {LLM_TOOL_COUNT}")
    schema = _schema_of_size(2048)
    call = LlmCall(
        messages=[{"role": "system", "content": "You are a bench agent."},
                  {"role": "user", "content": "Look up the records and answer as the schema says."}],
        tools=[d.name for d in catalog.definitions],
        response_format={"type": "json_schema", "name": "bench_answer",
                         "schema": json.dumps(schema, separators=(",", ":"))},
    )
    # What the broker sends (host/llm/broker.py: the adapter's request and its max_tokens for these caps).
    sent = {**openai_request(prepare(call, check_tools(call.tools, catalog))),
            "max_completion_tokens": min(16384, math.ceil(24000 / 3))}
    return _ToolsCall(catalog, schema, call, sent)


BROKER_ROUNDS = 4
"""A repetition's broker samples come in this many rounds, each the direct paths (interleaved) and then one
sandbox run of each kind, so direct and sandbox samples are never taken minutes apart."""


def broker(state: BenchState, runtime: str, n: int, warmup: int) -> dict[str, Any]:
    """CallLlm from the sandbox, the host's LlmSession, and the openai SDK straight to the provider; the
    same from the sandbox for the broker_tools call (8 tools, a 2 KiB schema) against the SDK sending it.

    The `n` samples of each path come in BROKER_ROUNDS rounds (fewer when n is smaller), each the direct
    paths in turn and then one sandbox run of each kind, so load drift reaches both sides of an overhead."""
    import openai  # noqa: PLC0415 (only the broker section needs the SDK)

    llm = LlmBroker(load_config(state.env).agent_sandbox.llm, state.env)
    model = str(llm.describe()["model"])
    rounds = max(1, min(BROKER_ROUNDS, n))
    per_round = -(-n // rounds)
    session = llm.session(LlmPolicy(enabled=True, max_calls=4 * rounds * (per_round + warmup),
                                    max_input_chars=24000, max_output_chars=24000))
    sdk = openai.OpenAI(api_key=FAKE_KEY, base_url=state.provider.base_url, max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": "ping"}]
    tools = _tools_call(state)

    def direct_stream(**request: Any) -> Iterator[str | None]:
        with sdk.chat.completions.create(model=model, **request, stream=True,
                                         stream_options={"include_usage": True}) as chunks:
            yield from (c.choices[0].delta.content for c in chunks if c.choices)

    plain = {"messages": messages, "max_completion_tokens": 100}
    paths: dict[str, Callable[[], float]] = {
        "direct_ms": lambda: _timed(lambda: sdk.chat.completions.create(model=model, **plain)),
        "session_ms": lambda: _timed(lambda: session.call(messages)),
        "direct_first_chunk_ms": lambda: _first_chunk(lambda: direct_stream(**plain)),
        "session_first_chunk_ms": lambda: _first_chunk(
            lambda: (x for x in session.stream(messages) if isinstance(x, str))),
        "direct_tools_ms": lambda: _timed(lambda: sdk.chat.completions.create(model=model, **tools.sent)),
        "direct_tools_first_chunk_ms": lambda: _first_chunk(lambda: direct_stream(**tools.sent)),
    }
    relays = {  # the same direct calls, each behind a bare gRPC hop from the sandbox (_relay_server)
        "relay_ms": (RELAY_CALL, False, plain), "relay_first_chunk_ms": (RELAY_STREAM, True, plain),
        "relay_tools_ms": (RELAY_CALL, False, tools.sent),
        "relay_tools_first_chunk_ms": (RELAY_STREAM, True, tools.sent),
    }
    # what the agent's run reports -> the figure it feeds, for the plain call and the broker_tools call
    inside = {"call_ms": "sandbox_ms", "first_chunk_ms": "sandbox_first_chunk_ms",
              "rpc_floor_ms": "sandbox_rpc_floor_ms"}
    inside_tools = {"call_ms": "sandbox_tools_ms", "first_chunk_ms": "sandbox_tools_first_chunk_ms"}
    samples: dict[str, list[float]] = {
        key: [] for key in [*paths, *inside.values(), *inside_tools.values(), *relays]
    }
    host = SandboxHost(env=state.env)
    try:
        for _ in range(rounds):
            for key, values in _interleaved(paths, n=per_round, warmup=warmup).items():
                samples[key] += values
            kwargs = {"n": per_round, "warmup": warmup}
            for run_kwargs, figures in ((kwargs, inside), ({**kwargs, "schema": tools.schema}, inside_tools)):
                reported = _ok(host.run(state.llm_caller, runtime=runtime, kwargs=run_kwargs)).result
                for key, name in figures.items():
                    samples[name] += reported[key]
            for key, (method, streamed, request) in relays.items():
                relay = _relay_server(functools.partial(sdk.chat.completions.create, model=model, **request),
                                      functools.partial(direct_stream, **request))
                samples[key] += rpc_from_container(state, runtime, relay, method=method, n=per_round,
                                                   warmup=warmup, stream=streamed)
    finally:
        sdk.close()
        host.close()
    out: dict[str, Any] = {"model": model, **{key: summary(v) for key, v in samples.items()}}

    def over(key: str, floor: str) -> float | None:
        a, b = med(out[key]), med(out[floor])
        return None if a is None or b is None else round(a - b, 3)

    out["overhead_ms"] = over("sandbox_ms", "direct_ms")
    out["first_chunk_overhead_ms"] = over("sandbox_first_chunk_ms", "direct_first_chunk_ms")
    out["session_overhead_ms"] = over("session_ms", "direct_ms")
    out["tools_overhead_ms"] = over("sandbox_tools_ms", "direct_tools_ms")
    out["tools_first_chunk_overhead_ms"] = over("sandbox_tools_first_chunk_ms", "direct_tools_first_chunk_ms")
    # The floor of each overhead: the same direct call behind a bare hop from the sandbox (no broker); what
    # that hop costs over the direct call, and what the brokered call costs beyond it (the broker's own).
    for kind in ("", "tools_"):
        for what in ("ms", "first_chunk_ms"):
            relayed, direct, sandbox = f"relay_{kind}{what}", f"direct_{kind}{what}", f"sandbox_{kind}{what}"
            out[f"{relayed}_over_direct"] = over(relayed, direct)
            out[f"{sandbox}_over_relay"] = over(sandbox, relayed)
    hop = med(out["sandbox_rpc_floor_ms"])  # the sandbox-to-host hop alone, measured in the same runs
    for key in ("overhead_ms", "tools_overhead_ms"):
        if out[key] is not None and hop is not None:
            out[key.replace("overhead_ms", "overhead_beyond_hop_ms")] = round(out[key] - hop, 3)
    return out


# -- broker with tools and a schema --------------------------------------------------------------------


def _schema_of_size(size: int) -> dict[str, Any]:
    """An object schema whose compact JSON text is at least `size` bytes: described string fields."""
    schema: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    i = 0
    while len(json.dumps(schema, separators=(",", ":"))) < size:
        schema["properties"][f"field_{i}"] = {"type": "string", "description": f"Part {i} of the answer."}
        schema["required"].append(f"field_{i}")
        i += 1
    return schema


def broker_tools(state: BenchState, n: int, warmup: int) -> dict[str, Any]:
    """The broker's own overhead on the broker_tools call (LLM_TOOL_COUNT installed tool definitions and a
    2 KiB JSON-schema response format), host-side: `LlmSession.call` / `.stream` against the openai SDK
    sending the very request the broker sends to the same fake provider, interleaved; the time to the first
    streamed text chunk likewise. (The `broker` section measures the same call from inside the sandbox.)"""
    import openai  # noqa: PLC0415 (only the broker sections need the SDK)

    tools = _tools_call(state)
    call, catalog, sent = tools.call, tools.catalog, tools.sent
    llm = LlmBroker(load_config(state.env).agent_sandbox.llm, state.env)
    model = str(llm.describe()["model"])
    session = llm.session(LlmPolicy(enabled=True, max_calls=2 * (n + warmup), max_input_chars=64000,
                                    max_output_chars=tools.max_output_chars))
    session.use_tools(lambda: catalog)
    sdk = openai.OpenAI(api_key=FAKE_KEY, base_url=state.provider.base_url, max_retries=0, timeout=60)

    def direct_stream() -> Iterator[str | None]:
        with sdk.chat.completions.create(model=model, **sent, stream=True,
                                         stream_options={"include_usage": True}) as chunks:
            yield from (c.choices[0].delta.content for c in chunks if c.choices)

    def session_call() -> None:
        if not session.call(call).content:
            raise RuntimeError("the broker's completion has no JSON answer")

    paths: dict[str, Callable[[], float]] = {
        "direct_ms": lambda: _timed(lambda: sdk.chat.completions.create(model=model, **sent)),
        "session_ms": lambda: _timed(session_call),
        "direct_first_chunk_ms": lambda: _first_chunk(direct_stream),
        "session_first_chunk_ms": lambda: _first_chunk(
            lambda: (x for x in session.stream(call) if isinstance(x, str))),
    }
    try:
        samples = _interleaved(paths, n=n, warmup=warmup)
    finally:
        sdk.close()
    schema_text = json.dumps(tools.schema, separators=(",", ":"))
    out: dict[str, Any] = {"tools": LLM_TOOL_COUNT, "schema_bytes": len(schema_text),
                           "request_bytes": len(json.dumps(sent, separators=(",", ":"))),
                           **{key: summary(v) for key, v in samples.items()}}
    direct, hosted = med(out["direct_ms"]), med(out["session_ms"])
    first_direct, first_hosted = med(out["direct_first_chunk_ms"]), med(out["session_first_chunk_ms"])
    out["overhead_ms"] = None if direct is None or hosted is None else round(hosted - direct, 3)
    out["first_chunk_overhead_ms"] = (None if first_direct is None or first_hosted is None
                                      else round(first_hosted - first_direct, 3))
    return out


# -- warm pools ------------------------------------------------------------------------------------


def _pool_ready(state: BenchState, used: set[str], size: int, timeout: float = 180.0, *,
                ready: Callable[[], int | None] | None = None) -> bool:
    """Wait until `size` unused members of the trivial agent's pool run (the filler launched them), then,
    given `ready` (how many members' wrappers wait for a task; None when the revision cannot tell), until
    that many are ready: a member still starting would share the machine with the run measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = state.client.api.containers(
            filters={"label": f"{LABEL_SLUG}={state.trivial}", "status": "running"}
        )
        if sum((c.get("Labels") or {}).get(LABEL_RUN) not in used for c in members) >= size:
            break
        time.sleep(0.1)
    else:
        return False
    while ready is not None and time.monotonic() < deadline:
        count = ready()
        if count is None or count >= size:
            return True
        time.sleep(0.02)
    return ready is None


def _scraped_ready(state: BenchState, port: int) -> int | None:
    """serve's agentnode_warm_pool_ready for the trivial agent's pools; None without that gauge."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "agentnode_warm_pool_ready":
            return _trivial_members(state, {s.labels.get("pool", ""): s.value for s in family.samples})
    return None


def _in_process_ready(host: SandboxHost, state: BenchState) -> Callable[[], int | None]:
    """The in-process twin of _scraped_ready (None for a revision without WarmPools.ready_counts)."""

    def count() -> int | None:
        counts = getattr(host.pools, "ready_counts", None)
        return None if counts is None else _trivial_members(state, counts())

    return count


def _trivial_members(state: BenchState, by_pool: Mapping[str, float]) -> int:
    """The trivial agent's share of counts by pool name (`slug/...`, as WarmPools names its pools)."""
    return int(sum(n for pool, n in by_pool.items() if pool.startswith(f"{state.trivial}/")))


def _audit_append(state: BenchState, n: int) -> dict[str, float]:
    """One audit append alone (flock, chained line, fsync, head file rewrite): every run pays it."""
    log = AuditLog(state.root / f"audit-{uuid.uuid4().hex}" / "audit.jsonl")
    log.path.parent.mkdir()
    record = run_record(
        slug=state.trivial, trust="unverified", run_id=uuid.uuid4().hex, action="allow",
        source="agent_sandbox", reason="agent_completed", sandbox=True, runtime="runc", image=state.image,
        duration_ms=20,
        timed_out=False, llm=None, tool_calls=0, tool_refusals=0,
    )
    return summary([_timed(lambda: log.append(record)) for _ in range(n)])


def _filler_probe(state: BenchState, runtime: str, n: int, settle: float) -> dict[str, dict[str, float]]:
    """Warm runs on an in-process host with serve's settings, once with the pool filler refilling while
    each run goes on (what serve does), once with the filler paused: `n` members launched first, then
    the pool's size set to 0 so no launch competes with the runs."""
    out: dict[str, dict[str, float]] = {}
    for mode in ("refilling", "paused"):
        size = 2 if mode == "refilling" else n
        host = SandboxHost(env=state.env, pool=PoolSettings(size=size, idle_ttl_seconds=3600),
                           async_teardown=True)
        used: set[str] = set()
        done: list[float] = []
        try:
            host.prewarm(state.trivial, runtime)
            ready = _in_process_ready(host, state)
            _pool_ready(state, used, size, ready=ready)
            time.sleep(1.0)  # every member reaches FetchTask (a revision that cannot tell)
            if mode == "paused" and host.pools is not None:
                host.pools.settings = PoolSettings(size=0, idle_ttl_seconds=3600)
            for _ in range(n):
                if mode == "refilling":
                    _pool_ready(state, used, size, ready=ready)
                    time.sleep(settle)
                result = _ok(host.run(state.trivial, runtime=runtime))
                used.add(result.run_id)
                if result.warm:
                    done.append(result.stages["done"])
        finally:
            host.close()
        out[mode] = summary(done)
    return out


def warm(state: BenchState, runtime: str, *, reps: int, pool_size: int, settle: float,
         filler: int) -> dict[str, Any]:
    """`serve` with a pool; a persistent client submits one run at a time once the pool is full again,
    alternating the blocking client and host.aio's (same socket, same pool), so their request-to-result
    times are interleaved in one run. Then the filler probe, `filler` runs with the filler on and off.

    Before each run, every member is ready (serve's agentnode_warm_pool_ready gauge; for a revision without
    it, running), then `settle` more seconds pass, so the newest member's start-up has calmed down.
    (The speed-up over a cold run is derived from the cold section afterwards: bench._report.aggregate.)
    """
    state.configure(runtime, pool={"size": pool_size, "idle_ttl_seconds": 3600})
    socket = state.root / "admin.sock"
    with contextlib.closing(socket_module.socket()) as probe:  # a free port for serve's metrics
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server_ms: list[float] = []
    client_ms: list[float] = []
    aio_ms: list[float] = []
    aio_server_ms: list[float] = []
    stages: dict[str, list[float]] = {}
    # The async client lives in a loop that runs all along on its own thread, as in an asyncio service.
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True, name="bench-aio-loop")
    loop_thread.start()

    def in_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=900)

    async def awaited(coro: Any) -> tuple[Any, float]:
        """`coro`'s result and the ms its await took, timed in the loop as the service awaiting it sees it
        (not this thread's hand-off to the loop and back, which no asyncio service pays)."""
        t = time.perf_counter()
        value = await coro
        return value, _since(t)

    warm_runs = 0
    used: set[str] = set()
    with contextlib.ExitStack() as serving:
        serving.callback(loop.close)  # (last: callbacks run in reverse, after serve has stopped)
        serving.callback(loop_thread.join, 30)
        serving.callback(loop.call_soon_threadsafe, loop.stop)
        serving.enter_context(_serving(state, runtime, "--socket", str(socket), "--warm", state.trivial,
                                       "--metrics", f"127.0.0.1:{port}"))
        aclient = AsyncRunnerClient(socket)  # its channel opens in `loop`, on first use
        with RunnerClient(socket) as client:
            for i in range(2 * reps + 2):
                through_aio = i % 2 == 1
                _pool_ready(state, used, pool_size, ready=functools.partial(_scraped_ready, state, port))
                time.sleep(settle)
                if through_aio:
                    result, elapsed = in_loop(awaited(aclient.submit(state.trivial, timeout=600)))
                    result = _ok(result)
                else:
                    t = time.perf_counter()
                    result = _ok(client.submit(state.trivial, timeout=600))
                    elapsed = _since(t)
                used.add(result.run_id)
                if i < 2:
                    continue  # each client's first call also opens its channel
                if through_aio:
                    if result.warm:
                        aio_ms.append(elapsed)
                        aio_server_ms.append(result.stages["done"])
                    continue
                warm_runs += result.warm
                if result.warm:
                    client_ms.append(elapsed)
                    server_ms.append(result.stages["done"])
                    s = result.stages
                    for key, value in (("claim", s["claimed"]), ("handover", s["fetched"] - s["claimed"]),
                                       ("agent", s["agent_done"] - s["fetched"]),
                                       ("finish", s["done"] - s["agent_done"])):
                        stages.setdefault(key, []).append(value)
        in_loop(aclient.close())
    server = summary(server_ms)
    sync_client, aio_client = summary(client_ms), summary(aio_ms)
    # Each client's own share of its runs (client side - server side, run by run): the server's time is the
    # same path for both and its spread (large under runsc) cancels out of the difference of these.
    aio_share = summary([c - s for c, s in zip(aio_ms, aio_server_ms, strict=True)])
    sync_share = summary([c - s for c, s in zip(client_ms, server_ms, strict=True)])
    p50, p95 = med(server), server.get("p95")
    return {
        "pool_size": pool_size,
        "submitted": reps,
        "warm_runs": warm_runs,
        "server_ms": server,
        "client_ms": sync_client,
        "aio_client_ms": aio_client,
        "aio_server_ms": summary(aio_server_ms),
        "aio_over_sync_ms": (None if med(aio_client) is None or med(sync_client) is None
                             else round((med(aio_client) or 0.0) - (med(sync_client) or 0.0), 3)),
        "aio_client_share_ms": aio_share,
        "sync_client_share_ms": sync_share,
        "aio_share_over_sync_ms": (None if med(aio_share) is None or med(sync_share) is None
                                   else round((med(aio_share) or 0.0) - (med(sync_share) or 0.0), 3)),
        "p95_over_p50": ratio(p95, p50),
        "stages_ms": {k: summary(v) for k, v in stages.items()},
        "audit_append_ms": _audit_append(state, max(reps, 5)),
        "filler_probe_ms": _filler_probe(state, runtime, filler, settle),
    }


__all__ = ["broker", "broker_tools", "calls", "cold", "rpc_from_container", "stdio", "warm"]
