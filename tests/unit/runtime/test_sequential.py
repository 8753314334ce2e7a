"""Sequential orchestration (format §5.5): every rule of the pipeline with no daemon, then whole runs through
SandboxHost.run with real tool workers (the sequential backend needs no engine: it runs no pack code)."""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import AuditReason
from host.policy.rules import resolve_run_policy
from host.runtime.backends.sequential import (
    CONSUMED_KWARGS,
    PipelineOutcome,
    evaluate_when,
    initial_input,
    json_exceeds,
    kept_step_names,
    parse_literal,
    pipeline_report,
    run_pipeline,
    split_tool,
)
from host.runtime.outcome import EndFacts, Ending, name_outcome
from host.runtime.runner import SandboxHost
from host.runtime.session import RunOutcome
from host.spec.config import AgentSandboxConfig, LimitsCeiling, load_config
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.load import load_manifest, manifest_data, parse_manifest
from host.spec.manifest.model import OrchestrationStep
from tests.support.paths import REPO
from tests.support.step_tools import STEP_TOOLS, STEP_TOOLS_MANIFEST


def S(
    tool: str, name: str | None = None, when: str | None = None, **mapping: Any
) -> OrchestrationStep:
    return OrchestrationStep(tool=tool, name=name, input_mapping=mapping, when=when)


