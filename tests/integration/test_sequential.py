"""Sequential orchestration agents end to end: real packs installed as the CLI installs them (volumes in the
real engine), runs through the installed command and through SandboxHost, the audit log read back.

A sequential agent runs no pack code, so its run starts no container whatever its trust: these tests hold
that (no container appears while it runs) next to the §5.5 behaviour of a whole run.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.audit.verify import verify_audit
from host.engine.labels import LABEL_OWNER
from host.runtime.pool import PoolSettings
from host.spec.lockfile import Lockfile
from tests.support.cli import cli, json_out
from tests.support.host_state import HostState
from tests.support.paths import REPO
from tests.support.schema import check_schema
from tests.support.step_tools import STEP_TOOLS, STEP_TOOLS_MANIFEST

pytestmark = pytest.mark.docker

EXAMPLES = REPO / "examples"
OWN = "seqtest-"


COUNT = {"name": "count_step", "tool": "word-tools:count_words", "input_mapping": {"text": "$input.text"}}
REVERSE = {"name": "reverse_step", "tool": "word-tools:reverse_words",
           "input_mapping": {"text": "$input.text"}}  # fmt: skip
LOUD = {"name": "loud_step", "tool": "word-tools:reverse_words", "input_mapping": {"text": "$input.text"},
        "when": "$input.loud == true"}  # fmt: skip
COMBINE = {"name": "combine_step", "tool": "step-tools:combine",
           "input_mapping": {"count": "$steps.count_step", "reversed": "$steps.reverse_step"}}  # fmt: skip
FAIL = {"name": "fail_step", "tool": "step-tools:fail"}
SECRET_TEXT = "zebra quokka narwhal"
"""Run input: it reaches the tools and the result, never the audit log."""
PRIVATE = ("count_step", "reverse_step", "loud_step", "combine_step", "fail_step", "zebra", "narwhal",
           "tool-authored", "words, reversed")  # fmt: skip
"""Step names, inputs and tool output: none may appear in an audit record."""


def unique() -> str:
    return f"{OWN}{uuid.uuid4().hex[:10]}"


def write_pack(parent: Path, manifest: dict[str, Any], files: dict[str, str] | None = None) -> Path:
    """A pack directory: the manifest (JSON is YAML) and its files."""
    pack = parent / manifest["package_id"]
    pack.mkdir(parents=True)
    (pack / "agentnode.yaml").write_text(json.dumps(manifest))
    for name, text in (files or {}).items():
        (pack / name).write_text(text)
    return pack


def sequential_agent(parent: Path, steps: list[dict[str, Any]], *, allowed: list[str] | None = None,
                     runtime_s: int = 60) -> tuple[str, Path]:  # fmt: skip
    slug = unique()
    manifest = {
        "package_id": slug,
        "version": "1.0.0",
        "package_type": "agent",
        "agent": {
            "goal": "a pipeline of tool calls",
            "orchestration": {"mode": "sequential", "steps": steps},
            "tool_access": {"allowed_packages": ["word-tools", "step-tools"] if allowed is None else allowed},
            "limits": {"max_runtime_seconds": runtime_s},
        },
    }
    return slug, write_pack(parent, manifest)


@pytest.fixture
def state(host_state: HostState, docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[HostState]:
    """A host with word-tools and step-tools installed as trusted tool packs."""
    host_state.install(EXAMPLES / "word-tools", trust="trusted")
    host_state.install(write_pack(tmp_path / "tools", STEP_TOOLS_MANIFEST, {"step_tools.py": STEP_TOOLS}),
                       trust="trusted")  # fmt: skip
    yield host_state
    for entry in Lockfile(host_state.dir / "agentnode.lock").entries().values():
        if entry.sandbox_volume and (entry.slug.startswith(OWN) or entry.slug == "sequential-agent"):
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.volumes.get(entry.sandbox_volume).remove(force=True)


def records_of(state: HostState, run_id: str) -> list[dict[str, Any]]:
    """The run's audit records; the raw lines hold nothing a step, its input or its tool wrote."""
    lines = [line for line in (state.dir / "audit.jsonl").read_text().splitlines() if run_id in line]
    for text in PRIVATE:
        assert all(text not in line for line in lines), text
    return [json.loads(line) for line in lines]


