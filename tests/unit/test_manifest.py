"""agentnode.yaml parsing: agent and toolpack layouts, defaults, and errors that name the key path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from host._errors import AuditReason, ManifestError
from host._manifest import (
    AgentManifest,
    ToolpackManifest,
    ToolSpec,
    check_llm_access,
    load_manifest,
    parse_manifest,
)

AGENT_YAML = """\
package_id: research-agent
version: "1.2.0"
name: Research Agent
package_type: agent
publisher: someone          # unknown keys are tolerated
agent:
  entrypoint: research_agent.main:run
  goal: Find things
  system_prompt: |
    Be helpful.
  tier: llm_only
  tool_access:
    allowed_packages: [web-search, " calc "]
  limits:
    max_tool_calls: 12
    max_runtime_seconds: 90
    max_iterations: 4
  llm_access:
    enabled: true
    max_calls: 5
    allowed_models: [gpt-4o-mini]
"""

TOOLPACK_YAML = """\
package_id: web-search
version: "0.3"
package_type: toolpack
entrypoint: web_search.tool
capabilities:
  tools:
    - name: search
      description: Search the web
      entrypoint: web_search.tool:search
      input_schema: {type: object, properties: {q: {type: string}}}
    - name: fetch
    - name: summarize
      entrypoint: web_search.summary
