"""Engine access without a daemon: both clients (the host's own and the SDK's) against a real (tiny) HTTP
server on a Unix socket: connect, engine_facts, pooled connections, followed logs, the runtime check;
and the owner tokens the sweep decides by."""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.core.errors import AuditReason, EngineError
from host.core.owner import owner_alive, owner_token
from host.engine.engine import ENGINE_SHARED_POOL_SIZE, follow_logs, open_engine, verify_runtime
from host.engine.facts import EngineFacts, EngineKind, engine_facts, require_capable
from host.engine.http import IDLE_CONNECTIONS, EngineApiError
from host.engine.sdk import connect
from tests.support.fake_engine import FakeEngine
from tests.unit.engine._support import DOCKERD_INFO, PODMAN_INFO, PODMAN_VERSION

# --- connect / engine_facts against a real HTTP server on a Unix socket -------------------------------------


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with FakeEngine(
        info={"ServerVersion": "27.1", "Runtimes": {"runc": {}, "runsc": {}}, "MemoryLimit": True}
    ) as fake:
        yield fake


CONNECTS = pytest.mark.parametrize("opener", [open_engine, connect], ids=["engine_client", "sdk"])
"""Both ways to reach the engine: the host's own client (the run path) and the SDK's (volumes, images)."""


@CONNECTS
def test_either_client_negotiates_with_one_unversioned_ping(engine: FakeEngine, opener: Any) -> None:
    opener({"DOCKER_HOST": engine.docker_host}).close()
    assert engine.raw_paths == ["/_ping"]


def test_connect_pings_the_engine_named_by_docker_host(engine: FakeEngine) -> None:
    client = open_engine({"DOCKER_HOST": engine.docker_host})
    try:
        # The API version is negotiated as `docker` does it: one unversioned /_ping names the server's.
        assert engine.raw_paths == ["/_ping"]
        facts = engine_facts(client)
    finally:
        client.close()
    assert facts == EngineFacts("27.1", frozenset({"runc", "runsc"}), memory_limit=True, swap_limit=False)


