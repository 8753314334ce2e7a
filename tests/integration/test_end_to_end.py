"""The main job end to end: the example agent, sandboxed, calling a host toolpack and the brokered LLM."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from host.audit.verify import verify_audit
from tests.support.fake_llm import FakeLlmServer
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = [pytest.mark.docker, pytest.mark.podman]

CANARY = "sk-canary-e2e-5f1d2c3b4a"


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


def test_example_agent_runs_sandboxed_end_to_end(
    host_state: HostState, fake_llm: FakeLlmServer, runtime: str
) -> None:
    host_state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=fake_llm.base_url_openai)
    host_state.install(REPO / "examples" / "word-tools", trust="trusted")
    entry = host_state.install(REPO / "examples" / "hello-agent", trust="unverified")
    assert entry.sandbox_volume and entry.host_path is None

    host = host_state.host()
    try:
        result = host.run("hello-agent", goal="count these five words please", runtime=runtime)
    finally:
        host.close()

    assert result.success, (result.error_code, result.error, result.logs)
    assert result.mode_used == "agent_sandbox"
    out = result.result
    assert out["run_id"] == result.run_id
    assert out["word_count"] == 5
    assert out["greeting"]  # the fake provider's reply crossed back through the broker
    assert out["refusals"] == []
    # The provider saw the key host-side; the agent, its output and the audit never did.
    assert len(fake_llm.requests) == 1
    assert CANARY in json.dumps(dict(fake_llm.requests[0].headers))
    assert CANARY not in json.dumps(out) and CANARY not in result.logs

    audit = host_state.audit()
    assert len(audit) == 1
    rec = audit[0]
    assert rec["event"] == "agent_run" and rec["action"] == "allow" and rec["reason"] == "agent_completed"
    assert rec["source"] == "agent_sandbox" and rec["sandbox"] is True and rec["runtime"] == runtime
    assert rec["run_id"] == result.run_id and rec["tool_calls"] == 1 and rec["llm"]["ok"] == 1
    assert CANARY not in json.dumps(rec) and "count these five words" not in json.dumps(rec)
    assert verify_audit(host_state.dir / "audit.jsonl").ok


def test_timeout_kills_and_removes_container(
    host_state: HostState, make_agent, runtime: str, docker_client
) -> None:
    agent = make_agent(
        "stubborn",
        """
        import signal, time
        def run(context, **kwargs):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            while True:
                time.sleep(1)
    """,
        extra="limits:\n  max_runtime_seconds: 3\n",
    )
    host_state.install(agent)
    bystander = docker_client.containers.run(
        host_state.image,
        ["-c", "import time; time.sleep(60)"],
        entrypoint=["/usr/bin/python3"],
        detach=True,
        network_mode="none",
        labels={"test": "bystander"},
    )
    try:
        host = host_state.host()
        try:
            result = host.run("stubborn", runtime=runtime)
        finally:
            host.close()
        assert result.timed_out is True and result.error_code == "timeout" and not result.success
        assert result.duration_ms < 20_000
        name = f"agentnode-run-{result.run_id[:20]}"
        assert docker_client.containers.list(all=True, filters={"name": name}) == []
        assert (
            docker_client.containers.list(
                all=True, filters={"label": f"io.agentnode.sandbox.run-id={result.run_id}"}
            )
            == []
        )
        bystander.reload()
        assert bystander.status == "running"
        rec = host_state.audit()[-1]
        assert rec["reason"] == "timeout" and rec["timed_out"] is True and rec["run_id"] == result.run_id
    finally:
        bystander.remove(force=True)