def the_end(state: HostState, run_id: str) -> dict[str, Any]:
    """Exactly one start and one end record for the run; the end record."""
    records = records_of(state, run_id)
    assert [r["event"] for r in records] == ["agent_run_start", "agent_run"], records
    end = records[1]
    where = (end["source"], end["sandbox"], end["runtime"], end["image"])
    assert where == ("agent_sequential", False, None, None)
    return end


def own_containers(client: docker.DockerClient, owner: str) -> list[str]:
    return [c.name for c in client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})]


def test_the_example_pipeline_through_the_installed_command(state: HostState) -> None:
    assert cli(state.env, "install", EXAMPLES / "sequential-agent", "--json").returncode == 0
    proc = cli(state.env, "run", "sequential-agent", "--arg", f'text="{SECRET_TEXT}"', "--json")
    assert proc.returncode == 0, proc.stderr
    out = json_out(proc)
    check_schema("run", out)
    assert out["result"] == {"text": "narwhal quokka zebra"} and out["mode_used"] == "agent_sequential"
    assert the_end(state, out["run_id"])["tool_calls"] == 2

    args = ["--arg", 'text="a b"', "--arg", "keep_order=true", "--json"]
    skipped = json_out(cli(state.env, "run", "sequential-agent", *args))
    assert skipped["success"] is True and skipped["result"] is None  # the last step was skipped

    missing = cli(state.env, "run", "sequential-agent", "--json")
    assert missing.returncode == 1
    out = json_out(missing)
    check_schema("run", out)
    assert out["error"] == "Step 'count' input mapping error: Input key 'text' not found in kwargs"
    assert (out["error_code"], out["result"]) == ("step_failed", {"steps_completed": []})
    human = cli(state.env, "run", "sequential-agent")
    assert human.returncode == 1 and "error: Step 'count' input mapping error" in human.stderr
    verified = json_out(cli(state.env, "audit", "verify", "--json"))
    assert verified["ok"] is True and verified["open_runs"] == []