@CONNECTS
def test_connect_ignores_the_process_environment(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, opener: Any
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    opener({"DOCKER_HOST": engine.docker_host}).close()
    assert engine.paths


@CONNECTS
def test_connect_to_a_missing_socket_is_engine_unavailable(opener: Any) -> None:
    with pytest.raises(EngineError) as info:
        opener({"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, timeout=5)
    assert info.value.reason is AuditReason.ENGINE_UNAVAILABLE
    assert info.value.__cause__ is None and info.value.__suppress_context__


@CONNECTS
def test_connect_to_a_dead_socket_is_engine_unavailable(tmp_path: Path, opener: Any) -> None:
    d = tempfile.mkdtemp(dir="/tmp")
    try:
        path = f"{d}/dead.sock"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        sock.close()  # the file stays; nobody listens
        with pytest.raises(EngineError) as info:
            opener({"DOCKER_HOST": f"unix://{path}"}, timeout=5)
    finally:
        shutil.rmtree(d)
    assert info.value.reason is AuditReason.ENGINE_UNAVAILABLE


@CONNECTS
@pytest.mark.parametrize("status", [401, 403])
def test_connect_refused_by_the_engine_is_permission_denied(status: int, opener: Any) -> None:
    with FakeEngine(status=status) as fake, pytest.raises(EngineError) as info:
        opener({"DOCKER_HOST": fake.docker_host}, timeout=5)
    assert info.value.reason is AuditReason.ENGINE_PERMISSION_DENIED
    assert "authorization denied" not in info.value.message  # the engine's text never crosses


def test_engine_facts_classifies_a_failing_engine(engine: FakeEngine) -> None:
    client = open_engine({"DOCKER_HOST": engine.docker_host})
    try:
        engine.status = 500
        with pytest.raises(EngineError) as info:
            engine_facts(client)
    finally:
        client.close()
    assert info.value.reason is AuditReason.ENGINE_UNAVAILABLE


def test_engine_facts_tolerates_missing_fields(engine: FakeEngine) -> None:
    engine.info = {"Runtimes": None}
    client = open_engine({"DOCKER_HOST": engine.docker_host})
    try:
        facts = engine_facts(client)
    finally:
        client.close()
    assert facts == EngineFacts("", frozenset(), memory_limit=False, swap_limit=False)
    with pytest.raises(EngineError):
        require_capable(facts, "runc")


def failing_connects_leave_no_open_socket() -> list[str]:
    """Connect failures of every kind, with either client; returns the ResourceWarnings the garbage they
    left produced."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for opener in (connect, open_engine):
            for host in ("unix:///nonexistent/docker.sock", "unix:///"):
                with pytest.raises(EngineError):
                    opener({"DOCKER_HOST": host}, timeout=5)
            for status in (403, 500):
                with FakeEngine(status=status) as fake, pytest.raises(EngineError):
                    opener({"DOCKER_HOST": fake.docker_host}, timeout=5)
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_failed_connects_close_what_they_opened() -> None:
    assert failing_connects_leave_no_open_socket() == []


# --- owner tokens ---------------------------------------------------------------------------------------


def test_owner_token_names_this_process_and_it_is_alive() -> None:
    token = owner_token()
    pid, _, start = token.partition(":")
    assert pid == str(os.getpid()) and start.isdigit() and start != "0"
    assert owner_token(os.getpid()) == token
    assert owner_alive(token)


def test_a_reaped_process_is_not_alive() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        token = owner_token(proc.pid)
        assert owner_alive(token)
    finally:
        proc.kill()
        proc.wait()
    assert not owner_alive(token)


def test_a_reused_pid_is_not_the_owner() -> None:
    pid, _, start = owner_token().partition(":")
    assert not owner_alive(f"{pid}:{int(start) + 1}")


@pytest.mark.parametrize("token", ["", "garbage", ":", "-1:5", "abc:123", "99999999:0", f"{os.getpid()}"])
def test_garbage_tokens_are_not_alive(token: str) -> None:
    assert not owner_alive(token)


def test_token_of_a_missing_process_never_matches_a_live_one() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    token = owner_token(proc.pid)
    assert token == f"{proc.pid}:0" and not owner_alive(token)


# --- kept-alive connections, shared and bounded; the followed log stream ------------------------------------


def test_one_connection_serves_requests_for_every_container() -> None:
    """docker-py keys its Unix-socket pools by the whole URL: each container's requests opened a fresh
    connection (and pool). Ours share one pool, so consecutive calls about different containers reuse the
    connection the first one opened; and no request reads proxy settings from the environment."""
    with FakeEngine() as engine:
        client = connect({"DOCKER_HOST": engine.docker_host})
        try:
            opened = None
            for n in range(6):
                with pytest.raises(docker.errors.NotFound):
                    client.api.inspect_container(f"{n:064x}")
                opened = opened or engine.connections
            assert engine.paths[-6:] == [f"/containers/{n:064x}/json" for n in range(6)]
            assert engine.connections == opened
            assert client.api.trust_env is False
        finally:
            client.close()


def test_the_host_client_reuses_one_connection_for_consecutive_calls() -> None:
    with FakeEngine() as engine:
        client = open_engine({"DOCKER_HOST": engine.docker_host})
        try:
            for n in range(6):
                with pytest.raises(EngineApiError) as info:
                    client.inspect_container(f"{n:064x}")
                assert info.value.status == 404
            assert engine.paths[-6:] == [f"/containers/{n:064x}/json" for n in range(6)]
            assert engine.connections == 1  # the ping's connection served every call
        finally:
            client.close()


def test_the_host_client_keeps_a_bounded_number_of_idle_connections() -> None:
    """A burst of runs needs more connections than are worth keeping: the client keeps IDLE_CONNECTIONS and
    closes the rest as they come back; closing the client closes the kept ones."""

    class Conn:
        closed = False

        def close(self) -> None:
            self.closed = True

    with FakeEngine() as engine:
        client = open_engine({"DOCKER_HOST": engine.docker_host})
        client.close()
        client._closed = False  # reopened, empty: the burst's connections come back to it
        returned = [Conn() for _ in range(IDLE_CONNECTIONS + 5)]
        for conn in returned:
            client._give_back(conn)  # type: ignore[arg-type]
        assert len(client._idle) == IDLE_CONNECTIONS and sum(c.closed for c in returned) == 5
        client.close()
    assert client._idle == [] and all(c.closed for c in returned)


def test_a_kept_connection_the_engine_closed_is_replaced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine may close a kept-alive connection while it sits idle: the next request opens a new one."""
    with FakeEngine() as engine:
        client = open_engine({"DOCKER_HOST": engine.docker_host})
        try:
            stale = client._idle[-1]
            assert stale.sock is not None
            stale.sock.shutdown(socket.SHUT_RDWR)  # as if the engine had closed it
            assert client.ping()
            assert engine.connections == 2
        finally:
            client.close()


def _frame(stream: int, data: bytes) -> bytes:
    """One frame of the engine's multiplexed log stream: stream (1 stdout, 2 stderr), size, payload."""
    return struct.pack(">BxxxL", stream, len(data)) + data


def test_a_followed_log_yields_both_streams_whatever_the_chunking() -> None:
    """The engine's frames arrive cut anywhere (inside a header, inside a payload): the output comes back
    whole and in order, stdout and stderr alike, and the stream ends with the answer."""
    body = _frame(1, b"hello ") + _frame(2, b"warn\n") + _frame(1, b"x" * 70_000) + _frame(1, b"end\n")
    cuts = [0, 3, 9, 20, 30, 50_000, len(body)]
    chunks = [body[a:b] for a, b in itertools.pairwise(cuts)]
    with FakeEngine(log_chunks=chunks) as engine:
        client = open_engine({"DOCKER_HOST": engine.docker_host})
        try:
            frames = list(follow_logs(client, "c" * 64))
        finally:
            client.close()
        assert engine.paths[-1] == f"/containers/{'c' * 64}/logs"
    assert b"".join(chunk for _, chunk in frames) == b"hello warn\n" + b"x" * 70_000 + b"end\n"
    assert b"".join(chunk for stream, chunk in frames if stream == 2) == b"warn\n"


def test_the_engine_pool_keeps_a_bounded_number_of_idle_connections(caplog: pytest.LogCaptureFixture) -> None:
    """A burst of runs needs more connections than are worth keeping: the pool keeps
    ENGINE_SHARED_POOL_SIZE idle and closes the rest as they come back, without a warning for each."""

    class Conn:
        closed = False

        def close(self) -> None:
            self.closed = True

    with FakeEngine() as engine:
        client = connect({"DOCKER_HOST": engine.docker_host})
        try:
            pool = client.api.get_adapter("http+docker://localhost").get_connection("http+docker://x/y")
            # every slot taken, as by as many concurrent requests (the ping's connection among them)
            taken = [pool._get_conn() for _ in range(ENGINE_SHARED_POOL_SIZE)]
            returned = [Conn() for _ in range(ENGINE_SHARED_POOL_SIZE + 5)]
            with caplog.at_level("DEBUG"):
                for conn in returned:
                    pool._put_conn(conn)
        finally:
            for conn in taken:
                conn.close()
            client.close()
    assert sum(c.closed for c in returned) >= 5
    assert pool.pool is None or pool.pool.qsize() <= ENGINE_SHARED_POOL_SIZE
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


# --- verify_runtime -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("used", ["runc", "crun"])
def test_a_container_under_another_runtime_than_asked_is_refused(used: str) -> None:
    """Podman's compatible API ignores the requested runtime: the created container's own is checked."""
    with FakeEngine(info=PODMAN_INFO, version=PODMAN_VERSION, oci_runtime=used) as fake:
        client = open_engine({"DOCKER_HOST": fake.docker_host})
        try:
            if used == "runc":
                verify_runtime(client, "c" * 64, "runc", EngineKind.PODMAN)
            else:
                with pytest.raises(EngineError) as caught:
                    verify_runtime(client, "c" * 64, "runc", EngineKind.PODMAN)
                assert caught.value.reason is AuditReason.RUNTIME_NOT_REGISTERED
                assert "'crun'" in caught.value.message and "containers.conf" in caught.value.hint
        finally:
            client.close()
        assert f"/v4.0.0/libpod/containers/{'c' * 64}/json" in fake.paths


def test_dockerd_runs_what_it_is_asked_so_nothing_is_inspected() -> None:
    with FakeEngine(info=DOCKERD_INFO) as fake:
        client = open_engine({"DOCKER_HOST": fake.docker_host})
        try:
            before = list(fake.paths)
            verify_runtime(client, "c" * 64, "runsc", EngineKind.DOCKER)
        finally:
            client.close()
        assert fake.paths == before
