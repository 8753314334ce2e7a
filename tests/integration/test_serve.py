"""The long-running host: single-use warm pools, cancellation, sweeping after a crash, owner-only socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from host.aio import AsyncRunnerClient, CallerInfo
from host.api.client import RunnerClient
from host.api.events import RunFinished, RunLog, RunStarted
from host.api.server import serve
from host.cli.doctor import leftover_check
from host.engine.http import EngineClient
from host.engine.labels import LABEL_OWNER, LABEL_RUN
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = [pytest.mark.docker, pytest.mark.podman]


class Served:
    """A `serve` loop in a thread of this process, with its admin socket and a persistent client."""

    def __init__(self, state: HostState, warm: list[str], metrics: str | None = None) -> None:
        self.socket = Path(state.root) / "admin.sock"
        self.stop = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=serve,
            args=(self.socket,),
            kwargs={
                "env": state.env,
                "warm": warm,
                "ready": lambda _s: ready.set(),
                "stop": self.stop,
                "drain_seconds": 5.0,
                "metrics_address": metrics,
            },
            daemon=True,
        )
        self.thread.start()
        assert ready.wait(60), "serve did not become ready"
        self.client = RunnerClient(self.socket)

    def close(self) -> None:
        self.client.close()
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()


@pytest.fixture
def served(host_state: HostState, make_agent: Callable[..., Path]) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(warm: list[str], pool_size: int = 2, metrics: str | None = None) -> Served:
        host_state.write_config({"pool": {"size": pool_size, "idle_ttl_seconds": 120}})
        s = Served(host_state, warm, metrics)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def _wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def _labelled(client: docker.DockerClient, label: str) -> list[str]:
    """Container names by label, without the per-container inspect that races with removal."""
    return sorted(
        c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters={"label": label})
    )


def _ours(client: docker.DockerClient, slug: str) -> list[str]:
    return _labelled(client, f"io.agentnode.sandbox.slug={slug}")


def test_warm_runs_never_share_state(
    host_state: HostState,
    make_agent: Callable[..., Path],
    served: Callable[..., Served],
    docker_client: docker.DockerClient,
    engine_client: EngineClient,
) -> None:
    agent = make_agent(
        "stateful",
        """
        import os
        def run(context, **kwargs):
            seen = sorted(os.listdir("/tmp"))
            with open("/tmp/left-by-" + context.run_id, "w") as fh:
                fh.write("x")
            return {"seen": seen, "pid1": open("/proc/1/stat").read().split()[21]}
    """,
    )
    host_state.install(agent)
    s = served(["stateful"], pool_size=2)
    _wait_for(lambda: len(_ours(docker_client, "stateful")) >= 2)
    time.sleep(2)  # let both members reach FetchTask
    assert "2 warm pool member(s)" in leftover_check(engine_client).detail  # doctor counts them
    results = [s.client.submit("stateful") for _ in range(4)]
    assert all(r.success for r in results), [(r.error_code, r.error) for r in results]
    assert sum(r.warm for r in results) >= 2
    assert len({r.run_id for r in results}) == 4
    for r in results:
        assert r.result["seen"] == []  # nothing any earlier run wrote is visible
        # each run's stages are recorded, in the order they happen, on the warm and the cold path
        # (a cold wrapper may fetch before the engine's start call has returned: no order between those)
        path = ["routed", "claimed"] if r.warm else ["routed", "verified"]
        orders = [[*path, "fetched", "agent_done", "done"]]
        orders += [] if r.warm else [[*path, "started", "agent_done", "done"]]
        for order in orders:
            assert set(order) <= set(r.stages), (r.warm, r.stages)
            assert [r.stages[k] for k in order] == sorted(r.stages[k] for k in order), (r.warm, r.stages)
    # every used member is destroyed: none of these run ids has a container any more
    for r in results:
        _wait_for(lambda r=r: not _labelled(docker_client, f"{LABEL_RUN}={r.run_id}"))
    audit = host_state.audit()
    assert [a["run_id"] for a in audit] == [r.run_id for r in results]


def test_cancel_kills_the_run(
    host_state: HostState,
    make_agent: Callable[..., Path],
    served: Callable[..., Served],
    docker_client: docker.DockerClient,
) -> None:
    host_state.install(
        make_agent(
            "sleepy",
            """
        import time
        def run(context, **kwargs):
            time.sleep(60)
    """,
            extra="limits:\n  max_runtime_seconds: 90\n",
        )
    )
    s = served([], pool_size=0)
    events: list[object] = []
    t = threading.Thread(target=lambda: events.extend(s.client.stream("sleepy")))
    t.start()
    _wait_for(lambda: any(isinstance(e, RunStarted) for e in events))
    run_id = next(e.run_id for e in events if isinstance(e, RunStarted))
    _wait_for(lambda: bool(_labelled(docker_client, f"{LABEL_RUN}={run_id}")))
    assert s.client.cancel(run_id) is True
    t.join(timeout=60)
    last = events[-1]
    assert isinstance(last, RunFinished)
    assert last.result.error_code == "cancelled" and last.result.run_id == run_id
    _wait_for(lambda: not _labelled(docker_client, f"{LABEL_RUN}={run_id}"))
    assert s.client.cancel(run_id) is False
    assert host_state.audit()[-1]["reason"] == "cancelled"


def test_killed_serve_is_swept_on_next_start(
    host_state: HostState, make_agent: Callable[..., Path], docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    host_state.install(
        make_agent(
            "warmable",
            """
        def run(context, **kwargs):
            return "ok"
    """,
        )
    )
    host_state.write_config({"pool": {"size": 2}})
    sock = tmp_path / "killed.sock"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from host.api.server import serve
        serve(Path({str(sock)!r}), warm=["warmable"], ready=lambda s: print("READY", flush=True))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, **host_state.env}, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        _wait_for(lambda: len(_ours(docker_client, "warmable")) >= 2)
        orphans = _ours(docker_client, "warmable")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert _ours(docker_client, "warmable") == orphans  # the crash left them behind
    bystander = docker_client.containers.run(
        host_state.image,
        ["-c", "import time; time.sleep(60)"],
        entrypoint=["/usr/bin/python3"],
        detach=True,
        network_mode="none",
        labels={LABEL_OWNER: "1:1"},
    )  # our owner label, but no run id
    try:
        s = Served(host_state, [])
        try:
            assert _ours(docker_client, "warmable") == []
            bystander.reload()
            assert bystander.status == "running"
        finally:
            s.close()
    finally:
        bystander.remove(force=True)


def test_admin_socket_refuses_other_users(host_state: HostState, served: Callable[..., Served]) -> None:
    s = served([], pool_size=0)
    st = s.socket.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
    assert s.socket.parent.stat().st_mode & 0o077 == 0
    probe = textwrap.dedent(f"""
        import os, socket, sys
        os.setgid(65534); os.setuid(65534)
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({str(s.socket)!r})
        except PermissionError:
            sys.exit(13)
        sys.exit(0)
    """)
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 13


def test_sixteen_async_runs_stream_their_logs_before_their_results_and_two_are_cancelled(
    host_state: HostState,
    make_agent: Callable[..., Path],
    served: Callable[..., Served],
    docker_client: docker.DockerClient,
) -> None:
    host_state.install(
        make_agent(
            "chatty",
            """
        import sys, time
        def run(context, n=0, wait=0, **kwargs):
            for i in range(3):
                print(f"run {n} line {i}", flush=True)
            print(f"run {n} \\x1b[31mstderr\\x1b[0m", file=sys.stderr, flush=True)
            time.sleep(wait)
            return {"n": n}
    """,
            extra="limits:\n  max_runtime_seconds: 120\n",
        )
    )
    s = served([], pool_size=0)
    doomed = {3, 11}
    seen: dict[int, list[object]] = {n: [] for n in range(16)}

    async def one(client: AsyncRunnerClient, n: int) -> tuple[int, list[object]]:
        caller = CallerInfo.parse(tenant="acme", request_id=f"req-{n}", labels={"batch": "b1"})
        async for event in client.stream("chatty", kwargs={"n": n, "wait": 90 if n in doomed else 0},
                                         caller=caller):  # fmt: skip
            seen[n].append(event)
        return n, seen[n]

    def sleeping(n: int) -> bool:
        """The run wrote its four lines: its agent is in its long sleep."""
        return sum(isinstance(e, RunLog) for e in seen[n]) == 4

    async def main() -> tuple[list[tuple[int, list[object]]], list[BaseException]]:
        async with AsyncRunnerClient(s.socket) as client:
            tasks = {n: asyncio.create_task(one(client, n)) for n in range(16)}
            deadline = time.monotonic() + 240
            while not all(sleeping(n) for n in doomed):
                assert time.monotonic() < deadline, "the long runs never started"
                await asyncio.sleep(0.1)
            for n in doomed:
                tasks[n].cancel()  # the task's cancellation cancels its run on the host
            done = await asyncio.gather(*tasks.values(), return_exceptions=True)
        finished = [d for d in done if isinstance(d, tuple)]
        errors = [d for d in done if isinstance(d, BaseException)]
        return finished, errors

    finished, errors = asyncio.run(main())
    assert len(errors) == 2 and all(isinstance(e, asyncio.CancelledError) for e in errors)
    assert sorted(n for n, _ in finished) == sorted(set(range(16)) - doomed)
    for n, events in finished:
        kinds = [type(e) for e in events]
        assert kinds.count(RunStarted) == 1 and kinds[-1] is RunFinished, events
        assert kinds.index(RunStarted) < kinds.index(RunLog)  # a line always names a started run
        result = events[-1].result
        assert result.success and result.result == {"n": n}, (result.error_code, result.error)
        lines = [e.text for e in events if isinstance(e, RunLog)]
        assert all(e.run_id == result.run_id for e in events if isinstance(e, RunLog))
        # every line the agent wrote came before its result, as written (the agent's text, unescaped)
        written = [f"run {n} line {i}" for i in range(3)] + [f"run {n} \x1b[31mstderr\x1b[0m"]
        assert sorted(lines) == sorted(written)
    _wait_for(lambda: not _ours(docker_client, "chatty"))
    audit = host_state.audit()
    assert len(audit) == 16
    assert sorted(a["reason"] for a in audit) == ["agent_completed"] * 14 + ["cancelled"] * 2
    by_request = {a["caller"]["request_id"]: a for a in audit}
    assert sorted(by_request) == sorted(f"req-{n}" for n in range(16))
    assert all(a["caller"]["tenant"] == "acme" and a["caller"]["labels"] == {"batch": "b1"} for a in audit)
    assert {by_request[f"req-{n}"]["reason"] for n in doomed} == {"cancelled"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the metrics endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_and_health_agree_with_the_audit_after_runs_of_every_outcome(
    host_state: HostState,
    make_agent: Callable[..., Path],
    served: Callable[..., Served],
    docker_client: docker.DockerClient,
) -> None:
    agents = {
        "fine": "def run(context, **kwargs):\n    return {'ok': True}\n",
        "broken": "def run(context, **kwargs):\n    raise ValueError('no')\n",
        "slow": "import time\ndef run(context, **kwargs):\n    time.sleep(30)\n",
        "sleepy": "import time\ndef run(context, **kwargs):\n    time.sleep(60)\n",
        "tooler": "def run(context, **kwargs):\n    return context.try_tool('absent-pack')\n",
    }
    for slug, source in agents.items():
        extra = "limits:\n  max_runtime_seconds: 2\n" if slug == "slow" else ""
        host_state.install(make_agent(slug, source, extra=extra))
    port = _free_port()
    s = served([], pool_size=0, metrics=f"127.0.0.1:{port}")
    with grpc.insecure_channel(f"unix:{s.socket}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for service in ("", "agentnode.sandbox.v1.RunnerService"):
            answer = check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    for slug in ("fine", "fine", "broken", "slow", "tooler", "not-installed"):
        s.client.submit(slug)
    events: list[object] = []
    t = threading.Thread(target=lambda: events.extend(s.client.stream("sleepy")))
    t.start()
    _wait_for(lambda: any(isinstance(e, RunStarted) for e in events))
    run_id = next(e.run_id for e in events if isinstance(e, RunStarted))
    _wait_for(lambda: bool(_labelled(docker_client, f"{LABEL_RUN}={run_id}")))
    assert s.client.cancel(run_id)
    t.join(timeout=60)

    audit = host_state.audit()
    samples = _scrape(port)
    expected: dict[tuple[str, str, str], int] = {}
    for record in audit:
        key = ("success" if record["action"] == "allow" else "failure", record["reason"], record["source"])
        expected[key] = expected.get(key, 0) + 1
    runs = {
        (dict(labels)["outcome"], dict(labels)["reason"], dict(labels)["mode"]): int(value)
        for (name, labels), value in samples.items()
        if name == "agentnode_runs_total" and value
    }
    assert runs == expected and sum(runs.values()) == 7
    assert {k[1] for k in runs} >= {"agent_completed", "agent_error", "timeout", "not_installed", "cancelled"}
    assert samples[("agentnode_tool_refusals_total", ())] == sum(r["tool_refusals"] for r in audit) >= 1
    assert samples[("agentnode_run_duration_seconds_count", (("mode", "agent_sandbox"),))] == sum(
        r["source"] == "agent_sandbox" for r in audit
    )
    assert samples[("agentnode_active_runs", ())] == 0
    assert samples[("agentnode_run_stage_seconds_count", (("stage", "agent_done"),))] >= 5
    assert samples[("agentnode_run_stage_seconds_count", (("stage", "done"),))] == 7  # every run ends


def _pool_samples(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    return {dict(labels)["pool"]: value for (n, labels), value in samples.items() if n == name}


def test_the_pool_gauges_tell_ready_members_from_starting_ones(
    host_state: HostState,
    make_agent: Callable[..., Path],
    served: Callable[..., Served],
) -> None:
    """`agentnode_warm_pool_ready` counts members whose wrapper waits for a task, which is what makes a
    run warm: an operator (and the benchmark) can wait for it rather than guess from container states."""
    host_state.install(make_agent("gauged", "def run(context, **kwargs):\n    return {'ok': True}\n"))
    port = _free_port()
    s = served(["gauged"], pool_size=2, metrics=f"127.0.0.1:{port}")

    def gauges() -> tuple[dict[str, float], dict[str, float]]:
        samples = _scrape(port)
        return (_pool_samples(samples, "agentnode_warm_pool_members"),
                _pool_samples(samples, "agentnode_warm_pool_ready"))

    _wait_for(lambda: list(gauges()[1].values()) == [2.0], timeout=120)
    members, ready = gauges()
    assert list(members) == list(ready) and all(p.startswith("gauged/") for p in members)
    assert members == ready  # all up: each member counted once as a member, once as ready
    result = s.client.submit("gauged")
    assert result.success and result.warm
    members, ready = gauges()
    assert all(ready[p] <= members[p] <= 2 for p in members)
    samples = _scrape(port)
    assert samples[("agentnode_warm_pool_hits_total", ())] == 1
    _wait_for(lambda: list(gauges()[1].values()) == [2.0], timeout=120)  # the refill becomes ready
