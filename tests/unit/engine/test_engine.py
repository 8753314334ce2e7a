"""Engine access without a daemon: the hardened spec as data, fail-closed capability checks, the classifier,
owner tokens and the pids probe; the SDK talks to a real (tiny) HTTP server on a Unix socket."""

from __future__ import annotations

import dataclasses
import errno
import gc
import itertools
import json
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
import requests
import requests.exceptions
import urllib3.exceptions

from host.core.errors import (
    AuditReason,
    EngineError,
    EngineImageNotFound,
    EngineNotFound,
    EngineRejected,
    PackError,
)
from host.core.owner import owner_alive, owner_token
from host.engine.contract import HOME_IN_CONTAINER, NPROC_LIMIT, ContainerLimits
from host.engine.engine import (
    ENGINE_SHARED_POOL_SIZE,
    LABEL_OWNER,
    LABEL_RUN,
    LABEL_SLUG,
    LABEL_WARM,
    EngineFacts,
    EngineKind,
    PidsProbe,
    classify_engine_exception,
    container_cgroup_dir,
    container_spec,
    create_body,
    engine_errors,
    engine_facts,
    engine_kind,
    facts_from,
    follow_logs,
    open_engine,
    require_capable,
    verify_runtime,
)
from host.engine.http import IDLE_CONNECTIONS, EngineApiError
from host.engine.sdk import connect
from tests.support.fake_engine import FakeEngine

MiB = 1024 * 1024
WRAPPER_ENV = {
    "HOME",
    "AGENTNODE_FETCH_TIMEOUT",
    "PATH",
    "LANG",
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "AGENTNODE_SOCKET",
    "AGENTNODE_IMPORT_ROOT",
    "AGENTNODE_PRELOAD",
}
ENGINE_SOCKETS = ("docker.sock", "podman.sock", "containerd.sock")


def spec(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "image": "sha256:" + "a" * 64,
        "run_id": "run123",
        "name": "agentnode-run-run123",
        "owner": "4242:777",
        "slug": "probe-agent",
        "runtime": "runc",
        "pack_volume": "agentnode-pack-probe-agent-1.0.0-0123456789abcdef",
        "import_root": "/pack/src",
        "socket_dir": "/run/agentnode-sandbox/run-run123",
    }
    return container_spec(**(kwargs | overrides))


# --- container_spec: every hardening decision, as data ------------------------------------------------


def test_spec_isolation_flags() -> None:
    s = spec()
    assert s["network_mode"] == "none"
    assert s["read_only"] is True
    assert s["cap_drop"] == ["ALL"] and "cap_add" not in s
    assert s["security_opt"] == ["no-new-privileges"]
    assert s["user"] == "65532:65532"
    assert s["init"] is True
    assert s["privileged"] is False and s["ipc_mode"] == "none"
    assert s["runtime"] == "runc" and spec(runtime="runsc")["runtime"] == "runsc"
    assert s["image"] == "sha256:" + "a" * 64 and s["name"] == "agentnode-run-run123"
    assert s["stdin_open"] is False and s["tty"] is False and s["auto_remove"] is False
    for absent in ("pid_mode", "userns_mode", "devices", "volumes", "volumes_from", "ports", "dns"):
        assert absent not in s


def test_spec_resource_limits_are_the_documented_ones() -> None:
    s = spec()
    assert s["pids_limit"] == 256
    assert s["mem_limit"] == 512 * MiB and s["memswap_limit"] == s["mem_limit"]  # no swap on top
    assert s["nano_cpus"] == 1_000_000_000
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in s["ulimits"]}
    assert ulimits == {"nofile": (256, 256), "fsize": (64 * MiB, 64 * MiB), "core": (0, 0),
                       "nproc": (NPROC_LIMIT, NPROC_LIMIT)}  # fmt: skip


