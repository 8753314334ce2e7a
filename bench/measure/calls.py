"""The calls section: a tool call from inside the sandbox against the floors of its transport."""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from bench._plan import CALL_ROUNDS
from bench._state import BenchState
from bench._stats import med, ratio, summary
from bench.measure.shared import (
    bare_server,
    bench_container,
    interleaved,
    rpc_from_container,
    succeeded,
    timed,
)
from host.engine.contract import SANDBOX_GID, SANDBOX_UID
from host.llm.broker import LlmBroker
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.rundir import make_run_dir
from host.runtime.runner import SandboxHost
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession, RunTask
from host.runtime.wiring import lookup_toolpack
from host.spec.config import LlmHostConfig
from host.tools import workers as _workers
from host.tools.calls import InstalledToolpack, ResolvedTool, ToolOutcome, resolve_tool
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner
from sandbox_wrapper import PROTOCOL_VERSION

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


def _echo_server(socket_path: str) -> grpc.Server:
    """A bare echo: the floor of any unary call on a per-run socket."""
    return bare_server(socket_path, "bench.Echo",
                       {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _ctx: request)})


WORKER_RELAY_CALL = "/bench.WorkerRelay/Call"


def _worker_relay_server(worker: Any, line: bytes) -> Callable[[str], grpc.Server]:
    """A bare server whose handler makes one round trip to a tool worker process (the same no-op tool,
    the same pipe protocol) and answers empty: from the sandbox, the floor of any design that runs a
    trusted tool in a worker process behind a per-run socket, with none of the servicer, gate or pool.
    The worker waits idle between calls as it does in a run, so its wake-up is in the floor, which a hot
    loop of worker round trips alone leaves out."""

    def build(socket_path: str) -> grpc.Server:
        return bare_server(socket_path, "bench.WorkerRelay", {
            "Call": grpc.unary_unary_rpc_method_handler(
                lambda _request, _ctx: (worker.call(line, 60), b"")[1]),
        })

    return build


def _worker_relay(state: BenchState, runtime: str, pack: InstalledToolpack, n: int,
                  warmup: int) -> list[float]:
    """Time the worker relay floor from inside a sandbox (see _worker_relay_server)."""
    tool = resolve_tool(pack.slug, pack.manifest, "noop")
    line = (json.dumps({"entrypoint": tool.entrypoint, "fallback": tool.fallback, "arguments": {}}) + "\n")
    worker = _workers._Worker(pack.root, pack.interpreter)
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
        container = bench_container(
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
        "gate_ms": lambda: timed(lambda: as_run.call(state.tools, "noop", "{}")),
        "gate_cached_lookup_ms": lambda: timed(lambda: cached.call(state.tools, "noop", "{}")),
        "worker_ms": lambda: timed(lambda: runner.run(pack, tool, {}, timeout=60)),
    }
    try:
        samples = interleaved(paths, n=n, warmup=warmup)
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
            result = succeeded(run_host.run(state.tool_caller, runtime=runtime,
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


__all__ = ["calls", "stdio"]
