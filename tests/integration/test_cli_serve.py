"""`serve` and `run --via` as installed commands: a warm host, a run through its socket, a clean SIGTERM."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.cli import cli, json_out
from tests.support.host_state import HostState
from tests.support.paths import BIN
from tests.support.schema import check_schema

pytestmark = [pytest.mark.docker, pytest.mark.podman]


def test_serve_then_run_via_its_socket(
    host_state: HostState, make_agent: Callable[..., Path], docker_client: docker.DockerClient
) -> None:
    host_state.install(
        make_agent(
            "via-agent",
            """
        def run(context, **kwargs):
            return {"goal": context.goal}
    """,
        )
    )
    host_state.write_config({"pool": {"size": 1}})
    sock = host_state.root / "admin.sock"
    serve = subprocess.Popen(
        [str(BIN), "serve", "--socket", str(sock), "--warm", "via-agent", "--json", "--drain-seconds", "5"],
        env=host_state.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        ready = json.loads(serve.stdout.readline())
        assert ready == {"socket": str(sock), "warm": ["via-agent"], "metrics": None}
        assert sock.stat().st_mode & 0o777 == 0o600
        proc = cli(
            host_state.env, "run", "via-agent", "--goal", "through the socket", "--via", sock, "--json"
        )
        assert proc.returncode == 0, proc.stderr
        out = json_out(proc)
        check_schema("run", out)
        assert out["success"] is True and out["result"] == {"goal": "through the socket"}
        missing = cli(host_state.env, "run", "not-installed", "--via", sock, "--json")
        assert missing.returncode == 1 and json_out(missing)["error_code"] == "not_installed"
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, err
    assert not sock.exists()
    # the warm member it kept and the sandbox that served the run are all gone
    owned = docker_client.api.containers(all=True, filters={"label": "io.agentnode.sandbox.slug=via-agent"})
    assert owned == [] and [r["reason"] for r in host_state.audit()] == ["agent_completed", "not_installed"]


PATH_AGENT = """
def run(context, n=0, **kwargs):
    print("working on it", flush=True)
    return {"goal": context.goal, "n": n}
"""
VARYING = {"run_id", "duration_ms", "path"}
"""What may differ between two runs of the same request: the run's identity and timing, and where it ran."""
AUDIT_VARYING = {"run_id", "duration_ms", "ts", "seq", "prev"}