def test_spec_limits_follow_container_limits() -> None:
    limits = ContainerLimits(memory_bytes=64 * MiB, pids=32, cpus=0.5, nofile=64, fsize_bytes=MiB)
    s = spec(limits=limits)
    assert (s["mem_limit"], s["memswap_limit"], s["pids_limit"]) == (64 * MiB, 64 * MiB, 32)
    assert s["nano_cpus"] == 500_000_000
    assert {u["Name"]: u["Hard"] for u in s["ulimits"]} == {
        "nofile": 64, "fsize": MiB, "core": 0, "nproc": NPROC_LIMIT
    }  # fmt: skip


def test_spec_tmpfs_are_small_and_not_executable() -> None:
    tmpfs = spec()["tmpfs"]
    assert set(tmpfs) == {"/tmp", HOME_IN_CONTAINER, "/dev/shm", "/dev/mqueue"}
    for target in ("/dev/shm", "/dev/mqueue"):  # overmounted read-only: no writable place but /tmp and HOME
        assert "ro" in tmpfs[target].split(",") and "rw" not in tmpfs[target].split(",")
    for target, size in (("/tmp", 64 * MiB), (HOME_IN_CONTAINER, 16 * MiB)):
        opts = tmpfs[target].split(",")
        assert {"noexec", "nosuid", "nodev"} <= set(opts)
        assert f"size={size}" in opts
        assert "exec" not in opts and "suid" not in opts and "dev" not in opts
    home = tmpfs[HOME_IN_CONTAINER].split(",")
    assert {"uid=65532", "gid=65532", "mode=0700"} <= set(home)


def test_podman_spec_differs_only_where_podman_needs_it() -> None:
    """Podman refuses tmpfs uid=/gid= ("unknown mount option") and spells the same ownership `U`; it mounts
    writable tmpfs at /run and /var/tmp under a read-only root, which the spec seals; and its default seccomp
    profile allows user namespaces, so the run names its own. Nothing else differs between the engines."""
    docker_spec = spec()
    podman_spec = spec(engine=EngineKind.PODMAN, seccomp_profile="/cfg/seccomp/seccomp-1.json")
    assert podman_spec["security_opt"] == ["no-new-privileges", "seccomp=/cfg/seccomp/seccomp-1.json"]
    assert docker_spec["security_opt"] == ["no-new-privileges"]
    for sealed in ("/run", "/var/tmp"):
        assert podman_spec["tmpfs"][sealed] == podman_spec["tmpfs"]["/dev/shm"]
        assert "ro" in podman_spec["tmpfs"][sealed].split(",") and sealed not in docker_spec["tmpfs"]
    with pytest.raises(ValueError, match="seccomp"):
        spec(engine=EngineKind.PODMAN)
    home = podman_spec["tmpfs"][HOME_IN_CONTAINER].split(",")
    assert "U" in home and not any(opt.startswith(("uid=", "gid=")) for opt in home)
    docker_home = set(docker_spec["tmpfs"][HOME_IN_CONTAINER].split(","))
    assert set(home) - {"U"} == docker_home - {"uid=65532", "gid=65532"}
    others = {k: v for k, v in podman_spec.items() if k not in ("tmpfs", "security_opt")}
    assert others == {k: v for k, v in docker_spec.items() if k not in ("tmpfs", "security_opt")}
    differ = (HOME_IN_CONTAINER, "/run", "/var/tmp")
    podman_tmpfs = {k: v for k, v in podman_spec["tmpfs"].items() if k not in differ}
    assert podman_tmpfs == {k: v for k, v in docker_spec["tmpfs"].items() if k != HOME_IN_CONTAINER}


def test_spec_environment_is_only_the_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "sk-host-canary-31337"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    s = spec()
    env = s["environment"]
    assert set(env) == WRAPPER_ENV
    assert env["HOME"] == HOME_IN_CONTAINER and env["PATH"] == "/usr/bin:/bin"
    assert env["AGENTNODE_SOCKET"] == "/run/agentnode/sandbox.sock"
    assert env["AGENTNODE_IMPORT_ROOT"] == "/pack/src"
    assert env["AGENTNODE_FETCH_TIMEOUT"] == "0"  # the host, not the wrapper, bounds the wait for a task
    assert env["AGENTNODE_PRELOAD"] == ""  # no agent module named: the wrapper imports it with its task
    assert spec(preload="agents.main")["environment"]["AGENTNODE_PRELOAD"] == "agents.main"
    assert spec(preload="agents.main", tool_for="r" * 32)["environment"]["AGENTNODE_PRELOAD"] == ""
    assert canary not in repr(s) and "docker.sock" not in repr(s)
    for key, value in os.environ.items():
        if key not in WRAPPER_ENV and len(value) > 6:
            assert value not in env.values(), key


