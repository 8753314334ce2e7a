"""Attacks on the long-running host itself: a connection flood under `serve`, stale pools after uninstall."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import pytest

from host.api.client import RunnerClient
from host.audit.verify import verify_audit
from host.core.errors import ManifestError
from host.engine.labels import LABEL_RUN, LABEL_SLUG
from host.runtime.runner import RunResult
from tests.hostile.conftest import Lab, Ledger, brief
from tests.support.cli import cli, json_out
from tests.support.engine import containers_with
from tests.support.paths import BIN

pytestmark = pytest.mark.docker

SERVE_NOFILE = 2048
"""The serve process's open-file limit in these tests: low enough that an unbounded flood exhausts it."""

FLOODER = r"""
import os, socket, time

def flood(path, seconds, out_fd):
    held, opened, refused = [], 0, 0
    end = time.time() + seconds
    while time.time() < end:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            opened += 1
            held.append(s)
        except OSError:
            refused += 1
            s.close()
            time.sleep(0.001)
        if len(held) >= 200:  # stay under this process's own descriptor limit (256): shed the oldest
            for old in held[:100]:
                old.close()
            del held[:100]
    os.write(out_fd, f"{opened} {refused}\n".encode())

def run(context, **kwargs):
    path = os.environ["AGENTNODE_SOCKET"]
    r, w = os.pipe()
    children = []
    for _ in range(kwargs.get("helpers", 6)):
        pid = os.fork()
        if pid == 0:
            try:
                flood(path, kwargs.get("seconds", 10), w)
            except BaseException as exc:
                os.write(w, f"error {type(exc).__name__}:{exc}\n".encode()[:200])
            finally:
                os._exit(0)
        children.append(pid)
    os.close(w)
    for pid in children:
        os.waitpid(pid, 0)
    with os.fdopen(r) as fh:
        lines = [line.split() for line in fh if line.strip()]
    counts = [tuple(map(int, parts)) for parts in lines if parts[0] != "error"]
    after = context.run_tool("hostile-tools", "echo", ok=True)
    return {
        "helpers_reported": len(counts),
        "errors": [" ".join(parts)[:120] for parts in lines if parts[0] == "error"],
        "connected": sum(c[0] for c in counts),
        "refused": sum(c[1] for c in counts),
        "after_flood_tool_call": after.success,
    }
"""

INNOCENT = """
def run(context, **kwargs):
    results = [context.run_tool("hostile-tools", "echo", n=n).success for n in range(5)]
    return {"tools_ok": all(results), "calls": len(results)}
"""


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


