"""agentnode.yaml parsing for agent packs and toolpacks, validated with key paths."""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
import yaml.nodes

from host._errors import ManifestError

MANIFEST_NAME = "agentnode.yaml"
MAX_MANIFEST_BYTES = 256 * 1024
"""Refused before parsing: real manifests are a few KiB, and pure-Python YAML costs seconds per MiB."""
MAX_YAML_DEPTH = 32
"""Deeper nesting is refused before PyYAML's recursive composer (and the host's stack) pays for it."""
UINT32_MAX = 2**32 - 1
"""Limits and llm_access caps travel as uint32 (session.proto RunLimits and LlmGrant)."""
MAX_VERSION_CHARS = 128
SLUG_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
VERSION_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?", re.ASCII)
"""The agentnode format's semver (MAJOR.MINOR.PATCH, optional -prerelease and +build), plus semver 2.0's
hyphens in identifiers. A version names a host-copy directory and part of a volume, so it never holds `/`
or a control character, and it starts with a digit, so it is never `.` or `..`."""
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*")
_ENTRYPOINT_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*(?::{_IDENT})?")
LLM_CAP_KEYS = ("max_calls", "max_input_chars", "max_output_chars")
_HINT = "Fix agentnode.yaml in the pack (or ask its author to) and reinstall it."
_FILE_HINT = (
    "Make agentnode.yaml a regular file in the pack directory (not a link, FIFO or device) and reinstall."
)
_STRICT_HINT = (
    "Write each value out in agentnode.yaml (no &anchors or *aliases, so no <<: *name merges; at most "
    f"{MAX_YAML_DEPTH} levels deep) and reinstall it."
)


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
    llm_access: Mapping[str, Any]  # validated: only enabled (a bool), the caps and allowed_models
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


