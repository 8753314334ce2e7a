"""The audit records: exactly the documented fields, sanitized by construction, values outside the fixed
sets refused."""

from __future__ import annotations

import json

import pytest

from host.audit.chain import GENESIS
from host.audit.records import start_record
from tests.unit.audit._support import FULL_LLM, record, start

# --- run_record ---------------------------------------------------------------------------------------


def test_run_record_has_exactly_the_documented_fields() -> None:
    rec = record()
    assert list(rec) == [
        "event", "slug", "action", "source", "reason", "trust", "run_id", "sandbox", "runtime",
        "image", "duration_ms", "timed_out", "llm", "tool_calls", "tool_refusals",
        "tool_calls_host_worker", "tool_calls_tool_sandbox", "tool_sandboxes_started", "llm_tool_calls",
        "llm_tool_calls_refused",
        "caller", "egress", "files",
    ]
    assert rec["event"] == "agent_run"
    assert rec["reason"] == "agent_completed" and type(rec["reason"]) is str
    assert rec["run_id"] == "run-1"
    assert rec["llm"] == {**FULL_LLM, "allowed_models": ["gpt-a", "gpt-b"]}
    assert json.loads(json.dumps(rec)) == rec


def test_run_record_llm_matches_the_documented_audit_schema() -> None:
    from tests.support.schema import check_schema, documented_schema

    paths = documented_schema("audit")
    documented = {path.removeprefix("[].llm.") for path in paths if path.startswith("[].llm.")}
    assert set(record()["llm"]) == documented  # every key the audit keeps is documented, and the reverse
    check_schema("audit", [{**record(), "ts": "t", "seq": 1, "prev": GENESIS}])


def test_run_record_keeps_dollar_amounts_only_as_finite_non_negative_numbers() -> None:
    llm = {"cost_usd": 2, "max_cost_usd": None, "input_tokens": 5}
    assert record(llm=llm)["llm"] == {"cost_usd": 2.0, "max_cost_usd": None, "input_tokens": 5}
    for bad in (float("nan"), float("inf"), -0.01, True, "0.5", [0.5], {"usd": 1}):
        assert record(llm={"cost_usd": bad, "max_cost_usd": bad})["llm"] == {}
    assert record(llm={"input_tokens": 1.5, "retries": "3", "cost": 9})["llm"] == {}


def test_run_record_without_llm_policy_has_null_llm() -> None:
    rec = record(llm=None, sandbox=False, source="agent_host", runtime=None, action="deny",
                 reason="refused_trust", timed_out=True)
    assert rec["llm"] is None
    assert (rec["sandbox"], rec["source"], rec["action"]) == (False, "agent_host", "deny")
    assert rec["timed_out"] is True


@pytest.mark.parametrize(
    "override",
    [{"reason": "prompt was rude"}, {"reason": "AGENT_COMPLETED"}, {"action": "maybe"}, {"source": "agent"}],
)
def test_run_record_refuses_values_outside_the_fixed_sets(override: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        record(**override)


def test_run_record_drops_unknown_llm_keys_and_unexpected_value_shapes() -> None:
    llm = {
        "enabled": "yes",                       # not a bool
        "max_calls": {"nested": 1},             # not an int
        "max_input_chars": True,                # bool is not a counter
        "max_output_chars": 3.5,
        "calls": 4,
        "requests": None,
        "allowed_models": ["ok", 1],            # not all strings
        "model": ["gpt"],
        "prompt": "secret prompt text",
        "api_key": "sk-live-123",
        "provider_error": "HTTP 500 body",
    }
    assert record(llm=llm)["llm"] == {"calls": 4, "requests": None}


# --- start_record -------------------------------------------------------------------------------------------


def test_start_record_carries_only_typed_fields() -> None:
    assert start() == {
        "event": "agent_run_start",
        "slug": "demo-agent",
        "source": "agent_sandbox",
        "trust": "unverified",
        "run_id": "run-1",
        "sandbox": True,
        "runtime": "runc",
        "max_runtime_seconds": 60,
    }
    with pytest.raises(ValueError):
        start_record(
            slug="x", trust=None, run_id="r", source="elsewhere", sandbox=True, runtime=None,
            max_runtime_seconds=1,
        )  # fmt: skip


def test_the_egress_section_keeps_counts_rule_texts_and_reason_words_only() -> None:
    hostile = {
        "attempts": 3, "bytes_out": 10, "bytes_in": 20, "prompt": "secret",
        "rules": {"api.example.com:443": {"connections": 2, "bytes_out": 10, "bytes_in": 20, "x": "y"},
                  "sk-live-key in a name\x1b[31m": {"connections": 1},
                  "*.example.com:8443": {"connections": 1}},
        "refused": {"name_not_granted": 1, "Evil Name.example:443": 1, "private_address": "2"},
        "cut": {"idle": 1}, "limits": {"max_connections": 256, "other": 1},
    }  # fmt: skip
    section = record(egress=hostile)["egress"]
    assert section == {
        "attempts": 3, "bytes_out": 10, "bytes_in": 20,
        "rules": {"api.example.com:443": {"connections": 2, "bytes_out": 10, "bytes_in": 20},
                  "*.example.com:8443": {"connections": 1}},
        "refused": {"name_not_granted": 1}, "cut": {"idle": 1}, "limits": {"max_connections": 256},
    }  # fmt: skip
    assert record()["egress"] is None