class Tools:
    """A step executor: records each call, answers from `answers` (by slug) or echoes the arguments."""

    def __init__(self, answers: dict[str, tuple[bool, Any, str]] | None = None, clock: Clock | None = None,
                 cost: float = 0.0) -> None:  # fmt: skip
        self.answers = answers or {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.clock, self.cost = clock, cost

    def __call__(self, slug: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any, str]:
        self.calls.append((slug, tool, arguments))
        if self.clock is not None:
            self.clock.now += self.cost
        return self.answers.get(slug, (True, {"slug": slug, "args": arguments}, ""))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(
    steps: list[OrchestrationStep],
    kwargs: dict[str, Any] | None = None,
    tools: Tools | None = None,
    **options: Any,
) -> PipelineOutcome:
    options.setdefault("deadline", float("inf"))
    options.setdefault("limit_seconds", 180)
    outcome = run_pipeline(steps, kwargs or {}, tools or Tools(), **options)
    assert outcome is not None
    return outcome


def completed(outcome: PipelineOutcome) -> list[dict[str, Any]]:
    assert isinstance(outcome.result, dict) and set(outcome.result) == {"steps_completed"}
    steps: list[dict[str, Any]] = outcome.result["steps_completed"]
    for step in steps:
        assert set(step) == {"name", "tool", "success", "duration_ms", "skipped"}
    return steps


# --- input_mapping ---------------------------------------------------------------------------------------


def test_mapping_resolves_input_keys_whole_step_results_and_passes_the_rest_through() -> None:
    tools = Tools({"a": (True, {"deep": {"x": [1, 2]}}, "")})
    steps = [
        S("a", "first", q="$input.topic"),
        S("b", text="$steps.first", n=3, flag=True, none=None, items=[1, "$input.topic"], plain="hello",
          nested={"q": "$input.topic"}, dollar_inside="costs $5"),
    ]  # fmt: skip
    outcome = run(steps, {"topic": {"t": 1}}, tools)
    assert outcome.success
    assert tools.calls[0] == ("a", "", {"q": {"t": 1}})
    assert tools.calls[1][2] == {
        "text": {"deep": {"x": [1, 2]}},  # the entire result of the earlier step
        "n": 3,
        "flag": True,
        "none": None,
        "items": [1, "$input.topic"],  # lists are not looked into
        "plain": "hello",
        "nested": {"q": "$input.topic"},  # nested mappings are not looked into
        "dollar_inside": "costs $5",
    }


def test_an_unresolvable_input_key_fails_the_step_before_it_runs() -> None:
    tools = Tools()
    outcome = run([S("a"), S("b", "second", q="$input.missing"), S("c")], {"other": 1}, tools)
    assert (outcome.success, outcome.timed_out) == (False, False)
    assert outcome.error == "Step 'second' input mapping error: Input key 'missing' not found in kwargs"
    assert [s["name"] for s in completed(outcome)] == ["step_0"]
    assert [c[0] for c in tools.calls] == ["a"]


def test_a_step_reference_must_name_an_earlier_step() -> None:
    outcome = run([S("a", "first", x="$steps.later"), S("b", "later")])
    assert outcome.error == "Step 'first' input mapping error: Step 'later' not found or not yet executed"
    assert completed(outcome) == []


def test_steps_a_b_names_a_step_literally_called_a_b() -> None:
    tools = Tools({"p": (True, "dotted", ""), "q": (True, {"b": "nested"}, "")})
    outcome = run([S("p", "a.b"), S("q", "a"), S("r", x="$steps.a.b", y="$steps.a")], tools=tools)
    assert outcome.success and tools.calls[2][2] == {"x": "dotted", "y": {"b": "nested"}}
    # No nested paths: with no step named `a.b`, `$steps.a.b` does not reach into step `a`'s result.
    outcome = run([S("q", "a"), S("r", "last", x="$steps.a.b")], tools=tools)
    assert outcome.error == "Step 'last' input mapping error: Step 'a.b' not found or not yet executed"


@pytest.mark.parametrize("ref", ["$env.HOME", "$input", "$steps", "$", "$inputs.x", "$Input.x"])
def test_any_other_dollar_reference_is_an_error(ref: str) -> None:
    outcome = run([S("a", "only", x=ref)], {"x": 1})
    assert outcome.error == f"Step 'only' input mapping error: Unknown variable reference: {ref}"


@pytest.mark.parametrize("key", sorted(CONSUMED_KWARGS))
def test_goal_llm_and_timeout_are_not_input(key: str) -> None:
    assert initial_input({key: "v", "x": 1}) == {"x": 1}
    outcome = run([S("a", "s", v=f"$input.{key}")], {key: "v"})
    assert outcome.error == f"Step 's' input mapping error: Input key '{key}' not found in kwargs"
    assert evaluate_when(f"$input.{key} is null", initial_input({key: "v"}), {})


# --- when --------------------------------------------------------------------------------------------------

INPUTS = {"mode": "loud", "n": 3, "f": 2.5, "yes": True, "no": False, "none": None, "word": "plain",
          "spaced": "a b"}  # fmt: skip


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("$input.mode == 'loud'", True),
        ('$input.mode == "loud"', True),
        ("$input.mode == 'quiet'", False),
        ("$input.mode != 'quiet'", True),
        ("$input.mode != 'loud'", False),
        ("$input.word == plain", True),  # a bare string
        ("$input.spaced == 'a b'", True),
        ("$input.n == 3", True),  # int
        ("$input.n == 3.0", True),  # float (Python equality, as the runtime compares)
        ("$input.n != 4", True),
        ("$input.f == 2.5", True),
        ("$input.yes == true", True),
        ("$input.no == false", True),
        ("$input.yes == 1", True),  # Python equality: True == 1, as in the runtime
        ("$input.none == null", True),
        ("$input.n == null", False),
        ("$input.n == '3'", False),  # a quoted string is a string
        ("  $input.n == 3  ", True),
    ],
)
def test_when_comparisons_and_literal_kinds(expr: str, expected: bool) -> None:
    assert evaluate_when(expr, INPUTS, {}) is expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("$input.missing == 'x'", False),  # unresolvable: == is false
        ("$input.missing != 'x'", False),  # ... and so is !=
        ("$steps.nothing == null", False),
        ("$nope.x != 1", False),
        ("$input.missing is null", True),  # unresolvable: is null is true
        ("$input.none is null", True),
        ("$input.n is null", False),
        ("$input.none is not null", True),  # resolves (to null): is not null is true
        ("$input.n is not null", True),
        ("$input.missing is not null", False),
        ("$steps.a is not null", True),
        ("$steps.b is null", True),
    ],
)
def test_when_with_unresolvable_and_null_references(expr: str, expected: bool) -> None:
    assert evaluate_when(expr, INPUTS, {"a": None}) is expected


@pytest.mark.parametrize(
    "expr",
    ["$input.n > 3", "$input.n==3", "$input.n", "", "$input.n is  null x", "$input.n equals 3", "not $x"],
)
def test_unknown_when_syntax_is_false(expr: str) -> None:
    assert evaluate_when(expr, INPUTS, {}) is False


def test_literals_parse_as_the_runtime_parses_them() -> None:
    texts = ["null", "true", "false", "'q'", '"q"', "7", "-7", "1.5", "1e3", "x y"]
    assert [parse_literal(t) for t in texts] == [None, True, False, "q", "q", 7, -7, 1.5, 1000.0, "x y"]
    assert parse_literal("NULL") == "NULL" and parse_literal("'") == ""


