"""The real Docker engine for the integration and hostile suites: fixtures, runtimes, our containers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import docker
import docker.errors
import pytest

from host.core.errors import SandboxError
from host.core.owner import owner_token
from host.engine.engine import open_engine
from host.engine.errors import container_vanished
from host.engine.facts import EngineKind, engine_facts
from host.engine.http import EngineClient
from host.engine.image import build_image
from host.engine.labels import LABEL_OWNER
from host.engine.sdk import connect
from tests.conftest import REQUIRE_DOCKER
from tests.support.paths import REPO

RUNSC_MISSING = "runsc is not registered with the engine (scripts/provision-engine registers it)"
TEST_RUNTIMES = tuple(
    name for name in os.environ.get("AGENTNODE_TEST_RUNTIMES", "runc,runsc").split(",") if name.strip()
)
"""The runtimes engine tests run under: both on Docker; Podman's pass names the one its default runtime is
(its compatible API cannot pick another: see `host.engine.facts.EngineFacts.runtimes`)."""


def runsc_available(client: docker.DockerClient) -> bool:
    return "runsc" in (client.info().get("Runtimes") or {})


def skip_or_fail(message: str) -> NoReturn:
    """Skip, or fail where Docker tests are required (CI, AGENTNODE_REQUIRE_DOCKER=1)."""
    if REQUIRE_DOCKER:
        pytest.fail(message)
    pytest.skip(message)
    raise AssertionError("unreachable")  # pragma: no cover (skip raises)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = connect()
    except SandboxError as exc:
        skip_or_fail(f"no Docker engine: {exc.message} ({exc.hint})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def engine_client(docker_client: docker.DockerClient) -> Iterator[EngineClient]:
    """The host's own client of the same engine (the run path's: SandboxHost, doctor, the sweep)."""
    client = open_engine()
    yield client
    client.close()


@pytest.fixture(scope="session")
def pinned_image(docker_client: docker.DockerClient) -> str:
    return build_image(docker_client, repo_root=REPO, progress=lambda _line: None).image_id


@pytest.fixture(params=TEST_RUNTIMES)
def runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str:
    name = str(request.param)
    if name == "runsc" and not runsc_available(docker_client):
        skip_or_fail(RUNSC_MISSING)
    return name


@pytest.fixture(scope="session")
def engine_kind(engine_client: EngineClient) -> EngineKind:
    """Which engine the suite runs against (Docker, or Podman's pass)."""
    return engine_facts(engine_client).kind


ENGINE_ENV = {EngineKind.DOCKER: {}, EngineKind.PODMAN: {"container": "podman", "TERM": "xterm"}}
"""What each engine itself adds to every container's environment (Podman: libpod's marker and its default
TERM), with its fixed values: nothing of the host's."""


def containers_with(client: docker.DockerClient, labels: list[str]) -> list[Any]:
    """Containers carrying all `labels`, skipping any removed while being listed (runs end concurrently)."""
    found = []
    for summary in client.api.containers(all=True, filters={"label": labels}):
        try:
            found.append(client.containers.get(summary["Id"]))
        except docker.errors.APIError as exc:
            if not container_vanished(exc):
                raise
    return found


def remove_own_containers(client: docker.DockerClient) -> list[str]:
    """Force-remove every container this test process created; returns their names (none: all clean).

    The low-level listing: no per-container inspect that could race with a removal in progress.
    """
    leftovers = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner_token()}"})
    for c in leftovers:
        try:
            client.api.remove_container(c["Id"], force=True)
        except docker.errors.APIError as exc:
            if not container_vanished(exc):
                raise
    return [name.lstrip("/") for c in leftovers for name in c.get("Names") or [c["Id"][:12]]]


def leftover_containers(request: pytest.FixtureRequest) -> list[str]:
    """For a finalizer: what a test that used the engine left behind, removed (empty without the engine)."""
    if "docker_client" not in request.fixturenames:
        return []
    return remove_own_containers(request.getfixturevalue("docker_client"))
