"""The published format's toolpack side, §1.5-§1.7: capabilities (tools, prompts, resources), permissions and
dependencies."""

from __future__ import annotations

from typing import Any

import pytest

from host.spec.manifest.model import (
    DEFAULT_PERMISSIONS,
    PackDependency,
    ToolSpec,
)
from tests.unit.spec.manifest._support import (
    MINIMAL_AGENT,
    _error,
    _parsed,
    _pub_toolpack,
    _published,
    _toolpack,
    _toolpack_of,
    _warnings,
)

# --- §1.5 capabilities --------------------------------------------------------------------------------------


def test_published_toolpacks_declare_at_least_one_tool() -> None:
    caps: Any
    for caps in ({}, {"tools": []}, {"tools": None}, None):
        message = _error(_pub_toolpack(capabilities=caps))
        assert message.startswith("capabilities.tools: a toolpack declares at least one tool")


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        ({"capability_id": "a"}, "capabilities.tools[0].name: expected a non-empty string, got nothing"),
        ({"name": "a"}, "capabilities.tools[0].capability_id: expected a non-empty string, got nothing"),
        ({"name": "a", "capability_id": ""}, "capabilities.tools[0].capability_id: expected a non-empty"),
        (
            {"name": "a", "capability_id": "a", "input_schema": {"type": "obj"}},
            "capabilities.tools[0].input_schema.type: expected one of string, integer, number, boolean",
        ),
        (
            {"name": "a", "capability_id": "a", "input_schema": {"type": ["object", "thing"]}},
            "capabilities.tools[0].input_schema.type: expected one of",
        ),
        (
            {"name": "a", "capability_id": "a", "input_schema": {"properties": {"q": "string"}}},
            "capabilities.tools[0].input_schema.properties: expected a mapping of property names",
        ),
        (
            {"name": "a", "capability_id": "a", "input_schema": {"required": "q"}},
            "capabilities.tools[0].input_schema.required: expected a list, got a string",
        ),
        (
            {"name": "a", "capability_id": "a",
             "input_schema": {"properties": {"q": {}}, "required": ["q", "r"]}},
            "capabilities.tools[0].input_schema.required: names a property that properties does not define",
        ),
        (
            {"name": "a", "capability_id": "a", "output_schema": {"type": "text"}},
            "capabilities.tools[0].output_schema.type: expected one of",
        ),
        (
            {"name": "a", "capability_id": "a", "output_schema": []},
            "capabilities.tools[0].output_schema: expected a mapping, got a list",
        ),
    ],
)
def test_published_tools_are_checked_as_the_publisher_does(tool: dict[str, Any], message: str) -> None:
    assert _error(_pub_toolpack(capabilities={"tools": [tool]})).startswith(message)


def test_published_tool_shapes_that_are_accepted() -> None:
    tool: dict[str, Any] = {
        "name": "a",
        "capability_id": "brand-new-capability",  # unknown ids only warn at the publisher
        "input_schema": {
            "type": ["object", "null"], "properties": {"q": {"type": "string"}}, "required": ["q"]
        },
        "output_schema": {"type": "object", "required": ["anything"]},  # no properties: not cross-checked
    }
    (spec,) = _toolpack_of(_pub_toolpack(capabilities={"tools": [tool]})).tools
    assert spec == ToolSpec(
        name="a",
        entrypoint="",
        description="",
        input_schema=tool["input_schema"],
        capability_id="brand-new-capability",
    )


def test_a_duplicate_tool_name_keeps_the_first_tool_with_a_warning() -> None:
    tools = [{"name": "a", "entrypoint": "m:first"}, {"name": "a", "entrypoint": "m:second"}]
    data = _toolpack(entrypoint="m", capabilities={"tools": tools})
    assert [t.entrypoint for t in _toolpack_of(data).tools] == ["m:first"]
    assert _warnings(data) == ["capabilities.tools[1].name: duplicate tool name; only the first tool so "
                               "named can be called"]  # fmt: skip


def test_a_description_that_is_not_a_string_is_dropped_with_a_warning() -> None:
    data = _toolpack(entrypoint="m", capabilities={"tools": [{"name": "a", "description": 5}]})
    assert _toolpack_of(data).tools[0].description == ""
    assert _warnings(data) == ["capabilities.tools[0].description: expected a string, got 5; ignored"]


def test_agent_tools_are_descriptive_and_checked() -> None:
    tools = [{"name": "research", "capability_id": "research", "entrypoint": "anything at all"}]
    assert _parsed(_published(capabilities={"tools": tools})).slug == "pub-agent"
    message = _error(_published(capabilities={"tools": [{"name": "research"}]}))
    assert message.startswith("capabilities.tools[0].capability_id: required")


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ({"prompts": [{"name": "p", "capability_id": "c"}]}, "capabilities.prompts[0].template: required"),
        (
            {"prompts": [{"name": "p", "capability_id": "c", "template": "t", "entrypoint": "m:f"}]},
            "capabilities.prompts[0].entrypoint: not allowed: prompts are not executable",
        ),
        (
            {"prompts": [{"name": "p", "capability_id": "c", "template": "t", "arguments": [{}]}]},
            "capabilities.prompts[0].arguments[0].name: required",
        ),
        ({"prompts": "p"}, "capabilities.prompts: expected a list"),
        ({"resources": [{"name": "r", "capability_id": "c"}]}, "capabilities.resources[0].uri: required"),
        (
            {"resources": [{"name": "r", "capability_id": "c", "uri": "file:///etc/passwd"}]},
            "capabilities.resources[0].uri: expected a URI starting with resource:// or https://",
        ),
        (
            {"resources": [{"name": "r", "capability_id": "c", "uri": "resource://x", "input_schema": {}}]},
            "capabilities.resources[0].input_schema: not allowed: resources are not executable",
        ),
        (
            {"resources": [{"name": "r", "capability_id": "c", "uri": "https://x", "content_path": "../x"}]},
            "capabilities.resources[0].content_path: expected a relative path without '..'",
        ),
    ],
)
def test_prompts_and_resources_are_checked(caps: dict[str, Any], message: str) -> None:
    assert _error(_published(capabilities=caps)).startswith(message)


