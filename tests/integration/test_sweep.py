"""The startup sweep: what a crashed host left (by our exact labels and owner) goes; nothing else does."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from host.core.owner import owner_alive, owner_token
from host.engine.labels import LABEL_OWNER, LABEL_RUN, LABEL_SLUG
from host.runtime.rundir import make_run_dir
from host.runtime.runner import SandboxHost
from tests.support.host_state import HostState

pytestmark = [pytest.mark.docker, pytest.mark.podman]


def dead_owner() -> str:
    """The owner token of a host process that has exited (spawned, killed and reaped here)."""
    proc = subprocess.Popen(["sleep", "60"])
    token = owner_token(proc.pid)
    proc.kill()
    proc.wait()
    assert not owner_alive(token)
    return token


@pytest.fixture
def made(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Ids of containers a test made; whatever the sweep left is removed afterwards."""
    ids: list[str] = []
    yield ids
    for cid in ids:
        try:
            docker_client.api.remove_container(cid, force=True)
        except docker.errors.NotFound:
            pass


def start(client: docker.DockerClient, image: str, labels: dict[str, str], ids: list[str]) -> str:
    container = client.containers.run(
        image,
        ["-c", "import time; time.sleep(120)"],
        entrypoint=["/usr/bin/python3"],
        name=f"sweep-test-{uuid.uuid4().hex[:12]}",
        detach=True,
        network_mode="none",
        labels=labels,
    )
    ids.append(container.id)
    return str(container.id)


def exists(client: docker.DockerClient, cid: str) -> bool:
    try:
        client.api.inspect_container(cid)
    except docker.errors.NotFound:
        return False
    return True


def test_startup_sweep_removes_only_what_a_dead_host_left(
    host_state: HostState, docker_client: docker.DockerClient, made: list[str], tmp_path: Path
) -> None:
    host_state.env["AGENTNODE_RUN_DIR"] = str(tmp_path / "runs")  # our own root: other hosts' runs are theirs
    dead = dead_owner()

    def ours(owner: str) -> dict[str, str]:
        return {LABEL_RUN: uuid.uuid4().hex, LABEL_OWNER: owner, LABEL_SLUG: "sweep-test"}

    crashed = start(docker_client, host_state.image, ours(dead), made)
    stopped = docker_client.containers.create(
        host_state.image, [], entrypoint=["/bin/true"], network_mode="none", labels=ours(dead)
    )  # created, never started: also left over
    made.append(stopped.id)
    live = start(docker_client, host_state.image, ours(owner_token()), made)
    bystander = start(docker_client, host_state.image, {"test": "bystander", LABEL_OWNER: dead}, made)
    unlabelled = start(docker_client, host_state.image, {}, made)
    crashed_dir = make_run_dir("crashed", dead, host_state.env)
    live_dir = make_run_dir("live", owner_token(), host_state.env)

    host = host_state.host()
    try:
        removed = host.startup_sweep()
    finally:
        host.close()

    assert not exists(docker_client, crashed) and not exists(docker_client, stopped.id)
    assert not crashed_dir.path.exists()
    assert "run-crashed" in removed
    for survivor in (live, bystander, unlabelled):
        assert exists(docker_client, survivor)
        assert docker_client.api.inspect_container(survivor)["State"]["Running"] is True
    assert live_dir.path.is_dir()
    live_dir.remove()
    for cid in (live, bystander, unlabelled):
        docker_client.api.remove_container(cid, force=True)


def test_sweep_without_an_engine_still_sweeps_run_dirs(host_state: HostState, tmp_path: Path) -> None:
    env = dict(
        host_state.env,
        AGENTNODE_RUN_DIR=str(tmp_path / "runs"),
        DOCKER_HOST="unix:///nonexistent/docker.sock",
    )
    crashed_dir = make_run_dir("crashed", dead_owner(), env)
    host = SandboxHost(env=env)
    try:
        assert host.startup_sweep() == ["run-crashed"]
    finally:
        host.close()
    assert not crashed_dir.path.exists()
