"""Run isolation and deadlines: another run's socket is out of reach, and no agent outlives its deadline."""

from __future__ import annotations

import threading
from typing import Any

import docker
import docker.errors
import pytest

from host.runtime.runner import RunResult
from tests.hostile.conftest import Lab, Ledger, brief

pytestmark = [pytest.mark.docker, pytest.mark.podman]

VICTIM = r"""
import time

def run(context, **kwargs):
    context.run_tool("hostile-tools", "nap", seconds=0.1)  # tells the test this run is live
    time.sleep(6)
    return {"victim": "done", "tool_calls": context.tool_calls_made}
"""

INTRUDER = r"""
import errno, os, random, socket

def probe(path):
    info = {"exists": os.path.exists(path)}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
        info["connected"] = True
    except OSError as exc:
        info["connected"] = False
        info["error"] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    finally:
        s.close()
    return info

CONTROL = "/tmp/control.sock"

def run(context, victim_run_id, victim_host_dir, **kwargs):
    out = {"own_socket_dir": sorted(os.listdir("/run/agentnode")), "run": sorted(os.listdir("/run"))}
    # The control: a socket of the agent's own, which the same probes must find, reach and list.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(CONTROL)
    listener.listen(4)
    out["control"] = {"path": CONTROL, "probe": probe(CONTROL),
                      "guess_hits": sum(os.path.exists(p) for p in ("/run/agentnode/sandbox.sock", CONTROL))}
    paths = [f"/run/agentnode-sandbox/run-{victim_run_id}/sandbox.sock", f"{victim_host_dir}/sandbox.sock",
             f"/run/agentnode/../agentnode-sandbox/run-{victim_run_id}/sandbox.sock",
             f"/proc/1/root{victim_host_dir}/sandbox.sock"]
    out["known_paths"] = {p: probe(p) for p in paths}
    hits = 0
    for _ in range(2000):
        guess = f"/run/agentnode-sandbox/run-{random.getrandbits(128):032x}/sandbox.sock"
        hits += os.path.exists(guess)
    out["brute_force_hits"] = hits
    rows = [line.split() for line in open("/proc/net/unix").read().splitlines()[1:]]
    named = [row[-1] for row in rows if len(row) > 7]
    out["named_unix_sockets"] = sorted(set(named))
    out["own_run_id"] = context.run_id
    listener.close()
    return out
"""

STUBBORN = r"""
import os, signal, time

def run(context, **kwargs):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.fork() == 0:  # a detached child in its own session, deaf to SIGTERM too
        os.setsid()
        while True:
            time.sleep(1)
    while True:
        try:
            time.sleep(1)
        except BaseException:
            pass
"""

SILENT = r"""
import time

def run(context, **kwargs):
    time.sleep(120)
"""


