"""Host-side faults: each must fail closed, with its own reason, one audit record and nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
import docker.errors
import pytest

from host.core.errors import AUDIT_REASONS
from host.engine.labels import LABEL_RUN
from host.runtime.runner import RunResult
from tests.hostile.conftest import Lab, Ledger, brief, host_subprocess
from tests.support.fake_llm import Behaviour

pytestmark = [pytest.mark.docker, pytest.mark.podman]

MIDCALL = r"""
import threading, time

def run(context, mode="nap", **kwargs):
    if mode == "oom":
        nap = lambda: context.run_tool("hostile-tools", "nap", seconds=8)
        threading.Thread(target=nap, daemon=True).start()
        time.sleep(1)
        hoard = []
        while True:
            block = bytearray(64 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            hoard.append(block)
    if mode == "between":
        context.run_tool("hostile-tools", "count")
        time.sleep(4)  # between calls: the host loses the run's socket directory now
        second = context.run_tool("hostile-tools", "count")
        return {"second_call": second.success}
    if mode == "sleep":
        time.sleep(90)
    context.run_tool("hostile-tools", "nap", seconds=20)
    return "survived"
"""

TOOL_FAULTS = r"""
import time

def run(context, **kwargs):
    out = {}
    # A success between the failures keeps the pack's circuit breaker (3 failures in a row) closed.
    calls = (("boom", "boom", {}), ("nap", "nap", {"seconds": 30}), ("between", "count", {}),
             ("crash", "crash", {}), ("count", "count", {}))
    for key, name, args in calls:
        started = time.monotonic()
        r = context.run_tool("hostile-tools", name, **args)
        out[key] = {"success": r.success, "error": r.error, "elapsed": round(time.monotonic() - started, 1)}
    return out
"""

PROVIDER_FAULTS = r"""
import time

def run(context, **kwargs):
    out = []
    for _ in range(5):
        started = time.monotonic()
        try:
            context.call_llm("hello")
            out.append({"ok": True})
        except Exception as exc:
            out.append({"ok": False, "type": type(exc).__name__, "reason": getattr(exc, "reason", ""),
                        "elapsed": round(time.monotonic() - started, 1)})
    return out
"""

HOST_PROCESS = """
import json, sys
from host.runtime.runner import SandboxHost
host = SandboxHost(env=json.loads(sys.argv[1]))
print("host up", flush=True)
host.run(sys.argv[2], runtime=sys.argv[3], kwargs={"mode": "sleep"})
"""


def _in_background(fn: Callable[[], RunResult]) -> tuple[threading.Thread, dict[str, RunResult]]:
    box: dict[str, RunResult] = {}
    thread = threading.Thread(target=lambda: box.update(result=fn()))
    thread.start()
    return thread, box


def _gone(client: docker.DockerClient, *refs: str) -> bool:
    for ref in refs:
        try:
            client.containers.get(ref)
        except docker.errors.NotFound:
            continue
        return False
    return True


def _live(lab: Lab, slug: str) -> dict[str, int]:
    """The run's debris while it is live, as the leftover probes of `_closed` see it (their control)."""
    return {"run_dirs": len(lab.live_run_dirs()), "containers": len(lab.containers(slug))}


def _closed(
    lab: Lab, result: RunResult, slug: str, reason: str, live: dict[str, int]
) -> tuple[bool, dict[str, Any]]:
    """Whether one run failed closed with `reason`: its code, its one audit record, nothing left behind.

    `live` is what the same probes saw while the run was live (one run dir, one container): without it,
    "nothing left" could come from probes that never see anything.
    """
    audit = [r["reason"] for r in lab.audit() if r["run_id"] == result.run_id]
    left = lab.run_dirs() + [c.name for c in lab.containers(slug)]
    facts = {"code": result.error_code or "completed", "audit": audit, "left": left, "seen_live": live}
    seen = live == {"run_dirs": 1, "containers": 1}
    closed = not result.success and result.error_code == reason and audit == [reason] and not left
    return closed and seen, facts


@pytest.mark.parametrize("how", ["kill", "remove"])
def test_container_killed_or_removed_mid_call(lab: Lab, ledger: Ledger, how: str) -> None:
    """What the host sees when the engine restarts: the container dies (or vanishes) under a live call."""
    lab.agent("midcall", MIDCALL)
    thread, box = _in_background(lambda: lab.run("midcall"))
    lab.wait_for_tool("nap")
    container = lab.wait_for_container("midcall")
    live = _live(lab, "midcall")
    struck = time.monotonic()
    if how == "kill":
        container.kill()
    else:
        lab.client.api.remove_container(container.id, force=True)
    thread.join()
    ended_after = round(time.monotonic() - struck, 1)
    result = box["result"]
    closed, facts = _closed(lab, result, "midcall", "exited_before_result", live)
    ledger.fault(
        f"fault.container_{'killed' if how == 'kill' else 'removed'}_mid_call",
        expected="exited_before_result well before the 20 s tool call ends; one audit record with that "
        "reason; nothing left",
        observed=brief({**facts, "run_ended_s_after_fault": ended_after}),
        ok=closed and ended_after < 15,
    )


def test_container_oom_killed_mid_call(lab: Lab, ledger: Ledger) -> None:
    lab.agent("midcall", MIDCALL)
    thread, box = _in_background(lambda: lab.run("midcall", kwargs={"mode": "oom"}))
    lab.wait_for_container("midcall")  # the agent hoards only a second after its tool call starts
    live = _live(lab, "midcall")
    thread.join()
    result = box["result"]
    closed, facts = _closed(lab, result, "midcall", "oom_killed", live)
    ledger.fault(
        "fault.oom_killed_mid_call",
        expected="oom_killed while a tool call is in flight; one audit record; nothing left",
        observed=brief(facts),
        ok=closed,
    )


def test_tool_raising_hanging_or_crashing(lab: Lab, ledger: Ledger, short_tool_timeout: float) -> None:
    lab.agent("tool-faults", TOOL_FAULTS)
    result = lab.run("tool-faults")
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result
    record = lab.audit()[-1]
    continued = out["between"]["success"] and out["count"]["success"] and record["tool_calls"] == 5
    ledger.fault(
        "fault.tool_raises",
        expected="the call fails with 'tool raised ValueError' (no exception text); the run continues",
        observed=brief(out["boom"]),
        ok=not out["boom"]["success"] and out["boom"]["error"] == "tool raised ValueError" and continued,
    )
    ledger.fault(
        "fault.tool_hangs",
        expected=f"the call fails as timed out after {short_tool_timeout:.0f} s; the run continues",
        observed=brief(out["nap"]),
        ok=not out["nap"]["success"]
        and "timed out" in out["nap"]["error"]
        and out["nap"]["elapsed"] < short_tool_timeout + 4
        and continued,
    )
    ledger.fault(
        "fault.tool_crashes_worker",
        expected="the call fails as 'tool worker crashed'; the next call works on a fresh worker",
        observed=brief({"crash": out["crash"], "next": out["count"]}),
        ok=not out["crash"]["success"] and out["crash"]["error"] == "tool worker crashed" and continued,
    )


def test_provider_errors_garbage_and_hang(lab: Lab, ledger: Ledger) -> None:
    lab.llm.script(  # a 503 is retried by the broker: 3 attempts
        Behaviour(status=400), *[Behaviour(status=503)] * 3, Behaviour(garbage=True), Behaviour(hang=True)
    )
    lab.agent("provider-faults", PROVIDER_FAULTS, llm_calls=5)
    result = lab.run("provider-faults")
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    calls = result.result
    llm = lab.audit()[-1]["llm"] or {}
    continued = calls[4] == {"ok": True} and llm.get("provider_errors") == 4
    for (name, expected_reason), call in zip(
        (
            ("4xx", "LLM_UNAVAILABLE"),
            ("5xx", "LLM_UNAVAILABLE"),
            ("garbage", "LLM_UNAVAILABLE"),
            ("hang", "LLM_TIMEOUT"),
        ),
        calls[:4],
        strict=True,
    ):
        ledger.fault(
            f"fault.provider_{name}",
            expected=f"LlmAccessError reason {expected_reason}, no provider text; the run continues",
            observed=brief({**call, "provider_errors_audited": llm.get("provider_errors")}),
            ok=not call["ok"]
            and call["reason"] == expected_reason
            and continued
            and (name != "hang" or call["elapsed"] < 4),
        )


def test_socket_dir_removed_between_calls(lab: Lab, ledger: Ledger) -> None:
    lab.agent("midcall", MIDCALL)
    thread, box = _in_background(lambda: lab.run("midcall", kwargs={"mode": "between"}))
    lab.wait_for_tool("count")
    time.sleep(0.5)  # the first call has returned; the agent sleeps before its next one
    removed = lab.live_run_dirs()
    for path in removed:
        shutil.rmtree(path)
    thread.join()
    result = box["result"]
    records = [r for r in lab.audit() if r["run_id"] == result.run_id]
    ledger.fault(
        "fault.socket_dir_removed",
        expected="the run fails closed with a named reason and one audit record; nothing left behind",
        observed=brief(
            {
                "removed": len(removed),
                "code": result.error_code or "completed",
                "result": result.result,
                "audit": [r["reason"] for r in records],
                "second_call_reached_host": len(lab.tool_calls("count")) > 1,
                "left": lab.run_dirs() + [c.name for c in lab.containers("midcall")],
            }
        ),
        ok=len(removed) == 1
        and not result.success
        and result.error_code in AUDIT_REASONS
        and [r["reason"] for r in records] == [result.error_code]
        and not lab.run_dirs()
        and not lab.containers("midcall"),
    )


def test_audit_file_unwritable(lab: Lab, ledger: Ledger) -> None:
    lab.agent("plain", "def run(context, **kwargs):\n    return 'done'\n")
    audit_file = lab.state.dir / "audit.jsonl"
    audit_file.mkdir()  # an unwritable audit file: appending to a directory fails for root too
    host = lab.host()
    first = lab.run("plain", host=host)
    failures = host.audit_failures
    audit_file.rmdir()
    second = lab.run("plain", host=host)
    ledger.fault(
        "fault.audit_unwritable",
        expected="no start record, no run: the agent never starts, the reply fails loudly (audit_failed, "
        "with a hint) and the failure is counted; once the log is writable the refused run's end record "
        "goes in first (nothing lost), then the next run's",
        observed=brief(
            {
                "first": [first.success, first.error_code, "started" in first.stages],
                "audit_failures": failures,
                "second": [second.success, second.result],
                "audited_after": [r["run_id"][:8] for r in lab.audit()],
            }
        ),
        ok=not first.success
        and first.error_code == "audit_failed"
        and "audit verify" in first.hint
        and "started" not in first.stages
        and failures == 1
        and second.success
        and host.audit_failures == 1
        and [r["run_id"] for r in lab.audit()] == [first.run_id, second.run_id],
    )


def test_host_killed_mid_run_then_swept(lab: Lab, ledger: Ledger, docker_client: docker.DockerClient) -> None:
    lab.agent("orphan", MIDCALL, max_runtime_seconds=120)
    proc = host_subprocess(HOST_PROCESS, json.dumps(lab.state.env), "orphan", lab.runtime)
    container = None
    try:
        container = lab.wait_for_container("orphan", all_owners=True)
        run_id = container.labels[LABEL_RUN]
        deadline = time.monotonic() + 30
        while not lab.live_run_dirs() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        container.reload()
        orphaned = {"container": container.status, "run_dirs": len(lab.live_run_dirs())}
        assert orphaned == {"container": "running", "run_dirs": 1}, orphaned  # the fault really left debris
        swept = lab.host().startup_sweep()
        records = [r for r in lab.audit() if r["run_id"] == run_id]
        ledger.fault(
            "fault.host_killed_and_restarted",
            expected="a restarted host's startup_sweep removes the orphaned container (by id and name) and "
            "run dir, and the interrupted run gets one audit record with a named reason",
            observed=brief(
                {
                    "orphaned": orphaned,
                    "swept": len(swept),
                    "container_gone": _gone(docker_client, container.id, container.name),
                    "run_dirs_left": lab.run_dirs(),
                    "audit": [r["reason"] for r in records],
                }
            ),
            ok=_gone(docker_client, container.id, container.name)
            and not lab.run_dirs()
            and len(records) == 1
            and records[0]["reason"] in AUDIT_REASONS
            and records[0]["reason"] != "agent_completed",
        )
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        if container is not None and not _gone(docker_client, container.id):
            docker_client.api.remove_container(container.id, force=True)