def test_spec_mounts_exactly_pack_and_socket_dir_read_only() -> None:
    s = spec()
    mounts = [dict(m) for m in s["mounts"]]
    assert mounts == [
        {
            "Target": "/pack",
            "Source": "agentnode-pack-probe-agent-1.0.0-0123456789abcdef",
            "Type": "volume",
            "ReadOnly": True,
            "VolumeOptions": {"NoCopy": True},
        },
        {
            "Target": "/run/agentnode",
            "Source": "/run/agentnode-sandbox/run-run123",
            "Type": "bind",
            "ReadOnly": True,
        },
    ]
    text = json.dumps({k: v for k, v in s.items() if k not in ("ulimits", "log_config")}, default=str)
    assert not any(sock in text for sock in ENGINE_SOCKETS)


def test_spec_labels_and_bounded_logs() -> None:
    s = spec(slug="x" * 64)
    assert s["labels"] == {LABEL_RUN: "run123", LABEL_OWNER: "4242:777", LABEL_SLUG: "x" * 63}
    log = s["log_config"]
    assert log == {"Type": "json-file", "Config": {"max-size": str(MiB), "max-file": "1"}}
    assert spec(limits=ContainerLimits(log_max_bytes=4096))["log_config"]["Config"]["max-size"] == "4096"


def _sdk_request(keywords: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The name and body the docker SDK's `containers.create` sends for these keywords."""
    from docker.models.containers import _create_container_args
    from docker.types import ContainerConfig

    args = _create_container_args({**keywords, "version": "1.41"})
    host_config, name = args.pop("host_config"), args.pop("name")
    body = dict(ContainerConfig("1.41", **args))
    body["HostConfig"] = dict(host_config)
    return name, {k: v for k, v in body.items() if v is not None}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"runtime": "runsc", "warm": True, "preload": "agents.main"},
        {"tool_for": "r" * 32},
        {"engine": EngineKind.PODMAN, "seccomp_profile": "/cfg/seccomp/seccomp-1.json"},
        {"limits": ContainerLimits(memory_bytes=64 * MiB, pids=32, cpus=0.5, nofile=64, fsize_bytes=MiB)},
    ],
    ids=["cold", "warm-runsc", "tool", "podman", "limits"],
)
def test_the_create_request_is_the_one_the_sdk_would_send(overrides: dict[str, Any]) -> None:
    """The host sends the create request itself (the SDK is not imported by a run): for every kind of spec
    it is, to the byte of its JSON, the one the SDK's `containers.create` sends for the same keywords."""
    keywords = spec(**overrides)
    name, body = create_body(keywords)
    sdk_name, sdk_body = _sdk_request(keywords)
    assert name == sdk_name
    assert json.dumps(body, sort_keys=True) == json.dumps(sdk_body, sort_keys=True)


def test_a_spec_keyword_without_a_mapping_is_refused() -> None:
    """A new hardening keyword in container_spec must be mapped into the request, never dropped."""
    with pytest.raises(ValueError, match="devices"):
        create_body({**spec(), "devices": ["/dev/kmsg"]})


def test_spec_is_pure() -> None:
    assert spec() == spec()
    # The whole command, split so that no engine substitutes the image's entrypoint for an empty one.
    assert spec()["entrypoint"] == ["/usr/bin/python3"]
    assert spec()["command"] == ["-s", "-m", "sandbox_wrapper"]


