"""Every fail-closed case of the sandbox runtime: a fixed reason, a way out, one audit record, nothing ran.

"Nothing ran" is shown three ways: the engine's event stream has no container created for the agent's slug
(for refusals before start), no container with that label is left, and the agent, which writes a marker
file to a host path when imported or run on the host, never did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.engine.contract import ContainerLimits
from host.engine.facts import EngineKind
from host.engine.http import EngineClient
from host.engine.image import LABEL_INPUTS_HASH
from host.engine.labels import LABEL_ARTIFACT, LABEL_SLUG
from host.llm.broker import LlmBroker
from host.llm.session import LlmSession
from host.policy.rules import LlmPolicy
from host.runtime.rundir import run_root
from host.runtime.runner import RunResult, SandboxHost
from host.spec.config import load_config
from host.spec.lockfile import Lockfile
from tests.support.fake_engine import FakeEngine
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = [pytest.mark.docker, pytest.mark.podman]

MARKED_AGENT = """
import os, pathlib

def mark(what):
    try:
        pathlib.Path({marker!r}).write_text(what)  # only possible on the host: the sandbox has no such path
    except OSError:
        pass

mark("imported")

def run(context, **kwargs):
    mark("ran")
    {last}
"""


class Case:
    """One fail-closed scenario: an installed marked agent and the evidence gathered around its run."""

    def __init__(
        self, state: HostState, make_agent: Callable[..., Path], tmp_path: Path, slug: str, last: str
    ) -> None:
        self.state = state
        self.client: docker.DockerClient = state.client
        self.slug = slug
        self.marker = tmp_path / f"{slug}.marker"
        self.pack = make_agent(slug, MARKED_AGENT.format(marker=str(self.marker), last=last))
        self.since = 0.0
        self.until = 0.0

    def install(self) -> Any:
        return self.state.install(self.pack)

    def run(self, host: SandboxHost, **kwargs: Any) -> RunResult:
        assert self.containers() == []
        self.since = time.time()
        try:
            return host.run(self.slug, **kwargs)
        finally:
            self.until = time.time()
            host.close()

    def containers(self) -> list[dict[str, Any]]:
        return list(self.client.api.containers(all=True, filters={"label": f"{LABEL_SLUG}={self.slug}"}))

    def created(self) -> list[dict[str, Any]]:
        """Container create events for this slug during the run, straight from the engine.

        The window starts exactly at the run (same clock): the other runtime's case of the same slug ran
        just before it, and a second of slack counted its container too.
        """
        events = self.client.events(
            since=f"{self.since:.9f}",
            until=f"{self.until + 0.5:.9f}",
            filters={"type": "container", "event": "create", "label": f"{LABEL_SLUG}={self.slug}"},
            decode=True,
        )
        return list(events)

    def assert_fail_closed(
        self, result: RunResult, reason: str, hint: str, *, container_started: bool = False
    ) -> dict[str, Any]:
        assert not result.success, result
        assert result.error_code == reason, (result.error_code, result.error, result.logs)
        assert hint in result.hint, result.hint
        assert result.error and result.result is None
        audit = self.state.audit()
        assert len(audit) == 1, audit
        record = audit[0]
        assert record["event"] == "agent_run" and record["run_id"] == result.run_id
        assert record["reason"] == reason and record["action"] == "deny"
        assert not self.marker.exists(), "the agent ran on the host"
        assert self.containers() == []
        if container_started:
            # The engine may publish the create event a moment after the run has ended: look again briefly.
            created = self.created()
            deadline = time.monotonic() + 3
            while len(created) != 1 and time.monotonic() < deadline:
                time.sleep(0.2)
                created = self.created()
            assert len(created) == 1, created
        else:
            assert self.created() == []
        assert not (run_root(self.state.env) / f"run-{result.run_id}").exists()
        return record


@pytest.fixture
def case(host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path) -> Callable[..., Case]:
    """Make a Case; `last` is the agent's last statement (after it tried to write the marker)."""

    def make(slug: str, last: str = "return 'ran'") -> Case:
        return Case(host_state, make_agent, tmp_path, slug, last)

    return make


