"""The AgentRun CRD (host/k8s/objects/agentrun.py), checked offline: its contract names, and AgentRun bodies
and statuses held to its schema."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from host.k8s.objects.agentrun import (
    API_VERSION,
    KIND,
    MAX_GOAL_CHARS,
    MAX_KWARGS_JSON_CHARS,
    RunRequest,
    agentrun,
    agentrun_crd,
)
from host.policy.caller import MAX_LABELS, CallerInfo


def _json_schema(node: Any) -> Any:
    """The CRD's OpenAPI schema as JSON Schema: the Kubernetes extensions (CEL rules and the like) are the
    API server's to apply, not jsonschema's; a pattern's `$` is Go's (the end of the text), which Python
    spells `\\Z` (its `$` also matches before a final newline)."""
    if isinstance(node, dict):
        return {
            k: v[:-1] + "\\Z" if k == "pattern" and v.endswith("$") else _json_schema(v)
            for k, v in node.items()
            if not k.startswith("x-kubernetes-")
        }
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    return node


@pytest.fixture(scope="module")
def agentrun_validator() -> jsonschema.protocols.Validator:
    [version] = agentrun_crd()["spec"]["versions"]
    schema = _json_schema(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def test_the_crd_has_the_contract_names() -> None:
    crd = agentrun_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "agentruns.sandbox.agentnode.net"
    assert (spec["group"], spec["scope"]) == ("sandbox.agentnode.net", "Namespaced")
    assert spec["names"] | {"shortNames": spec["names"]["shortNames"]} == {
        "kind": "AgentRun", "listKind": "AgentRunList", "plural": "agentruns", "singular": "agentrun",
        "shortNames": ["arun"],
    }  # fmt: skip
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [c["jsonPath"] for c in version["additionalPrinterColumns"]] == [
        ".status.phase", ".status.errorCode", ".metadata.creationTimestamp"
    ]  # fmt: skip
    root = version["schema"]["openAPIV3Schema"]
    assert root["properties"]["spec"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "spec is immutable: create a new AgentRun instead"}
    ]
    status = root["properties"]["status"]["properties"]
    assert set(status) == {
        "phase", "runId", "podName", "podUid", "success", "resultJson", "errorCode", "error", "hint",
        "timedOut", "durationMs", "auditDigest", "observedGeneration", "modeUsed", "resultTruncated",
    }  # fmt: skip
    assert status["phase"]["enum"] == ["Pending", "Scheduled", "Running", "Succeeded", "Failed"]
    assert all("maxLength" in s for s in status.values() if s["type"] == "string" and "enum" not in s)


def test_agentrun_bodies_match_the_crd(agentrun_validator: jsonschema.protocols.Validator) -> None:
    caller = CallerInfo.parse("acme", "req-1", {"team": "search"})
    request = RunRequest(slug="report", goal="sum up", kwargs={"n": 1, "é": [True]}, runtime="runsc",
                         caller=caller)  # fmt: skip
    full = agentrun("nightly", "team-a", request)
    assert full == {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "nightly", "namespace": "team-a"},
        "spec": {
            "slug": "report", "goal": "sum up", "kwargsJson": '{"n":1,"é":[true]}', "runtime": "runsc",
            "caller": {"tenant": "acme", "requestId": "req-1", "labels": {"team": "search"}},
        },
    }  # fmt: skip
    minimal = agentrun("nightly", "team-a", RunRequest(slug="report", caller=CallerInfo()))
    assert minimal["spec"] == {"slug": "report", "kwargsJson": "{}"}
    for body in (full, minimal):
        agentrun_validator.validate(body)


def _spec(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": fields}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_spec(goal="no slug"), id="missing-slug"),
        pytest.param({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}}, id="missing-spec"),
        pytest.param(_spec(slug="report", runtime="kata"), id="bad-runtime"),
        pytest.param(_spec(slug="report", runtime="crun"), id="runtime-not-on-a-cluster"),
        pytest.param(_spec(slug="../etc"), id="slug-path"),
        pytest.param(_spec(slug="Report"), id="slug-capitals"),
        pytest.param(_spec(slug="r" * 65), id="slug-too-long"),
        pytest.param(_spec(slug="report\n"), id="slug-newline"),
        pytest.param(_spec(slug="report", goal="g" * (MAX_GOAL_CHARS + 1)), id="goal-too-long"),
        pytest.param(
            _spec(slug="report", kwargsJson="1" * (MAX_KWARGS_JSON_CHARS + 1)), id="kwargs-too-long"
        ),
        pytest.param(_spec(slug="report", caller={"tenant": "a b"}), id="tenant"),
        pytest.param(_spec(slug="report", caller={"requestId": "x" * 129}), id="request-id"),
        pytest.param(
            _spec(slug="report", caller={"labels": {f"k{i}": "" for i in range(MAX_LABELS + 1)}}), id="labels"
        ),
        pytest.param(_spec(slug="report", caller={"labels": {"k": "a b"}}), id="label-value"),
    ],
)
def test_bad_agentrun_bodies_are_refused(
    agentrun_validator: jsonschema.protocols.Validator, body: dict[str, Any]
) -> None:
    assert not agentrun_validator.is_valid(body)


def test_a_status_is_bounded_too(agentrun_validator: jsonschema.protocols.Validator) -> None:
    body = agentrun("nightly", "team-a", RunRequest(slug="report"))
    body["status"] = {
        "phase": "Succeeded", "runId": "ab" * 16, "success": True, "durationMs": 12,
        "auditDigest": "c" * 64, "errorCode": "agent_completed", "observedGeneration": 1,
    }  # fmt: skip
    agentrun_validator.validate(body)
    for bad in ({"phase": "Done"}, {"errorCode": "Bad Code"}, {"durationMs": -1}, {"auditDigest": "x"}):
        assert not agentrun_validator.is_valid({**body, "status": bad})
