"""64 sandboxed runs at once through one host: each succeeds and leaves one intact, chained audit line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest

from host.audit.verify import verify_audit
from host.core.owner import owner_token
from host.engine.labels import LABEL_OWNER
from host.runtime.runner import RunResult
from tests.support.fake_llm import Behaviour, FakeLlmServer
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

RUNS = 64
CANARY = "sk-canary-concurrency-41d2a9"

TRIVIAL = """
def run(context, n=0, **kwargs):
    return {"n": n, "run_id": context.run_id}
"""

BUSY = """
def run(context, n=0, **kwargs):
    counted = context.run_tool("word-tools", "count_words", text="one two three")
    reply = context.call_llm_text("hello %d" % n)
    return {"n": n, "run_id": context.run_id, "count": counted.result["count"], "reply": reply}
"""


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


def test_64_concurrent_runs_each_succeed_with_one_verified_audit_line(
    host_state: HostState,
    make_agent: Callable[..., Path],
    fake_llm: FakeLlmServer,
    docker_client: docker.DockerClient,
    runtime: str,
) -> None:
    fake_llm.default = Behaviour(text="hi", delay=0.2)
    host_state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=fake_llm.base_url_openai)
    # Generous budgets: 64 interpreters start on a 2-core box, so a run may wait long for its first call.
    host_state.write_config({"idle_timeout_seconds": 120})
    host_state.install(REPO / "examples" / "word-tools", trust="trusted")
    host_state.install(make_agent("trivial", TRIVIAL, extra="limits:\n  max_runtime_seconds: 120\n"))
    host_state.install(
        make_agent(
            "busy",
            BUSY,
            extra="limits:\n  max_runtime_seconds: 120\ntool_access:\n  allowed_packages: [word-tools]\n"
            "llm_access:\n  enabled: true\n",
        )
    )
    slugs = ["busy" if n % 8 == 0 else "trivial" for n in range(RUNS)]  # 8 busy, 56 trivial

    host = host_state.host()
    try:
        with ThreadPoolExecutor(max_workers=RUNS) as pool:
            results: list[RunResult] = list(
                pool.map(lambda n: host.run(slugs[n], kwargs={"n": n}, runtime=runtime), range(RUNS))
            )
    finally:
        host.close()

    failures = [(r.error_code, r.error, r.logs[-500:]) for r in results if not r.success]
    assert not failures, failures
    assert all(r.mode_used == "agent_sandbox" for r in results)
    for n, r in enumerate(results):
        assert r.result["n"] == n and r.result["run_id"] == r.run_id
        if slugs[n] == "busy":
            assert r.result["count"] == 3 and r.result["reply"] == "hi"
    assert len(fake_llm.requests) == slugs.count("busy")

    lines = (host_state.dir / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 2 * RUNS  # a start and an end record per run
    everything = [json.loads(line) for line in lines]
    records = [r for r in everything if r["event"] == "agent_run"]
    starts = [r for r in everything if r["event"] == "agent_run_start"]
    assert {r["run_id"] for r in starts} == {r["run_id"] for r in records}
    assert {r["run_id"] for r in records} == {r.run_id for r in results}
    assert len({r.run_id for r in results}) == RUNS
    assert all(r["action"] == "allow" and r["reason"] == "agent_completed" for r in records)
    assert all(r["sandbox"] is True and r["runtime"] == runtime for r in records)
    report = verify_audit(host_state.dir / "audit.jsonl")
    assert report.ok and report.records == 2 * RUNS and not report.open_runs, report.problems
    assert CANARY not in "\n".join(lines)

    leftovers = docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner_token()}"})
    assert leftovers == []