def test_a_false_when_skips_the_step_and_records_it() -> None:
    tools = Tools()
    gate = S("a", "gate", when="$input.go == true")
    outcome = run([gate, S("b", "next", x="$input.go")], {"go": False}, tools)
    assert outcome.success and [c[0] for c in tools.calls] == ["b"]
    outcome = run([gate, S("b", fail="$steps.gate")], {"go": False}, tools)
    assert outcome.error == "Step 'step_1' input mapping error: Step 'gate' not found or not yet executed"
    assert completed(outcome) == [
        {"name": "gate", "tool": "a", "success": True, "skipped": True, "duration_ms": 0.0}
    ]


def test_a_skipped_last_step_makes_the_result_null() -> None:
    tools = Tools({"a": (True, {"kept": 1}, "")})
    outcome = run([S("a", "first"), S("b", "last", when="$steps.first == null")], tools=tools)
    assert outcome == PipelineOutcome(True, None) and len(tools.calls) == 1


def test_when_can_test_an_earlier_step_result() -> None:
    tools = Tools({"a": (True, "yes", "")})
    outcome = run([S("a", "first"), S("b", "second", when="$steps.first == yes")], tools=tools)
    assert outcome.success and [c[0] for c in tools.calls] == ["a", "b"]


# --- steps, results, failures, time -------------------------------------------------------------------------


def test_success_returns_the_last_steps_result_only() -> None:
    tools = Tools({"a": (True, {"a": 1}, ""), "b": (True, [1, 2], ""), "c": (True, "last", "")})
    assert run([S("a"), S("b"), S("c")], tools=tools) == PipelineOutcome(True, "last")


def test_tool_is_split_on_the_first_colon() -> None:
    assert split_tool("pack:tool") == ("pack", "tool")
    assert split_tool("pack") == ("pack", "")
    assert split_tool("pack:") == ("pack", "")
    assert split_tool("pack:tool:more") == ("pack", "tool:more")
    tools = Tools()
    run([S("p:t:x"), S("q")], tools=tools)
    assert [(c[0], c[1]) for c in tools.calls] == [("p", "t:x"), ("q", "")]


def test_unnamed_steps_are_named_step_i() -> None:
    tools = Tools({"a": (True, "zero", "")})
    outcome = run([S("a"), S("b", "named"), S("c", x="$steps.step_0")], tools=tools)
    assert outcome.success and tools.calls[2][2] == {"x": "zero"}
    failing = Tools({"c": (False, None, "boom")})
    assert run([S("a"), S("b", "named"), S("c")], tools=failing).error == "Step 'step_2' failed: boom"


def test_the_first_failure_ends_the_run_with_the_steps_so_far() -> None:
    tools = Tools({"b": (False, None, "tool raised ValueError")})
    outcome = run([S("a", "one"), S("b:x", "two"), S("c", "three")], tools=tools)
    assert (outcome.success, outcome.timed_out) == (False, False)
    assert outcome.error == "Step 'two' failed: tool raised ValueError"
    steps = completed(outcome)
    assert [(s["name"], s["tool"], s["success"], s["skipped"]) for s in steps] == [
        ("one", "a", True, False),
        ("two", "b:x", False, False),
    ]
    assert all(isinstance(s["duration_ms"], float) for s in steps)
    assert [c[0] for c in tools.calls] == ["a", "b"]


def test_the_deadline_is_checked_between_steps() -> None:
    clock = Clock()
    tools = Tools(clock=clock, cost=10)
    outcome = run([S("a"), S("b"), S("c"), S("d"), S("e")], tools=tools, deadline=25, limit_seconds=25,
                  clock=clock)  # fmt: skip
    assert (outcome.success, outcome.timed_out) == (False, True)
    assert outcome.error == "Sequential orchestration timed out after 3/5 steps (25s limit)"
    assert [s["name"] for s in completed(outcome)] == ["step_0", "step_1", "step_2"]
    assert [s["duration_ms"] for s in completed(outcome)] == [10000.0] * 3
    assert len(tools.calls) == 3


