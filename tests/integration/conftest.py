"""Integration fixtures: the real engine, the real pinned image, isolated host state, tracked containers."""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host._config import load_config
from host._engine import LABEL_OWNER, connect, owner_token
from host._errors import SandboxError
from host._image import build_image
from host._packs import LockEntry, install_pack
from host._runner import SandboxHost
from tests.conftest import REQUIRE_DOCKER

REPO = Path(__file__).resolve().parents[2]


def runsc_available(client: docker.DockerClient) -> bool:
    return "runsc" in (client.info().get("Runtimes") or {})


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = connect()
    except SandboxError as exc:
        message = f"no Docker engine: {exc.message} ({exc.hint})"
        if REQUIRE_DOCKER:
            pytest.fail(message)
        pytest.skip(message)
    yield client
    client.close()


@pytest.fixture(scope="session")
def pinned_image(docker_client: docker.DockerClient) -> str:
    return build_image(docker_client, repo_root=REPO, progress=lambda _line: None).image_id


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str:
    name = str(request.param)
    if name == "runsc" and not runsc_available(docker_client):
        message = "runsc is not registered with the engine (scripts/provision-engine registers it)"
        if REQUIRE_DOCKER:
            pytest.fail(message)
        pytest.skip(message)
    return name


@pytest.fixture(autouse=True)
def _no_leftover_containers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every container this test process created is gone after each test; a leftover fails the test."""
    yield
    if "docker_client" not in request.fixturenames:
        return
    client: docker.DockerClient = request.getfixturevalue("docker_client")
    # The low-level listing: no per-container inspect that could race with a removal in progress.
    leftovers = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner_token()}"})
    for c in leftovers:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(c["Id"], force=True)
    assert not leftovers, f"containers left behind: {[c['Names'] for c in leftovers]}"


class HostState:
    """An isolated host: its own config dir, lockfile, audit log and environment."""

    def __init__(self, root: Path, image: str, client: docker.DockerClient) -> None:
        self.root = root
        self.dir = root / "agentnode"
        self.dir.mkdir(parents=True)
        self.image = image
        self.client = client
        self.env: dict[str, str] = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "AGENTNODE_CONFIG": str(self.dir),
            "AGENTNODE_AGENT_SANDBOX": "1",
        }
        self.write_config({})

    def write_config(self, agent_sandbox: dict[str, Any]) -> None:
        section = {"image": self.image, **agent_sandbox}
        (self.dir / "config.json").write_text(json.dumps({"agent_sandbox": section}))

    def install(self, pack: Path, trust: str = "unverified") -> LockEntry:
        cfg = load_config(self.env)
        return install_pack(
            pack, trust=trust, paths=cfg.paths, client=self.client, image=cfg.agent_sandbox.image
        )

    def host(self, **kwargs: Any) -> SandboxHost:
        return SandboxHost(env=self.env, client_factory=lambda: self.client, **kwargs)

    def audit(self) -> list[dict[str, Any]]:
        """The runs' end records (`agent_run`), oldest first; `audit_all` includes the start records."""
        return [r for r in self.audit_all() if r.get("event") == "agent_run"]

    def audit_all(self) -> list[dict[str, Any]]:
        path = self.dir / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def host_state(tmp_path: Path, pinned_image: str, docker_client: docker.DockerClient) -> HostState:
    return HostState(tmp_path, pinned_image, docker_client)


@pytest.fixture
def make_agent(tmp_path: Path) -> Callable[..., Path]:
    """Write an agent pack from source text; returns its directory."""

    def make(slug: str, source: str, *, entrypoint: str = "agent:run", extra: str = "") -> Path:
        d = tmp_path / "packs" / slug
        d.mkdir(parents=True)
        module = entrypoint.split(":", maxsplit=1)[0]
        (d / f"{module}.py").write_text(textwrap.dedent(source))
        (d / "agentnode.yaml").write_text(
            f'package_id: {slug}\nversion: "1.0.0"\npackage_type: agent\n'
            f'agent:\n  entrypoint: "{entrypoint}"\n  goal: probe\n'
            + textwrap.indent(textwrap.dedent(extra), "  ")
        )
        return d

    return make
