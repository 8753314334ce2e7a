"""agentnode.yaml parsing for agent packs and toolpacks, validated with key paths."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from host._errors import ManifestError

MANIFEST_NAME = "agentnode.yaml"
MAX_MANIFEST_BYTES = 1 << 20
SLUG_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*")
_ENTRYPOINT_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*(?::{_IDENT})?")
LLM_CAP_KEYS = ("max_calls", "max_input_chars", "max_output_chars")
_HINT = "Fix agentnode.yaml in the pack (or ask its author to) and reinstall it."


@dataclass(frozen=True)
class AgentManifest:
    """An agent pack's manifest (`package_type: agent`)."""

    slug: str
    version: str
    name: str
    entrypoint: str
    goal: str
    system_prompt: str
    allowed_packages: tuple[str, ...] | None
    max_tool_calls: int
    max_runtime_seconds: int
    max_iterations: int
    llm_access: Mapping[str, Any]
    dependencies: tuple[str, ...]


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a toolpack."""

    name: str
    entrypoint: str
    description: str
    input_schema: Mapping[str, Any] | None


@dataclass(frozen=True)
class ToolpackManifest:
    """A toolpack's manifest (`package_type: toolpack`)."""

    slug: str
    version: str
    name: str
    entrypoint: str
    tools: tuple[ToolSpec, ...]
    dependencies: tuple[str, ...]


def load_manifest(pack_dir: Path) -> AgentManifest | ToolpackManifest:
    """Read and validate `<pack_dir>/agentnode.yaml`; every problem is a ManifestError."""
    path = pack_dir / MANIFEST_NAME
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest ({type(exc).__name__})", hint=_HINT) from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES} bytes", hint=_HINT)
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: manifest is not UTF-8", hint=_HINT) from exc
    except yaml.YAMLError as exc:
        where = f"{path}{_yaml_location(exc)}"
        raise ManifestError(f"{where}: invalid YAML{_yaml_problem(exc)}", hint=_HINT) from exc
    return parse_manifest(data, source=str(path))


def parse_manifest(data: Any, *, source: str) -> AgentManifest | ToolpackManifest:
    """Validate parsed YAML; unknown keys are tolerated because authoring tools add their own."""
    return _Parser(source).manifest(data)


def check_llm_access(block: Any, *, source: str = "") -> None:
    """Reject a malformed `agent.llm_access` block rather than silently ignoring a cap or model list."""
    _Parser(source).llm_access(block)


