"""The boundary, proven from inside a live container (or by effect where gVisor hides the evidence)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from host.engine.engine import container_runtime
from host.engine.facts import EngineKind
from host.engine.http import EngineClient
from tests.support.engine import ENGINE_ENV
from tests.support.host_state import HostState
from tests.support.packs import fork_bomb

pytestmark = [pytest.mark.docker, pytest.mark.podman]

PROBE = r"""
import os, resource, socket, subprocess

def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError as exc:
        return "ERR:" + type(exc).__name__

def _status(key):
    for line in _read("/proc/self/status").splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None

def _writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w") as fh:
            fh.write("x")
        os.unlink(os.path.join(path, ".probe"))
        return True
    except OSError:
        return False

def _exec_from_tmp():
    script = "/tmp/probe.sh"
    with open(script, "w") as fh:
        fh.write("#!/bin/sh\necho hi\n")
    os.chmod(script, 0o755)
    try:
        subprocess.run([script], check=True, capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False

def _can_connect_out():
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=1).close()
        return True
    except OSError:
        return False

def _cgroup():
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # v2
        quota, period = (_read("/sys/fs/cgroup/cpu.max").split() + ["", ""])[:2]
        swap = _read("/sys/fs/cgroup/memory.swap.max")
        return {"memory": _read("/sys/fs/cgroup/memory.max"), "memory_swap_extra": swap,
                "pids": _read("/sys/fs/cgroup/pids.max"), "cpu_quota": quota, "cpu_period": period}
    mem = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    memsw = _read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
    return {"memory": mem, "memory_swap_extra": str(int(memsw) - int(mem)) if memsw.isdigit() else memsw,
            "pids": _read("/sys/fs/cgroup/pids/pids.max"),
            "cpu_quota": _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
            "cpu_period": _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")}

def run(context, **kwargs):
    return {
        "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
        "cap_eff": _status("CapEff"), "cap_prm": _status("CapPrm"), "no_new_privs": _status("NoNewPrivs"),
        "root_writable": _writable("/"), "etc_writable": _writable("/etc"),
        "pack_writable": _writable("/pack"),
        "tmp_writable": _writable("/tmp"), "home_writable": _writable(os.environ.get("HOME", "/nonexistent")),
        "tmp_exec": _exec_from_tmp(),
        "interfaces": sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None,
        "net_dev": [l.split(":")[0].strip() for l in _read("/proc/net/dev").splitlines()[2:]],
        "connect_out": _can_connect_out(),
        "cgroup": _cgroup(),
        "env": dict(os.environ),
        "engine_sockets": [p for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock",
                                       "/run/containerd/containerd.sock") if os.path.exists(p)],
        "mounts": [l.split()[4] for l in _read("/proc/self/mountinfo").splitlines()],
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "fsize": list(resource.getrlimit(resource.RLIMIT_FSIZE)),
        "pid1": _read("/proc/1/cmdline").replace("\x00", " "),
        "hostname": socket.gethostname(),
    }
