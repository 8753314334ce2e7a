"""Integration fixtures: the real engine, the real pinned image, isolated host state, tracked containers."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from tests.support.engine import (
    docker_client,
    engine_client,
    engine_kind,
    leftover_containers,
    pinned_image,
    runtime,
)
from tests.support.host_state import HostState
from tests.support.packs import write_agent

# fixtures from tests.support.engine
__all__ = ["docker_client", "engine_client", "engine_kind", "pinned_image", "runtime"]


@pytest.fixture(autouse=True)
def _no_leftover_containers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every container this test process created is gone after each test; a leftover fails the test."""
    yield
    leftovers = leftover_containers(request)
    assert not leftovers, f"containers left behind: {leftovers}"


@pytest.fixture
def host_state(tmp_path: Path, pinned_image: str, docker_client: docker.DockerClient) -> Iterator[HostState]:
    state = HostState(tmp_path, pinned_image, docker_client)
    yield state
    state.remove_volumes()  # the engine would keep every test's pack volumes for good
    state.engine.close()


@pytest.fixture
def make_agent(tmp_path: Path) -> Callable[..., Path]:
    """Write an agent pack from source text; returns its directory."""

    def make(slug: str, source: str, *, entrypoint: str = "agent:run", extra: str = "") -> Path:
        agent = textwrap.indent(textwrap.dedent(extra), "  ")
        return write_agent(tmp_path / "packs", slug, source, entrypoint=entrypoint, agent=agent)

    return make