def test_a_warm_spec_is_the_cold_spec_plus_the_warm_label() -> None:
    cold, warm = spec(), spec(warm=True)
    assert cold == spec(warm=False)
    assert LABEL_WARM not in cold["labels"]
    labels = {LABEL_RUN: "run123", LABEL_OWNER: "4242:777", LABEL_SLUG: "probe-agent", LABEL_WARM: "1"}
    assert warm["labels"] == labels
    assert warm == {**cold, "labels": {**cold["labels"], LABEL_WARM: "1"}}  # the whole spec, every key
    assert set(warm) == set(cold)


# --- require_capable ---------------------------------------------------------------------------------

CAPABLE = EngineFacts(
    server_version="27.0", runtimes=frozenset({"runc", "runsc"}), memory_limit=True, swap_limit=True
)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_capable_engine_passes(runtime: str) -> None:
    require_capable(CAPABLE, runtime)


def refusal(facts: EngineFacts, runtime: str) -> EngineError:
    with pytest.raises(EngineError) as info:
        require_capable(facts, runtime)
    return info.value


def test_unknown_runtime_is_a_config_error() -> None:
    err = refusal(CAPABLE, "kata")
    assert err.reason is AuditReason.CONFIG_INVALID and err.check == "runtime"
    assert "runc or runsc" in err.hint


def test_runsc_not_registered_says_how_to_register_it() -> None:
    err = refusal(EngineFacts("27.0", frozenset({"runc"}), True, True), "runsc")
    assert err.reason is AuditReason.RUNTIME_NOT_REGISTERED and err.check == "runtime"
    assert "--host-uds=open" in err.hint and "docker info" in err.hint


def test_runc_not_registered() -> None:
    err = refusal(EngineFacts("x", frozenset({"crun"}), True, True), "runc")
    assert err.reason is AuditReason.RUNTIME_NOT_REGISTERED and "docker info" in err.hint


@pytest.mark.parametrize(("memory", "swap"), [(False, True), (True, False), (False, False)])
def test_memory_ceiling_unenforceable_fails_closed(memory: bool, swap: bool) -> None:
    err = refusal(EngineFacts("x", frozenset({"runc"}), memory, swap), "runc")
    assert err.reason is AuditReason.MEMORY_LIMIT_UNSUPPORTED and err.check == "memory_limit"
    assert "{{.MemoryLimit}} {{.SwapLimit}}" in err.hint