def test_another_runs_socket_is_unreachable(lab: Lab, ledger: Ledger) -> None:
    lab.agent("victim", VICTIM)
    lab.agent("intruder", INTRUDER)
    host = lab.host()
    results: dict[str, RunResult] = {}
    victim = threading.Thread(target=lambda: results.update(victim=lab.run("victim", host=host)))
    victim.start()
    try:
        lab.wait_for_tool("nap")
        dirs = lab.live_run_dirs()
        assert len(dirs) == 1, dirs
        victim_dir = dirs[0]
        results["intruder"] = lab.run(
            "intruder",
            host=host,
            kwargs={
                "victim_run_id": victim_dir.name.removeprefix("run-"),
                "victim_host_dir": str(victim_dir),
            },
        )
    finally:
        victim.join()
    intruder, victim_result = results["intruder"], results["victim"]
    assert intruder.success, (intruder.error_code, intruder.error, intruder.logs[-2000:])
    out = intruder.result
    control = out["control"]
    audit = {r["slug"]: r for r in lab.audit()}
    reached = {p: v for p, v in out["known_paths"].items() if v["exists"] or v["connected"]}
    ledger.attack(
        "xrun.known_socket_path",
        expected="even knowing the victim's run id and host path, its socket neither exists nor connects "
        "(the same probe finds and connects to a socket of the agent's own)",
        observed=brief(
            {"reachable": reached, "own_socket_dir": out["own_socket_dir"], "control": control["probe"]}
        ),
        ok=not reached
        and set(out["own_socket_dir"]) <= {"sandbox.sock", "owner"}
        and control["probe"] == {"exists": True, "connected": True},
    )
    ledger.attack(
        "xrun.brute_force_paths",
        expected="2000 guessed /run/agentnode-sandbox/run-* paths: none exists (the root is not mounted); "
        "the same test finds the agent's own two sockets",
        observed=brief(
            {"hits": out["brute_force_hits"], "/run": out["run"], "control_hits": control["guess_hits"]}
        ),
        ok=out["brute_force_hits"] == 0
        and "agentnode-sandbox" not in out["run"]
        and control["guess_hits"] == 2,
    )
    # Under runc, /proc/net/unix shows the host path of the agent's own socket (the accepted end of its own
    # connection lives in its network namespace); it must never show another run's. The agent's control
    # socket must be listed: the table is read and parsed, so an empty list is evidence.
    named = out["named_unix_sockets"]
    foreign = [
        s for s in named if out["own_run_id"] not in s and "/run/agentnode/" not in s and s != control["path"]
    ]
    ledger.attack(
        "xrun.socket_table",
        expected="/proc/net/unix lists no socket of another run (at most the agent's own), and does list the "
        "agent's control socket",
        observed=brief({"named_unix_sockets": named, "foreign": foreign}),
        ok=not foreign and not any(victim_dir.name in s for s in named) and control["path"] in named,
    )
    ledger.attack(
        "xrun.victim_undisturbed",
        expected="the victim completes normally; its audit shows only its own single tool call",
        observed=brief(
            {
                "victim": victim_result.result if victim_result.success else victim_result.error_code,
                "victim_audit_tool_calls": audit["victim"]["tool_calls"],
            }
        ),
        ok=victim_result.success and audit["victim"]["tool_calls"] == 1,
    )


def test_sigterm_ignoring_agent_dies_at_deadline(
    lab: Lab, ledger: Ledger, docker_client: docker.DockerClient
) -> None:
    lab.agent("stubborn", STUBBORN, max_runtime_seconds=4)
    seen: dict[str, Any] = {}

    def capture() -> None:
        c = lab.wait_for_container("stubborn")
        seen.update(id=c.id, name=c.name)

    spy = threading.Thread(target=capture)
    spy.start()
    result = lab.run("stubborn")
    spy.join()
    gone = []
    for ref in (seen["id"], seen["name"]):
        try:
            docker_client.containers.get(ref)
        except docker.errors.NotFound:
            gone.append(ref)
    record = lab.audit()[-1]
    ledger.attack(
        "deadline.ignore_sigterm",
        expected="at max_runtime_seconds (4 s) the run is timed_out and the container is gone by id and name",
        observed=brief(
            {
                "code": result.error_code,
                "timed_out": result.timed_out,
                "duration_s": round(result.duration_ms / 1000, 1),
                "gone_by": len(gone),
                "audit": [record["reason"], record["timed_out"]],
            }
        ),
        ok=result.timed_out
        and result.error_code == "timeout"
        and result.duration_ms < 20_000
        and len(gone) == 2
        and record["reason"] == "timeout"
        and record["timed_out"] is True,
    )


def test_silent_agent_hits_idle_limit(lab: Lab, ledger: Ledger) -> None:
    lab.configure(idle_timeout_seconds=3)
    lab.agent("silent", SILENT, max_runtime_seconds=120)
    result = lab.run("silent")
    ledger.attack(
        "deadline.idle_without_calls",
        expected="an agent making no call for idle_timeout_seconds (3 s) is killed as timed out",
        observed=brief(
            {
                "code": result.error_code,
                "timed_out": result.timed_out,
                "duration_s": round(result.duration_ms / 1000, 1),
                "error": result.error,
            }
        ),
        ok=result.error_code == "timeout" and result.timed_out and result.duration_ms < 20_000,
    )