class InfoOverride:
    """The real engine client whose `info()` reports a missing capability: the host takes its client
    injected, so this is how an engine without that capability looks to it."""

    def __init__(self, client: EngineClient, change: Callable[[dict[str, Any]], None]) -> None:
        self._client = client
        self._change = change

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self._client.info()
        self._change(info)
        return info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


# --- the engine ------------------------------------------------------------------------------------------


def test_engine_unavailable(case: Callable[..., Case]) -> None:
    c = case("fc-no-engine")
    c.install()
    env = dict(c.state.env, DOCKER_HOST="unix:///nonexistent/docker.sock")
    result = c.run(SandboxHost(env=env))
    record = c.assert_fail_closed(result, "engine_unavailable", "agentnode-sandbox doctor")
    assert record["sandbox"] is True and record["source"] == "agent_sandbox"


def test_engine_permission_denied(case: Callable[..., Case]) -> None:
    c = case("fc-engine-403")
    c.install()
    with FakeEngine(status=403) as engine:
        result = c.run(SandboxHost(env=dict(c.state.env, DOCKER_HOST=engine.docker_host)))
    assert engine.paths  # the host did ask the (refusing) engine
    c.assert_fail_closed(result, "engine_permission_denied", "agentnode-sandbox doctor")


@pytest.mark.parametrize("key", ["MemoryLimit", "SwapLimit"])
def test_memory_ceiling_unsupported(case: Callable[..., Case], key: str, engine_kind: EngineKind) -> None:
    c = case(f"fc-no-{key.lower()}")
    c.install()
    client = InfoOverride(c.state.engine, lambda info: info.update({key: False}))
    result = c.run(_host(c, client))
    check = "docker info --format" if engine_kind is EngineKind.DOCKER else "podman info --format"
    c.assert_fail_closed(result, "memory_limit_unsupported", check)


def _host(c: Case, client: Any) -> SandboxHost:
    return SandboxHost(env=c.state.env, client_factory=lambda: client)


def test_runtime_not_registered(case: Callable[..., Case], engine_kind: EngineKind) -> None:
    c = case("fc-no-runsc")
    c.install()
    client = InfoOverride(c.state.engine, lambda info: (info.get("Runtimes") or {}).pop("runsc", None))
    result = c.run(_host(c, client), runtime="runsc")
    hint = "docker info" if engine_kind is EngineKind.DOCKER else "gVisor (runsc) needs Docker"
    record = c.assert_fail_closed(result, "runtime_not_registered", hint)
    assert record["runtime"] == "runsc"


# --- the image -------------------------------------------------------------------------------------------


def test_image_not_pinned(case: Callable[..., Case]) -> None:
    c = case("fc-no-pin")
    c.install()
    c.state.write_config({"image": None})
    c.assert_fail_closed(c.run(c.state.host()), "image_not_pinned", "agentnode-sandbox image build")


def test_image_missing(case: Callable[..., Case]) -> None:
    c = case("fc-image-missing")
    c.install()
    c.state.write_config({"image": "sha256:" + "0" * 64})
    c.assert_fail_closed(c.run(c.state.host()), "image_missing", "agentnode-sandbox image build")


def test_image_mismatch(case: Callable[..., Case], docker_client: docker.DockerClient) -> None:
    c = case("fc-image-mismatch")
    c.install()
    base = docker_client.images.list(name="agentnode-sandbox-base")
    assert base, "the pinned image's base layer image is expected next to it"
    c.state.write_config({"image": base[0].id})  # a real local image, but not the sandbox image
    c.assert_fail_closed(c.run(c.state.host()), "image_mismatch", "agentnode-sandbox image build")


