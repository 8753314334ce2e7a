"""The published format's agent block, §1.8-§1.9: goal, prompts, tiers, limits, llm access, orchestration and
verification cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from host.core.errors import ManifestError
from host.spec.manifest.load import load_manifest
from host.spec.manifest.model import (
    OrchestrationStep,
)
from tests.unit.spec.manifest._support import (
    _DROP,
    HEADER,
    SEQUENTIAL,
    _agent,
    _agent_of,
    _error,
    _parsed,
    _pub_agent,
    _pub_toolpack,
    _published,
    _warnings,
)

# --- §1.8 the agent block -----------------------------------------------------------------------------------


def test_a_published_agent_needs_a_goal() -> None:
    for goal in (_DROP, None, ""):
        data = _published()
        if goal is _DROP:
            del data["agent"]["goal"]
        else:
            data["agent"]["goal"] = goal
        assert _error(data).startswith("agent.goal: expected a non-empty string")
    assert _error(_pub_agent(goal=["a"])).startswith("agent.goal: expected a non-empty string, got a list")


def test_the_host_form_allows_an_empty_goal() -> None:
    assert _agent_of(_agent(goal="")).goal == ""


@pytest.mark.parametrize(
    ("value", "kept"), [("Be brief.", "Be brief."), (None, ""), ("", ""), ([], ""), (0, "")]
)
def test_a_falsy_system_prompt_is_none(value: Any, kept: str) -> None:
    assert _agent_of(_pub_agent(system_prompt=value)).system_prompt == kept


def test_a_truthy_system_prompt_must_be_a_string() -> None:
    assert _error(_pub_agent(system_prompt={"a": 1})).startswith("agent.system_prompt: expected a string")


@pytest.mark.parametrize("tier", ["llm_only", "llm_plus_tools", "llm_plus_credentials"])
def test_tiers_are_kept(tier: str) -> None:
    assert _agent_of(_pub_agent(tier=tier)).tier == tier


@pytest.mark.parametrize("tier", ["llm", "LLM_ONLY", 1, ["llm_only"]])
def test_other_tiers_are_refused(tier: Any) -> None:
    assert _error(_pub_agent(tier=tier)).startswith("agent.tier: expected one of llm_only, llm_plus_tools")


@pytest.mark.parametrize(
    ("llm", "required"),
    [(None, False), ({}, False), ({"required": True}, True), ({"required": "yes"}, True),
     ({"required": False, "model": "x"}, False), ({"required": 0}, False)],
)  # fmt: skip
def test_llm_required_is_the_truthiness_of_agent_llm_required(llm: Any, required: bool) -> None:
    assert _agent_of(_pub_agent(llm=llm)).llm_required is required


def test_agent_llm_must_be_a_mapping() -> None:
    assert _error(_pub_agent(llm="openai")).startswith("agent.llm: expected a mapping, got a string")


@pytest.mark.parametrize(
    ("tool_access", "allowed"),
    [
        (_DROP, None),
        (None, None),
        ({}, None),
        ({"allowed_packages": None}, None),
        ({"allowed_packages": []}, ()),
        ({"allowed_packages": ["a", " b ", ""]}, ("a", "b")),
    ],
)
def test_tool_access_absent_empty_and_listed(tool_access: Any, allowed: Any) -> None:
    data = _published()
    if tool_access is not _DROP:
        data["agent"]["tool_access"] = tool_access
    assert _agent_of(data).allowed_packages == allowed


@pytest.mark.parametrize(
    ("key", "low", "high", "default"),
    [
        ("max_iterations", 1, 100, 12),
        ("max_tool_calls", 0, 500, 40),
        ("max_runtime_seconds", 1, 3600, 180),
    ],
)
def test_limits_ranges_boundaries_and_defaults(key: str, low: int, high: int, default: int) -> None:
    for data in (_pub_agent(limits={key: low}), _agent(limits={key: low})):
        assert getattr(_agent_of(data), key) == low
    assert getattr(_agent_of(_pub_agent(limits={key: high})), key) == high
    assert getattr(_agent_of(_pub_agent(limits={key: None})), key) == default  # explicit null: absent
    assert getattr(_agent_of(_pub_agent(limits={})), key) == default
    assert getattr(_agent_of(_pub_agent(limits=None)), key) == default
    for bad in (low - 1, high + 1, True, 1.0, "5", 2**64):
        for data in (_pub_agent(limits={key: bad}), _agent(limits={key: bad})):
            message = _error(data)
            assert message.startswith(f"agent.limits.{key}: expected a positive integer no larger than")
            assert f"than {high}" in message
            assert len(message) < 200


def test_max_tool_calls_0_means_no_tool_calls() -> None:
    assert _agent_of(_pub_agent(limits={"max_tool_calls": 0})).max_tool_calls == 0
    assert "(or 0: no tool calls)" in _error(_pub_agent(limits={"max_tool_calls": 501}))


def test_limits_must_be_a_mapping() -> None:
    assert _error(_pub_agent(limits=[1])).startswith("agent.limits: expected a mapping, got a list")


def test_stop_on_consecutive_errors_range_and_default() -> None:
    def termination(value: Any) -> dict[str, Any]:
        return _pub_agent(termination={"stop_on_consecutive_errors": value})

    assert _agent_of(termination(1)).stop_on_consecutive_errors == 1
    assert _agent_of(termination(10)).stop_on_consecutive_errors == 10
    assert _agent_of(termination(None)).stop_on_consecutive_errors == 3
    assert _agent_of(_pub_agent(termination=None)).stop_on_consecutive_errors == 3
    for bad in (0, 11, False, "3"):
        message = _error(termination(bad))
        assert message.startswith("agent.termination.stop_on_consecutive_errors: expected a positive integer "
                                  "no larger than 10")  # fmt: skip


def test_termination_stop_on_final_answer_is_a_bool_and_conditions_are_tolerated() -> None:
    data = _pub_agent(termination={"stop_on_final_answer": False, "conditions": ["done"]})
    assert _warnings(data) == []
    message = _error(_pub_agent(termination={"stop_on_final_answer": "yes"}))
    assert message.startswith("agent.termination.stop_on_final_answer: expected true or false, got a string")


def test_state_persistence_and_isolation_values() -> None:
    for persistence in ("none", "session"):
        assert _parsed(_pub_agent(state={"persistence": persistence})).slug == "pub-agent"
    for isolation in ("process", "thread"):
        assert _parsed(_pub_agent(isolation=isolation)).slug == "pub-agent"
    assert _error(_pub_agent(state={"persistence": "disk"})).startswith(
        "agent.state.persistence: expected one of none, session, got a string"
    )
    assert _error(_pub_agent(isolation="container")).startswith("agent.isolation: expected one of process")


@pytest.mark.parametrize("key", ["max_tokens", "planning"])
def test_max_tokens_and_planning_are_refused_even_as_null(key: str) -> None:
    for data in (_pub_agent(**{key: 100}), _pub_agent(**{key: None}), _agent(**{key: 1})):
        assert _error(data).startswith(f"agent.{key}: not supported by the agentnode format")


def test_error_handling_is_tolerated() -> None:
    data = _pub_agent(error_handling={"retry": {"max_retries": 5, "backoff_base": 0.5, "enabled": False}})
    assert _warnings(data) == []




def test_a_sequential_orchestration_is_kept() -> None:
    data = _published()
    data["agent"]["orchestration"] = SEQUENTIAL
    del data["agent"]["entrypoint"]
    manifest = _agent_of(data)
    assert manifest.entrypoint == ""
    assert manifest.orchestration == (
        OrchestrationStep(tool="web-search:search", name="search", input_mapping={"q": "$input.topic"}),
        OrchestrationStep(
            tool="summarizer",
            input_mapping={"text": "$steps.search", "n": 3, "deep": {"a": [1]}},
            when="$steps.search is not null",
        ),
        OrchestrationStep(tool="notify", name="", when="$input.mode == 'loud'"),
    )


def test_an_orchestration_without_a_mode_is_ignored() -> None:
    assert _agent_of(_pub_agent(orchestration={"steps": "junk"})).orchestration is None
    assert _agent_of(_pub_agent(orchestration=None)).orchestration is None


@pytest.mark.parametrize(
    "when",
    ["$x == 1", "$x != null", "$steps.a is null", "$input.k is not null", "  $x == 'a b'  ", "$x == true"],
)
def test_when_conditions_the_publisher_accepts(when: str) -> None:
    steps = [{"tool": "t", "when": when}]
    assert _agent_of(_pub_agent(orchestration={"mode": "sequential", "steps": steps})).orchestration


@pytest.mark.parametrize(
    ("orchestration", "message"),
    [
        ({"mode": "parallel", "steps": [{"tool": "t"}]}, 'agent.orchestration.mode: expected "sequential"'),
        ({"mode": "sequential"}, "agent.orchestration.steps: required for mode sequential, got nothing"),
        ({"mode": "sequential", "steps": []}, "agent.orchestration.steps: required for mode sequential"),
        (
            {"mode": "sequential", "steps": {"a": 1}},
            "agent.orchestration.steps: expected a list, got a mapping",
        ),
        ({"mode": "sequential", "steps": ["t"]}, "agent.orchestration.steps[0]: expected a mapping"),
        ({"mode": "sequential", "steps": [{"name": "a"}]}, "agent.orchestration.steps[0].tool: expected a"),
        ({"mode": "sequential", "steps": [{"tool": 3}]}, "agent.orchestration.steps[0].tool: expected a"),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "name": "a"}, {"tool": "u", "name": "a"}]},
            "agent.orchestration.steps[1].name: duplicate step name",
        ),
        ({"mode": "sequential", "steps": [{"tool": "t", "name": 1}]}, "agent.orchestration.steps[0].name:"),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "input_mapping": ["$input.q"]}]},
            "agent.orchestration.steps[0].input_mapping: expected a mapping, got a list",
        ),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "when": True}]},
            "agent.orchestration.steps[0].when: expected a string, got true",
        ),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "when": "  "}]},
            "agent.orchestration.steps[0].when: expected a condition, got an empty string",
        ),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "when": "$x > 3"}]},
            "agent.orchestration.steps[0].when: expected $ref == value, $ref != value, $ref is null",
        ),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "when": "x == 3"}]},
            "agent.orchestration.steps[0].when: the left side must be a $reference",
        ),
        (
            {"mode": "sequential", "steps": [{"tool": "t", "when": "x is not null"}]},
            "agent.orchestration.steps[0].when: the left side must be a $reference",
        ),
        ("sequential", "agent.orchestration: expected a mapping, got a string"),
    ],
)
def test_invalid_orchestrations_are_refused_naming_the_key(orchestration: Any, message: str) -> None:
    assert _error(_pub_agent(orchestration=orchestration)).startswith(message)


def test_an_input_mapping_must_be_json_data(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text(
        HEADER + "agent:\n  orchestration:\n    mode: sequential\n    steps:\n"
        "      - tool: t\n        input_mapping: {when: 2001-12-14}\n"
    )
    with pytest.raises(ManifestError, match=r"steps\[0\]\.input_mapping: expected JSON data, got a date"):
        load_manifest(tmp_path)


# --- §1.9 agent.verification.cases --------------------------------------------------------------------------

GOAL_20 = "Research the history of Python"


def _case(**fields: Any) -> dict[str, Any]:
    return {"name": "basic", "goal": GOAL_20, **fields}


def test_verification_cases_in_their_accepted_shapes() -> None:
    cases = [
        _case(expected={"required_keys": ["done"], "done": True, "min_lengths": {"summary": 1},
                        "llm_prompt_contains": ["Python"]}),
        _case(name="abc", goal="x" * 20),
    ] + [_case(name=f"case-{i}", goal=f"{GOAL_20} {i}") for i in range(8)]  # fmt: skip
    assert _warnings(_pub_agent(verification={"cases": cases})) == []


@pytest.mark.parametrize(
    ("cases", "message"),
    [
        ([_case(name=f"case-{i}", goal=f"{GOAL_20} {i}") for i in range(11)],
         "agent.verification.cases: expected at most 10 cases, got 11"),
        ([_case(name="ab")], "agent.verification.cases[0].name: expected a string of at least 3 characters"),
        ([{"goal": GOAL_20}], "agent.verification.cases[0].name: expected a string of at least 3 characters"),
        ([_case(goal="x" * 19)], "agent.verification.cases[0].goal: expected a string of at least 20"),
        ([_case(), _case(goal=GOAL_20 + "!")], "agent.verification.cases[1].name: duplicate case name"),
        ([_case(), _case(name="other")], "agent.verification.cases[1].goal: duplicate case goal"),
        ([_case(expected=["done"])], "agent.verification.cases[0].expected: expected a mapping"),
        ([_case(expected={"required_keys": "done"})], "agent.verification.cases[0].expected.required_keys:"),
        ([_case(expected={"done": "yes"})], "agent.verification.cases[0].expected.done: expected true or"),
        ([_case(expected={"min_lengths": {"a": 0}})], "agent.verification.cases[0].expected.min_lengths: e"),
        ([_case(expected={"min_lengths": {"a": True}})], "agent.verification.cases[0].expected.min_lengths:"),
        ([_case(expected={"llm_prompt_contains": [1]})], "agent.verification.cases[0].expected.llm_prompt_"),
        (["basic"], "agent.verification.cases[0]: expected a mapping, got a string"),
        ("basic", "agent.verification.cases: expected a list, got a string"),
    ],
)  # fmt: skip
def test_invalid_verification_cases_are_refused_naming_the_key(cases: Any, message: str) -> None:
    assert _error(_pub_agent(verification={"cases": cases})).startswith(message)


def test_toolpack_verification_cases_are_checked() -> None:
    good = {"cases": [{"name": "echo", "input": {"x": 1}, "tool": "echo",
                       "cassette": "fixtures/cassettes/echo.yaml",
                       "expected": {"return_type": "dict"}}]}  # fmt: skip
    assert _warnings(_pub_toolpack(verification=good)) == []
    bad_cassette = {"cases": [{"name": "echo", "input": {}, "cassette": "/etc/passwd"}]}
    assert _error(_pub_toolpack(verification=bad_cassette)).startswith(
        "verification.cases[0].cassette: expected a path under fixtures/cassettes/"
    )
    no_input = {"cases": [{"name": "echo"}]}
    assert _error(_pub_toolpack(verification=no_input)).startswith("verification.cases[0].input: expected a")
    # on an agent, top-level verification is ignored
    assert _parsed(_published(verification="anything")).slug == "pub-agent"
