"""The published agentnode format (manifest_version 0.1 / 0.2), §1.2-§1.4 of agentnode-format.md: versions and
normalization, top-level keys, entrypoints; unknown keys as warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from host.core.errors import ManifestError
from host.spec.manifest.load import load_manifest
from host.spec.manifest.model import (
    DEFAULT_PERMISSIONS,
    MAX_WARNINGS,
    AgentManifest,
    ManifestWarnings,
    PackDependency,
)
from tests.unit.spec.manifest._support import (
    _DROP,
    AGENT_YAML,
    MINIMAL_AGENT,
    PUBLISHED_AGENT_YAML,
    _agent,
    _agent_of,
    _error,
    _parsed,
    _pub_agent,
    _pub_toolpack,
    _published,
    _toolpack_of,
    _v01,
    _warnings,
)

# === the agentnode format (manifest_version 0.1 / 0.2), rule by rule =======================================

def test_a_published_0_2_agent_loads_with_every_field(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text(PUBLISHED_AGENT_YAML)
    sink = ManifestWarnings()
    manifest = load_manifest(tmp_path, warnings=sink)
    assert sink.lines() == []
    assert manifest == AgentManifest(
        slug="research-agent",
        version="1.2.0",
        name="Research Agent",
        entrypoint="research_agent.main:run",
        goal="Research the topic and summarize it",
        system_prompt="You are a careful researcher who cites sources.",
        allowed_packages=("web-search", "summarizer"),
        max_tool_calls=0,
        max_runtime_seconds=3600,
        max_iterations=8,
        llm_access={},
        dependencies=("web-search", "summarizer"),
        llm_required=True,
        tier="llm_plus_tools",
        stop_on_consecutive_errors=10,
        orchestration=None,
        pack_dependencies=(
            PackDependency("web-search", role="search", required=True),
            PackDependency("summarizer", required=False, min_version="0.2.0"),
        ),
        manifest_version="0.2",
        publisher="someone",
        summary="Researches a topic and summarizes what it found.",
        permissions=DEFAULT_PERMISSIONS,
    )


# --- §1.2 manifest versions and normalization ---------------------------------------------------------------


def test_manifest_versions_0_1_and_0_2_are_accepted() -> None:
    assert _parsed(_published()).manifest_version == "0.2"
    assert _parsed(_v01(_published())).manifest_version == "0.1"


def test_without_manifest_version_a_manifest_is_read_in_the_host_form() -> None:
    assert _parsed(MINIMAL_AGENT).manifest_version == ""


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("0.3", 'got "0.3"'),
        ("1.0", 'got "1.0"'),
        ("0.2 ", "got a string"),
        ("\x1b[2J", "got a string"),
        ("", "got an empty string"),
        (None, "got null"),
        (0.2, 'got the number 0.2; quote it: manifest_version: "0.2"'),
        (2, 'got the number 2; quote it: manifest_version: "0.2"'),
        (["0.2"], "got a list"),
    ],
)
def test_other_manifest_versions_are_refused_naming_key_and_value(value: Any, got: str) -> None:
    message = _error(_published(manifest_version=value))
    assert message.startswith('manifest_version: expected "0.1" or "0.2"')
    assert message.endswith(got)


def test_0_2_fills_runtime_install_mode_hosting_type_and_permissions() -> None:
    manifest = _parsed(_published())  # none of them given
    assert manifest.permissions == DEFAULT_PERMISSIONS


@pytest.mark.parametrize("key", ["runtime", "install_mode", "hosting_type", "permissions"])
def test_0_1_is_not_normalized_and_requires_every_key(key: str) -> None:
    data = _v01(_published())
    del data[key]
    assert _error(data).startswith(f"{key}: ")


@pytest.mark.parametrize("key", ["runtime", "install_mode", "hosting_type", "permissions"])
def test_0_2_keeps_a_key_given_as_null_and_refuses_it(key: str) -> None:
    assert _error(_published(**{key: None})).startswith(f"{key}: expected")


@pytest.mark.parametrize("key", ["runtime", "install_mode", "hosting_type", "permissions"])
def test_the_host_form_reads_a_null_key_as_absent(key: str) -> None:
    assert _parsed({**MINIMAL_AGENT, key: None}).permissions == DEFAULT_PERMISSIONS


def test_0_2_merges_permissions_one_level_deep() -> None:
    manifest = _parsed(_published(permissions={"network": {"level": "restricted", "allowed_domains": ["x"]}}))
    assert manifest.permissions == {**DEFAULT_PERMISSIONS, "network": "restricted"}
    assert _parsed(_published(permissions={})).permissions == DEFAULT_PERMISSIONS
    # a sub-block replaces the default one whole: without its level it is refused
    message = _error(_published(permissions={"network": {"allowed_domains": ["example.com"]}}))
    assert message.startswith("permissions.network.level: expected one of none, restricted, unrestricted")


def test_0_1_permissions_must_name_all_five_levels() -> None:
    data = _v01(_published())
    assert _error({**data, "permissions": {}}).startswith("permissions: required in manifest_version 0.1")
    del data["permissions"]["filesystem"]
    assert _error(data).startswith("permissions.filesystem.level: expected one of none, temp,")


# --- §1.3 top-level keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize("slug", ["abc", "a-b", "-abc-", "123", "a" * 60, "---"])
def test_published_package_ids_are_accepted(slug: str) -> None:
    assert _parsed(_published(package_id=slug)).slug == slug


@pytest.mark.parametrize("slug", ["ab", "a" * 61, "a_b", "a.b", "Abc", "abc\n", "ab c", "../x", "", 123])
def test_other_published_package_ids_are_refused(slug: Any) -> None:
    message = _error(_published(package_id=slug))
    assert message.startswith("package_id: expected a slug matching [a-z0-9-]{3,60}")
    assert "\n" not in message and "../x" not in message


def test_the_host_form_keeps_its_own_slug_rule() -> None:
    assert _parsed({**MINIMAL_AGENT, "package_id": "a.b_c"}).slug == "a.b_c"
    assert _error({**MINIMAL_AGENT, "package_id": "-abc"}).startswith("package_id: expected a slug matching")


def test_upgrade_packages_are_refused_with_a_clear_message() -> None:
    with pytest.raises(ManifestError) as info:
        _parsed(_published(package_type="upgrade", agent=_DROP))
    assert "package_type: upgrade packages are not installed by this host" in info.value.message
    assert "agents and toolpacks" in info.value.hint


@pytest.mark.parametrize(
    ("name", "ok"), [("abc", True), ("a" * 100, True), ("ab", False), ("a" * 101, False), (None, False)]
)
def test_published_name_is_3_to_100_characters(name: Any, ok: bool) -> None:
    data = _published(name=name)
    if ok:
        assert _parsed(data).name == name
    else:
        assert _error(data).startswith("name: expected a string of 3 to 100 characters")


def test_published_publisher_is_required() -> None:
    message = _error(_published(publisher=_DROP))
    assert message.startswith("publisher: expected a non-empty string, got nothing")
    assert _error(_published(publisher="")).startswith("publisher: expected a non-empty string")


@pytest.mark.parametrize(
    ("summary", "ok"),
    [("s" * 20, True), ("s" * 200, True), ("s" * 19, False), ("s" * 201, False), (None, False)],
)
def test_published_summary_is_20_to_200_characters(summary: Any, ok: bool) -> None:
    data = _published(summary=summary)
    if ok:
        assert _parsed(data).summary == summary
    else:
        assert _error(data).startswith("summary: expected a string of 20 to 200 characters")


def test_the_host_form_needs_neither_publisher_nor_summary_and_keeps_neither() -> None:
    manifest = _parsed({**MINIMAL_AGENT, "publisher": {"x": 1}, "summary": 5})
    assert (manifest.publisher, manifest.summary) == ("", "")


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"runtime": "node"}, "runtime: expected one of python, mcp, remote, got a string"),
        ({"install_mode": "pip"}, "install_mode: expected one of package, remote_endpoint"),
        ({"hosting_type": "self_hosted"}, "hosting_type: expected one of agentnode_hosted"),
        ({"runtime": "mcp"}, "install_mode: package_type agent with runtime mcp takes install_mode package"),
        ({"install_mode": "remote_endpoint"}, "install_mode: package_type agent with runtime python takes"),
    ],
)
def test_runtime_install_mode_and_hosting_type_values_and_combinations(
    top: dict[str, Any], message: str
) -> None:
    assert _error(_published(**top)).startswith(message)


def test_mcp_and_remote_toolpacks_are_valid_but_not_run_by_this_host() -> None:
    with pytest.raises(ManifestError) as info:
        _parsed(_pub_toolpack(runtime="mcp"))
    assert "runtime: mcp toolpacks are not supported by this host" in info.value.message
    assert "Python" in info.value.hint
    remote = _pub_toolpack(runtime="remote", install_mode="remote_endpoint")
    assert _error(remote).startswith("runtime: remote toolpacks are not supported")
    assert _error(_pub_toolpack(runtime="remote")).startswith(
        "install_mode: package_type toolpack with runtime remote takes install_mode remote_endpoint"
    )


def test_an_agent_block_on_a_toolpack_is_ignored() -> None:
    assert _toolpack_of(_pub_toolpack(agent={"max_tokens": 1, "limits": "junk"})).slug == "pub-tools"


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"connector": {"provider": "github"}}, "connector: only toolpacks may declare a connector"),
        ({"connector": None}, "connector: only toolpacks may declare a connector"),
    ],
)
def test_a_connector_is_for_toolpacks_only(top: dict[str, Any], message: str) -> None:
    assert _error(_published(**top)).startswith(message)


@pytest.mark.parametrize(
    ("connector", "message"),
    [
        ({"auth_type": "api_key"}, "connector.provider: required"),
        ({"provider": "x", "auth_type": "custom"}, "connector.auth_type: expected one of api_key, oauth2"),
        ({"provider": "x", "scopes": "repo"}, "connector.scopes: expected a list"),
        ({"provider": "x", "scopes": [1]}, "connector.scopes: expected a list of strings"),
        ({"provider": "x", "token_refresh": "yes"}, "connector.token_refresh: expected true or false"),
        (
            {"provider": "x", "health_check": {"interval_seconds": 5}},
            "connector.health_check.endpoint: required",
        ),
        (
            {"provider": "x", "health_check": {"endpoint": "/h", "interval_seconds": 0}},
            "connector.health_check.interval_seconds: expected a positive integer, got 0",
        ),
        (
            {"provider": "x", "rate_limits": {"requests_per_minute": "many"}},
            "connector.rate_limits.requests_per_minute: expected a positive integer",
        ),
    ],
)
def test_a_toolpack_connector_is_checked(connector: dict[str, Any], message: str) -> None:
    assert _error(_pub_toolpack(connector=connector)).startswith(message)
    full = {"provider": "github", "auth_type": "oauth2", "scopes": ["repo"], "token_refresh": True,
            "health_check": {"endpoint": "/h", "interval_seconds": 60},
            "rate_limits": {"requests_per_minute": 5}}  # fmt: skip
    assert _parsed(_pub_toolpack(connector=full)).slug == "pub-tools"


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"env_requirements": [{"required": True}]}, "env_requirements[0].name: required"),
        ({"env_requirements": "API_KEY"}, "env_requirements: expected a list"),
        ({"use_cases": [3]}, "use_cases[0]: expected a string, got 3"),
        ({"examples": [{"title": "t"}]}, "examples[0].code: required"),
        ({"examples": ["x"]}, "examples[0]: expected a mapping"),
        ({"homepage_url": "javascript:alert(1)"}, "homepage_url: expected a URL starting with http"),
        ({"docs_url": "ftp://x"}, "docs_url: expected a URL"),
        ({"source_url": 5}, "source_url: expected a URL"),
        ({"compatibility": ["generic"]}, "compatibility: expected a mapping, got a list"),
    ],
)
def test_enrichment_fields_are_checked_as_the_publisher_does(top: dict[str, Any], message: str) -> None:
    assert _error(_published(**top)).startswith(message)


def test_enrichment_fields_in_their_accepted_shapes() -> None:
    data = _published(
        env_requirements=[{"name": "API_KEY", "required": True}],
        use_cases=["Read Excel files"],
        examples=[{"title": "Basic", "code": "run()"}],
        homepage_url="https://example.com",
        docs_url="",
        source_url="http://example.com/src",
        compatibility={"frameworks": [], "python": ">=3.10", "dependencies": ["requests>=2"]},
        tags="not a list",  # the publisher only warns about tags and categories
        categories=None,
        security={"signature": ""},
        license="MIT",
        upgrade_roles=["x"],
        install_strategy="local",
    )
    assert _warnings(data) == []


def test_the_host_form_does_not_check_publisher_only_metadata() -> None:
    data = {**MINIMAL_AGENT, "homepage_url": "javascript:x", "examples": ["x"], "connector": {}}
    assert _parsed(data).slug == "a"


# --- §1.4 entrypoints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entrypoint", "ok"),
    [
        ("pkg.main:run", True),
        ("_pkg.sub.mod:_run2", True),
        ("pkg:run", False),  # a single-segment module
        ("Pkg.main:run", False),  # capitals
        ("pkg.main", False),  # v1 form
        ("pkg.main:run:x", False),
        ("pkg.main:run()", False),
        ("pkg.main:run\n", False),
    ],
)
def test_published_agent_entrypoints_are_the_v2_form(entrypoint: str, ok: bool) -> None:
    data = _pub_agent(entrypoint=entrypoint)
    if ok:
        assert _agent_of(data).entrypoint == entrypoint
    else:
        message = _error(data)
        assert message.startswith('agent.entrypoint: expected an entrypoint like "package.module:function"')


def test_the_host_form_also_takes_one_segment_entrypoints() -> None:
    assert _agent_of(_agent(entrypoint="agent:run")).entrypoint == "agent:run"
    assert _agent_of(_agent(entrypoint="Agent")).entrypoint == "Agent"


def test_an_agent_entrypoint_is_required_unless_sequential() -> None:
    assert _error(_pub_agent(entrypoint=_DROP)).startswith("agent.entrypoint: expected an entrypoint")
    data = _published()
    del data["agent"]["entrypoint"]
    assert _error(data).startswith("agent.entrypoint: expected an entrypoint like")
    data["agent"]["orchestration"] = {"mode": "sequential", "steps": [{"tool": "web-search"}]}
    assert _agent_of(data).entrypoint == ""


def test_the_top_level_entrypoint_of_an_agent_is_not_validated_or_kept() -> None:
    manifest = _agent_of(_published(entrypoint="not a module: at all()"))
    assert manifest.entrypoint == "pub_agent.main:run"


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        (_DROP, 'entrypoint: expected a module path like "package.tools"'),
        ("pub_tools", 'entrypoint: expected a module path like "package.tools" (lower case, at least two'),
        ("pub_tools.tool:run", "entrypoint: expected a module path"),
    ],
)
def test_0_1_toolpacks_need_a_v1_package_entrypoint(entrypoint: Any, message: str) -> None:
    assert _error(_v01(_pub_toolpack(entrypoint=entrypoint))).startswith(message)


def test_0_1_tool_entrypoints_are_kept_in_either_form() -> None:
    tools = [{"name": "a", "capability_id": "a", "entrypoint": "pub_tools.other"},
             {"name": "b", "capability_id": "b", "entrypoint": "Pub:B"},
             {"name": "c", "capability_id": "c"}]  # fmt: skip
    manifest = _toolpack_of(_v01(_pub_toolpack(capabilities={"tools": tools})))
    assert [t.entrypoint for t in manifest.tools] == ["pub_tools.other:run", "Pub:B", ""]
    assert manifest.entrypoint == "pub_tools.tool"
    bad = [{"name": "a", "capability_id": "a", "entrypoint": "src/tool.py"}]  # never importable
    message = _error(_v01(_pub_toolpack(capabilities={"tools": bad})))
    assert message.startswith("capabilities.tools[0].entrypoint: expected an entrypoint")


def test_0_2_toolpack_entrypoint_rules() -> None:
    one = {"name": "a", "capability_id": "a"}
    # one tool: the package entrypoint (v1) serves it as module.run
    manifest = _toolpack_of(_pub_toolpack(capabilities={"tools": [one]}))
    assert manifest.tools[0].entrypoint == ""  # resolved by name at call time (§3.3)
    # ... or the tool's own v2 entrypoint, with no package entrypoint
    own = {**one, "entrypoint": "pub_tools.tool:a"}
    manifest = _toolpack_of(_pub_toolpack(entrypoint=_DROP, capabilities={"tools": [own]}))
    assert (manifest.entrypoint, manifest.tools[0].entrypoint) == ("", "pub_tools.tool:a")
    # neither
    message = _error(_pub_toolpack(entrypoint=_DROP, capabilities={"tools": [one]}))
    assert message.startswith("capabilities.tools[0].entrypoint: required when the toolpack has no top-level")
    # several tools: each needs its own, in v2 form
    two = [own, {"name": "b", "capability_id": "b"}]
    message = _error(_pub_toolpack(capabilities={"tools": two}))
    assert message.startswith("capabilities.tools[1].entrypoint: required when the toolpack has more than")
    v1 = [own, {"name": "b", "capability_id": "b", "entrypoint": "pub_tools.tool"}]
    message = _error(_pub_toolpack(capabilities={"tools": v1}))
    assert message.startswith('capabilities.tools[1].entrypoint: expected an entrypoint like "package.module')
    # the package entrypoint, when present, is v1 (no :function)
    assert _error(_pub_toolpack(entrypoint="pub_tools.tool:run")).startswith("entrypoint: expected a module")


# --- unknown keys: tolerated, reported as warnings ----------------------------------------------------------


def test_unknown_and_misspelled_keys_are_warnings_with_a_suggestion() -> None:
    data = _published(descripton="x", readme_md="y", custom_field=1)
    data["agent"].update(limtis={"max_tool_calls": 3}, sytem_prompt="x", llm_access={"max_call": 3})
    data["agent"]["limits"] = {"max_tool_call": 2}
    manifest = _agent_of(data)
    assert manifest.max_tool_calls == 40  # the misspelled limit is not applied: hence the warning
    assert _warnings(data) == [
        "descripton: unknown key, ignored (did you mean description?)",
        "custom_field: unknown key, ignored",
        "agent.limtis: unknown key, ignored (did you mean limits?)",
        "agent.sytem_prompt: unknown key, ignored (did you mean system_prompt?)",
        "agent.limits.max_tool_call: unknown key, ignored (did you mean max_tool_calls?)",
        "agent.llm_access.max_call: unknown key, ignored (did you mean max_calls?)",
    ]


def test_unknown_keys_of_the_host_form_are_reported_too() -> None:
    assert _warnings({**MINIMAL_AGENT, "entry_point": "x"}) == [
        "entry_point: unknown key, ignored (did you mean entrypoint?)"
    ]


def test_free_form_blocks_are_not_looked_into() -> None:
    data = _pub_agent(llm={"required": True, "provider": "openai", "anything": 1},
                      error_handling={"whatever": 1}, orchestration={"mode": "sequential", "steps": [
                          {"tool": "t", "input_mapping": {"any_key": "$input.x"}}]})  # fmt: skip
    assert _warnings(data) == []


def test_warnings_never_carry_raw_control_characters() -> None:
    hostile = "x\x1b]0;pwned\x07\r\n\u202e" + "y" * 500
    data: dict[Any, Any] = {**_published(), hostile: 1, 5: "int key"}
    lines = _warnings(data)
    assert len(lines) == 2
    assert all(c.isprintable() for line in lines for c in line)
    assert lines[0].startswith("x\\x1b]0;pwned\\x07\\r\\n\\u202e") and len(lines[0]) < 200
    assert lines[1] == "(top level): a key that is not a string (5) is ignored"


def test_warnings_are_bounded() -> None:
    data = _published(**{f"junk_{i}": i for i in range(MAX_WARNINGS + 25)})
    lines = _warnings(data)
    assert len(lines) == MAX_WARNINGS + 1
    assert lines[-1] == "... and 25 more warnings"


def test_a_manifest_without_unknown_keys_has_no_warnings() -> None:
    assert _warnings(_published()) == [] and _warnings(MINIMAL_AGENT) == []
    assert _warnings(_v01(_pub_toolpack())) == []


def test_load_manifest_reports_warnings(tmp_path: Path) -> None:
    (tmp_path / "agentnode.yaml").write_text(AGENT_YAML.replace("  limits:", "  limtis:"))
    sink = ManifestWarnings()
    manifest = load_manifest(tmp_path, warnings=sink)
    assert isinstance(manifest, AgentManifest) and manifest.max_tool_calls == 40
    assert sink.lines() == ["agent.limtis: unknown key, ignored (did you mean limits?)"]
