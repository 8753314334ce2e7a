"""The agentnode format's run-time rules, each through a real pack installed unchanged and run sandboxed.

Packs here are written the way the publisher accepts them (manifest_version 0.1 or 0.2, a package directory
with the entrypoint module inside), and the agent probes only the AgentContext API a published agent uses,
so a rule that holds here holds for packs in the wild (../shared/agentnode-format.md §1.4, §1.7, §1.8, §3.3).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

SUMMARY = "A pack that does one useful thing well."
PERMISSIONS = {
    "network": {"level": "none"},
    "filesystem": {"level": "none"},
    "code_execution": {"level": "none"},
    "data_access": {"level": "input_only"},
    "user_approval": {"required": "never"},
}

# A multi-tool pack as real ones are written: a package-level `run` that dispatches on `operation`, plus
# functions named like its tools.
MULTI_TOOLS = """
def run(operation="describe", text="", **kwargs):
    if operation == "count":
        return count(text)
    return {"ran": "run", "operation": operation}

def count(text=""):
    return {"ran": "count", "words": len(text.split())}

def upper(text=""):
    return {"ran": "upper", "text": text.upper()}
"""

SINGLE_TOOL = """
def echo(**kwargs):
    return {"ran": "echo", "kwargs": kwargs}
"""

# The probe agent runs a plan of context calls and reports what each did, by exception class name (a
# published agent imports nothing from the host).
PROBE = """
import time

def _call(context, step):
    op = step["op"]
    if op == "tool":
        r = context.run_tool(step["slug"], step.get("tool"), **step.get("kwargs", {}))
        return {"success": r.success, "result": r.result, "error": r.error}
    if op == "iterate":
        context.next_iteration()
        return {"iteration": context.iteration}
    if op == "sleep":
        time.sleep(step["seconds"])
        return {}
    if op == "allowed":
        return {"allowed": context.allowed_packages}
    raise ValueError(op)

def run(context, plan=(), **kwargs):
    seen = []
    for step in plan:
        try:
            seen.append(_call(context, step))
        except Exception as exc:
            seen.append({"raised": type(exc).__name__, "permission": isinstance(exc, PermissionError),
                         "runtime_error": isinstance(exc, RuntimeError)})
    return {"seen": seen, "done": True}