# --- classify_engine_exception -------------------------------------------------------------------------


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    """`outer` raised from `inner`, with real tracebacks, as the SDK does."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


class FakeResponse(requests.Response):
    def __init__(self, status: int) -> None:
        super().__init__()
        self.status_code = status
        self.reason = "Forbidden"


@pytest.mark.parametrize(
    "exc",
    [
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.EPERM, "Operation not permitted"),
        chained(
            requests.exceptions.ConnectionError("Connection aborted."),
            PermissionError(errno.EACCES, "Permission denied"),
        ),
        chained(
            docker.errors.DockerException("Error while fetching server API version"),
            chained(requests.exceptions.ConnectionError("aborted"), PermissionError(errno.EACCES, "no")),
        ),
        docker.errors.APIError("denied", response=FakeResponse(403)),
        chained(
            docker.errors.DockerException("Error while fetching server API version: 403"),
            docker.errors.APIError("denied", response=FakeResponse(403)),
        ),
    ],
)
def test_permission_problems_are_classified(exc: BaseException) -> None:
    err = classify_engine_exception(exc)
    assert err.reason is AuditReason.ENGINE_PERMISSION_DENIED and err.check == "engine"
    assert "agentnode-sandbox doctor" in err.hint


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        chained(
            requests.exceptions.ConnectionError("Connection aborted."),
            FileNotFoundError(errno.ENOENT, "No such file or directory"),
        ),
        requests.exceptions.ReadTimeout("read timed out"),
        docker.errors.APIError("boom", response=FakeResponse(500)),
        docker.errors.DockerException("Error while fetching server API version"),
        RuntimeError("anything else"),
    ],
)
def test_everything_else_is_engine_unavailable(exc: BaseException) -> None:
    err = classify_engine_exception(exc)
    assert err.reason is AuditReason.ENGINE_UNAVAILABLE and err.check == "engine"
    assert "DOCKER_HOST" in err.hint and "agentnode-sandbox doctor" in err.hint


def test_classifier_never_copies_the_exception_text() -> None:
    err = classify_engine_exception(
        chained(RuntimeError("secret-token-abc at /srv/x"), PermissionError(errno.EACCES, "secret"))
    )
    assert "secret" not in err.message + err.hint


def test_a_cyclic_chain_terminates() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify_engine_exception(a).reason is AuditReason.ENGINE_UNAVAILABLE


def api_error(kind: type[docker.errors.APIError], status: int | None, explanation: str = "") -> BaseException:
    response = FakeResponse(status) if status is not None else None
    return kind("engine said no", response=response, explanation=explanation or None)


UNAVAILABLE = ("no container engine answers", AuditReason.ENGINE_UNAVAILABLE)
SOCKET_DENIED = ("not permitted to use the container engine socket", AuditReason.ENGINE_PERMISSION_DENIED)
REFUSED = ("the container engine refused the request", AuditReason.ENGINE_PERMISSION_DENIED)


@pytest.mark.parametrize(
    ("exc", "kind", "status", "expected"),
    [
        # no answer: the connection failed somewhere below the SDK
        (FileNotFoundError(errno.ENOENT, "gone"), EngineError, None, UNAVAILABLE),
        (requests.exceptions.ConnectionError("aborted"), EngineError, None, UNAVAILABLE),
        (urllib3.exceptions.ProtocolError("Connection broken"), EngineError, None, UNAVAILABLE),
        (docker.errors.DockerException("fetching server API version"), EngineError, None, UNAVAILABLE),
        (PermissionError(errno.EACCES, "denied"), EngineError, None, SOCKET_DENIED),
        (
            chained(docker.errors.DockerException("version probe"), api_error(docker.errors.APIError, 403)),
            EngineError, None, REFUSED,
        ),
        # an answer with an error status: the status is kept, 404s are told apart
        (api_error(docker.errors.NotFound, 404, "no such volume: v"), EngineNotFound, 404, UNAVAILABLE),
        (api_error(docker.errors.ImageNotFound, 404, "No such image"), EngineImageNotFound, 404, UNAVAILABLE),
        (api_error(docker.errors.APIError, 409, "removal in progress"), EngineRejected, 409, UNAVAILABLE),
        (api_error(docker.errors.APIError, 500, "boom"), EngineRejected, 500, UNAVAILABLE),
        # Podman's answer for a container removed while it was asked is "absent", not "failing"
        (api_error(docker.errors.APIError, 500, "container 5a does not exist in database: no such container"),
         EngineNotFound, 500, UNAVAILABLE),
        (api_error(docker.errors.APIError, 500, "no such container?"), EngineRejected, 500, UNAVAILABLE),
        (api_error(docker.errors.APIError, 409, "no such container"), EngineRejected, 409, UNAVAILABLE),
        (api_error(docker.errors.APIError, 403, "authorization denied"), EngineRejected, 403, REFUSED),
        (api_error(docker.errors.APIError, 401), EngineRejected, 401, REFUSED),
        (api_error(docker.errors.APIError, None), EngineRejected, None, UNAVAILABLE),
        # the same answers through the host's own client
        (EngineApiError(404, "no such container: 5a"), EngineNotFound, 404, UNAVAILABLE),
        (EngineApiError(404, "No such image: sha256:ab"), EngineImageNotFound, 404, UNAVAILABLE),
        (EngineApiError(500, "container 5a does not exist in database: no such container"),
         EngineNotFound, 500, UNAVAILABLE),
        (EngineApiError(409, "removal in progress"), EngineRejected, 409, UNAVAILABLE),
        (EngineApiError(403, "authorization denied"), EngineRejected, 403, REFUSED),
    ],
)  # fmt: skip
def test_the_classifier_as_data(
    exc: BaseException, kind: type[EngineError], status: int | None, expected: tuple[str, AuditReason]
) -> None:
    err = classify_engine_exception(exc)
    assert type(err) is kind
    assert (err.message, err.reason, err.check) == (*expected, "engine")
    assert "agentnode-sandbox doctor" in err.hint
    if isinstance(err, EngineRejected):
        assert err.status == status
        assert err.explanation == str(getattr(exc, "explanation", None) or "").strip()
        assert not err.explanation or err.explanation not in err.message + err.hint  # kept, never quoted


def test_uncaught_a_rejection_reads_like_any_engine_failure() -> None:
    """Telling "absent" from "failing" is the caller's choice; left alone, a 404 is just a failing engine."""
    plain = classify_engine_exception(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    missing = classify_engine_exception(api_error(docker.errors.NotFound, 404, "no such container"))
    assert (missing.message, missing.reason, missing.hint) == (plain.message, plain.reason, plain.hint)


@pytest.mark.parametrize(
    "exc",
    [
        requests.exceptions.ConnectionError("aborted"),
        api_error(docker.errors.NotFound, 404),
        docker.errors.DockerException("x"),
        OSError(errno.EIO, "io"),
        urllib3.exceptions.ReadTimeoutError(None, "/x", "read timed out"),
    ],
)
def test_the_boundary_classifies_every_engine_failure_without_its_chain(exc: BaseException) -> None:
    with pytest.raises(EngineError) as info, engine_errors():
        raise exc
    assert type(info.value) is type(classify_engine_exception(exc))
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(
    "exc",
    [
        PackError("the host's own error"),
        classify_engine_exception(api_error(docker.errors.NotFound, 404)),  # an inner boundary's answer
        KeyError("a bug is not an engine failure"),
    ],
)
def test_the_boundary_passes_everything_else_unchanged(exc: Exception) -> None:
    with pytest.raises(type(exc)) as info, engine_errors():
        raise exc
    assert info.value is exc


def test_callers_tell_absent_from_failing() -> None:
    def lookup(exc: BaseException) -> str | None:
        try:
            with engine_errors():
                raise exc
        except EngineNotFound:
            return None
        return "found"

    assert lookup(api_error(docker.errors.NotFound, 404)) is None
    with pytest.raises(EngineRejected) as info:
        lookup(api_error(docker.errors.APIError, 500))
    assert info.value.reason is AuditReason.ENGINE_UNAVAILABLE


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


@pytest.mark.parametrize(
    "layout",
    [
        "pids/docker/{id}",
        "pids/system.slice/docker-{id}.scope",
        "docker/{id}",
        "system.slice/docker-{id}.scope",
    ],
)
def test_a_containers_cgroup_is_found_by_its_id_in_every_driver_layout(tmp_path: Path, layout: str) -> None:
    cid = "ab" * 32
    where = tmp_path / layout.format(id=cid)
    where.mkdir(parents=True)
    (where / "pids.events").write_text("max 0\n")
    assert container_cgroup_dir(cid, "pids", "pids.events", root=tmp_path) == where
    assert container_cgroup_dir(cid, "pids", "pids.max", root=tmp_path) is None  # the marker must be there
    assert container_cgroup_dir("cd" * 32, "pids", "pids.events", root=tmp_path) is None


@pytest.mark.parametrize("bad", ["", "../../etc", "AB" * 32, "ab" * 31, "ab" * 32 + "/..", "docker"])
def test_only_a_full_container_id_is_looked_up(tmp_path: Path, bad: str) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "pids.events").write_text("max 0\n")
    assert container_cgroup_dir(bad, "pids", "pids.events", root=tmp_path) is None


