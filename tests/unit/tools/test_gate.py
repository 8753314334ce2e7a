"""Tool gate and runner: every refusal, the atomic cap, the closed envelope and failure containment."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from host.spec.manifest.model import ToolpackManifest, ToolSpec
from host.tools.arguments import schema_error
from host.tools.calls import (
    InstalledToolpack,
    ResolvedTool,
    ToolOutcome,
    ToolRefusal,
    reply_outcome,
    resolve_tool,
)
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner

TOOL_MODULE = textwrap.dedent(
    """
    import os, sys, time

    def echo(**kwargs):
        return kwargs

    def types(**kwargs):
        return {key: [type(value).__name__, value] for key, value in kwargs.items()}

    def count(path):
        with open(path, "a") as handle:
            handle.write("ran\\n")
        return "counted"

    def boom(token=""):
        raise ValueError("secret-" + token)

    def hang(timeout=None, mode=None):
        time.sleep(30)

    def crash():
        os._exit(3)

    def leave():
        sys.exit(0)

    def unserializable():
        return {"x": object()}

    def nan():
        return float("nan")

    def huge():
        return "x" * (1 << 20)

    def chatty():
        print("noise on stdout" * 1000)
        return "quiet reply"

    def reads_stdin():
        return input()

    def pid():
        return os.getpid()

    def env():
        return sorted(os.environ)

    def which():
        return WHO
    """
)

# `missing_function` is declared but not defined in the module.
TOOL_NAMES = (
    "echo types count boom hang crash leave unserializable nan huge chatty reads_stdin pid env which"
    " missing_function"
).split()


MISSING_IN_CALC = (
    "tool not found: package 'calc' defines no function for this call; its tools: " + ", ".join(TOOL_NAMES)
)[:200]


def make_pack(
    base: Path,
    slug: str,
    *,
    version: str = "1.0.0",
    trust: str = "trusted",
    src_layout: bool = False,
    who: str = "",
    schema: Mapping[str, Any] | None = None,
) -> InstalledToolpack:
    """Write a toolpack whose module `tool` holds every test tool; `who` tells packs apart."""
    pack_dir = base / f"{slug}-{version}"
    root = pack_dir / "src" if src_layout else pack_dir
    root.mkdir(parents=True)
    (root / "tool.py").write_text(TOOL_MODULE + f"\nWHO = {who!r}\n")
    tools = tuple(
        ToolSpec(name=name, entrypoint=f"tool:{name}", description="", input_schema=schema)
        for name in TOOL_NAMES
    )
    manifest = ToolpackManifest(
        slug=slug, version=version, name=slug, entrypoint="", tools=tools, dependencies=()
    )
    return InstalledToolpack(slug=slug, version=version, trust=trust, root=root, manifest=manifest)


def single_tool_pack(
    base: Path, slug: str, tools: tuple[ToolSpec, ...], entrypoint: str = ""
) -> InstalledToolpack:
    root = base / slug
    root.mkdir()
    (root / "single.py").write_text("def run(**kwargs):\n    return {'ran': 'run', **kwargs}\n")
    manifest = ToolpackManifest(
        slug=slug, version="1", name=slug, entrypoint=entrypoint, tools=tools, dependencies=()
    )
    return InstalledToolpack(slug=slug, version="1", trust="curated", root=root, manifest=manifest)


@pytest.fixture
def runner() -> Iterator[ToolRunner]:
    tool_runner = ToolRunner()
    yield tool_runner
    tool_runner.close()


def gate_for(
    runner: ToolRunner,
    *packs: InstalledToolpack,
    allowed: tuple[str, ...] | None = None,
    max_tool_calls: int = 20,
    budget: float = 30.0,
    tool_timeout: float = 10.0,
) -> ToolGate:
    by_slug = {pack.slug: pack for pack in packs}
    return ToolGate(
        allowed_packages=allowed if allowed is not None else tuple(by_slug),
        max_tool_calls=max_tool_calls,
        lookup=by_slug.get,
        runner=runner,
        deadline=time.monotonic() + budget,
        tool_timeout=tool_timeout,
    )


def refusal(gate: ToolGate, slug: str, tool: str, arguments_json: str) -> ToolRefusal:
    with pytest.raises(ToolRefusal) as caught:
        gate.call(slug, tool, arguments_json)
    return caught.value


def ok(outcome: ToolOutcome) -> Any:
    assert outcome.success, outcome.error
    assert outcome.error == ""
    assert outcome.mode_used == "host_worker"
    return outcome.result


# --- allowed calls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("src_layout", [False, True])
def test_allowed_call_runs_the_tool_and_counts(tmp_path: Path, runner: ToolRunner, src_layout: bool) -> None:
    pack = make_pack(tmp_path, "calc", src_layout=src_layout)
    gate = gate_for(runner, pack, max_tool_calls=3)
    assert ok(gate.call("calc", "echo", '{"a": [1, "two", null]}')) == {"a": [1, "two", None]}
    assert (gate.calls_made, gate.remaining, gate.refusals) == (1, 2, 0)


def test_empty_tool_name_selects_the_only_tool_or_the_implicit_run(
    tmp_path: Path, runner: ToolRunner
) -> None:
    only = ToolSpec(name="only", entrypoint="single:run", description="", input_schema=None)
    single = single_tool_pack(tmp_path, "single", (only,))
    implicit = single_tool_pack(tmp_path, "implicit", (), entrypoint="single")
    gate = gate_for(runner, single, implicit)
    assert ok(gate.call("single", "", '{"x": 1}')) == {"ran": "run", "x": 1}
    assert ok(gate.call("implicit", "", "{}")) == {"ran": "run"}
    assert ok(gate.call("implicit", "run", "{}")) == {"ran": "run"}


def test_tool_arguments_named_like_controls_are_plain_kwargs(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"))
    arguments = {
        "timeout": 0.001,
        "mode": "sandbox",
        "mode_used": "x",
        "root": "/",
        "entrypoint": "os:system",
    }
    outcome = gate.call("calc", "echo", json.dumps(arguments))
    assert ok(outcome) == arguments
    assert outcome.mode_used == "host_worker"


def test_ints_floats_and_big_ints_survive_the_round_trip(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"))
    result = ok(
        gate.call("calc", "types", '{"i": 1, "f": 1.0, "big": 123456789012345678901234567890, "e": 1e300}')
    )
    assert result == {
        "i": ["int", 1],
        "f": ["float", 1.0],
        "big": ["int", 123456789012345678901234567890],
        "e": ["float", 1e300],
    }
    assert type(result["f"][1]) is float and type(result["big"][1]) is int


# --- refusals -----------------------------------------------------------------------------------------


def test_every_refusal_reason_is_counted_and_runs_nothing(tmp_path: Path, runner: ToolRunner) -> None:
    marker = tmp_path / "ran.txt"
    count_args = json.dumps({"path": str(marker)})
    calc = make_pack(tmp_path, "calc")
    community = make_pack(tmp_path, "community", trust="verified")
    empty = single_tool_pack(tmp_path, "empty", ())
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": False}
    strict = make_pack(tmp_path, "strict", schema=schema)
    gate = gate_for(
        runner, calc, community, empty, strict, allowed=("calc", "community", "empty", "strict", "ghost")
    )
    cases: list[tuple[str, str, str, str]] = [
        ("", "count", count_args, "INVALID_REQUEST"),
        ("Bad Slug!", "count", count_args, "INVALID_REQUEST"),
        ("other", "count", count_args, "TOOL_NOT_ALLOWED"),
        ("calc", "count", '{"path": "' + "x" * (1 << 20) + '"}', "TOO_LARGE"),
        ("calc", "count", "", "INVALID_REQUEST"),
        ("calc", "count", "not json", "INVALID_REQUEST"),
        ("calc", "count", "[1]", "INVALID_REQUEST"),
        ("calc", "count", '{"path": NaN}', "INVALID_REQUEST"),
        ("calc", "count", '{"path": -Infinity}', "INVALID_REQUEST"),
        ("calc", "count", "[" * 200_000, "INVALID_REQUEST"),
        ("ghost", "count", count_args, "TOOL_NOT_FOUND"),
        ("community", "count", count_args, "TOOL_PACK_UNTRUSTED"),
        ("calc", "", count_args, "TOOL_NOT_FOUND"),
        ("calc", "nope", count_args, "TOOL_NOT_FOUND"),
        ("empty", "", "{}", "TOOL_NOT_FOUND"),
        ("strict", "count", '{"path": 3}', "TOOL_ARGUMENTS_INVALID"),
        ("strict", "count", '{"path": "p", "extra": 1}', "TOOL_ARGUMENTS_INVALID"),
    ]
    for number, (slug, tool, arguments_json, reason) in enumerate(cases, start=1):
        refused = refusal(gate, slug, tool, arguments_json)
        assert refused.reason == reason, (slug, tool, arguments_json[:40])
        assert str(refused).startswith(f"{reason}: ")
        assert len(refused.message) <= 200
        assert gate.refusals == number
    assert gate.calls_made == 0
    assert not marker.exists()


def test_refusal_messages_name_what_the_agent_needs(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(
        runner,
        make_pack(tmp_path, "calc"),
        make_pack(tmp_path, "strict", schema={"properties": {"n": {"type": "integer"}}}),
        allowed=("calc", "strict", "ghost"),
    )
    assert "'other-pack'" in refusal(gate, "other-pack", "", "{}").message
    assert "not installed on this host" in refusal(gate, "ghost", "", "{}").message
    listed = refusal(gate, "calc", "", "{}").message
    assert "no package entrypoint" in listed and "name one of" in listed and "echo" in listed
    assert "$.n: expected integer" in refusal(gate, "strict", "echo", '{"n": 1.5}').message
    untrusted = gate_for(runner, make_pack(tmp_path / "c", "comm", trust="unverified"))
    assert refusal(untrusted, "comm", "echo", "{}").message == (  # no tool sandboxes: the sandbox is off
        "community tool packs run only in tool sandboxes, and this host's sandbox is off "
        "(AGENTNODE_AGENT_SANDBOX=1 turns it on)"
    )


def test_refusals_do_not_consume_the_cap(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"), max_tool_calls=2)
    for slug, tool, arguments_json in [
        ("other", "echo", "{}"),
        ("calc", "nope", "{}"),
        ("calc", "echo", "[]"),
    ] * 3:
        refusal(gate, slug, tool, arguments_json)
    assert (gate.refusals, gate.calls_made, gate.remaining) == (9, 0, 2)
    ok(gate.call("calc", "echo", "{}"))
    ok(gate.call("calc", "echo", "{}"))
    assert refusal(gate, "calc", "echo", "{}").reason == "TOOL_CALL_LIMIT"
    assert (gate.refusals, gate.calls_made, gate.remaining) == (10, 2, 0)


def test_cap_holds_under_concurrency(tmp_path: Path, runner: ToolRunner) -> None:
    marker = tmp_path / "ran.txt"
    pack = make_pack(tmp_path, "calc")

    def slow_lookup(slug: str) -> InstalledToolpack:
        time.sleep(0.05)  # every caller passes the early cap check before anyone reserves
        return pack

    gate = ToolGate(
        allowed_packages=["calc"],
        max_tool_calls=5,
        lookup=slow_lookup,
        runner=runner,
        deadline=time.monotonic() + 30,
    )
    start = threading.Barrier(50)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait()
        try:
            result = gate.call("calc", "count", json.dumps({"path": str(marker)}))
            label = "ok" if result.success else result.error
        except ToolRefusal as refused:
            label = refused.reason
        with lock:
            outcomes.append(label)

    threads = [threading.Thread(target=worker) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(outcomes) == ["TOOL_CALL_LIMIT"] * 45 + ["ok"] * 5
    assert marker.read_text().splitlines() == ["ran"] * 5
    assert (gate.calls_made, gate.refusals, gate.remaining) == (5, 45, 0)


def test_spent_deadline_refuses_and_clamps_the_timeout(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"), budget=0.5, tool_timeout=60)
    started = time.monotonic()
    outcome = gate.call("calc", "hang", "{}")
    assert not outcome.success and outcome.error == "tool timed out after 0.5 s"
    assert time.monotonic() - started < 2
    assert refusal(gate, "calc", "echo", "{}").reason == "RUN_DEADLINE"
    assert (gate.calls_made, gate.refusals) == (1, 1)


# --- failures stay inside their call ------------------------------------------------------------------


def test_a_result_that_is_not_json_comes_back_as_the_formats_fallback_repr(
    tmp_path: Path, runner: ToolRunner
) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"))
    assert ok(gate.call("calc", "nan", "{}")) == {"__agentnode_fallback_repr__": True, "repr": "nan"}
    fallback = ok(gate.call("calc", "unserializable", "{}"))
    assert fallback["__agentnode_fallback_repr__"] is True and fallback["repr"].startswith("{'x': <object")


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    [
        ("boom", {"token": "sk-live-123"}, "tool raised ValueError"),
        ("reads_stdin", {}, "tool raised EOFError"),
        ("crash", {}, "tool worker crashed"),
        ("leave", {}, "tool worker crashed"),
        ("huge", {}, "tool result too large"),
        ("hang", {"timeout": 3600, "mode": "sandbox"}, "tool timed out after 1.0 s"),
        ("missing_function", {}, MISSING_IN_CALC),
    ],
)
def test_a_failing_tool_fails_only_its_call(
    tmp_path: Path, runner: ToolRunner, tool: str, arguments: dict[str, Any], error: str
) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"), tool_timeout=1.0)
    started = time.monotonic()
    outcome = gate.call("calc", tool, json.dumps(arguments))
    assert time.monotonic() - started < 5
    assert (outcome.success, outcome.result, outcome.error) == (False, None, error)
    assert "sk-live" not in outcome.error
    assert ok(gate.call("calc", "echo", '{"after": true}')) == {"after": True}
    assert gate.calls_made == 2


def test_tool_prints_do_not_corrupt_the_protocol(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"))
    assert ok(gate.call("calc", "chatty", "{}")) == "quiet reply"
    assert ok(gate.call("calc", "chatty", "{}")) == "quiet reply"


# --- workers ------------------------------------------------------------------------------------------


def test_worker_env_holds_no_api_keys(
    tmp_path: Path, runner: ToolRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-canary")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    keys = ok(gate_for(runner, make_pack(tmp_path, "calc")).call("calc", "env", "{}"))
    assert "OPENAI_API_KEY" not in keys and "ANTHROPIC_API_KEY" not in keys
    assert set(keys) <= {"PATH", "LANG", "HOME", "LC_CTYPE"}


def test_workers_are_reused_per_pack_and_never_shared(tmp_path: Path, runner: ToolRunner) -> None:
    alpha = make_pack(tmp_path, "alpha", who="alpha")
    beta = make_pack(tmp_path, "beta", who="beta")
    alpha_next = make_pack(tmp_path, "alpha", version="2.0.0", who="alpha 2")
    gate = gate_for(runner, alpha, beta)
    first, second = ok(gate.call("alpha", "pid", "{}")), ok(gate.call("alpha", "pid", "{}"))
    assert first == second
    assert ok(gate.call("beta", "pid", "{}")) != first
    assert ok(gate.call("alpha", "which", "{}")) == "alpha"
    assert ok(gate.call("beta", "which", "{}")) == "beta"
    upgraded = gate_for(runner, alpha_next)
    assert ok(upgraded.call("alpha", "pid", "{}")) != first
    assert ok(upgraded.call("alpha", "which", "{}")) == "alpha 2"


def test_a_timed_out_worker_is_replaced(tmp_path: Path, runner: ToolRunner) -> None:
    gate = gate_for(runner, make_pack(tmp_path, "calc"), tool_timeout=0.5)
    before = ok(gate.call("calc", "pid", "{}"))
    assert gate.call("calc", "hang", "{}").error == "tool timed out after 0.5 s"
    with pytest.raises(ProcessLookupError):
        os.kill(before, 0)
    assert ok(gate.call("calc", "pid", "{}")) != before


def test_arguments_that_are_not_strict_json_fail_without_taking_a_worker(
    tmp_path: Path, runner: ToolRunner
) -> None:
    pack = make_pack(tmp_path, "calc")
    tool = resolve_tool(pack.slug, pack.manifest, "pid")
    outcome = runner.run(pack, tool, {"x": float("nan")}, timeout=30)
    assert not outcome.success and outcome.error == "tool arguments are not strict JSON"
    assert not runner._busy and not runner._idle  # no worker was started, none is left busy


def test_close_kills_workers_and_later_calls_fail(tmp_path: Path) -> None:
    runner = ToolRunner()
    gate = gate_for(runner, make_pack(tmp_path, "calc"))
    pid = ok(gate.call("calc", "pid", "{}"))
    runner.close()
    runner.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert gate.call("calc", "pid", "{}").error == "tool runner is closed"


# --- schema subset ------------------------------------------------------------------------------------

OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "count": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "mode": {"enum": ["fast", "slow", 1]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "maybe": {"type": ["string", "null"]},
        "nested": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}


@pytest.mark.parametrize(
    "value",
    [
        {"name": "a"},
        {"name": "abcde", "count": 0, "ratio": 1, "flag": False, "mode": 1, "tags": [], "maybe": None},
        {
            "name": "a",
            "count": 10,
            "ratio": 2.5,
            "mode": "slow",
            "tags": ["x"],
            "maybe": "y",
            "nested": {"k": 3},
        },
    ],
)
def test_schema_accepts(value: dict[str, Any]) -> None:
    assert schema_error(OBJECT_SCHEMA, value) is None


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({}, "$.name: required property missing"),
        ({"name": ""}, "$.name: shorter than 1 characters"),
        ({"name": "abcdef"}, "$.name: longer than 5 characters"),
        ({"name": 5}, "$.name: expected string"),
        ({"name": "a", "count": 1.0}, "$.count: expected integer"),
        ({"name": "a", "count": True}, "$.count: expected integer"),
        ({"name": "a", "count": -1}, "$.count: less than 0"),
        ({"name": "a", "count": 11}, "$.count: greater than 10"),
        ({"name": "a", "ratio": False}, "$.ratio: expected number"),
        ({"name": "a", "flag": 0}, "$.flag: expected boolean"),
        ({"name": "a", "mode": "medium"}, "$.mode: not one of the allowed values"),
        ({"name": "a", "mode": True}, "$.mode: not one of the allowed values"),
        ({"name": "a", "tags": ["x", 2]}, "$.tags[1]: expected string"),
        ({"name": "a", "tags": "x"}, "$.tags: expected array"),
        ({"name": "a", "maybe": 1}, "$.maybe: expected string or null"),
        ({"name": "a", "nested": {"k": "v"}}, "$.nested.k: expected integer"),
        ({"name": "a", "surprise": 1}, "$.surprise: unexpected property"),
        ([], "$: expected object"),
    ],
)
def test_schema_rejects_with_the_failing_path(value: Any, error: str) -> None:
    assert schema_error(OBJECT_SCHEMA, value) == error


def test_schema_with_an_unknown_type_fails_closed() -> None:
    assert schema_error({"type": "intger"}, 1) == "$: the tool's schema uses an unsupported type"


# --- cheap checks before parsing, strict JSON both ways (red-team issue 12) ------------------------------


def test_checks_that_need_no_arguments_come_before_parsing(tmp_path: Path, runner: ToolRunner) -> None:
    """Findings 2 and 8: a refused call used to parse its arguments first (~23 MB for 1 MiB of JSON)."""
    calc = make_pack(tmp_path, "calc")
    community = make_pack(tmp_path, "community", trust="unverified")
    unparseable = "[" * 200_000  # would be INVALID_REQUEST if it were ever parsed
    gate = gate_for(runner, calc, community, allowed=("calc", "community", "ghost"), max_tool_calls=1)
    for slug, tool, expected in [
        ("other", "echo", "TOOL_NOT_ALLOWED"),
        ("ghost", "echo", "TOOL_NOT_FOUND"),
        ("community", "echo", "TOOL_PACK_UNTRUSTED"),
        ("calc", "nope", "TOOL_NOT_FOUND"),
    ]:
        assert refusal(gate, slug, tool, unparseable).reason == expected
    ok(gate.call("calc", "echo", "{}"))
    assert refusal(gate, "calc", "echo", unparseable).reason == "TOOL_CALL_LIMIT"
    late = gate_for(runner, calc, budget=-1)
    assert refusal(late, "calc", "echo", unparseable).reason == "RUN_DEADLINE"


def test_a_refusal_before_parsing_allocates_nothing_for_the_arguments(
    tmp_path: Path, runner: ToolRunner
) -> None:
    import tracemalloc

    strict = make_pack(tmp_path, "strict", schema={"type": "object", "additionalProperties": False})
    gate = gate_for(runner, strict, allowed=("strict", "ghost"))
    swarm = json.dumps({"x": [[]] * 340_000}, separators=(",", ":"))  # ~1 MiB of tiny lists
    arguments = json.dumps({"x": [[]] * 40_000}, separators=(",", ":"))  # under the container bound
    assert len(swarm) <= 1 << 20
    tracemalloc.start()
    try:
        refusal(gate, "ghost", "echo", swarm)
        before_parse = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert refusal(gate, "strict", "echo", swarm).reason == "INVALID_REQUEST"  # counted, not built
        counted = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert refusal(gate, "strict", "echo", arguments).reason == "TOOL_ARGUMENTS_INVALID"
        after_parse = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert before_parse < 64 * 1024, before_parse
    assert counted < 8 << 20, counted  # the scan's working copies of the text, not 340,000 lists
    assert after_parse > 1 << 20  # the schema needs the parsed value: the refusal budget bounds this one


def test_screen_refuses_without_a_request(tmp_path: Path, runner: ToolRunner) -> None:
    from host.tools.calls import MAX_REQUEST_BYTES

    calc = make_pack(tmp_path, "calc")
    nothing = gate_for(runner, calc, allowed=())
    with pytest.raises(ToolRefusal) as empty:
        nothing.screen(10)
    assert empty.value.reason == "TOOL_NOT_ALLOWED" and nothing.refusals == 1
    gate = gate_for(runner, calc, max_tool_calls=1)
    gate.screen(MAX_REQUEST_BYTES)
    with pytest.raises(ToolRefusal) as large:
        gate.screen(MAX_REQUEST_BYTES + 1)
    assert large.value.reason == "TOO_LARGE"
    ok(gate.call("calc", "echo", "{}"))
    with pytest.raises(ToolRefusal) as spent:
        gate.screen(10)
    assert spent.value.reason == "TOOL_CALL_LIMIT" and gate.refusals == 2


@pytest.mark.parametrize(
    "arguments", ['{"n": 1e999}', '{"n": -1e999}', '{"n": 1E400}', '{"n": [2e308]}', '{"n": NaN}']
)
def test_non_finite_arguments_never_reach_a_schema_or_a_tool(
    tmp_path: Path, runner: ToolRunner, arguments: str
) -> None:
    """Finding 8: `1e999` became inf and passed a `minimum: 0` schema into the tool."""
    schema = {"type": "object", "properties": {"n": {"type": ["number", "array"], "minimum": 0}}}
    gate = gate_for(runner, make_pack(tmp_path, "calc", schema=schema))
    refused = refusal(gate, "calc", "types", arguments)
    assert refused.reason == "INVALID_REQUEST" and "not strict JSON" in refused.message
    assert gate.calls_made == 0
    assert ok(gate.call("calc", "types", '{"n": 1e308}')) == {"n": ["float", 1e308]}


@pytest.mark.parametrize("result_json", ["1e999", "[-1e999]", '{"a": NaN}', "[" * 65 + "]" * 65, "{oops"])
def test_a_tool_result_that_is_not_strict_json_is_a_failed_call(result_json: str) -> None:
    from host.tools.calls import reply_outcome

    outcome = reply_outcome({"ok": True, "result_json": result_json})
    assert (outcome.success, outcome.result, outcome.error) == (
        False,
        None,
        "tool result is not JSON-serializable",
    )
    assert reply_outcome({"ok": True, "result_json": "[1e308]"}).result == [1e308]


def test_the_worker_refuses_non_finite_requests() -> None:
    from sandbox_wrapper._strictjson import loads_finite

    for text in ("1e999", '{"a": -1e999}', "[NaN]", "Infinity"):
        with pytest.raises(ValueError):
            loads_finite(text)
    assert loads_finite('{"a": 1.5, "b": 2}') == {"a": 1.5, "b": 2}


def test_on_admit_runs_only_for_admitted_calls(tmp_path: Path, runner: ToolRunner) -> None:
    admitted: list[int] = []
    gate = gate_for(runner, make_pack(tmp_path, "calc"), max_tool_calls=1)
    refusal_seen = pytest.raises(ToolRefusal)
    with refusal_seen:
        gate.call("calc", "echo", "[1]", on_admit=lambda: admitted.append(1))
    ok(gate.call("calc", "echo", "{}", on_admit=lambda: admitted.append(2)))
    with pytest.raises(ToolRefusal):
        gate.call("calc", "echo", "{}", on_admit=lambda: admitted.append(3))
    assert admitted == [2]


def test_a_new_pack_version_retires_idle_workers_of_the_old_one(tmp_path: Path) -> None:
    """After a reinstall the old version's idle workers are disposed, not kept until the host exits."""
    runner = ToolRunner()
    try:
        old, new = tmp_path / "v1", tmp_path / "v2"
        for root, reply in ((old, "one"), (new, "two")):
            root.mkdir()
            source = f"import os\ndef run(**kw):\n    return [{reply!r}, os.getpid()]\n"
            (root / "versioned.py").write_text(source)
        spec = ToolSpec(name="run", entrypoint="versioned:run", description="", input_schema=None)

        def pack(version: str, root: Path) -> InstalledToolpack:
            manifest = ToolpackManifest(
                slug="versioned", version=version, name="v", entrypoint="versioned", tools=(spec,),
                dependencies=(),
            )  # fmt: skip
            return InstalledToolpack(slug="versioned", version=version, trust="trusted", root=root,
                                     manifest=manifest)  # fmt: skip

        first = runner.run(pack("1.0.0", old), ResolvedTool(spec.entrypoint), {}, timeout=30)
        assert first.success and first.result[0] == "one"
        old_pid = first.result[1]
        second = runner.run(pack("2.0.0", new), ResolvedTool(spec.entrypoint), {}, timeout=30)
        assert second.success and second.result[0] == "two"
        deadline = time.monotonic() + 10
        while Path(f"/proc/{old_pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        status = Path(f"/proc/{old_pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text()
        assert all(k[1] == "2.0.0" for k in runner._idle)
    finally:
        runner.close()


# --- tool resolution (agentnode-format §3.3) ----------------------------------------------------------

DISPATCH_MODULE = textwrap.dedent(
    """
    import asyncio
    from os import getcwd  # imported, not the pack's: never reachable as a tool

    def run(operation="default", **kwargs):
        return {"ran": "run", "operation": operation, **kwargs}

    def count(text=""):
        return {"ran": "count", "n": len(text.split())}

    def other(**kwargs):
        return {"ran": "other"}

    async def slow_upper(text=""):
        await asyncio.sleep(0)
        return {"ran": "slow_upper", "text": text.upper()}

    def _private():
        return {"ran": "_private"}

    NOT_CALLABLE = 3
    """
)


def _spec(name: str, entrypoint: str = "", schema: Mapping[str, Any] | None = None) -> ToolSpec:
    return ToolSpec(name=name, entrypoint=entrypoint, description="", input_schema=schema)


def _manifest(entrypoint: str, *tools: ToolSpec, version: str = "0.2") -> ToolpackManifest:
    return ToolpackManifest(
        slug="multi", version="1", name="multi", entrypoint=entrypoint, tools=tools, dependencies=(),
        manifest_version=version,
    )  # fmt: skip


def test_no_tool_name_runs_the_package_entrypoints_default_function() -> None:
    tools = (_spec("count"), _spec("other", "multi_pack.tools:other"))
    default = ResolvedTool("multi_pack.tools:run")
    assert resolve_tool("multi", _manifest("multi_pack.tools", *tools), "") == default
    assert resolve_tool("multi", _manifest("multi_pack.tools:main", *tools), "") == ResolvedTool(
        "multi_pack.tools:main"
    )


def test_no_tool_name_never_falls_back_to_a_first_tool() -> None:
    only = _spec("count", "multi_pack.tools:count")
    for version in ("0.1", "0.2"):
        with pytest.raises(ToolRefusal) as caught:
            resolve_tool("multi", _manifest("", only, version=version), "")
        assert caught.value.reason == "TOOL_NOT_FOUND" and "count" in caught.value.message
    # This host's own manifest form (no manifest_version) keeps running its only tool.
    assert resolve_tool("multi", _manifest("", only, version=""), "").entrypoint == "multi_pack.tools:count"


def test_a_named_tool_with_its_own_entrypoint_runs_that_function() -> None:
    schema = {"type": "object"}
    other = _spec("other", "multi_pack.extra:other", schema)
    resolved = resolve_tool("multi", _manifest("multi_pack.tools", other), "other")
    assert resolved == ResolvedTool("multi_pack.extra:other", spec=other)


def test_a_name_without_its_own_entrypoint_is_looked_up_in_the_package_module_then_falls_back() -> None:
    count = _spec("count", schema={"type": "object"})
    manifest = _manifest("multi_pack.tools:main", count)
    assert resolve_tool("multi", manifest, "count") == ResolvedTool(
        "multi_pack.tools:count", fallback="main", spec=count
    )
    # An undeclared name is looked up the same way (no schema applies); capability ids are never names.
    assert resolve_tool("multi", manifest, "anything") == ResolvedTool("multi_pack.tools:anything", "main")
    # Names that cannot be a public function of the module run the default function.
    for name in ("_private", "a:b", "has space", "__init__"):
        assert resolve_tool("multi", manifest, name) == ResolvedTool("multi_pack.tools:main", "main")


def test_an_unknown_name_without_a_package_entrypoint_is_tool_not_found_listing_the_tools() -> None:
    manifest = _manifest("", _spec("count", "m.t:count", None), ToolSpec(
        name="search", entrypoint="m.t:search", description="", input_schema=None, capability_id="web_search"
    ))  # fmt: skip
    for name in ("nope", "web_search"):
        with pytest.raises(ToolRefusal) as caught:
            resolve_tool("multi", manifest, name)
        assert caught.value.reason == "TOOL_NOT_FOUND"
        assert "count" in caught.value.message and "search" in caught.value.message


def test_resolution_runs_for_real_in_a_worker(tmp_path: Path, runner: ToolRunner) -> None:
    root = tmp_path / "multi"
    (root / "multi_pack").mkdir(parents=True)
    (root / "multi_pack" / "__init__.py").write_text("")
    (root / "multi_pack" / "tools.py").write_text(DISPATCH_MODULE)
    declared = (
        _spec("count"), _spec("other", "multi_pack.tools:other"), _spec("broken", "multi_pack.tools:gone")
    )
    manifest = _manifest("multi_pack.tools", *declared)
    pack = InstalledToolpack(slug="multi", version="1", trust="trusted", root=root, manifest=manifest)
    gate = gate_for(runner, pack)
    # A multi-tool pack's dispatcher, called without a tool name, as real agents do.
    assert ok(gate.call("multi", "", '{"operation": "sum"}')) == {"ran": "run", "operation": "sum"}
    assert ok(gate.call("multi", "count", '{"text": "a b c"}')) == {"ran": "count", "n": 3}
    assert ok(gate.call("multi", "other", "{}")) == {"ran": "other"}
    assert ok(gate.call("multi", "slow_upper", '{"text": "hi"}')) == {"ran": "slow_upper", "text": "HI"}
    # Unknown, private, imported or non-callable names fall back to the default function.
    for name in ("unknown", "_private", "getcwd", "NOT_CALLABLE"):
        assert ok(gate.call("multi", name, "{}")) == {"ran": "run", "operation": "default"}
    # A declared entrypoint whose function is missing fails its call (the format's ImportError).
    broken = gate.call("multi", "broken", "{}")
    assert broken.success is False
    assert broken.error == "tool not found: package 'multi' defines no function for this call; its tools: " \
        "count, other, broken"


def test_an_unrestricted_gate_runs_any_installed_pack_and_refuses_what_is_not_installed(
    tmp_path: Path, runner: ToolRunner
) -> None:
    by_slug = {"calc": make_pack(tmp_path, "calc")}
    gate = ToolGate(allowed_packages=None, max_tool_calls=5, lookup=by_slug.get, runner=runner,
                    deadline=time.monotonic() + 30)  # fmt: skip
    gate.screen(100)  # an unrestricted run is not an empty allowlist
    assert ok(gate.call("calc", "echo", '{"a": 1}')) == {"a": 1}
    assert refusal(gate, "ghost", "echo", "{}").reason == "TOOL_NOT_FOUND"
    assert (gate.calls_made, gate.refusals) == (1, 1)


# --- the per-call fast paths (issue 17): same decisions, less work per call --------------------------------


def test_a_gate_resolves_each_tool_once_per_looked_up_pack(tmp_path: Path, runner: ToolRunner) -> None:
    from host.tools.gate import RESOLVED_PER_RUN

    first = single_tool_pack(tmp_path, "single", (), entrypoint="single")
    packs = {"single": first}
    gate = ToolGate(allowed_packages=("single",), max_tool_calls=RESOLVED_PER_RUN + 20,
                    lookup=packs.get, runner=runner, deadline=time.monotonic() + 60)
    outcome = gate.call("single", "run", '{"a": 1}')
    assert ok(outcome) == {"ran": "run", "a": 1}
    assert outcome.result_json is not None and json.loads(outcome.result_json) == outcome.result
    # A reinstall hands the gate a new pack whose manifest has no package entrypoint: resolved again.
    (tmp_path / "again").mkdir()
    packs["single"] = single_tool_pack(tmp_path / "again", "single", ())
    assert refusal(gate, "single", "run", "{}").reason == "TOOL_NOT_FOUND"
    packs["single"] = first
    for index in range(RESOLVED_PER_RUN + 10):  # names an agent makes up: at most the bound is kept
        assert ok(gate.call("single", f"made_up_{index}", "{}")) == {"ran": "run"}
    assert len(gate._resolved) == RESOLVED_PER_RUN


def test_only_large_arguments_wait_for_a_parse_slot(tmp_path: Path, runner: ToolRunner) -> None:
    from host.tools.gate import PARSE_SLOT_MIN_CHARS, PARSE_SLOTS

    pack = make_pack(tmp_path, "calc")
    gate = gate_for(runner, pack)
    for _ in range(PARSE_SLOTS):
        assert gate._parsing.acquire(timeout=1)  # every slot taken, as by concurrent large calls
    small, large = threading.Event(), threading.Event()
    calls = [({"s": "x" * 100}, small), ({"s": "x" * PARSE_SLOT_MIN_CHARS}, large)]
    for arguments, done in calls:
        text = json.dumps(arguments)
        call = lambda t=text, d=done: (ok(gate.call("calc", "echo", t)), d.set())  # noqa: E731
        threading.Thread(target=call, daemon=True).start()
    try:
        assert small.wait(10)  # a small call parses without a slot
        assert not large.wait(0.5)  # a large one waits for a slot
    finally:
        for _ in range(PARSE_SLOTS):
            gate._parsing.release()
    assert large.wait(10)


# --- a missing function is a flag on the outcome, not a message the gate matches -------------------------


class _Replying:
    """A ToolRunner stand-in that answers every call with one worker reply (as reply_outcome reads it)."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def run(self, pack: InstalledToolpack, tool: Any, arguments: Any, *, timeout: float) -> ToolOutcome:
        return reply_outcome(self.reply)


def test_only_the_missing_flag_makes_the_gate_name_the_packs_tools(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, "calc")
    missing = gate_for(_Replying({"ok": False, "failure": "missing"}), pack)  # type: ignore[arg-type]
    outcome = missing.call("calc", "missing_function", "{}")
    assert (outcome.success, outcome.missing, outcome.error) == (False, False, MISSING_IN_CALC)
    # the same words for another failure are passed on as they are: nothing branches on the text
    lookalike = ToolOutcome(success=False, result=None, error="tool not found (ImportError)")
    runner = _Replying({})
    runner.run = lambda *a, **k: lookalike  # type: ignore[method-assign]
    assert gate_for(runner, pack).call("calc", "echo", "{}") == lookalike  # type: ignore[arg-type]