def test_run_uses_the_serve_host_running_for_its_config_and_says_so(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    """The same `run` without a `serve` host, with one running on the config's default socket, with
    --no-serve beside it, and with a stale socket left behind: one --json contract and one audit record,
    apart from `path`."""
    host_state.install(make_agent("path-agent", PATH_AGENT))
    host_state.write_config({"pool": {"size": 1}})
    request = ("run", "path-agent", "--goal", "where am I", "--arg", "n=7", "--tenant", "acme",
               "--request-id", "req-19", "--label", "team=blue", "--json")  # fmt: skip

    def run(*extra: str) -> dict[str, Any]:
        proc = cli(host_state.env, *request, *extra)
        assert proc.returncode == 0, proc.stderr
        out: dict[str, Any] = json_out(proc)
        check_schema("run", out)
        return out

    outputs = {"local": run()}
    default_socket = host_state.dir / "agentnode-admin.sock"
    serve = subprocess.Popen(
        [str(BIN), "serve", "--warm", "path-agent", "--json", "--drain-seconds", "5"],
        env=host_state.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        assert json.loads(serve.stdout.readline())["socket"] == str(default_socket)
        outputs["serve"] = run()
        outputs["no-serve"] = run("--no-serve")
        human = cli(host_state.env, *request[:-1])
        assert human.returncode == 0 and "on the serve host" in human.stderr, human.stderr
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, err
    # A host that died leaves its socket: nothing accepts on it, so the run happens here.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(default_socket))
    stale.close()
    outputs["stale"] = run()

    assert {name: out["path"] for name, out in outputs.items()} == {
        "local": "local", "serve": "serve", "no-serve": "local", "stale": "local"
    }  # fmt: skip
    # Every path answers with all of the agent's output, the serve host's warm run too: it waits for the
    # wrapper's end-of-output marks, not for the container's end.
    same = [{k: v for k, v in out.items() if k not in VARYING} for out in outputs.values()]
    assert same[0]["result"] == {"goal": "where am I", "n": 7} and all(s == same[0] for s in same), same
    assert outputs["local"]["logs"] != "" and "agentnode:end-of-output" not in outputs["local"]["logs"]
    ours = {out["run_id"] for out in outputs.values()}
    records = [r for r in host_state.audit() if r["run_id"] in ours]  # (the human-mode run's aside)
    assert len(ours) == 4 and {r["run_id"] for r in records} == ours and len(records) == 4
    fixed = [{k: v for k, v in r.items() if k not in AUDIT_VARYING} for r in records]
    assert fixed[0]["caller"] == {"tenant": "acme", "request_id": "req-19", "labels": {"team": "blue"}}
    assert all(f == fixed[0] for f in fixed), fixed


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to one thread of another process (Linux tgkill), as the kernel may deliver a SIGTERM."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[platform.machine()]


@pytest.mark.parametrize("which", [0, -1])
def test_serve_stops_on_sigterm_whichever_thread_gets_it(host_state: HostState, which: int) -> None:
    """A process-directed SIGTERM lands on any thread not blocking it; serve must stop whichever it was."""
    sock = host_state.root / "admin.sock"
    serve = subprocess.Popen(
        [str(BIN), "serve", "--socket", str(sock), "--json", "--drain-seconds", "1"],
        env=host_state.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        json.loads(serve.stdout.readline())  # ready: its gRPC and engine threads are running
        tids = sorted(int(t) for t in os.listdir(f"/proc/{serve.pid}/task") if int(t) != serve.pid)
        assert tids, "serve runs threads besides its main one"
        _tgkill(serve.pid, tids[which], signal.SIGTERM)  # the oldest or the newest thread but the main one
        _, err = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()
    assert serve.returncode == 0, err
    assert not sock.exists()


def test_run_via_a_socket_nobody_serves(host_state: HostState) -> None:
    proc = cli(host_state.env, "run", "anything", "--via", host_state.root / "nobody.sock", "--json")
    assert proc.returncode == 1
    out = json_out(proc)
    assert out["success"] is False and "serve" in (out["hint"] or "")


def test_pack_and_inspection_commands_run_on_the_serve_host_via_its_socket(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    pack = make_agent("remote-agent", """
        def run(context, **kwargs):
            return "ok"
    """)  # fmt: skip
    sock = host_state.root / "admin.sock"
    serve = subprocess.Popen(
        [str(BIN), "serve", "--socket", str(sock), "--json", "--drain-seconds", "5"],
        env=host_state.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The client has a config of its own, empty: whatever it sees came from the host's.
    elsewhere = {**host_state.env, "AGENTNODE_CONFIG": str(tmp_path / "client-config")}
    try:
        assert serve.stdout is not None and json.loads(serve.stdout.readline())["socket"] == str(sock)
        installed = cli(elsewhere, "install", str(pack), "--via", str(sock), "--json")
        assert installed.returncode == 0, installed.stderr
        entry = json_out(installed)
        check_schema("install", entry)
        assert entry["slug"] == "remote-agent" and entry["sandbox_volume"]
        listed = json_out(cli(elsewhere, "list", "--json", "--via", str(sock)))
        assert [row["slug"] for row in listed] == ["remote-agent"]
        assert json_out(cli(elsewhere, "list", "--json")) == []  # the client's own lockfile is untouched
        explained = cli(elsewhere, "policy", "explain", "remote-agent", "--json", "--via", str(sock))
        assert explained.returncode == 0 and json_out(explained)["slug"] == "remote-agent"
        doctor = cli(elsewhere, "doctor", "remote-agent", "--json", "--via", str(sock))
        report = json_out(doctor)
        check_schema("doctor", report)
        assert doctor.returncode == 0 and report["ready"] is True
        ran = json_out(cli(elsewhere, "run", "remote-agent", "--json", "--via", str(sock)))
        assert ran["success"] is True and ran["result"] == "ok"
        gone = cli(elsewhere, "uninstall", "remote-agent", "--json", "--via", str(sock))
        assert gone.returncode == 0 and json_out(gone)["slug"] == "remote-agent"
        refused = cli(elsewhere, "uninstall", "remote-agent", "--via", str(sock))
        assert refused.returncode == 1 and refused.stderr.startswith("error: ")
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, err
    assert [r["reason"] for r in host_state.audit()] == ["agent_completed"]
    # Uninstalled while the host's warm members used its volume: the host drops it once they are gone.
    assert [v.name for v in docker_client.volumes.list(filters={"name": entry["sandbox_volume"]})] == []