# --- PidsProbe ---------------------------------------------------------------------------------------------


def test_pids_probe_reads_max_events_and_never_goes_down(tmp_path: Path) -> None:
    probe = PidsProbe(os.getpid())
    events = tmp_path / "pids.events"
    probe.path = events
    events.write_text("max 7\n")
    assert probe.poll() == 7
    events.write_text("max 3\n")
    assert probe.poll() == 7  # a counter only grows; a smaller reading is not news
    events.write_text("max 12\n")
    assert probe.poll() == 12 and probe.hits == 12
    events.write_text("other 99\nmax notanumber\n")
    assert probe.poll() == 12
    events.unlink()
    assert probe.poll() == 12  # the cgroup went away with the container: the last count stands


def test_pids_probe_without_a_cgroup_reports_zero(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    probe = PidsProbe(proc.pid)  # no /proc/<pid>/cgroup any more
    assert probe.path is None and probe.poll() == 0
    probe.path = tmp_path / "absent"
    assert probe.poll() == 0


def test_pids_probe_finds_a_pids_events_file_for_a_live_process() -> None:
    probe = PidsProbe(os.getpid())
    if probe.path is None:
        pytest.skip("this host exposes no pids controller for the test process")
    assert probe.path.name == "pids.events" and probe.path.is_file()
    assert probe.poll() >= 0


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


# --- engine facts, normalized from either engine's answers -------------------------------------------------

# Recorded answers (trimmed to the fields read) of the two engines on one Debian 12 machine.
DOCKERD_INFO = {
    "Architecture": "x86_64", "OSType": "linux", "CgroupVersion": "1", "CgroupDriver": "cgroupfs",
    "SecurityOptions": ["name=seccomp,profile=default"], "MemoryLimit": True, "SwapLimit": True,
    "PidsLimit": True, "ServerVersion": "20.10.24+dfsg1", "DefaultRuntime": "runc",
    "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"},
                 "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]}},
}  # fmt: skip
DOCKERD_PING = {"Api-Version": "1.41", "Docker-Experimental": "false", "Ostype": "linux",
                "Server": "Docker/20.10.24+dfsg1 (linux)"}  # fmt: skip