@pytest.fixture
def protocol_999_image(docker_client: docker.DockerClient, pinned_image: str) -> Iterator[str]:
    """The pinned image relabelled to speak another protocol version; removed afterwards."""
    inputs = docker_client.images.get(pinned_image).labels[LABEL_INPUTS_HASH]
    dockerfile = (
        f"FROM {pinned_image}\nLABEL io.agentnode.sandbox.protocol=999 {LABEL_INPUTS_HASH}={inputs}\n"
    )
    image, _ = docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True, pull=False, network_mode="none"
    )
    try:
        assert image.labels["io.agentnode.sandbox.protocol"] == "999"
        assert image.labels[LABEL_INPUTS_HASH] == inputs
        yield str(image.id)
    finally:
        docker_client.images.remove(image.id, force=True, noprune=True)


def test_protocol_mismatch(case: Callable[..., Case], protocol_999_image: str) -> None:
    c = case("fc-protocol")
    c.install()
    c.state.write_config({"image": protocol_999_image})
    result = c.run(c.state.host())
    c.assert_fail_closed(result, "protocol_mismatch", "agentnode-sandbox image build")
    assert "999" in result.error


def test_image_removed_while_the_host_lives(
    case: Callable[..., Case], docker_client: docker.DockerClient, pinned_image: str
) -> None:
    """The host trusts a verified pin for a while without asking the engine again; an image removed in
    that while is still refused as missing (the create finds it gone), not as a failed start."""
    c = case("fc-image-removed")
    c.install()
    image, _ = docker_client.images.build(
        fileobj=io.BytesIO(f"FROM {pinned_image}\nLABEL io.agentnode.test.copy=1\n".encode()),
        rm=True, forcerm=True, pull=False, network_mode="none",
    )  # fmt: skip
    try:
        c.state.write_config({"image": image.id})
        host = c.state.host()
        first = host.run(c.slug)
        assert first.success, (first.error_code, first.error, first.logs)
        docker_client.images.remove(image.id, force=True, noprune=True)
        result = c.run(host)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.images.remove(image.id, force=True, noprune=True)
    assert not result.success and result.error_code == "image_missing", (result.error_code, result.error)
    assert "agentnode-sandbox image build" in result.hint and image.id in result.error
    records = c.state.audit()
    assert [r["reason"] for r in records] == ["agent_completed", "image_missing"], records
    assert records[-1]["run_id"] == result.run_id and records[-1]["action"] == "deny"
    assert c.containers() == []
    assert not (run_root(c.state.env) / f"run-{result.run_id}").exists()


# --- the pack volume -------------------------------------------------------------------------------------