class _Refused(yaml.MarkedYAMLError):
    """YAML this host does not accept even though it is valid YAML."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses anchors, aliases and deep nesting.

    A few hundred bytes of aliases expand to gigabytes once constructed (and then into the lockfile), so an
    anchor is refused where it is declared, before anything is built; no real manifest needs one.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.nodes.Node | None, index: int) -> yaml.nodes.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        mark = event.start_mark if isinstance(event.start_mark, yaml.Mark) else None
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(problem="aliases (*name, <<: *name) are not allowed", problem_mark=mark)
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise _Refused(problem="anchors (&name) are not allowed", problem_mark=mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise _Refused(problem=f"nesting deeper than {MAX_YAML_DEPTH} levels", problem_mark=mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str) -> Any:
    """Parse one YAML document with StrictLoader; raises yaml.YAMLError (or ValueError for a bad value)."""
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _read_manifest_bytes(path: Path) -> bytes:
    """The manifest bytes: links and non-regular files refused before opening, big files before reading."""
    try:
        before = os.lstat(path)
        if not stat.S_ISREG(before.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(before.st_mode) else "not a regular file"
            raise ManifestError(f"{path}: the manifest is {what}", hint=_FILE_HINT)
        if before.st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES} bytes", hint=_HINT)
        # O_NOFOLLOW and O_NONBLOCK: a link or FIFO swapped in after lstat can neither redirect nor block us.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ManifestError(f"{path}: the manifest is a symbolic link", hint=_FILE_HINT) from None
        raise ManifestError(f"{path}: cannot read manifest ({type(exc).__name__})", hint=_HINT) from exc
    with os.fdopen(fd, "rb") as fh:
        now = os.fstat(fh.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            raise ManifestError(f"{path}: the manifest changed while it was read", hint=_FILE_HINT)
        raw = fh.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES} bytes", hint=_HINT)
    return raw


def load_manifest(pack_dir: Path) -> AgentManifest | ToolpackManifest:
    """Read and validate `<pack_dir>/agentnode.yaml`; every problem is a ManifestError."""
    path = pack_dir / MANIFEST_NAME
    raw = _read_manifest_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: manifest is not UTF-8", hint=_HINT) from exc
    try:
        data = load_yaml(text)
    except _Refused as exc:
        where = f"{path}{_yaml_location(exc)}"
        raise ManifestError(f"{where}: YAML not accepted: {exc.problem}", hint=_STRICT_HINT) from None
    except yaml.YAMLError as exc:
        where = f"{path}{_yaml_location(exc)}"
        raise ManifestError(f"{where}: invalid YAML{_yaml_problem(exc)}", hint=_HINT) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an integer of 5,000 digits, a bad date
        raise ManifestError(f"{path}: a value cannot be read ({type(exc).__name__})", hint=_HINT) from None
    return parse_manifest(data, source=str(path))


def parse_manifest(data: Any, *, source: str) -> AgentManifest | ToolpackManifest:
    """Validate parsed YAML; unknown keys are tolerated because authoring tools add their own."""
    return _Parser(source).manifest(data)


def check_llm_access(block: Any, *, source: str = "") -> None:
    """Reject a malformed `agent.llm_access` block rather than silently ignoring a cap or model list."""
    _Parser(source).llm_access(block)


def manifest_data(manifest: AgentManifest | ToolpackManifest) -> dict[str, Any]:
    """The validated manifest as JSON data that parse_manifest reads back to an equal manifest.

    This, not the pack's YAML, is what the lockfile stores: unknown keys (where an alias bomb or a README
    would sit) never reach it, and every run reads only what was validated at install.
    """
    data: dict[str, Any] = {
        "package_id": manifest.slug,
        "version": manifest.version,
        "name": manifest.name,
        "dependencies": list(manifest.dependencies),
    }
    if isinstance(manifest, AgentManifest):
        llm = dict(manifest.llm_access)
        if "allowed_models" in llm:
            llm["allowed_models"] = list(llm["allowed_models"])
        agent: dict[str, Any] = {
            "entrypoint": manifest.entrypoint,
            "goal": manifest.goal,
            "system_prompt": manifest.system_prompt,
            "limits": {
                "max_tool_calls": manifest.max_tool_calls,
                "max_runtime_seconds": manifest.max_runtime_seconds,
                "max_iterations": manifest.max_iterations,
            },
            "llm_access": llm,
        }
        if manifest.allowed_packages is not None:
            agent["tool_access"] = {"allowed_packages": list(manifest.allowed_packages)}
        return {**data, "package_type": "agent", "agent": agent}
    tools: list[dict[str, Any]] = []
    for tool in manifest.tools:
        item: dict[str, Any] = {
            "name": tool.name,
            "entrypoint": tool.entrypoint,
            "description": tool.description,
        }
        if tool.input_schema is not None:
            item["input_schema"] = tool.input_schema
        tools.append(item)
    data = {**data, "package_type": "toolpack", "capabilities": {"tools": tools}}
    if manifest.entrypoint:
        data["entrypoint"] = manifest.entrypoint
    return data


def _describe(value: Any) -> str:
    """Name a value's type for an error message without echoing agent-authored text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"a {value.bit_length()}-bit integer"
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

    def text(
        self,
        value: Any,
        key: str,
        *,
        default: str | None = None,
        pattern: re.Pattern[str] | None = None,
        expected: str = "a non-empty string",
    ) -> str:
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
        """A positive integer that fits the uint32 wire field it is sent in; absent or null is `default`."""
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, f"expected a positive integer, got {_describe(value)}")
        if value > UINT32_MAX:
            raise self.fail(
                key,
                f"expected a positive integer no larger than {UINT32_MAX} (it is sent as a "
                f"uint32), got {_describe(value)}",
            )
        return value

    def json_data(self, value: Any, key: str) -> None:
        """Plain JSON data (str-keyed mappings, lists, strings, finite numbers, booleans, null), as stored."""
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    raise self.fail(key, "expected JSON data, got a mapping key that is not a string")
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, float) and not math.isfinite(item):
                raise self.fail(key, f"expected JSON data, got {_describe(item)}")
            elif item is not None and not isinstance(item, str | int | float):  # bool is an int
                raise self.fail(key, f"expected JSON data, got {_describe(item)}")

    def version(self, value: Any) -> str:
        """The agentnode format's semver; anything else (a path, a newline, an escape) is refused."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise self.fail(
                "version",
                f'expected a string, got the number {value!r}; quote a semantic version: version: "1.0.0"',
            )
        if not isinstance(value, str) or len(value) > MAX_VERSION_CHARS or not VERSION_RE.fullmatch(value):
            got = "nothing" if value is None else _describe(value)
            if isinstance(value, str) and len(value) > MAX_VERSION_CHARS:
                got = f"a string of {len(value)} characters"
            raise self.fail(
                "version",
                "expected a semantic version MAJOR.MINOR.PATCH with optional "
                "-prerelease and +build (ASCII letters, digits, dots and hyphens; at most "
                f"{MAX_VERSION_CHARS} characters), got {got}",
            )
        return value

    def names(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, f"expected a list of non-empty strings, got {_describe(value)}")
        return tuple(v.strip() for v in value)

    def manifest(self, data: Any) -> AgentManifest | ToolpackManifest:
        if not isinstance(data, dict):
            raise self.fail("(top level)", f"expected a mapping, got {_describe(data)}")
        slug = self.text(
            data.get("package_id"),
            "package_id",
            pattern=SLUG_RE,
            expected=f"a slug matching {SLUG_RE.pattern}",
        )
        version = self.version(data.get("version"))
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

    def agent(
        self, data: Mapping[str, Any], slug: str, version: str, name: str, dependencies: tuple[str, ...]
    ) -> AgentManifest:
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
            entrypoint=self.text(
                agent.get("entrypoint"),
                "agent.entrypoint",
                pattern=_ENTRYPOINT_RE,
                expected='an entrypoint like "package.module:function"',
            ),
            goal=self.string(agent.get("goal"), "agent.goal"),
            system_prompt=self.string(agent.get("system_prompt"), "agent.system_prompt"),
            allowed_packages=None
            if allowed is None
            else self.names(allowed, "agent.tool_access.allowed_packages"),
            max_tool_calls=self.positive_int(limits.get("max_tool_calls"), "agent.limits.max_tool_calls", 40),
            max_runtime_seconds=self.positive_int(
                limits.get("max_runtime_seconds"), "agent.limits.max_runtime_seconds", 180
            ),
            max_iterations=self.positive_int(limits.get("max_iterations"), "agent.limits.max_iterations", 10),
            llm_access=llm_access,
            dependencies=dependencies,
        )

    def llm_access(self, value: Any) -> Mapping[str, Any]:
        """The validated block: caps and model list type-checked, other keys dropped.

        `enabled` is deliberately not type-checked: only a literal `true` enables, so it is kept as that bool.
        """
        block = self.mapping(value, "agent.llm_access")
        out: dict[str, Any] = {}
        if "enabled" in block:
            out["enabled"] = block["enabled"] is True
        for cap in LLM_CAP_KEYS:
            if block.get(cap) is not None:
                out[cap] = self.positive_int(block[cap], f"agent.llm_access.{cap}", 0)
        if block.get("allowed_models") is not None:
            out["allowed_models"] = list(
                self.names(block["allowed_models"], "agent.llm_access.allowed_models")
            )
        return out

    def toolpack(
        self, data: Mapping[str, Any], slug: str, version: str, name: str, dependencies: tuple[str, ...]
    ) -> ToolpackManifest:
        entrypoint = self.text(
            data.get("entrypoint"),
            "entrypoint",
            default="",
            pattern=_MODULE_RE,
            expected='a module path like "package.tools"',
        )
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
        return ToolpackManifest(
            slug=slug,
            version=version,
            name=name,
            entrypoint=entrypoint,
            tools=tuple(tools),
            dependencies=dependencies,
        )

    def tool(self, item: Any, key: str, pack_entrypoint: str) -> ToolSpec:
        if not isinstance(item, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(item)}")
        raw_entry = item.get("entrypoint")
        if raw_entry is None and not pack_entrypoint:
            raise self.fail(f"{key}.entrypoint", "required when the toolpack has no top-level entrypoint")
        entry = self.text(
            raw_entry,
            f"{key}.entrypoint",
            default=pack_entrypoint,
            pattern=_ENTRYPOINT_RE,
            expected='an entrypoint like "package.module:function"',
        )
        schema = item.get("input_schema")
        if schema is not None:
            self.json_data(self.mapping(schema, f"{key}.input_schema"), f"{key}.input_schema")
        return ToolSpec(
            name=self.text(item.get("name"), f"{key}.name"),
            entrypoint=entry if ":" in entry else f"{entry}:run",
            description=self.string(item.get("description"), f"{key}.description"),
            input_schema=None if schema is None else self.mapping(schema, f"{key}.input_schema"),
        )