PODMAN_PING = {"Api-Version": "1.41", "Docker-Experimental": "true", "Libpod-Api-Version": "4.3.1",
               "Libpod-Buildah-Version": "1.28.2", "Server": "Libpod/4.3.1 (linux)"}  # fmt: skip
PODMAN_INFO = {
    "Architecture": "amd64", "OSType": "linux", "CgroupVersion": "1", "CgroupDriver": "cgroupfs",
    "SecurityOptions": ["name=seccomp,profile=default"], "MemoryLimit": True, "SwapLimit": True,
    "PidsLimit": True, "ServerVersion": "4.3.1", "DefaultRuntime": "crun",
    "Runtimes": {"crun": {"path": "/usr/bin/crun"}, "kata": {"path": "/usr/bin/kata-runtime"},
                 "runc": {"path": "/usr/bin/runc"}, "runsc": {"path": "/usr/bin/runsc"}},
}  # fmt: skip
PODMAN_LIBPOD = {"host": {
    "security": {"rootless": False, "seccompProfilePath": "/usr/share/containers/seccomp.json"},
    "cgroupVersion": "v1", "cgroupControllers": ["cpuset", "cpu", "cpuacct", "blkio", "memory", "devices",
                                                 "freezer", "pids"],
}}  # fmt: skip
# A rootless service on the same cgroup v1 host: its compatible /info says exactly what the rootful one says
# (limits, no rootless option), though it can enforce no limit at all; its own /libpod/info tells.
ROOTLESS_V1_LIBPOD = {
    "host": {"security": {"rootless": True}, "cgroupVersion": "v1", "cgroupControllers": []}
}
PODMAN_VERSION = {
    "Components": [{"Name": "Podman Engine"}, {"Name": "Conmon"}, {"Name": "OCI Runtime (crun)"}]
}


def test_the_engine_is_told_by_its_ping_headers_in_any_case() -> None:
    assert engine_kind(DOCKERD_PING) is EngineKind.DOCKER and engine_kind({}) is EngineKind.DOCKER
    assert engine_kind(PODMAN_PING) is EngineKind.PODMAN
    assert engine_kind({"libpod-api-version": "5.0.0"}) is EngineKind.PODMAN
    assert engine_kind({"Libpod-Api-Version": ""}) is EngineKind.DOCKER