@pytest.fixture
def volumes(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Names of volumes a test created; removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            docker_client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass


def test_pack_volume_missing_is_never_created_by_the_engine(
    case: Callable[..., Case], volumes: list[str]
) -> None:
    c = case("fc-volume-missing")
    entry = c.install()
    volumes.append(entry.sandbox_volume)
    c.client.volumes.get(entry.sandbox_volume).remove()
    c.assert_fail_closed(c.run(c.state.host()), "volume_missing", "agentnode-sandbox install")
    with pytest.raises(docker.errors.NotFound):
        c.client.volumes.get(entry.sandbox_volume)


def test_pack_volume_stale(case: Callable[..., Case], volumes: list[str]) -> None:
    c = case("fc-volume-stale")
    entry = c.install()
    volumes.append(entry.sandbox_volume)
    c.client.volumes.get(entry.sandbox_volume).remove()
    c.client.volumes.create(name=entry.sandbox_volume, labels={LABEL_ARTIFACT: "f" * 64})
    c.assert_fail_closed(c.run(c.state.host()), "volume_stale", "agentnode-sandbox install")


def test_lockfile_naming_another_volume_is_stale(case: Callable[..., Case], volumes: list[str]) -> None:
    c = case("fc-lock-stale")
    entry = c.install()
    volumes.append(entry.sandbox_volume)
    lock = Lockfile(c.state.dir / "agentnode.lock")
    lock.put(dataclasses.replace(entry, sandbox_volume=entry.sandbox_volume + "-old"))
    c.assert_fail_closed(c.run(c.state.host()), "volume_stale", "agentnode-sandbox install")


# --- start and run ---------------------------------------------------------------------------------------


def test_start_failure(case: Callable[..., Case], engine_kind: EngineKind) -> None:
    c = case("fc-start-failed")
    c.install()
    # Below every engine's minimum memory limit: dockerd refuses to create the container (400); Podman
    # creates it and refuses to start it (500), and the created container is removed all the same.
    host = c.state.host(limits=ContainerLimits(memory_bytes=1024 * 1024))
    result = c.run(host)
    podman = engine_kind is EngineKind.PODMAN
    c.assert_fail_closed(result, "start_failed", "agentnode-sandbox doctor", container_started=podman)
    assert ("(500)" if podman else "(400)") in result.error


def test_container_exiting_before_reporting(case: Callable[..., Case], runtime: str) -> None:
    c = case("fc-exits-early", last="os._exit(7)")
    c.install()
    result = c.run(c.state.host(), runtime=runtime)
    record = c.assert_fail_closed(result, "exited_before_result", "run --json", container_started=True)
    assert "status 7" in result.error
    assert record["runtime"] == runtime


class BrokenBroker(LlmBroker):
    """A broker with a bug: the host loop must fail closed and still write its audit record."""

    def session(
        self, policy: LlmPolicy, slug: str | None = None, *, deadline: float | None = None
    ) -> LlmSession:
        raise RuntimeError("secret-ish broker failure text")


def test_host_loop_error(case: Callable[..., Case]) -> None:
    c = case("fc-host-loop")
    c.install()
    broker = BrokenBroker(load_config(c.state.env).agent_sandbox.llm, env={})
    result = c.run(c.state.host(broker=broker))
    # The run's services are built before its sandbox: the failure comes before any container exists.
    record = c.assert_fail_closed(result, "host_loop_error", "agentnode-sandbox doctor")
    assert "secret-ish" not in result.error + json.dumps(record)
    assert "RuntimeError" in result.error


def test_failing_audit_write_fails_the_run_loudly(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    host_state.install(
        make_agent(
            "fc-audit-broken",
            """
            def run(context, **kwargs):
                return {"fine": True}
            """,
        )
    )
    (host_state.dir / "audit.jsonl").mkdir()  # every append now fails
    host = host_state.host()
    try:
        result = host.run("fc-audit-broken")
        refused = host.run("fc-not-installed")
    finally:
        host.close()
    # No start record, no run: the agent never started, and neither reply pretends all is well.
    assert not result.success and result.error_code == "audit_failed", (result.error_code, result.error)
    assert "started" not in result.stages and "audit verify" in result.hint
    assert not refused.success and refused.error_code == "audit_failed" and "not_installed" in refused.error
    assert host.audit_failures == 2


# --- routing refusals ------------------------------------------------------------------------------------


def test_flag_off(case: Callable[..., Case]) -> None:
    c = case("fc-flag-off")
    c.install()
    c.state.env["AGENTNODE_AGENT_SANDBOX"] = "0"
    record = c.assert_fail_closed(
        c.run(c.state.host()), "refused_flag_off", "export AGENTNODE_AGENT_SANDBOX=1"
    )
    assert record["sandbox"] is False


def test_unknown_trust(case: Callable[..., Case]) -> None:
    c = case("fc-odd-trust")
    entry = c.install()
    Lockfile(c.state.dir / "agentnode.lock").put(dataclasses.replace(entry, trust_level="community"))
    record = c.assert_fail_closed(c.run(c.state.host()), "refused_trust", "agentnode-sandbox install")
    assert record["trust"] == "community"


def test_not_installed(case: Callable[..., Case]) -> None:
    c = case("fc-ghost")  # never installed
    record = c.assert_fail_closed(c.run(c.state.host()), "not_installed", "agentnode-sandbox install")
    assert record["slug"] == "fc-ghost"


def test_toolpack_run_as_agent(case: Callable[..., Case]) -> None:
    c = case("word-tools")
    c.state.install(REPO / "examples" / "word-tools", trust="trusted")
    c.assert_fail_closed(c.run(c.state.host()), "not_an_agent", "agentnode-sandbox list")