def _describe(value: Any) -> str:
    """Name a value's type for an error message without echoing agent-authored text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _yaml_location(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    if not isinstance(problem, str):
        return ""
    return " (" + "".join(c if c.isprintable() else "?" for c in problem)[:100] + ")"


class _Parser:
    """Converts each key, naming `source` and the key path on failure."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> ManifestError:
        prefix = f"{self.source}: " if self.source else ""
        return ManifestError(f"{prefix}{key}: {problem}", hint=_HINT)

    def mapping(self, value: Any, key: str) -> Mapping[str, Any]:
        """An optional mapping; absent or null is empty."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        return value

    def text(self, value: Any, key: str, *, default: str | None = None,
             pattern: re.Pattern[str] | None = None, expected: str = "a non-empty string") -> str:
        """A non-empty string (matching `pattern` when given); absent or null is `default` when given."""
        if value is None and default is not None:
            return default
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.fullmatch(value)):
            got = "nothing" if value is None else _describe(value)
            raise self.fail(key, f"expected {expected}, got {got}")
        return value

    def string(self, value: Any, key: str) -> str:
        """Free text that may be empty; absent or null is ""."""
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_describe(value)}")
        return value

    def positive_int(self, value: Any, key: str, default: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, f"expected a positive integer, got {_describe(value)}")
        return value

    def names(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, f"expected a list of non-empty strings, got {_describe(value)}")
        return tuple(v.strip() for v in value)

    def manifest(self, data: Any) -> AgentManifest | ToolpackManifest:
        if not isinstance(data, dict):
            raise self.fail("(top level)", f"expected a mapping, got {_describe(data)}")
        slug = self.text(data.get("package_id"), "package_id", pattern=SLUG_RE,
                         expected=f"a slug matching {SLUG_RE.pattern}")
        version = data.get("version")
        if isinstance(version, int | float) and not isinstance(version, bool):
            raise self.fail("version", f"expected a string, got the number {version!r}; "
                            f'quote it: version: "{version!r}"')
        version = self.text(version, "version")
        name = self.text(data.get("name"), "name", default=slug)
        deps = data.get("dependencies")
        dependencies = () if deps is None else self.names(deps, "dependencies")
        kind = data.get("package_type")
        if kind == "agent":
            return self.agent(data, slug, version, name, dependencies)
        if kind == "toolpack":
            return self.toolpack(data, slug, version, name, dependencies)
        got = "nothing" if kind is None else _describe(kind)
        raise self.fail("package_type", f'expected "agent" or "toolpack", got {got}')

    def agent(self, data: Mapping[str, Any], slug: str, version: str, name: str,
              dependencies: tuple[str, ...]) -> AgentManifest:
        if data.get("agent") is None:
            raise self.fail("agent", "required for package_type agent")
        agent = self.mapping(data["agent"], "agent")
        tool_access = self.mapping(agent.get("tool_access"), "agent.tool_access")
        allowed = tool_access.get("allowed_packages")
        limits = self.mapping(agent.get("limits"), "agent.limits")
        llm_access = self.llm_access(agent.get("llm_access"))
        return AgentManifest(
            slug=slug,
            version=version,
            name=name,
            entrypoint=self.text(agent.get("entrypoint"), "agent.entrypoint", pattern=_ENTRYPOINT_RE,
                                 expected='an entrypoint like "package.module:function"'),
            goal=self.string(agent.get("goal"), "agent.goal"),
            system_prompt=self.string(agent.get("system_prompt"), "agent.system_prompt"),
            allowed_packages=None if allowed is None
            else self.names(allowed, "agent.tool_access.allowed_packages"),
            max_tool_calls=self.positive_int(limits.get("max_tool_calls"), "agent.limits.max_tool_calls", 40),
            max_runtime_seconds=self.positive_int(limits.get("max_runtime_seconds"),
                                                  "agent.limits.max_runtime_seconds", 180),
            max_iterations=self.positive_int(limits.get("max_iterations"), "agent.limits.max_iterations", 10),
            llm_access=llm_access,
            dependencies=dependencies,
        )

    def llm_access(self, value: Any) -> Mapping[str, Any]:
        """Type-check the caps and model list; `enabled` is deliberately unchecked (only `true` enables)."""
        block = self.mapping(value, "agent.llm_access")
        for cap in LLM_CAP_KEYS:
            self.positive_int(block.get(cap), f"agent.llm_access.{cap}", 0)
        if block.get("allowed_models") is not None:
            self.names(block["allowed_models"], "agent.llm_access.allowed_models")
        return block

    def toolpack(self, data: Mapping[str, Any], slug: str, version: str, name: str,
                 dependencies: tuple[str, ...]) -> ToolpackManifest:
        entrypoint = self.text(data.get("entrypoint"), "entrypoint", default="", pattern=_MODULE_RE,
                               expected='a module path like "package.tools"')
        items = self.mapping(data.get("capabilities"), "capabilities").get("tools")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise self.fail("capabilities.tools", f"expected a list, got {_describe(items)}")
        tools: list[ToolSpec] = []
        for i, item in enumerate(items):
            key = f"capabilities.tools[{i}]"
            spec = self.tool(item, key, entrypoint)
            if any(t.name == spec.name for t in tools):
                raise self.fail(f"{key}.name", "duplicate tool name")
            tools.append(spec)
        return ToolpackManifest(slug=slug, version=version, name=name, entrypoint=entrypoint,
                                tools=tuple(tools), dependencies=dependencies)

    def tool(self, item: Any, key: str, pack_entrypoint: str) -> ToolSpec:
        if not isinstance(item, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(item)}")
        raw_entry = item.get("entrypoint")
        if raw_entry is None and not pack_entrypoint:
            raise self.fail(f"{key}.entrypoint", "required when the toolpack has no top-level entrypoint")
        entry = self.text(raw_entry, f"{key}.entrypoint", default=pack_entrypoint, pattern=_ENTRYPOINT_RE,
                          expected='an entrypoint like "package.module:function"')
        schema = item.get("input_schema")
        return ToolSpec(
            name=self.text(item.get("name"), f"{key}.name"),
            entrypoint=entry if ":" in entry else f"{entry}:run",
            description=self.string(item.get("description"), f"{key}.description"),
            input_schema=None if schema is None else self.mapping(schema, f"{key}.input_schema"),
        )