def test_a_last_step_that_ends_after_the_deadline_still_succeeds() -> None:
    clock = Clock()
    tools = Tools(clock=clock, cost=10)
    outcome = run([S("a"), S("b")], tools=tools, deadline=15, limit_seconds=15, clock=clock)
    assert outcome.success  # no check after the last step, as in the runtime


def test_a_step_cut_by_the_deadline_ends_the_run_as_timed_out() -> None:
    clock = Clock()
    tools = Tools({"b": (False, None, "tool timed out after 5.0 s")}, clock=clock, cost=5)
    outcome = run([S("a"), S("b"), S("c")], tools=tools, deadline=10, limit_seconds=10, clock=clock)
    assert outcome.timed_out
    assert outcome.error == "Sequential orchestration timed out after 1/3 steps (10s limit)"
    assert [(s["name"], s["success"]) for s in completed(outcome)] == [("step_0", True), ("step_1", False)]


def test_a_stopped_run_reports_nothing_and_runs_no_further_step() -> None:
    stop = threading.Event()
    tools = Tools()

    def execute(slug: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any, str]:
        stop.set()
        return tools(slug, tool, arguments)

    outcome = run_pipeline([S("a"), S("b")], {}, execute, deadline=1e9, limit_seconds=1, stopped=stop.is_set)
    assert outcome is None
    assert len(tools.calls) == 1


def test_only_results_that_later_steps_use_are_kept_and_they_are_bounded() -> None:
    uses = S("c", x="$steps.used", when="$steps.maybe is null")
    steps = [S("a", "big"), S("b", "used"), uses, S("d", "end")]
    assert kept_step_names(steps) == {"used", "maybe", "end"}
    big = (True, "x" * 5000, "")
    assert run(steps, tools=Tools({"a": big}), max_kept_bytes=1000).success  # `big` is never kept
    outcome = run(steps, tools=Tools({"b": big}), max_kept_bytes=1000)
    assert outcome.error == "Step 'used' failed: the step results later steps use exceed 1000 bytes"
    assert [s["success"] for s in completed(outcome)] == [True, False]


def test_json_exceeds_is_a_lower_bound_that_stops_early() -> None:
    assert not json_exceeds({"a": "x" * 10, "b": [1, 2, None]}, 100)
    assert json_exceeds({"a": "x" * 200}, 100)
    chunk = ["y" * 1000] * 1000
    shared = {f"k{i}": chunk for i in range(100_000)}  # 100 GB as JSON, a few MB in memory
    started = time.monotonic()
    assert json_exceeds(shared, 1 << 20)
    assert time.monotonic() - started < 2


def test_pipeline_reports_are_bounded_like_an_agents() -> None:
    assert pipeline_report(PipelineOutcome(True, {"r": 1}), 100) == RunOutcome(value_json='{"r": 1}')
    failed = PipelineOutcome(False, {"steps_completed": []}, "Step 'x' failed: e")
    assert pipeline_report(failed, 100) == RunOutcome(
        failure_code="step_failed",
        failure_message="Step 'x' failed: e",
        failure_value_json='{"steps_completed": []}',
    )
    late = pipeline_report(PipelineOutcome(False, {"steps_completed": []}, "timed out", True), 100)
    assert (late.failure_code, late.timed_out) == ("timeout", True)
    assert pipeline_report(PipelineOutcome(True, "x" * 200), 100).failure_code == "result_too_large"
    assert pipeline_report(PipelineOutcome(True, float("nan")), 100).failure_code == "result_not_serializable"


def test_reported_failures_and_timeouts_are_named_with_their_result() -> None:
    partial = '{"steps_completed": [{"name": "s"}]}'
    failed = RunOutcome(
        failure_code="step_failed", failure_message="Step 's' failed: e", failure_value_json=partial
    )
    out = name_outcome(EndFacts(Ending.REPORTED, failed))
    assert (out.reason, out.error_code, out.error, out.timed_out) == (
        AuditReason.AGENT_ERROR, "step_failed", "Step 's' failed: e", False
    )  # fmt: skip
    assert out.result == {"steps_completed": [{"name": "s"}]}
    late = RunOutcome(
        failure_code="timeout", failure_message="timed out", failure_value_json=partial, timed_out=True
    )
    out = name_outcome(EndFacts(Ending.REPORTED, late))
    assert (out.reason, out.error_code, out.timed_out, out.result["steps_completed"][0]["name"]) == (
        AuditReason.TIMEOUT, "timeout", True, "s"
    )  # fmt: skip
    assert "max_runtime_seconds" in out.hint
    own = RunOutcome(failure_code="agent_exception", failure_message="m")
    agent = name_outcome(EndFacts(Ending.REPORTED, own))
    assert (agent.result, agent.reason) == (None, AuditReason.AGENT_ERROR)  # agents' failures carry no result


