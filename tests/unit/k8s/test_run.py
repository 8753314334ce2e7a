"""An AgentRun's spec is re-validated like a local run's request; its status carries the --json contract."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from host.audit.log import AuditLog
from host.audit.records import run_record
from host.core.errors import AuditReason, ConfigError
from host.k8s.objects.agentrun import API_VERSION, KIND, MAX_ERROR_CHARS, MAX_KWARGS_JSON_CHARS
from host.k8s.run import (
    audit_digest,
    controller_owner,
    result_json,
    run_request,
    status_for,
)
from host.runtime.result import RunResult


def agentrun(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "r1", "namespace": "ns"},
            "spec": {"slug": "hello-agent", **spec}}  # fmt: skip


def test_a_full_spec_is_read_as_a_run_request() -> None:
    caller = {"tenant": "acme", "requestId": "req-1", "labels": {"team": "a"}}
    request = run_request(agentrun(goal="count", kwargsJson='{"n": 3}', runtime="runsc", caller=caller))
    got = (request.slug, request.goal, dict(request.kwargs), request.runtime)
    assert got == ("hello-agent", "count", {"n": 3}, "runsc")
    assert request.caller.tenant == "acme" and request.caller.request_id == "req-1"
    assert dict(request.caller.labels) == {"team": "a"}


SECRET = "sk-live-do-not-echo"


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ({"slug": ""}, "spec.slug"),
        ({"slug": 5}, "spec.slug"),
        ({"goal": ["x"]}, "spec.goal"),
        ({"goal": "g" * (64 * 1024 + 1)}, "spec.goal"),
        ({"kwargsJson": "[1, 2]"}, "spec.kwargsJson"),
        ({"kwargsJson": '{"n": NaN}'}, "spec.kwargsJson"),
        ({"kwargsJson": "{" * 5000 + "}" * 5000}, "spec.kwargsJson"),
        ({"kwargsJson": json.dumps({"k": "v" * MAX_KWARGS_JSON_CHARS})}, "spec.kwargsJson"),
        ({"slug": "Hello Agent"}, "spec.slug"),
        ({"slug": "../etc"}, "spec.slug"),
        ({"kwargsJson": f'{{"key": "{SECRET}"'}, "spec.kwargsJson"),
        ({"runtime": "kata"}, "spec.runtime"),
        ({"caller": {"tenant": SECRET + "!"}}, "spec.caller"),
        ({"caller": "acme"}, "spec.caller"),
    ],
)
def test_a_bad_spec_is_refused_by_name_never_quoting_it(spec: dict[str, Any], names: str) -> None:
    body = agentrun()
    body["spec"].update(spec)
    with pytest.raises(ConfigError) as info:
        run_request(body)
    assert names in info.value.message and info.value.reason is AuditReason.CONFIG_INVALID
    assert SECRET not in info.value.message + info.value.hint
    assert "kubectl explain" in info.value.hint


def test_only_one_controller_reference_of_our_kind_counts() -> None:
    ours = {"apiVersion": API_VERSION, "kind": KIND, "name": "r1", "uid": "u1", "controller": True}
    assert controller_owner({"metadata": {"ownerReferences": [ours]}}) == ours
    assert controller_owner({"metadata": {"ownerReferences": [{**ours, "controller": False}]}}) is None
    assert controller_owner({"metadata": {"ownerReferences": [{**ours, "kind": "Job"}]}}) is None
    assert controller_owner({"metadata": {"ownerReferences": [{**ours, "apiVersion": "x/v1"}]}}) is None
    assert controller_owner({"metadata": {"ownerReferences": [ours, {**ours, "uid": "u2"}]}}) is None
    assert controller_owner({"metadata": {}}) is None


def test_the_status_round_trips_to_the_json_contract() -> None:
    result = RunResult(True, result={"n": 3, "s": "é"}, run_id="abc", duration_ms=12, mode_used="sandbox")
    status = status_for(result, audit_digest="d" * 64)
    assert status["phase"] == "Succeeded" and status["auditDigest"] == "d" * 64
    body = {"status": status}
    assert result_json(body) == {**result.to_json(), "logs": "", "path": "kubernetes"}


def test_a_huge_result_stays_out_of_the_status_and_says_so() -> None:
    status = status_for(RunResult(True, result={"x": "y" * 200_000}, run_id="a"), audit_digest="")
    assert status["resultJson"] is None and status["resultTruncated"] is True


def test_status_text_stays_within_the_schema() -> None:
    status = status_for(RunResult(False, error="e" * 5000, hint="h" * 5000, run_id="a"), audit_digest="")
    assert len(status["error"]) == MAX_ERROR_CHARS and status["error"].endswith("…")
    assert len(status["hint"]) <= MAX_ERROR_CHARS


def test_a_failed_run_reads_as_failed() -> None:
    result = RunResult(False, error="the agent timed out", error_code="timeout", hint="raise the limit",
                       timed_out=True, run_id="r")  # fmt: skip
    got = result_json({"status": status_for(result, audit_digest="")})
    seen = (got["success"], got["error_code"], got["timed_out"], got["hint"])
    assert seen == (False, "timeout", True, "raise the limit")


def test_the_audit_digest_is_the_chain_link_of_the_runs_record(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    for run_id in ("first", "second"):
        assert log.append(run_record(slug="s", trust="community", run_id=run_id, action="allow",
                                     source="agent_sandbox", reason="agent_completed", sandbox=True,
                                     runtime="runsc", image="i", duration_ms=1, timed_out=False, llm=None,
                                     tool_calls=0, tool_refusals=0))  # fmt: skip
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    digest = audit_digest(tmp_path / "audit.jsonl", "first")
    assert digest == hashlib.sha256(lines[0]).hexdigest() == json.loads(lines[1])["prev"]
    assert audit_digest(tmp_path / "audit.jsonl", "absent") == ""
    assert audit_digest(tmp_path / "missing.jsonl", "first") == ""


@pytest.mark.parametrize(
    "result",
    [
        RunResult(True, result={"n": 1}, run_id="ab" * 16, duration_ms=5, mode_used="sandbox"),
        RunResult(True, result={"x": "é" * 100_000}, run_id="ab" * 16),  # over the bound: kept out
        RunResult(False, error="e" * 9000, error_code="agent_error", hint="h" * 9000, run_id="ab" * 16),
    ],
)
def test_every_status_the_node_agent_writes_fits_the_crd(result: RunResult) -> None:
    """A status the schema refuses would lose the whole result (the API server rejects the patch)."""
    import jsonschema

    from host.k8s.objects.agentrun import agentrun_crd

    schema = agentrun_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    status = {k: v for k, v in status_for(result, audit_digest="d" * 64).items() if v is not None}
    jsonschema.validate(status, schema)