@contextmanager
def _serve(
    lab: Lab, warm: list[str], nofile: int = SERVE_NOFILE
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """`agentnode-sandbox serve` as its own process with a low descriptor limit; SIGTERM on exit."""
    sock = lab.root / "admin.sock"
    env = dict(lab.state.env)
    args = [str(BIN), "serve", "--socket", str(sock), "--json", "--drain-seconds", "5"]
    for slug in warm:
        args += ["--warm", slug]
    # The shell lowers the hard limit too, so serve cannot raise itself out of the test's bound.
    shell = ["/bin/sh", "-c", f'ulimit -n {nofile} && exec "$@"', "serve"]
    proc = subprocess.Popen(
        [*shell, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "serve exited"
        yield proc, sock
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_connection_flood_under_serve_hurts_only_the_flooder(lab: Lab, ledger: Ledger) -> None:
    lab.configure(runtime=lab.runtime, pool={"size": 1})
    lab.agent("flooder", FLOODER, max_runtime_seconds=120)
    lab.agent("innocent", INNOCENT, max_runtime_seconds=120)
    with _serve(lab, warm=["innocent"]) as (proc, sock):
        peak = {"fds": 0}
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                peak["fds"] = max(peak["fds"], _fds(proc.pid))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        baseline = _fds(proc.pid)
        cpu_before = _cpu_seconds(proc.pid)
        flood_results: list[RunResult] = []
        # Two flooders at once ("a few agents together"). Under gVisor each process also costs host
        # threads against the pids limit: fewer, fuller helpers there.
        helpers = 10 if lab.runtime == "runc" else 4

        def attack() -> None:
            with RunnerClient(sock) as client:
                flood_results.append(client.submit("flooder", kwargs={"helpers": helpers, "seconds": 12}))

        attackers = [threading.Thread(target=attack) for _ in range(2)]
        for attacker in attackers:
            attacker.start()
        deadline = time.monotonic() + 120
        while len([c for c in lab.containers("flooder", all_owners=True) if c.status == "running"]) < 2:
            assert time.monotonic() < deadline, "the flooders never started"
            time.sleep(0.1)
        time.sleep(2)  # the flood is on
        during: list[tuple[bool, str, float, bool]] = []
        refilled = False
        for n in range(2):
            t0 = time.monotonic()
            with RunnerClient(sock) as client:  # a fresh admin connection each time
                r = client.submit("innocent")
            during.append((r.success, r.error_code, round(time.monotonic() - t0, 3), r.warm))
            if n == 0:  # the warm pool refills its member while the flood goes on
                # The member this run claimed may still be running while it is torn down (seconds under
                # runsc): only a container of another run is the refill.
                until = time.monotonic() + 60
                while time.monotonic() < until and not refilled:
                    refilled = any(
                        c.status == "running" and c.labels.get(LABEL_RUN) != r.run_id
                        for c in lab.containers("innocent", all_owners=True)
                    )
                    time.sleep(0.1)
                time.sleep(0.5)  # the engine reports it running just before the pool records its start
        for attacker in attackers:
            attacker.join(timeout=180)
        serve_cpu = _cpu_seconds(proc.pid) - cpu_before
        watching.set()
        watcher.join()
        made = sum(f.result.get("connected", 0) for f in flood_results if isinstance(f.result, dict))
        records = {r["run_id"]: r for r in lab.audit()}
        report = verify_audit(lab.state.dir / "audit.jsonl")
    ledger.attack(
        "serve.connection_flood.admin_and_neighbours",
        expected="the admin socket keeps taking runs and an innocent run's tool calls succeed while a run "
        "floods its own socket with bare connections (two such runs at once, each with forked helpers, 10 "
        "under runc and 4 under runsc, each holding up to 200 connections and opening new ones for 12 s); "
        "the warm pool refills meanwhile, so the second innocent run is warm",
        observed=brief(
            {"innocent_runs": during, "pool_refilled": refilled, "serve_cpu_s": round(serve_cpu, 2)}
        ),
        ok=all(ok for ok, _, _, _ in during) and refilled and during[-1][3],  # the second run was warm
    )
    ledger.attack(
        "serve.connection_flood.descriptors_bounded",
        expected=f"the serve process's descriptors stay far from its limit ({SERVE_NOFILE}): each run's "
        "socket holds a bounded number of connections",
        observed=brief(
            {
                "connections_made": made,
                "baseline_fds": baseline,
                "peak_fds": peak["fds"],
                "limit": SERVE_NOFILE,
            }
        ),
        ok=made >= 1000 and 0 < peak["fds"] < SERVE_NOFILE // 2,  # the flood really happened, and was bounded
    )
    ledger.attack(
        "serve.connection_flood.audited",
        expected="each flooder's run ends and is audited (start and end), and audit verify is ok",
        observed=brief(
            {
                "flooders": [[f.success, f.error_code, f.result] for f in flood_results],
                "audited": [f.run_id in records for f in flood_results],
                "verify": [report.ok, report.problems[:2], report.open_runs],
            }
        ),
        ok=len(flood_results) == 2
        and all(f.run_id in records for f in flood_results)
        and report.ok
        and not report.open_runs,
    )


def test_uninstall_and_reinstall_under_serve_drop_pools_and_volumes(
    lab: Lab, ledger: Ledger, docker_client: docker.DockerClient
) -> None:
    lab.configure(runtime=lab.runtime, pool={"size": 2})
    slug = lab.agent("pooled", "def run(context, **kwargs):\n    return 'v1'\n")
    first = lab.state.install(lab.root / "packs" / slug)  # the same pack again: same artifact, same volume
    with _serve(lab, warm=[slug]) as (_, sock):
        _wait_members(docker_client, slug, first.sandbox_volume or "", 2)
        # reinstall a changed version: the old pool and its volume must go, nothing keeps refilling it
        (lab.root / "packs" / slug / "agent.py").write_text("def run(context, **kwargs):\n    return 'v2'\n")
        second = lab.state.install(lab.root / "packs" / slug)
        lab.volumes.add(second.sandbox_volume or "")
        stale = _wait_gone(docker_client, slug, first.sandbox_volume or "", lab)
        with RunnerClient(sock) as client:  # a run of the new version: serve keeps a pool of it now
            ran = client.submit(slug)
        _wait_members(docker_client, slug, second.sandbox_volume or "", 2)
        # uninstall while serve runs: the volume its warm members use is named, then serve drops both
        proc = cli(lab.state.env, "uninstall", slug, "--json")
        out = json_out(proc)
        gone = _wait_gone(docker_client, slug, second.sandbox_volume or "", lab)
        time.sleep(3)  # a few refill ticks: nothing comes back
        refilled = containers_with(docker_client, [f"{LABEL_SLUG}={slug}"])
    ledger.attack(
        "serve.reinstall_drops_stale_pool",
        expected="after a reinstall the old version's warm members are destroyed and its volume removed",
        observed=brief(stale),
        ok=stale["containers"] == 0 and not stale["volume"],
    )
    ledger.attack(
        "serve.uninstall_drops_pool_and_volume",
        expected="after uninstall under serve: no members refilled, the volume is gone (or named as left "
        "over by `uninstall --json`, then dropped by serve)",
        observed=brief(
            {
                "new_version_ran": [ran.success, ran.result],
                "uninstall": {k: out.get(k) for k in ("volume_left_behind", "left_behind_reason")},
                "after": gone,
                "refilled": len(refilled),
            }
        ),
        ok=proc.returncode == 0
        and ran.success
        and ran.result == "v2"
        and out.get("volume_left_behind") == second.sandbox_volume
        and "serve" in (out.get("left_behind_reason") or "")
        and gone["containers"] == 0
        and not gone["volume"]
        and not refilled,
    )


def _wait_members(client: docker.DockerClient, slug: str, volume: str, n: int, timeout: float = 120) -> None:
    """Wait until `n` running containers of `slug` use `volume` (a filled warm pool of that version)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [
            c for c in containers_with(client, [f"{LABEL_SLUG}={slug}"])
            if c.status == "running" and any(m.get("Name") == volume for m in c.attrs.get("Mounts", []))
        ]  # fmt: skip
        if len(running) >= n:
            return
        assert time.monotonic() < deadline, f"the warm pool of {volume} never filled"
        time.sleep(0.2)


def _wait_gone(
    client: docker.DockerClient, slug: str, volume: str, lab: Lab, timeout: float = 60
) -> dict[str, Any]:
    """Wait until no container of `slug` uses `volume` and the volume is gone; report what is left."""
    deadline = time.monotonic() + timeout
    while True:
        containers = [
            c for c in containers_with(client, [f"{LABEL_SLUG}={slug}"])
            if any(m.get("Name") == volume for m in c.attrs.get("Mounts", []))
        ]  # fmt: skip
        names = {v.name for v in client.volumes.list()}
        state = {"containers": len(containers), "volume": volume in names}
        if (not containers and volume not in names) or time.monotonic() > deadline:
            return state
        time.sleep(0.25)



def test_no_run_is_unbounded_by_default(lab: Lab, ledger: Ledger) -> None:
    """A manifest asking for the format's largest runtime (3600 s) runs under the host's default ceiling;
    anything larger (up to the wire's 2**32 - 1 and beyond) is refused at install."""
    source = "def run(context, **kwargs):\n    return 'quick'\n"
    slug = lab.agent("forever", source, max_runtime_seconds=3600)
    result = lab.run(slug)
    starts = [r for r in lab.state.audit_all() if r.get("event") == "agent_run_start"]
    bound = starts[-1].get("max_runtime_seconds") if starts else None
    ledger.attack(
        "limits.default_runtime_ceiling",
        expected="max_runtime_seconds 3600 (the format's largest) in the manifest runs under the host's "
        "default ceiling (3600 s), as the run's own start record shows",
        observed=brief({"result": [result.success, result.result], "run_bound_s": bound}),
        ok=result.success and bound == 3600,
    )
    lab.configure(limits={"max_runtime_seconds": 30})
    lab.run(slug)
    starts = [r for r in lab.state.audit_all() if r.get("event") == "agent_run_start"]
    lowered = starts[-1].get("max_runtime_seconds") if starts else None
    ledger.attack(
        "limits.configured_runtime_ceiling",
        expected="a configured ceiling (30 s) wins over the manifest",
        observed=brief({"run_bound_s": lowered}),
        ok=lowered == 30,
    )
    refused: list[str] = []
    for i, asked in enumerate((3601, 2**32 - 1, 2**32)):
        try:
            lab.agent(f"beyond-{i}", "def run(context, **kwargs):\n    return 1\n", max_runtime_seconds=asked)
        except ManifestError as exc:
            refused.append(exc.message.rpartition("agentnode.yaml: ")[2])
    ledger.attack(
        "limits.runtime_beyond_the_wire",
        expected="max_runtime_seconds above the format's 3600 (3601, 2**32 - 1, and 2**32, which does not "
        "fit uint32) is refused at install, naming the key",
        observed=brief(refused),
        ok=len(refused) == 3 and all("max_runtime_seconds" in r for r in refused),
    )