"""


def _probe(host_state: HostState, make_agent: Callable[..., Path], runtime: str) -> dict[str, Any]:
    seen = host_state.run_once(make_agent("probe", PROBE), "probe", runtime)
    assert isinstance(seen, dict)
    return seen


def test_boundary_seen_from_inside(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str, monkeypatch: pytest.MonkeyPatch,
    engine_kind: EngineKind,
) -> None:  # fmt: skip
    canary = "sk-canary-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    host_state.env["OPENAI_API_KEY"] = canary
    facts = _probe(host_state, make_agent, runtime)

    assert facts["uid"] == 65532 and facts["euid"] == 65532 and facts["gid"] == 65532
    assert int(facts["cap_eff"], 16) == 0 and int(facts["cap_prm"], 16) == 0
    if runtime != "runsc":  # a kernel-sharing runtime (runc, or crun on Podman): the host kernel shows them
        assert facts["no_new_privs"] == "1"
        cg = facts["cgroup"]  # cgroup v1 or v2, whichever the host runs
        assert cg["memory"] == str(512 * 1024 * 1024)
        assert cg["memory_swap_extra"] == "0"
        assert cg["pids"] == "256"
        assert int(cg["cpu_quota"]) == int(cg["cpu_period"])  # exactly one CPU
    assert facts["root_writable"] is False and facts["etc_writable"] is False
    assert facts["pack_writable"] is False
    assert facts["tmp_writable"] is True and facts["home_writable"] is True
    assert facts["tmp_exec"] is False
    assert facts["net_dev"] == ["lo"]
    assert facts["connect_out"] is False
    assert facts["engine_sockets"] == []
    assert set(facts["mounts"]) >= {"/", "/pack", "/run/agentnode", "/tmp", "/home/sandbox"}
    assert not any(m.endswith(".sock") and "docker" in m for m in facts["mounts"])
    assert facts["nofile"] == [256, 256]
    assert facts["fsize"] == [64 * 1024 * 1024, 64 * 1024 * 1024]
    env = facts["env"]
    assert canary not in repr(env)
    assert set(env) <= {
        "HOME",
        "PATH",
        "LANG",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "AGENTNODE_SOCKET",
        "AGENTNODE_IMPORT_ROOT",
        "AGENTNODE_FETCH_TIMEOUT",
        "AGENTNODE_PRELOAD",
        "HOSTNAME",
        *ENGINE_ENV[engine_kind],
    }
    assert {name: env[name] for name in ENGINE_ENV[engine_kind]} == ENGINE_ENV[engine_kind]


def test_host_side_cgroup_limits(
    *, host_state: HostState, make_agent: Callable[..., Path], runtime: str,
    docker_client: docker.DockerClient, engine_kind: EngineKind, engine_client: EngineClient,
) -> None:  # fmt: skip
    """Under gVisor the cgroup files are hidden inside; the engine's view of the container proves them."""
    sleeper = make_agent(
        "sleeper",
        """
        import time
        def run(context, **kwargs):
            time.sleep(30)
    """,
        extra="limits:\n  max_runtime_seconds: 8\n",
    )
    host_state.install(sleeper)
    host = host_state.host()
    import threading

    seen: dict[str, Any] = {}

    def inspect_while_running() -> None:
        import time

        for _ in range(100):
            running = docker_client.containers.list(filters={"label": "io.agentnode.sandbox.slug=sleeper"})
            if running:
                seen.update(running[0].attrs["HostConfig"])
                seen["runtime"] = container_runtime(engine_client, running[0].id, engine_kind)
                return
            time.sleep(0.1)

    t = threading.Thread(target=inspect_while_running)
    t.start()
    try:
        result = host.run("sleeper", runtime=runtime)
    finally:
        host.close()
        t.join()
    assert result.timed_out and result.error_code == "timeout"
    assert seen["Memory"] == 512 * 1024 * 1024 and seen["MemorySwap"] == 512 * 1024 * 1024
    assert seen["PidsLimit"] == 256 and seen["NanoCpus"] == 1_000_000_000
    assert seen["runtime"] == runtime and seen["NetworkMode"] == "none" and seen["ReadonlyRootfs"] is True


def test_memory_ceiling_kills_768_mib_but_allows_64(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    hog = make_agent(
        "hog",
        """
        def run(context, mib=64, **kwargs):
            block = bytearray(mib * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            return {"allocated_mib": mib}
    """,
    )
    host_state.install(hog)
    host = host_state.host()
    try:
        small = host.run("hog", kwargs={"mib": 64}, runtime=runtime)
        big = host.run("hog", kwargs={"mib": 768}, runtime=runtime)
    finally:
        host.close()
    assert small.success and small.result == {"allocated_mib": 64}
    assert not big.success
    assert big.error_code == "oom_killed", (big.error_code, big.error)


def test_fork_bomb_is_contained(host_state: HostState, make_agent: Callable[..., Path], runtime: str) -> None:
    bomb = make_agent(
        "forkbomb",
        fork_bomb("run(context, **kwargs)", forks=2000, hold_s=20),
        extra="limits:\n  max_runtime_seconds: 30\n",
    )
    host_state.install(bomb)
    survivor = make_agent("after-bomb", """
        def run(context, **kwargs):
            return "still fine"
    """)
    host_state.install(survivor)
    host = host_state.host()
    try:
        result = host.run("forkbomb", runtime=runtime)
        after = host.run("after-bomb", runtime=runtime)
    finally:
        host.close()
    contained = result.success and result.result["children"] < 256  # runc may hand the agent EAGAIN
    # gVisor pays a host process per fork, so there the limit stops the whole sandbox; either way the cause
    # is named (pids_exhausted; sandbox_crashed only if the probe missed the moment under runsc).
    named = {"pids_exhausted"} | ({"sandbox_crashed"} if runtime == "runsc" else set())
    assert contained or result.error_code in named, (result.error_code, result.error)
    assert after.success and after.result == "still fine"
    audit = host_state.audit()
    assert [r["run_id"] for r in audit] == [result.run_id, after.run_id]
    assert audit[0]["reason"] == (result.error_code or "agent_completed")