def test_prompts_and_resources_in_their_accepted_shapes() -> None:
    caps = {
        "prompts": [{"name": "p", "capability_id": "c", "template": "t", "arguments": [{"name": "x"}]}],
        "resources": [
            {"name": "r", "capability_id": "c", "uri": "resource://x", "content_path": "docs/a.md"}
        ],
    }
    assert _warnings(_published(capabilities=caps)) == []


def test_the_host_form_keeps_tools_lenient() -> None:
    # no capability_id, a one-segment module, no tools at all: this host's form allows them
    manifest = _toolpack_of(_toolpack(entrypoint="tool", capabilities={"tools": [{"name": "a"}]}))
    assert manifest.tools == (ToolSpec(name="a", entrypoint="", description="", input_schema=None),)
    assert _toolpack_of(_toolpack()).tools == ()


# --- §1.6 permissions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "field_name", "value"),
    [
        ("network", "level", "unrestricted"),
        ("filesystem", "level", "workspace_write"),
        ("filesystem", "level", "any"),
        ("code_execution", "level", "shell"),
        ("data_access", "level", "persistent"),
        ("user_approval", "required", "high_risk_only"),
    ],
)
def test_permission_levels_are_kept(name: str, field_name: str, value: str) -> None:
    data = _published(permissions={name: {field_name: value}, "external_integrations": ["github"]})
    assert _parsed(data).permissions == {**DEFAULT_PERMISSIONS, name: value}


@pytest.mark.parametrize(
    ("permissions", "message"),
    [
        ({"network": {"level": "full"}}, "permissions.network.level: expected one of none, restricted"),
        ({"filesystem": {"level": "read"}}, "permissions.filesystem.level: expected one of none, temp"),
        ({"code_execution": {"level": "subprocess"}}, "permissions.code_execution.level: expected one of"),
        ({"data_access": {"level": None}}, "permissions.data_access.level: expected one of input_only"),
        ({"user_approval": {"level": "never"}}, "permissions.user_approval.required: expected one of always"),
        ({"network": "none"}, "permissions.network: expected a mapping with level, got a string"),
        ({"network": None}, "permissions.network: expected a mapping with level, got null"),
        ("all", "permissions: expected a mapping, got a string"),
    ],
)
def test_invalid_permissions_are_refused_naming_the_key(permissions: Any, message: str) -> None:
    assert _error(_published(permissions=permissions)).startswith(message)
    if isinstance(permissions, dict) and None not in permissions.values():
        assert _error({**MINIMAL_AGENT, "permissions": permissions}).startswith(message)


# --- §1.7 dependencies --------------------------------------------------------------------------------------


def test_dependencies_take_strings_and_objects_in_both_spellings() -> None:
    deps = [
        "plain-slug",
        {"package_id": "by-id", "role": "search", "is_required": False},
        {"package_slug": "by-slug", "required": True, "min_version": "1.2.0", "fallback": "other"},
        {"package_slug": "preferred", "package_id": "ignored-when-slug-given"},
        {"package_id": "truthy", "required": "no"},  # the publisher's reading: truthiness
    ]
    manifest = _parsed(_published(dependencies=deps))
    assert manifest.pack_dependencies == (
        PackDependency("plain-slug"),
        PackDependency("by-id", role="search", required=False),
        PackDependency("by-slug", required=True, min_version="1.2.0"),
        PackDependency("preferred"),
        PackDependency("truthy", required=True),
    )
    assert manifest.dependencies == ("plain-slug", "by-id", "by-slug", "preferred", "truthy")


def test_dependencies_that_name_no_pack_are_ignored_with_a_warning() -> None:
    deps = ["requests>=2", 5, {"role": "x"}, {"package_id": "Bad Slug"}, "ok-pack", "ok-pack", "\x1b[2Jx"]
    data = _published(dependencies=deps)
    assert _parsed(data).dependencies == ("ok-pack",)
    lines = _warnings(data)
    assert len(lines) == 6
    assert lines[0].startswith("dependencies[0]: expected a pack slug, got a string of 11 characters;")
    assert "pyproject.toml" in lines[0]
    assert lines[1] == "dependencies[1]: expected a pack slug or a mapping, got 5; ignored"
    assert lines[2].startswith("dependencies[2]: expected a pack slug, got nothing")
    assert lines[4] == "dependencies[5]: ok-pack is listed again; the first entry is kept"
    assert all("\x1b" not in line for line in lines)


def test_dependencies_that_are_not_a_list_are_ignored_with_a_warning() -> None:
    data = _published(dependencies={"web-search": "1.0"})
    assert _parsed(data).dependencies == ()
    assert _warnings(data) == ["dependencies: expected a list of pack references, got a mapping; ignored"]


def test_a_dependency_role_or_min_version_that_is_not_text_is_dropped() -> None:
    data = _published(dependencies=[{"package_id": "dep", "role": ["x"], "min_version": 1.2}])
    assert _parsed(data).pack_dependencies == (PackDependency("dep"),)
    assert len(_warnings(data)) == 2