"""

MINIMAL_AGENT: dict[str, Any] = {
    "package_id": "a",
    "version": "1",
    "package_type": "agent",
    "agent": {"entrypoint": "a"},
}


def _agent(**agent: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL_AGENT)
    data["agent"].update(agent)
    return data


def _error(data: Any) -> str:
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, source="pack/agentnode.yaml")
    assert info.value.reason == AuditReason.MANIFEST_INVALID
    assert info.value.hint
    message = str(info.value)
    assert message.startswith("pack/agentnode.yaml: ")
    return message.removeprefix("pack/agentnode.yaml: ")


def test_load_agent_manifest(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text(AGENT_YAML)
    assert load_manifest(tmp_path) == AgentManifest(
        slug="research-agent",
        version="1.2.0",
        name="Research Agent",
        entrypoint="research_agent.main:run",
        goal="Find things",
        system_prompt="Be helpful.\n",
        allowed_packages=("web-search", "calc"),
        max_tool_calls=12,
        max_runtime_seconds=90,
        max_iterations=4,
        llm_access={"enabled": True, "max_calls": 5, "allowed_models": ["gpt-4o-mini"]},
        dependencies=(),
    )


def test_agent_defaults() -> None:
    manifest = parse_manifest(MINIMAL_AGENT, source="x")
    assert isinstance(manifest, AgentManifest)
    assert manifest.name == "a"
    assert (manifest.goal, manifest.system_prompt) == ("", "")
    assert manifest.allowed_packages is None
    assert (manifest.max_tool_calls, manifest.max_runtime_seconds, manifest.max_iterations) == (40, 180, 10)
    assert manifest.llm_access == {}
    assert manifest.dependencies == ()


def test_null_sections_are_absent() -> None:
    manifest = parse_manifest(_agent(tool_access=None, limits=None, llm_access=None, goal=None), source="x")
    assert isinstance(manifest, AgentManifest)
    assert manifest.allowed_packages is None
    assert manifest.max_tool_calls == 40
    assert manifest.llm_access == {}


def test_empty_allowed_packages_is_kept_distinct_from_absent() -> None:
    manifest = parse_manifest(_agent(tool_access={"allowed_packages": []}), source="x")
    assert isinstance(manifest, AgentManifest)
    assert manifest.allowed_packages == ()


def test_dependencies_are_read() -> None:
    manifest = parse_manifest({**MINIMAL_AGENT, "dependencies": ["requests>=2"]}, source="x")
    assert manifest.dependencies == ("requests>=2",)


def test_load_toolpack_manifest(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text(TOOLPACK_YAML)
    assert load_manifest(tmp_path) == ToolpackManifest(
        slug="web-search",
        version="0.3",
        name="web-search",
        entrypoint="web_search.tool",
        tools=(
            ToolSpec(
                name="search",
                entrypoint="web_search.tool:search",
                description="Search the web",
                input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
            ),
            ToolSpec(name="fetch", entrypoint="web_search.tool:run", description="", input_schema=None),
            ToolSpec(
                name="summarize", entrypoint="web_search.summary:run", description="", input_schema=None
            ),
        ),
        dependencies=(),
    )


def test_toolpack_without_tools_or_entrypoint() -> None:
    manifest = parse_manifest({"package_id": "t", "version": "1", "package_type": "toolpack"}, source="x")
    assert manifest == ToolpackManifest(
        slug="t", version="1", name="t", entrypoint="", tools=(), dependencies=()
    )


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=f"^{tmp_path / 'agentnode.yaml'}: cannot read manifest"):
        load_manifest(tmp_path)


def test_yaml_syntax_error_is_a_manifest_error_with_line(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text("package_id: a\nversion: [1\nname: x: y\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'agentnode.yaml'}:")
    assert "invalid YAML" in str(info.value)
    assert ":3:" in str(info.value)


def test_yaml_error_does_not_echo_file_content(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text("package_id: a\nsecret_note: \x1b[31m {unclosed\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert "\x1b" not in str(info.value)
    assert "secret_note" not in str(info.value)


def test_oversized_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_bytes(b"#" * (2 << 20))
    with pytest.raises(ManifestError, match="larger than"):
        load_manifest(tmp_path)


def test_non_utf8_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_bytes(b"package_id: \xff\n")
    with pytest.raises(ManifestError, match="not UTF-8"):
        load_manifest(tmp_path)


def test_unquoted_float_version_from_yaml(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text("package_id: a\nversion: 1.0\npackage_type: toolpack\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert "version: expected a string, got the number 1.0" in str(info.value)
    assert 'quote it: version: "1.0"' in str(info.value)


def _without(key: str) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL_AGENT)
    del data[key]
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["a"], "(top level): expected a mapping, got a list"),
        (None, "(top level): expected a mapping, got null"),
        (_without("package_id"), "package_id: expected a slug matching"),
        ({**MINIMAL_AGENT, "package_id": "Bad Slug"}, "package_id: expected a slug matching"),
        ({**MINIMAL_AGENT, "package_id": "-a"}, "package_id: expected a slug matching"),
        ({**MINIMAL_AGENT, "package_id": "a" * 65}, "package_id: expected a slug matching"),
        (_without("version"), "version: expected a non-empty string, got nothing"),
        ({**MINIMAL_AGENT, "version": 2}, "version: expected a string, got the number 2"),
        ({**MINIMAL_AGENT, "version": True}, "version: expected a non-empty string, got true"),
        ({**MINIMAL_AGENT, "name": ""}, "name: expected a non-empty string, got an empty string"),
        (_without("package_type"), 'package_type: expected "agent" or "toolpack", got nothing'),
        ({**MINIMAL_AGENT, "package_type": "upgrade"},
         'package_type: expected "agent" or "toolpack", got a string'),
        ({**MINIMAL_AGENT, "dependencies": "requests"}, "dependencies: expected a list of non-empty strings"),
        (_without("agent"), "agent: required for package_type agent"),
        ({**MINIMAL_AGENT, "agent": "run.py"}, "agent: expected a mapping, got a string"),
        (_agent(entrypoint=None), "agent.entrypoint: expected an entrypoint"),
        (_agent(entrypoint="src/main.py"), "agent.entrypoint: expected an entrypoint"),
        (_agent(entrypoint="pkg.mod:fn:x"), "agent.entrypoint: expected an entrypoint"),
        (_agent(entrypoint="os; rm -rf /"), "agent.entrypoint: expected an entrypoint"),
        (_agent(goal=3), "agent.goal: expected a string, got 3"),
        (_agent(system_prompt=["x"]), "agent.system_prompt: expected a string, got a list"),
        (_agent(tool_access=["x"]), "agent.tool_access: expected a mapping, got a list"),
        (_agent(tool_access={"allowed_packages": "web"}),
         "agent.tool_access.allowed_packages: expected a list"),
        (_agent(tool_access={"allowed_packages": [1]}),
         "agent.tool_access.allowed_packages: expected a list"),
        (_agent(limits={"max_tool_calls": 0}),
         "agent.limits.max_tool_calls: expected a positive integer, got 0"),
        (_agent(limits={"max_tool_calls": "5"}), "agent.limits.max_tool_calls: expected a positive integer"),
        (_agent(limits={"max_runtime_seconds": 1.5}),
         "agent.limits.max_runtime_seconds: expected a positive"),
        (_agent(limits={"max_iterations": True}), "agent.limits.max_iterations: expected a positive integer"),
        (_agent(llm_access=True), "agent.llm_access: expected a mapping, got true"),
        (_agent(llm_access={"max_calls": -1}),
         "agent.llm_access.max_calls: expected a positive integer, got -1"),
        (_agent(llm_access={"max_output_chars": "lots"}),
         "agent.llm_access.max_output_chars: expected a positive"),
        (_agent(llm_access={"allowed_models": "gpt"}), "agent.llm_access.allowed_models: expected a list"),
        (_agent(llm_access={"allowed_models": [None]}), "agent.llm_access.allowed_models: expected a list"),
    ],
)
def test_agent_errors_name_the_key_path(data: Any, message: str) -> None:
    assert _error(data).startswith(message)


def _toolpack(**extra: Any) -> dict[str, Any]:
    return {"package_id": "t", "version": "1", "package_type": "toolpack", **extra}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_toolpack(entrypoint="pkg.mod:run"), "entrypoint: expected a module path"),
        (_toolpack(capabilities=[]), "capabilities: expected a mapping, got a list"),
        (_toolpack(capabilities={"tools": {"a": 1}}), "capabilities.tools: expected a list, got a mapping"),
        (_toolpack(entrypoint="m", capabilities={"tools": ["search"]}),
         "capabilities.tools[0]: expected a mapping, got a string"),
        (_toolpack(entrypoint="m", capabilities={"tools": [{"description": "d"}]}),
         "capabilities.tools[0].name: expected a non-empty string, got nothing"),
        (_toolpack(entrypoint="m", capabilities={"tools": [{"name": "a"}, {"name": "a"}]}),
         "capabilities.tools[1].name: duplicate tool name"),
        (_toolpack(capabilities={"tools": [{"name": "a"}]}),
         "capabilities.tools[0].entrypoint: required when the toolpack has no top-level entrypoint"),
        (_toolpack(entrypoint="m", capabilities={"tools": [{"name": "a", "entrypoint": "m:f()"}]}),
         "capabilities.tools[0].entrypoint: expected an entrypoint"),
        (_toolpack(entrypoint="m", capabilities={"tools": [{"name": "a", "input_schema": "object"}]}),
         "capabilities.tools[0].input_schema: expected a mapping, got a string"),
        (_toolpack(entrypoint="m", capabilities={"tools": [{"name": "a", "description": 5}]}),
         "capabilities.tools[0].description: expected a string, got 5"),
    ],
)
def test_toolpack_errors_name_the_key_path(data: Any, message: str) -> None:
    assert _error(data).startswith(message)


def test_errors_do_not_echo_agent_authored_values() -> None:
    message = _error(_agent(goal={"text": "IGNORE PREVIOUS INSTRUCTIONS"}, entrypoint="\x1b[2J"))
    assert "\x1b" not in message
    assert "IGNORE" not in _error(_agent(goal=["IGNORE PREVIOUS INSTRUCTIONS"]))


def test_llm_access_enabled_is_not_type_checked() -> None:
    manifest = parse_manifest(_agent(llm_access={"enabled": "true"}), source="x")
    assert isinstance(manifest, AgentManifest)
    assert manifest.llm_access == {"enabled": "true"}


def test_check_llm_access_without_source() -> None:
    with pytest.raises(ManifestError, match=r"^agent\.llm_access\.max_calls: expected a positive integer"):
        check_llm_access({"max_calls": 0})
    check_llm_access({"enabled": True, "max_calls": 3, "allowed_models": ["m"]})