"""


def _write(parent: Path, slug: str, manifest: dict[str, Any], package: str, modules: dict[str, str]) -> Path:
    """A pack directory: `package/` with its modules, and agentnode.yaml."""
    pack = parent / slug
    shutil.rmtree(pack, ignore_errors=True)  # a test may reinstall the pack with another manifest
    (pack / package).mkdir(parents=True)
    (pack / package / "__init__.py").write_text("")
    for name, source in modules.items():
        (pack / package / f"{name}.py").write_text(textwrap.dedent(source))
    (pack / "agentnode.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return pack


def _published(slug: str, package_type: str, version: str = "0.2", **top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "manifest_version": version,
        "package_id": slug,
        "package_type": package_type,
        "name": slug.replace("-", " ").title(),
        "publisher": "someone",
        "version": "1.0.0",
        "summary": SUMMARY,
    }
    if version == "0.1":
        data.update(runtime="python", install_mode="package", hosting_type="agentnode_hosted",
                    permissions=PERMISSIONS)  # fmt: skip
    return {**data, **top}


def _install_tools(state: HostState, parent: Path) -> None:
    """Two trusted tool packs: a 0.1 multi-tool pack whose tools have no entrypoint of their own, and a
    0.2 single-tool pack with only a tool-level entrypoint (no package entrypoint)."""
    multi = _published(
        "multi-tools", "toolpack", "0.1", entrypoint="multi_tools.tool",
        capabilities={"tools": [{"name": "count", "capability_id": "word_count"},
                                {"name": "upper", "capability_id": "text_upper"}]},
    )  # fmt: skip
    single = _published(
        "single-tool", "toolpack",
        capabilities={"tools": [
            {"name": "echo", "capability_id": "echo", "entrypoint": "single_tool.tool:echo"},
        ]},
    )  # fmt: skip
    state.install(_write(parent, "multi-tools", multi, "multi_tools", {"tool": MULTI_TOOLS}), trust="trusted")
    state.install(
        _write(parent, "single-tool", single, "single_tool", {"tool": SINGLE_TOOL}), trust="trusted"
    )


def _run_probe(
    state: HostState,
    parent: Path,
    plan: list[dict[str, Any]],
    agent: dict[str, Any],
    *,
    version: str = "0.2",
    dependencies: Any = None,
) -> Any:
    """Install the probe agent with this `agent:` block (entrypoint and goal added) and run the plan."""
    top: dict[str, Any] = {
        "agent": {"entrypoint": "probe_agent.main:run", "goal": "Probe the runtime", **agent}
    }
    if dependencies is not None:
        top["dependencies"] = dependencies
    manifest = _published("probe-agent", "agent", version, **top)
    state.install(_write(parent, "probe-agent", manifest, "probe_agent", {"main": PROBE}))
    host = state.host()
    try:
        return host.run("probe-agent", kwargs={"plan": plan})
    finally:
        host.close()


def _seen(result: Any) -> list[dict[str, Any]]:
    assert result.success, (result.error_code, result.error, result.logs)
    seen: list[dict[str, Any]] = result.result["seen"]
    return seen


@pytest.fixture
def packs(tmp_path: Path) -> Path:
    return tmp_path / "packs"


def test_tool_resolution_follows_section_3_3(host_state: HostState, packs: Path) -> None:
    _install_tools(host_state, packs)
    plan = [
        {
            "op": "tool",
            "slug": "multi-tools",
            "kwargs": {"operation": "count", "text": "a b c"},
        },  # no name: run
        {
            "op": "tool",
            "slug": "multi-tools",
            "tool": "upper",
            "kwargs": {"text": "hi"},
        },  # the module's upper
        {"op": "tool", "slug": "multi-tools", "tool": "word_count", "kwargs": {}},  # a capability id: run
        {"op": "tool", "slug": "multi-tools", "tool": "no_such_tool", "kwargs": {}},  # unknown: run
        {"op": "tool", "slug": "single-tool", "tool": "echo", "kwargs": {"x": 1}},  # its own entrypoint
        {"op": "tool", "slug": "single-tool", "kwargs": {}},  # no name, no package entrypoint
        {"op": "tool", "slug": "single-tool", "tool": "nope", "kwargs": {}},  # unknown, no package entrypoint
    ]
    seen = _seen(_run_probe(host_state, packs, plan, {}))
    assert [s.get("result") for s in seen[:5]] == [
        {"ran": "count", "words": 3},
        {"ran": "upper", "text": "HI"},
        {"ran": "run", "operation": "describe"},
        {"ran": "run", "operation": "describe"},
        {"ran": "echo", "kwargs": {"x": 1}},
    ]
    for refused in seen[5:]:
        assert refused["success"] is False and refused["error"].startswith("TOOL_NOT_FOUND"), refused


def test_an_absent_allowlist_is_unrestricted_and_an_empty_one_allows_nothing(
    host_state: HostState, packs: Path
) -> None:
    _install_tools(host_state, packs)
    plan = [{"op": "allowed"}, {"op": "tool", "slug": "single-tool", "tool": "echo"}]
    unrestricted = _seen(_run_probe(host_state, packs, plan, {}))
    assert unrestricted[0] == {"allowed": None} and unrestricted[1]["success"] is True
    listed = _seen(
        _run_probe(host_state, packs, plan, {"tool_access": {"allowed_packages": ["multi-tools"]}})
    )
    assert listed[0] == {"allowed": ["multi-tools"]} and listed[1]["permission"] is True
    empty = _seen(_run_probe(host_state, packs, plan, {"tool_access": {"allowed_packages": []}}))
    assert empty[0] == {"allowed": []} and empty[1]["permission"] is True


def test_max_tool_calls_zero_means_an_llm_only_agent(host_state: HostState, packs: Path) -> None:
    _install_tools(host_state, packs)
    plan = [{"op": "tool", "slug": "single-tool", "tool": "echo"}]
    seen = _seen(_run_probe(host_state, packs, plan, {"limits": {"max_tool_calls": 0}}))
    assert seen == [{"raised": "AgentLimitExceeded", "permission": False, "runtime_error": True}]


def test_max_iterations_lets_exactly_that_many_iterations_run(host_state: HostState, packs: Path) -> None:
    seen = _seen(_run_probe(host_state, packs, [{"op": "iterate"}] * 3, {"limits": {"max_iterations": 2}}))
    assert seen[:2] == [{"iteration": 1}, {"iteration": 2}]
    assert seen[2]["raised"] == "AgentLimitExceeded"


def test_stop_on_consecutive_errors_terminates_inside_the_failing_call(
    host_state: HostState, packs: Path
) -> None:
    _install_tools(host_state, packs)
    works = {"op": "tool", "slug": "single-tool", "tool": "echo"}
    broken = {"op": "tool", "slug": "single-tool"}  # TOOL_NOT_FOUND: a failed dispatch
    agent = {"termination": {"stop_on_consecutive_errors": 2}}
    seen = _seen(_run_probe(host_state, packs, [broken, works, broken, broken], agent))
    assert seen[0]["success"] is False and seen[1]["success"] is True  # a success resets the count
    assert seen[2]["success"] is False
    assert seen[3]["raised"] == "AgentTerminated" and seen[3]["runtime_error"] is True


def test_max_runtime_seconds_ends_the_run_as_timed_out(host_state: HostState, packs: Path) -> None:
    result = _run_probe(
        host_state, packs, [{"op": "sleep", "seconds": 30}], {"limits": {"max_runtime_seconds": 3}}
    )
    assert result.success is False and result.timed_out is True


@pytest.mark.parametrize(
    "dependencies",
    [
        ["web-search", "summarizer"],
        [
            {"package_id": "web-search", "role": "search", "is_required": True},
            {"package_slug": "summarizer", "required": False, "min_version": "0.2.0"},
        ],
    ],
    ids=["strings", "objects"],
)
def test_pack_dependencies_in_either_spelling_install_and_run(
    host_state: HostState, packs: Path, dependencies: Any
) -> None:
    result = _run_probe(host_state, packs, [], {}, dependencies=dependencies)
    assert _seen(result) == []


def test_a_0_1_agent_installs_and_runs(host_state: HostState, packs: Path) -> None:
    _install_tools(host_state, packs)
    plan = [{"op": "tool", "slug": "multi-tools", "tool": "count", "kwargs": {"text": "one two"}}]
    seen = _seen(_run_probe(host_state, packs, plan, {}, version="0.1"))
    assert seen == [{"success": True, "result": {"ran": "count", "words": 2}, "error": None}]