def test_both_engines_answers_normalize_to_the_same_terms() -> None:
    docker_facts = facts_from(DOCKERD_INFO, EngineKind.DOCKER)
    podman_facts = facts_from(PODMAN_INFO, EngineKind.PODMAN, PODMAN_LIBPOD)
    assert (docker_facts.kind, podman_facts.kind) == (EngineKind.DOCKER, EngineKind.PODMAN)
    for facts in (docker_facts, podman_facts):
        assert (facts.architecture, facts.os, facts.cgroup_version) == ("x86_64", "linux", "1")
        assert facts.security_options == frozenset({"seccomp"}) and not facts.rootless
        assert facts.memory_limit and facts.swap_limit and facts.pids_limit
    assert docker_facts.runtimes == frozenset({"io.containerd.runc.v2", "runc", "runsc"})
    # Podman lists every runtime its configuration knows (installed or not) but runs each container under
    # its default one: only that one can be had.
    assert podman_facts.runtimes == frozenset({"crun"}) and podman_facts.default_runtime == "crun"
    assert podman_facts.seccomp_profile_path == "/usr/share/containers/seccomp.json"


def test_rootless_podman_without_delegated_controllers_is_refused() -> None:
    """Its compatible /info claims every limit; the run would have none. Refused, naming delegation."""
    facts = facts_from(PODMAN_INFO, EngineKind.PODMAN, ROOTLESS_V1_LIBPOD)
    assert facts.rootless and "rootless" in facts.security_options
    assert not (facts.memory_limit or facts.swap_limit or facts.pids_limit)
    err = refusal(facts, "crun")
    assert err.reason is AuditReason.MEMORY_LIMIT_UNSUPPORTED and "Delegate=" in err.hint
    delegated = {
        "host": {**ROOTLESS_V1_LIBPOD["host"], "cgroupVersion": "v2", "cgroupControllers": ["memory", "pids"]}
    }
    require_capable(facts_from({**PODMAN_INFO, "CgroupVersion": "2"}, EngineKind.PODMAN, delegated), "crun")


def test_rootless_and_security_options_are_read_by_name() -> None:
    """Rootless dockerd says so among its security options (Podman's own /libpod/info decides there)."""
    options = ["name=seccomp,profile=default", "name=rootless", "name=cgroupns"]
    facts = facts_from({**DOCKERD_INFO, "SecurityOptions": options}, EngineKind.DOCKER)
    assert facts.rootless and facts.security_options == frozenset({"seccomp", "rootless", "cgroupns"})


def test_podman_offers_only_its_default_runtime() -> None:
    facts = facts_from({**PODMAN_INFO, "DefaultRuntime": "runc"}, EngineKind.PODMAN, PODMAN_LIBPOD)
    require_capable(facts, "runc")
    for runtime, says in (("runsc", "--host-uds=open"), ("crun", 'runtime = "crun"')):
        err = refusal(facts, runtime)
        assert err.reason is AuditReason.RUNTIME_NOT_REGISTERED and "podman 4.3.1" in err.message
        assert says in err.hint and "agent_sandbox.runtime to runc" in err.hint


def test_an_engine_without_pids_accounting_is_refused() -> None:
    facts = dataclasses.replace(
        facts_from(PODMAN_INFO, EngineKind.PODMAN, PODMAN_LIBPOD), pids_limit=False, rootless=True
    )
    err = refusal(facts, "crun")
    assert err.reason is AuditReason.MEMORY_LIMIT_UNSUPPORTED and "pids" in err.message
    assert "rootless Podman" in err.hint and "Delegate=" in err.hint


def test_engine_facts_reads_which_engine_answers() -> None:
    with FakeEngine(info=PODMAN_INFO, version=PODMAN_VERSION, libpod_info=ROOTLESS_V1_LIBPOD) as fake:
        client = open_engine({"DOCKER_HOST": fake.docker_host})
        try:
            facts = engine_facts(client)
        finally:
            client.close()
        assert "/v4.0.0/libpod/info" in fake.paths  # Podman's own answer is asked for
    assert facts == facts_from(PODMAN_INFO, EngineKind.PODMAN, ROOTLESS_V1_LIBPOD) and facts.rootless


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
