"""What several sections measure with: timing, the CLI floor, a hardened container, bare gRPC, serve."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from bench._roots import CODE_ROOT
from bench._state import BENCH_LABEL, BenchState, stop_process
from host.engine.contract import SANDBOX_GID, SANDBOX_UID
from host.engine.labels import LABEL_RUN, LABEL_SLUG
from host.engine.spec import container_spec
from host.runtime.rundir import make_run_dir
from host.runtime.runner import RunResult
from host.runtime.runserver import MAX_MESSAGE_BYTES

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


MS = 1000.0


def since(t: float) -> float:
    return (time.perf_counter() - t) * MS


def timed(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return since(t)


def interleaved(paths: dict[str, Callable[[], float]], *, n: int, warmup: int) -> dict[str, list[float]]:
    """`n` samples of each path (each returns its own ms) after `warmup` rounds, the paths taken in turn
    each round so load drift hits them all alike."""
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for i in range(warmup + n):
        for key, measure in paths.items():
            value = measure()
            if i >= warmup:
                samples[key].append(value)
    return samples


def succeeded(result: RunResult) -> RunResult:
    if not result.success:
        raise RuntimeError(f"bench run failed: {result.error_code}: {result.error}\n{result.logs[-2000:]}")
    return result


def cli_floor(state: BenchState, runtime: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--runtime", runtime, "--label",
         f"{BENCH_LABEL}={state.tag}", "--entrypoint", "/usr/bin/python3", state.image, "-c", "import grpc"],
        check=True, capture_output=True, timeout=300,
    )
    return since(t)


def bench_container(state: BenchState, runtime: str, socket_dir: Path, command: list[str],
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


def bare_server(socket_path: str, service: str, methods: dict[str, grpc.RpcMethodHandler]) -> grpc.Server:
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
        container = bench_container(
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


@contextlib.contextmanager
def serve_running(state: BenchState, runtime: str, *args: str) -> Iterator[None]:
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
        stop_process(served, timeout=300)  # serve drains its runs first
        state.configure(runtime)


def pool_ready(state: BenchState, used: set[str], size: int, timeout: float = 180.0, *,
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


def first_chunk(chunks: Callable[[], Iterable[str | None]]) -> float:
    """Milliseconds until the first non-empty text chunk; the stream is then read to its end."""
    t = time.perf_counter()
    first: float | None = None
    for chunk in chunks():
        if chunk and first is None:
            first = since(t)
    return first if first is not None else since(t)


__all__ = [
    "MS", "RPC_CLIENT", "bare_server", "bench_container", "cli_floor", "first_chunk", "interleaved",
    "pool_ready", "rpc_from_container", "serve_running", "since", "succeeded", "timed",
]