# --- policy ------------------------------------------------------------------------------------------------


def _sequential_manifest(steps: int, **agent: Any) -> Any:
    data = {
        "package_id": "seq",
        "version": "1.0.0",
        "package_type": "agent",
        "agent": {"orchestration": {"mode": "sequential", "steps": [{"tool": "t"}] * steps}, **agent},
    }
    return parse_manifest(data, source="test")


def test_a_sequential_run_may_make_one_call_per_step_whatever_its_limits_say() -> None:
    manifest = _sequential_manifest(60, limits={"max_tool_calls": 0})
    for sandboxed in (True, False):
        policy = resolve_run_policy(manifest, AgentSandboxConfig(), sandboxed=sandboxed)
        assert (policy.max_tool_calls, policy.clamped) == (60, ())
    ceiling = AgentSandboxConfig(limits=LimitsCeiling(max_tool_calls=5))
    policy = resolve_run_policy(manifest, ceiling, sandboxed=True)
    assert (policy.max_tool_calls, policy.clamped) == (5, ("max_tool_calls",))  # the host ceiling still wins


# --- whole runs through SandboxHost.run, with real tool workers and no engine ----------------------------



class Lab:
    """A host state with installed tool packs (host copies the workers import) and sequential agents."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            "PATH": "/usr/bin:/bin",
            "AGENTNODE_CONFIG": str(root / "cfg"),
            "AGENTNODE_RUN_DIR": str(root / "r"),
            "AGENTNODE_AGENT_SANDBOX": "1",
        }
        (root / "cfg").mkdir()
        self.configure({})
        self.lockfile = Lockfile(load_config(self.env).paths.lockfile)
        code = root / "packs" / "step-tools"
        code.mkdir(parents=True)
        (code / "step_tools.py").write_text(textwrap.dedent(STEP_TOOLS))
        self.put(STEP_TOOLS_MANIFEST, "trusted", host_path=str(code))
        word_tools = REPO / "examples" / "word-tools"
        word_data = manifest_data(load_manifest(word_tools))
        self.put(word_data, "trusted", host_path=str(word_tools), import_subdir="src")

    def configure(self, agent_sandbox: dict[str, Any]) -> None:
        section = {"image": "agentnode-sandbox:unit", "idle_timeout_seconds": 30, **agent_sandbox}
        (self.root / "cfg" / "config.json").write_text(json.dumps({"agent_sandbox": section}))

    def put(self, manifest: dict[str, Any], trust: str, *, host_path: str | None = None,
            import_subdir: str = "") -> None:  # fmt: skip
        data = manifest_data(parse_manifest(manifest, source=manifest["package_id"]))
        self.lockfile.put(
            LockEntry(
                slug=manifest["package_id"], version="1.0.0", package_type=data["package_type"],
                trust_level=trust, artifact_hash="a" * 64, import_subdir=import_subdir, sandbox_volume=None,
                host_path=host_path, manifest=data, installed_at="2026-01-01T00:00:00Z",
            )
        )  # fmt: skip

    def agent(self, slug: str, steps: list[dict[str, Any]], *, trust: str = "unverified",
              allowed: list[str] | None = None, runtime_s: int = 30) -> None:  # fmt: skip
        packages = ["word-tools", "step-tools"] if allowed is None else allowed
        self.put(
            {
                "package_id": slug,
                "version": "1.0.0",
                "package_type": "agent",
                "agent": {
                    "goal": "pipeline",
                    "orchestration": {"mode": "sequential", "steps": steps},
                    "tool_access": {"allowed_packages": packages},
                    "limits": {"max_runtime_seconds": runtime_s},
                },
            },
            trust,
        )

    def host(self) -> SandboxHost:
        return SandboxHost(config=load_config(self.env), env=self.env, client_factory=_no_engine,
                           sandbox_backend=_NoSandbox())  # fmt: skip

    def lines(self, run_id: str) -> list[str]:
        path = load_config(self.env).paths.audit_file
        return [line for line in path.read_text().splitlines() if run_id in line]

    def end(self, run_id: str) -> dict[str, Any]:
        """The run's one end record, after its one start record."""
        records = [json.loads(line) for line in self.lines(run_id)]
        assert [r["event"] for r in records] == ["agent_run_start", "agent_run"], records
        return records[1]


