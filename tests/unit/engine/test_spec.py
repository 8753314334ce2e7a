"""The hardened container spec as data: every isolation flag, limit, mount and label of `container_spec`,
and the create request `create_body` makes of it, held equal to the one the docker SDK would send."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from host.engine.contract import HOME_IN_CONTAINER, NPROC_LIMIT, ContainerLimits, FilesMounts
from host.engine.facts import EngineKind
from host.engine.labels import LABEL_OWNER, LABEL_RUN, LABEL_SLUG, LABEL_WARM
from host.engine.spec import container_spec, create_body

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


@pytest.mark.parametrize("workspace", ["read", "write"])
def test_a_workspace_is_one_more_bind_at_a_fixed_path(workspace: str) -> None:
    area = "/run/agentnode-sandbox/run-run123.files"
    mounts = spec(files=FilesMounts(area, workspace=workspace))["mounts"]
    assert mounts[:2] == spec()["mounts"]
    bind = {"Target": "/workspace", "Source": f"{area}/workspace", "Type": "bind",
            "ReadOnly": workspace == "read"}  # fmt: skip
    assert mounts[2:] == [bind]
    assert spec(files=FilesMounts(area))["mounts"] == spec()["mounts"]  # no workspace: nothing at /workspace


def test_an_agents_inputs_are_read_only_and_its_outputs_writable() -> None:
    area = "/run/agentnode-sandbox/run-run123.files"
    mounts = spec(files=FilesMounts(area, io=True))["mounts"][2:]
    assert mounts == [
        {"Target": "/inputs", "Source": f"{area}/inputs", "Type": "bind", "ReadOnly": True},
        {"Target": "/outputs", "Source": f"{area}/outputs", "Type": "bind", "ReadOnly": False},
    ]


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