def test_a_pipeline_passes_inputs_and_results_and_skips_by_when(
    state: HostState, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    slug, pack = sequential_agent(tmp_path, [COUNT, REVERSE, LOUD, COMBINE])
    entry = state.install(pack)  # unverified: a community agent, routed to the sandbox
    assert entry.sandbox_volume
    host = state.host()
    try:
        seen: list[list[str]] = []
        r = host.run(slug, kwargs={"text": SECRET_TEXT, "loud": False},
                     on_start=lambda _: seen.append(own_containers(docker_client, host.owner)))  # fmt: skip
    finally:
        host.close()
    assert r.success, (r.error_code, r.error)
    assert r.result == {"summary": "3 words, reversed: narwhal quokka zebra"}
    assert seen == [[]]  # no container for a pipeline, even a community one
    end = the_end(state, r.run_id)
    counters = (end["reason"], end["action"], end["tool_calls"], end["tool_refusals"])
    assert counters == ("agent_completed", "allow", 3, 0)


def test_a_warm_pool_is_never_built_for_a_pipeline(
    state: HostState, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    slug, pack = sequential_agent(tmp_path, [COUNT])
    state.install(pack)
    host = state.host(pool=PoolSettings(size=1))
    try:
        host.prewarm(slug)
        time.sleep(1.0)  # a refill would have started by now
        assert own_containers(docker_client, host.owner) == []
    finally:
        host.close()


def test_a_failing_step_ends_the_run_with_the_steps_completed(state: HostState, tmp_path: Path) -> None:
    slug, pack = sequential_agent(tmp_path, [COUNT, LOUD, FAIL, COMBINE])
    state.install(pack, trust="trusted")  # trusted: the host route; still no agent code runs
    host = state.host()
    try:
        r = host.run(slug, kwargs={"text": SECRET_TEXT})
    finally:
        host.close()
    assert (r.success, r.error_code, r.timed_out) == (False, "step_failed", False)
    assert r.mode_used == "agent_sequential"
    assert r.error.startswith("Step 'fail_step' failed: ") and "tool-authored" not in r.error
    assert [(s["name"], s["success"], s["skipped"]) for s in r.result["steps_completed"]] == [
        ("count_step", True, False),
        ("loud_step", True, True),  # `$input.loud` does not resolve: `==` is false, the step is skipped
        ("fail_step", False, False),
    ]
    end = the_end(state, r.run_id)
    assert (end["reason"], end["action"], end["tool_calls"]) == ("agent_error", "deny", 2)


def test_a_package_off_the_allowlist_is_a_failed_step(state: HostState, tmp_path: Path) -> None:
    slug, pack = sequential_agent(tmp_path, [COUNT, REVERSE, COMBINE], allowed=["word-tools"])
    state.install(pack)
    proc = cli(state.env, "run", slug, "--arg", f'text="{SECRET_TEXT}"', "--json")
    out = json_out(proc)
    assert proc.returncode == 1 and out["error_code"] == "step_failed"
    assert out["error"] == (
        "Step 'combine_step' failed: TOOL_NOT_ALLOWED: "
        "package 'step-tools' is not on this run's tool allowlist"
    )
    assert [s["success"] for s in out["result"]["steps_completed"]] == [True, True, False]
    end = the_end(state, out["run_id"])
    assert (end["tool_calls"], end["tool_refusals"]) == (2, 1)


def test_the_deadline_ends_a_pipeline_between_steps(state: HostState, tmp_path: Path) -> None:
    log = tmp_path / "naps"
    nap = {"tool": "step-tools:nap", "input_mapping": {"seconds": 0.7, "log": str(log)}}
    slug, pack = sequential_agent(tmp_path, [{"name": f"nap_{i}", **nap} for i in range(10)], runtime_s=2)
    state.install(pack)
    host = state.host()
    try:
        started = time.monotonic()
        r = host.run(slug)
        took = time.monotonic() - started
    finally:
        host.close()
    assert took < 6, took  # the pipeline reports its own timeout, well before the deadline's backstop
    assert (r.success, r.timed_out, r.error_code) == (False, True, "timeout")
    assert r.error.startswith("Sequential orchestration timed out after ") and r.error.endswith("(2s limit)")
    steps = r.result["steps_completed"]
    assert 2 <= len(steps) <= 3 and all(s["success"] for s in steps[:2])
    end = the_end(state, r.run_id)
    assert (end["reason"], end["timed_out"], end["tool_calls"]) == ("timeout", True, len(steps))
    assert len(log.read_text().splitlines()) == len(steps)


def test_cancel_stops_a_pipeline_and_no_step_starts_after_it(state: HostState, tmp_path: Path) -> None:
    log = tmp_path / "naps"
    nap = {"tool": "step-tools:nap", "input_mapping": {"seconds": 0.5, "log": str(log)}}
    slug, pack = sequential_agent(tmp_path, [{"name": f"nap_{i}", **nap} for i in range(20)])
    state.install(pack)
    host = state.host()
    ids: list[str] = []
    try:
        timer = threading.Timer(1.0, lambda: host.cancel(ids[0]))
        timer.start()
        r = host.run(slug, on_start=ids.append)
        timer.join()
    finally:
        host.close()
    assert (r.success, r.error_code, r.result) == (False, "cancelled", None)
    time.sleep(1.5)  # longer than a step: a step in flight at the cancel has ended, and none followed it
    end = the_end(state, r.run_id)
    assert end["reason"] == "cancelled" and 1 <= end["tool_calls"] <= 4
    assert len(log.read_text().splitlines()) == end["tool_calls"]
    assert verify_audit(state.dir / "audit.jsonl").ok