def _no_engine() -> Any:
    raise AssertionError("a sequential run never reaches a container engine")


class _NoSandbox:
    """The sandbox backend: a sequential run never uses it, whatever its route."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a sequential run called the sandbox backend's {name}")


@pytest.fixture
def lab() -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="sq-", dir="/tmp"))
    try:
        yield Lab(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(lab: Lab, slug: str, **kwargs: Any) -> Any:
    host = lab.host()
    try:
        return host.run(slug, kwargs=kwargs)
    finally:
        host.close()


PIPELINE = [
    {"name": "count", "tool": "word-tools:count_words", "input_mapping": {"text": "$input.text"}},
    {"name": "reverse", "tool": "word-tools:reverse_words", "input_mapping": {"text": "$input.text"}},
    {"name": "loud", "tool": "step-tools:shout", "input_mapping": {"text": "$input.text", "times": 2},
     "when": "$input.loud == true"},
    {"name": "final", "tool": "step-tools:shout", "input_mapping": {"text": "$input.text", "times": 1}},
]  # fmt: skip


@pytest.mark.parametrize("trust", ["unverified", "trusted"])
def test_a_pipeline_runs_on_the_host_whatever_its_route_and_is_audited_once(lab: Lab, trust: str) -> None:
    combine = {"name": "final", "tool": "step-tools:combine",
               "input_mapping": {"count": "$steps.count", "reversed": "$steps.reverse"}}  # fmt: skip
    lab.agent("seq", [*PIPELINE[:3], combine], trust=trust)
    r = _run(lab, "seq", text="one two three", loud=False, goal="not an input")
    assert r.success, (r.error_code, r.error)
    assert r.result == {"summary": "3 words, reversed: three two one"}  # whole results of earlier steps
    assert (r.mode_used, r.reason, r.timed_out) == ("agent_sequential", AuditReason.AGENT_COMPLETED, False)
    end = lab.end(r.run_id)
    where = (end["source"], end["sandbox"], end["runtime"], end["image"])
    assert where == ("agent_sequential", False, None, None)
    assert (end["reason"], end["tool_calls"], end["tool_refusals"]) == ("agent_completed", 3, 0)
    audit = "\n".join(lab.lines(r.run_id))
    for text in ("reverse", "count", "three", "words", "final", "loud", "combine", "step-tools"):
        assert text not in audit  # step names, inputs and tool outputs never reach the audit log


def test_a_failing_step_ends_the_run_with_the_steps_so_far(lab: Lab) -> None:
    lab.agent("seq", [PIPELINE[0], {"name": "boom", "tool": "step-tools:fail"}, PIPELINE[3]])
    r = _run(lab, "seq", text="a b")
    assert (r.success, r.reason, r.error_code) == (False, AuditReason.AGENT_ERROR, "step_failed")
    assert r.error.startswith("Step 'boom' failed: ") and "tool-authored" not in r.error
    steps = [(s["name"], s["success"]) for s in r.result["steps_completed"]]
    assert steps == [("count", True), ("boom", False)]
    end = lab.end(r.run_id)
    assert (end["reason"], end["action"], end["tool_calls"]) == ("agent_error", "deny", 2)
    assert "boom" not in "\n".join(lab.lines(r.run_id))


def test_a_refused_step_is_a_failed_step_naming_the_refusal(lab: Lab) -> None:
    lab.agent("seq", [PIPELINE[0], PIPELINE[3]], allowed=["word-tools"])
    r = _run(lab, "seq", text="a b")
    assert r.error == (
        "Step 'final' failed: TOOL_NOT_ALLOWED: package 'step-tools' is not on this run's tool allowlist"
    )
    steps = [(s["name"], s["success"]) for s in r.result["steps_completed"]]
    assert steps == [("count", True), ("final", False)]
    end = lab.end(r.run_id)
    assert (end["tool_calls"], end["tool_refusals"]) == (1, 1)


def test_arguments_over_the_gates_limit_are_refused_before_they_are_built(lab: Lab) -> None:
    big = {f"k{i}": "$input.text" for i in range(200)}
    lab.agent("seq", [{"name": "wide", "tool": "step-tools:shout", "input_mapping": big}])
    r = _run(lab, "seq", text="x" * 10_000)
    assert r.error == "Step 'wide' failed: TOO_LARGE: arguments_json exceeds 1048576 bytes"
    assert lab.end(r.run_id)["tool_refusals"] == 1


def test_the_deadline_ends_a_pipeline_as_timed_out_with_its_steps(lab: Lab) -> None:
    nap = {"tool": "step-tools:nap", "input_mapping": {"seconds": 0.6, "log": str(lab.root / "naps")}}
    lab.agent("seq", [{"name": "a", **nap}, {"name": "b", **nap}, {"name": "c", **nap}], runtime_s=1)
    started = time.monotonic()
    r = _run(lab, "seq")
    assert time.monotonic() - started < 5
    assert (r.success, r.timed_out, r.reason, r.error_code) == (False, True, AuditReason.TIMEOUT, "timeout")
    assert r.error.startswith("Sequential orchestration timed out after ") and "(1s limit)" in r.error
    steps = r.result["steps_completed"]
    assert 1 <= len(steps) <= 2 and (steps[0]["name"], steps[0]["success"]) == ("a", True)
    end = lab.end(r.run_id)
    assert (end["reason"], end["timed_out"]) == ("timeout", True)


def test_cancel_stops_a_pipeline_between_steps(lab: Lab) -> None:
    log = lab.root / "naps"
    nap = {"tool": "step-tools:nap", "input_mapping": {"seconds": 0.5, "log": str(log)}}
    lab.agent("seq", [{"name": f"n{i}", **nap} for i in range(20)])
    host = lab.host()
    started: list[str] = []
    try:
        timer = threading.Timer(0.8, lambda: host.cancel(started[0]))
        timer.start()
        r = host.run("seq", on_start=started.append)
        timer.join()
    finally:
        host.close()
    assert (r.success, r.reason) == (False, AuditReason.CANCELLED)
    time.sleep(1.2)  # a call in flight at the cancel ends; no further step starts
    end = lab.end(r.run_id)
    assert end["reason"] == "cancelled" and 1 <= end["tool_calls"] <= 3
    assert len(log.read_text().splitlines()) == end["tool_calls"]


def test_a_long_pipeline_is_not_held_to_max_tool_calls(lab: Lab) -> None:
    step = {"tool": "word-tools:count_words", "input_mapping": {"text": "$input.text"}}
    lab.agent("seq", [step] * 60)  # the default limits.max_tool_calls is 40
    r = _run(lab, "seq", text="a b c")
    assert r.success and r.result == {"count": 3}
    assert lab.end(r.run_id)["tool_calls"] == 60
    lab.configure({"limits": {"max_tool_calls": 5}})  # a host ceiling still binds a community agent
    r = _run(lab, "seq", text="a b c")
    assert r.error == "Step 'step_5' failed: TOOL_CALL_LIMIT: this run's tool-call cap is used up"


def test_admission_refusals_stay_as_they_are(lab: Lab) -> None:
    lab.agent("seq", [PIPELINE[0]])
    lab.env["AGENTNODE_AGENT_SANDBOX"] = "0"
    r = _run(lab, "seq", text="a")
    assert r.reason is AuditReason.REFUSED_FLAG_OFF
    records = [json.loads(line) for line in lab.lines(r.run_id)]
    assert [(x["event"], x["source"]) for x in records] == [("agent_run", "agent_sandbox")]


def test_a_failed_runs_steps_completed_cross_the_admin_socket() -> None:
    from host.api.client import result_from
    from host.api.server import report_from
    from host.runtime.result import RunResult

    entry = {"name": "s", "tool": "t", "success": False, "duration_ms": 1.0, "skipped": False}
    steps = {"steps_completed": [entry]}
    failed = RunResult(False, steps, "Step 's' failed: e", "step_failed", timed_out=True)
    back = result_from(report_from(failed))
    assert (back.success, back.result, back.error_code, back.timed_out) == (False, steps, "step_failed", True)
    assert result_from(report_from(RunResult(False, error="boom"))).result is None  # agents' failures: none
    unjson = report_from(RunResult(False, result={"x": float("nan")}, error="e"))
    assert (unjson.success, unjson.result_json, unjson.error) == (False, "", "e")
