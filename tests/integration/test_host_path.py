"""Trusted agents on the host path: a local process with the same wrapper and services, no key, timed."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from host.audit.verify import verify_audit
from tests.support.fake_llm import FakeLlmServer
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

CANARY = "sk-canary-host-path-9e8d7c"

AGENT = """
import os

def run(context, **kwargs):
    tool = context.run_tool("word-tools", "count_words", text="one two three four")
    replies = [context.call_llm_text("hello %d" % i) for i in range(3)]
    return {
        "pid": os.getpid(),
        "env": dict(os.environ),
        "tool": {"success": tool.success, "result": tool.result, "mode_used": tool.mode_used},
        "replies": replies,
        "tool_calls_made": context.tool_calls_made,
    }
"""

STUBBORN = """
import os, signal, subprocess, time

def run(context, pid_file=None, **kwargs):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "300"])
    with open(pid_file, "w") as fh:
        fh.write("%d %d" % (os.getpid(), child.pid))
    while True:
        time.sleep(1)
"""


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone: it runs no code)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_trusted_agent_runs_as_a_local_process_with_the_same_services(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer
) -> None:
    host_state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=fake_llm.base_url_openai)
    host_state.install(REPO / "examples" / "word-tools", trust="trusted")
    # A tiny llm_access block: the host path applies no llm_access caps, so three calls still work.
    host_state.install(
        make_agent(
            "local",
            AGENT,
            extra="tool_access:\n  allowed_packages: [word-tools]\n"
            "llm_access:\n  enabled: true\n  max_calls: 1\n",
        ),
        trust="trusted",
    )
    host = host_state.host()
    try:
        result = host.run("local")
    finally:
        host.close()

    assert result.success, (result.error_code, result.error, result.logs)
    assert result.mode_used == "agent_host"
    out = result.result
    assert out["pid"] != os.getpid()
    assert out["tool"] == {"success": True, "result": {"count": 4}, "mode_used": "host_worker"}
    assert out["replies"] == ["fake reply"] * 3 and out["tool_calls_made"] == 1
    assert len(fake_llm.requests) == 3
    assert all(r.headers["authorization"] == f"Bearer {CANARY}" for r in fake_llm.requests)
    # The agent's process holds no key: the broker on the host made the calls.
    env = out["env"]
    assert CANARY not in json.dumps(env) and CANARY not in result.logs
    assert not any(k.endswith(("_API_KEY", "_BASE_URL")) for k in env)
    assert "AGENTNODE_SOCKET" in env

    (rec,) = host_state.audit()
    assert rec["source"] == "agent_host" and rec["sandbox"] is False and rec["reason"] == "agent_completed"
    assert rec["run_id"] == result.run_id and rec["tool_calls"] == 1
    assert rec["llm"]["ok"] == 3 and rec["llm"]["calls"] == 3
    assert CANARY not in json.dumps(rec)
    assert verify_audit(host_state.dir / "audit.jsonl").ok


def test_community_toolpack_is_refused_on_the_host_path_while_the_sandbox_is_off(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    """A host-path run calls community tool packs in tool sandboxes only (tests/integration/
    test_tool_sandbox.py); with the sandbox off there is none, and the call is refused."""
    host_state.env["AGENTNODE_AGENT_SANDBOX"] = "0"
    host_state.install(REPO / "examples" / "word-tools", trust="verified")
    host_state.install(
        make_agent(
            "local",
            """
            def run(context, **kwargs):
                try:
                    context.run_tool("word-tools", "count_words", text="a b")
                except PermissionError as exc:
                    return str(exc)
                return "ran"
            """,
            extra="tool_access:\n  allowed_packages: [word-tools]\n",
        ),
        trust="curated",
    )
    host = host_state.host()
    try:
        result = host.run("local")
    finally:
        host.close()
    assert result.success and result.mode_used == "agent_host", (result.error_code, result.error)
    assert result.result.startswith("TOOL_PACK_UNTRUSTED:")
    assert host_state.audit()[0]["tool_refusals"] == 1


def test_timeout_kills_the_host_process_and_its_children(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    host_state.install(
        make_agent("stubborn", STUBBORN, extra="limits:\n  max_runtime_seconds: 3\n"), trust="trusted"
    )
    host = host_state.host()
    started = time.monotonic()
    try:
        result = host.run("stubborn", kwargs={"pid_file": str(pid_file)})
    finally:
        host.close()
    assert time.monotonic() - started < 20
    assert result.timed_out and result.error_code == "timeout" and result.mode_used == "agent_host"
    agent_pid, child_pid = map(int, pid_file.read_text().split())
    assert agent_pid != os.getpid()
    deadline = time.monotonic() + 5  # the orphaned child is reaped by init, asynchronously
    while (_alive(agent_pid) or _alive(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(agent_pid), "the agent process survived its timeout"
    assert not _alive(child_pid), "the agent's child survived the timeout"
    (rec,) = host_state.audit()
    assert rec["reason"] == "timeout" and rec["timed_out"] is True and rec["source"] == "agent_host"
