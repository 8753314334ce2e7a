"""agentnode.yaml parsing for agent packs and toolpacks, validated with key paths.

Three forms are read (README "Pack format support" lists them and every deliberate difference):

- `manifest_version: "0.1"` and `"0.2"`: the agentnode format as its publisher validates it, with 0.2's
  defaults (runtime, install_mode, hosting_type, permissions) filled in when a key is absent;
- no `manifest_version`: this host's authoring form, read like 0.2 for every key the host uses (types,
  ranges, defaults), with the publisher-only metadata (publisher, summary, resources, prompts, connector,
  verification, enrichment fields) neither checked nor kept, and a few author-friendly relaxations
  (`name` defaults to the slug, `agent.goal` may be empty, a tool's `capability_id` is optional,
  entrypoints may have one module segment and capitals, a toolpack may declare no tools).

Unknown keys are tolerated, as the publisher tolerates them, but each is reported as a warning (with a
"did you mean" for a likely misspelling) so a typo like `limtis:` does not silently drop a limit.
"""

from __future__ import annotations

import difflib
import errno
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host.core.errors import ManifestError
from host.core.terminal import safe_line

MANIFEST_NAME = "agentnode.yaml"
MAX_MANIFEST_BYTES = 256 * 1024
"""Refused before parsing: real manifests are a few KiB, and pure-Python YAML costs seconds per MiB."""
MAX_YAML_DEPTH = 32
"""Deeper nesting is refused before PyYAML's recursive composer (and the host's stack) pays for it."""
UINT32_MAX = 2**32 - 1
"""Limits and llm_access caps travel as uint32 (session.proto RunLimits and LlmGrant)."""
MAX_VERSION_CHARS = 128
MANIFEST_VERSIONS = ("0.1", "0.2")
"""The agentnode format's manifest versions; without the key a manifest is read in this host's own form."""
SLUG_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
"""A slug of this host's own form (and what `init` scaffolds). Never `.`/`..`, `/`, a space or a control."""
PUBLISHED_SLUG_RE = re.compile(r"[a-z0-9-]{3,60}")
"""The format's package_id (3-60 of a-z, 0-9 and `-`; a hyphen may lead or trail), required of 0.1/0.2
manifests. Just as path- and volume-safe: no `/`, `.`, space or control, and a volume name gets the fixed
prefix `agentnode-pack-`. Matched whole (the publisher's `^...$` also lets a trailing newline through)."""
VERSION_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?", re.ASCII)
"""The agentnode format's semver (MAJOR.MINOR.PATCH, optional -prerelease and +build), plus semver 2.0's
hyphens in identifiers. A version names a host-copy directory and part of a volume, so it never holds `/`
or a control character, and it starts with a digit, so it is never `.` or `..`."""
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*")
_ENTRYPOINT_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*(?::{_IDENT})?")
_FORMAT_IDENT = r"[a-z_][a-z0-9_]*"
FORMAT_MODULE_RE = re.compile(rf"{_FORMAT_IDENT}(?:\.{_FORMAT_IDENT})+")
"""The format's v1 entrypoint: a module path of at least two lower-case segments (meaning `module.run`)."""
FORMAT_ENTRYPOINT_RE = re.compile(rf"{_FORMAT_IDENT}(?:\.{_FORMAT_IDENT})+:{_FORMAT_IDENT}")
"""The format's v2 entrypoint: a v1 module path, `:`, a function name."""
LLM_CAP_KEYS = ("max_calls", "max_input_chars", "max_output_chars")
LLM_TOKEN_CAP_KEYS = ("max_input_tokens", "max_output_tokens", "max_total_tokens")
"""Token budgets (host/llm/budget.py): input and output per call, everything per run."""
LLM_COST_CAP_KEY = "max_cost_usd"
"""The run's provider cost budget in USD, a positive number."""
MAX_COST_USD = 1_000_000.0
LIMITS: dict[str, tuple[int, int, int]] = {
    "max_iterations": (1, 100, 12),
    "max_tool_calls": (0, 500, 40),
    "max_runtime_seconds": (1, 3600, 180),
}
"""agent.limits: (lowest, highest, default). max_tool_calls 0 means no tool call at all, not unlimited."""
STOP_ON_CONSECUTIVE_ERRORS = (1, 10, 3)
"""agent.termination.stop_on_consecutive_errors: (lowest, highest, default)."""
TIERS = ("llm_only", "llm_plus_tools", "llm_plus_credentials")
PERMISSION_LEVELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "network": ("level", ("none", "restricted", "unrestricted")),
    "filesystem": ("level", ("none", "temp", "workspace_read", "workspace_write", "any")),
    "code_execution": ("level", ("none", "limited_subprocess", "shell")),
    "data_access": ("level", ("input_only", "connected_accounts", "persistent")),
    "user_approval": ("required", ("always", "high_risk_only", "once", "never")),
}
"""permissions.<name>.<field>: the allowed values. This host's sandbox does not act on them (its own policy
decides); they are validated as the publisher does and kept."""
DEFAULT_PERMISSIONS: Mapping[str, str] = {
    "network": "none",
    "filesystem": "none",
    "code_execution": "none",
    "data_access": "input_only",
    "user_approval": "never",
}
"""The 0.2 defaults of the five permission levels (also this host's form's)."""
JSON_SCHEMA_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
MAX_VERIFICATION_CASES = 10
MAX_WARNINGS = 50
"""Warnings kept per install; the rest are counted ("... and N more warnings")."""
_VALID_COMBINATIONS = {
    ("toolpack", "python", "package"),
    ("toolpack", "mcp", "package"),
    ("toolpack", "remote", "remote_endpoint"),
    ("agent", "python", "package"),
    ("upgrade", "python", "package"),
}

# Known keys, for the unknown-key warnings (free-form blocks such as agent.llm, input_schema or
# error_handling are not looked into).
_TOP_KEYS = frozenset({
    "manifest_version", "package_id", "package_type", "name", "publisher", "version", "summary",
    "description", "runtime", "install_mode", "hosting_type", "entrypoint", "capabilities", "permissions",
    "dependencies", "compatibility", "tags", "categories", "connector", "agent", "verification",
    "upgrade_metadata", "env_requirements", "use_cases", "examples", "homepage_url", "docs_url",
    "source_url", "security", "support", "deprecation_policy", "license", "pricing_model", "channel",
    "changelog", "readme_md",
    # legacy keys real 0.1 packs carry, tolerated by the publisher
    "upgrade_roles", "recommended_for", "install_strategy", "fallback_behavior", "policy_requirements",
})  # fmt: skip
_AGENT_KEYS = frozenset({
    "entrypoint", "goal", "system_prompt", "tier", "llm", "tool_access", "limits", "termination", "state",
    "isolation", "orchestration", "verification", "error_handling", "llm_access",
})  # fmt: skip
_TERMINATION_KEYS = frozenset({"stop_on_final_answer", "stop_on_consecutive_errors", "conditions"})
_STEP_KEYS = frozenset({"name", "tool", "input_mapping", "when"})
_CASE_KEYS = frozenset({"name", "goal", "expected"})
_EXPECTED_KEYS = frozenset({"required_keys", "done", "min_lengths", "llm_prompt_contains"})
_TOOL_KEYS = frozenset(
    {"name", "capability_id", "description", "entrypoint", "input_schema", "output_schema"}
)
_DEPENDENCY_KEYS = frozenset({
    "package_slug", "package_id", "role", "required", "is_required", "min_version", "fallback",
})  # fmt: skip
_LLM_ACCESS_KEYS = frozenset(
    {"enabled", "allowed_models", *LLM_CAP_KEYS, *LLM_TOKEN_CAP_KEYS, LLM_COST_CAP_KEY}
)

_HINT = "Fix agentnode.yaml in the pack (or ask its author to) and reinstall it."
_FILE_HINT = (
    "Make agentnode.yaml a regular file in the pack directory (not a link, FIFO or device) and reinstall."
)
_STRICT_HINT = (
    "Write each value out in agentnode.yaml (no &anchors or *aliases, so no <<: *name merges; at most "
    f"{MAX_YAML_DEPTH} levels deep) and reinstall it."
)
_UPGRADE_HINT = (
    "This host runs agents and toolpacks; an upgrade package only recommends other packs: install those."
)
_RUNTIME_HINT = "This host runs Python toolpacks (runtime: python); use a Python build of the toolpack."


@dataclass(frozen=True)
class PackDependency:
    """One entry of the top-level `dependencies`: another pack (never a Python requirement).

    Nothing installs it: the host (like the agentnode SDK) only reports at install that it is missing.
    """

    slug: str
    role: str = ""
    required: bool = True
    min_version: str | None = None


@dataclass(frozen=True)
class OrchestrationStep:
    """One step of `agent.orchestration.steps` (mode `sequential`), validated, for a sequential runner."""

    tool: str
    """`slug` or `slug:tool_name` (split on the first colon); checked against the allowlist at run time."""
    name: str | None = None
    """As declared (unique when given); a runner names an unnamed step `step_<i>`."""
    input_mapping: Mapping[str, Any] = field(default_factory=dict)
    """JSON data: `$input.<key>`, `$steps.<name>` or a literal per keyword argument."""
    when: str | None = None
    """`$ref == v`, `$ref != v`, `$ref is null` or `$ref is not null`, as written."""


def _default_permissions() -> dict[str, str]:
    return dict(DEFAULT_PERMISSIONS)


@dataclass(frozen=True)
class AgentManifest:
    """An agent pack's manifest (`package_type: agent`).

    `dependencies` is the tuple of the slugs of `pack_dependencies` (the packs it references).
    """

    slug: str
    version: str
    name: str
    entrypoint: str  # "" only for a sequential orchestration (which runs no entrypoint)
    goal: str
    system_prompt: str
    allowed_packages: tuple[str, ...] | None
    max_tool_calls: int
    max_runtime_seconds: int
    max_iterations: int
    llm_access: Mapping[str, Any]  # validated: only enabled (a bool), the caps and allowed_models
    dependencies: tuple[str, ...]
    llm_required: bool = False
    tier: str = ""
    stop_on_consecutive_errors: int = STOP_ON_CONSECUTIVE_ERRORS[2]
    orchestration: tuple[OrchestrationStep, ...] | None = None  # None unless mode is sequential
    pack_dependencies: tuple[PackDependency, ...] = ()
    manifest_version: str = ""  # "0.1", "0.2", or "" for this host's own form
    publisher: str = ""
    summary: str = ""
    permissions: Mapping[str, str] = field(default_factory=_default_permissions)

    @property
    def entrypoint_module(self) -> str:
        """The module part of `entrypoint` (what the wrapper imports ahead of its task); "" for none."""
        return self.entrypoint.partition(":")[0]


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a toolpack."""

    name: str
    entrypoint: str  # its own, as module:function; "" when it has none (resolved by name at call time, §3.3)
    description: str
    input_schema: Mapping[str, Any] | None
    capability_id: str = ""


@dataclass(frozen=True)
class ToolpackManifest:
    """A toolpack's manifest (`package_type: toolpack`); `entrypoint` is the package's (v1: a module)."""

    slug: str
    version: str
    name: str
    entrypoint: str
    tools: tuple[ToolSpec, ...]
    dependencies: tuple[str, ...]
    pack_dependencies: tuple[PackDependency, ...] = ()
    manifest_version: str = ""
    publisher: str = ""
    summary: str = ""
    permissions: Mapping[str, str] = field(default_factory=_default_permissions)


class ManifestWarnings:
    """What is wrong with a manifest that still installs: each line terminal-safe, at most `limit` kept."""

    def __init__(self, limit: int = MAX_WARNINGS) -> None:
        self._items: list[str] = []
        self._more = 0
        self._limit = limit

    @property
    def full(self) -> bool:
        return len(self._items) >= self._limit

    def add(self, text: str) -> None:
        if self.full:
            self._more += 1
        else:
            self._items.append(safe_line(text, limit=400))

    def lines(self) -> list[str]:
        return self._items + ([f"... and {self._more} more warnings"] if self._more else [])


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


def load_manifest(
    pack_dir: Path, *, warnings: ManifestWarnings | None = None
) -> AgentManifest | ToolpackManifest:
    """Read and validate `<pack_dir>/agentnode.yaml`; every problem is a ManifestError.

    What is tolerated but probably wrong (unknown or misspelled keys, ignored dependencies) goes to
    `warnings` when given.
    """
    path = pack_dir / MANIFEST_NAME
    raw = _read_manifest_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: manifest is not UTF-8", hint=_HINT) from exc
    from host.core.strictyaml import YamlError, YamlRefused, load_yaml, yaml_location, yaml_problem  # noqa: PLC0415

    try:
        data = load_yaml(text, max_depth=MAX_YAML_DEPTH)
    except YamlRefused as exc:
        where = f"{path}{yaml_location(exc)}"
        raise ManifestError(f"{where}: YAML not accepted: {exc.problem}", hint=_STRICT_HINT) from None
    except YamlError as exc:
        where = f"{path}{yaml_location(exc)}"
        raise ManifestError(f"{where}: invalid YAML{yaml_problem(exc)}", hint=_HINT) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an integer of 5,000 digits, a bad date
        raise ManifestError(f"{path}: a value cannot be read ({type(exc).__name__})", hint=_HINT) from None
    return parse_manifest(data, source=str(path), warnings=warnings)


def parse_manifest(
    data: Any, *, source: str, warnings: ManifestWarnings | None = None
) -> AgentManifest | ToolpackManifest:
    """Validate parsed YAML (or a lockfile's stored form); unknown keys are tolerated and reported as
    `warnings` (when given), because the publisher tolerates them and authoring tools add their own."""
    return _Parser(source, warnings).manifest(data)


def check_llm_access(block: Any, *, source: str = "") -> None:
    """Reject a malformed `agent.llm_access` block rather than silently ignoring a cap or model list."""
    _Parser(source).llm_access(block)


def manifest_data(manifest: AgentManifest | ToolpackManifest) -> dict[str, Any]:
    """The validated manifest as JSON data that parse_manifest reads back to an equal manifest.

    This, not the pack's YAML, is what the lockfile stores: unknown keys (where an alias bomb or a README
    would sit) never reach it, and every run reads only what was validated at install. A 0.1/0.2 manifest
    is stored as a manifest of its version (so it is validated by the same rules when read back).
    """
    data: dict[str, Any] = {}
    if manifest.manifest_version:
        data["manifest_version"] = manifest.manifest_version
    data.update(package_id=manifest.slug, version=manifest.version, name=manifest.name)
    if manifest.publisher:
        data["publisher"] = manifest.publisher
    if manifest.summary:
        data["summary"] = manifest.summary
    if manifest.manifest_version:  # the only combinations this host installs
        data.update(runtime="python", install_mode="package", hosting_type="agentnode_hosted")
    data["permissions"] = {
        name: {key: manifest.permissions[name]} for name, (key, _) in PERMISSION_LEVELS.items()
    }
    data["dependencies"] = [
        {"package_slug": d.slug, "role": d.role, "required": d.required, "min_version": d.min_version}
        for d in manifest.pack_dependencies
    ]
    if isinstance(manifest, AgentManifest):
        llm = dict(manifest.llm_access)
        if "allowed_models" in llm:
            llm["allowed_models"] = list(llm["allowed_models"])
        agent: dict[str, Any] = {
            "goal": manifest.goal,
            "system_prompt": manifest.system_prompt,
            "limits": {
                "max_tool_calls": manifest.max_tool_calls,
                "max_runtime_seconds": manifest.max_runtime_seconds,
                "max_iterations": manifest.max_iterations,
            },
            "termination": {"stop_on_consecutive_errors": manifest.stop_on_consecutive_errors},
            "llm_access": llm,
        }
        if manifest.entrypoint:
            agent["entrypoint"] = manifest.entrypoint
        if manifest.tier:
            agent["tier"] = manifest.tier
        if manifest.llm_required:
            agent["llm"] = {"required": True}
        if manifest.allowed_packages is not None:
            agent["tool_access"] = {"allowed_packages": list(manifest.allowed_packages)}
        if manifest.orchestration is not None:
            agent["orchestration"] = {
                "mode": "sequential",
                "steps": [_step_data(step) for step in manifest.orchestration],
            }
        return {**data, "package_type": "agent", "agent": agent}
    tools: list[dict[str, Any]] = []
    for tool in manifest.tools:
        item: dict[str, Any] = {"name": tool.name, "description": tool.description}
        if tool.entrypoint:
            item["entrypoint"] = tool.entrypoint
        if tool.capability_id:
            item["capability_id"] = tool.capability_id
        if tool.input_schema is not None:
            item["input_schema"] = tool.input_schema
        tools.append(item)
    data = {**data, "package_type": "toolpack", "capabilities": {"tools": tools}}
    if manifest.entrypoint:
        data["entrypoint"] = manifest.entrypoint
    return data


def _step_data(step: OrchestrationStep) -> dict[str, Any]:
    item: dict[str, Any] = {"tool": step.tool, "input_mapping": dict(step.input_mapping)}
    if step.name is not None:
        item["name"] = step.name
    if step.when is not None:
        item["when"] = step.when
    return item


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


def _describe_text(value: Any) -> str:
    """Like _describe, with a string's length (for the length rules)."""
    if isinstance(value, str) and value:
        return f"a string of {len(value)} characters"
    return "nothing" if value is None else _describe(value)


def _when_problem(expr: str) -> str | None:
    """What is wrong with a step's `when` (the publisher's grammar), or None."""
    expr = expr.strip()
    if not expr:
        return "expected a condition, got an empty string"
    left: str | None = None
    for suffix in (" is not null", " is null"):
        if expr.endswith(suffix):
            left = expr[: -len(suffix)]
            break
    else:
        for op in ("!=", "=="):  # in this order, as the publisher checks them
            if f" {op} " in expr:
                left = expr.split(f" {op} ", 1)[0]
                break
    if left is None:
        return "expected $ref == value, $ref != value, $ref is null or $ref is not null"
    if not left.strip().startswith("$"):
        return "the left side must be a $reference ($input.<key> or $steps.<name>)"
    return None


class _Parser:
    """Converts each key, naming `source` and the key path on failure.

    `form` is the manifest_version ("0.1", "0.2") or "" for this host's own form; `published` says the
    publisher's rules apply in full.
    """

    def __init__(self, source: str, warnings: ManifestWarnings | None = None) -> None:
        self.source = source
        self.warnings = warnings if warnings is not None else ManifestWarnings()
        self.form = ""

    @property
    def published(self) -> bool:
        return bool(self.form)

    def fail(self, key: str, problem: str, hint: str = _HINT) -> ManifestError:
        prefix = f"{self.source}: " if self.source else ""
        return ManifestError(f"{prefix}{key}: {problem}", hint=hint)

    def warn(self, key: str, problem: str) -> None:
        self.warnings.add(f"{key}: {problem}")

    def keys(self, block: Mapping[Any, Any], known: frozenset[str], path: str) -> None:
        """A warning per unknown key of `block` (they are ignored), with the likely intended key."""
        for key in block:
            if isinstance(key, str) and key in known:
                continue
            if self.warnings.full:  # counted only: no difflib over thousands of junk keys
                self.warnings.add("")
                continue
            if not isinstance(key, str):
                self.warn(path or "(top level)", f"a key that is not a string ({_describe(key)}) is ignored")
                continue
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75) if len(key) <= 64 else []
            where = f"{path}.{safe_line(key, limit=64)}" if path else safe_line(key, limit=64)
            self.warn(where, "unknown key, ignored" + (f" (did you mean {close[0]}?)" if close else ""))

    def mapping(self, value: Any, key: str) -> Mapping[str, Any]:
        """An optional mapping; absent or null is empty."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        return value

    def item(self, value: Any, key: str) -> Mapping[str, Any]:
        """A required mapping (a list item)."""
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        return value

    def listing(self, value: Any, key: str) -> list[Any]:
        """An optional list; absent or null is empty."""
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {_describe(value)}")
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

    def sized(self, value: Any, key: str, low: int, high: int | None = None) -> str:
        """A string of `low` to `high` characters."""
        if not isinstance(value, str) or len(value) < low or (high is not None and len(value) > high):
            size = f"{low} to {high}" if high is not None else f"at least {low}"
            raise self.fail(key, f"expected a string of {size} characters, got {_describe_text(value)}")
        return value

    def strings(self, value: Any, key: str) -> list[str]:
        """An optional list of strings; absent or null is empty."""
        items = self.listing(value, key)
        if not all(isinstance(v, str) for v in items):
            raise self.fail(key, "expected a list of strings, got a list with an entry that is not a string")
        return items

    def choice(self, value: Any, key: str, allowed: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in allowed:
            got = "nothing" if value is None else _describe(value)
            raise self.fail(key, f"expected one of {', '.join(allowed)}, got {got}")
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

    def bounded_int(self, value: Any, key: str, bounds: tuple[int, int, int], zero: str = "") -> int:
        """An integer in the format's range (bools are not integers); absent or null is the default."""
        low, high, default = bounds
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            also = f" (or 0: {zero})" if low == 0 else ""
            raise self.fail(
                key, f"expected a positive integer no larger than {high}{also}, got {_describe(value)}"
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

    # --- top level -------------------------------------------------------------------------------------

    def manifest(self, data: Any) -> AgentManifest | ToolpackManifest:
        if not isinstance(data, dict):
            raise self.fail("(top level)", f"expected a mapping, got {_describe(data)}")
        self.form = self.manifest_version(data)
        self.keys(data, _TOP_KEYS, "")
        if self.published:
            slug = self.text(
                data.get("package_id"),
                "package_id",
                pattern=PUBLISHED_SLUG_RE,
                expected=f"a slug matching {PUBLISHED_SLUG_RE.pattern} (3 to 60 lower-case letters, "
                "digits and hyphens)",
            )
        else:
            slug = self.text(
                data.get("package_id"),
                "package_id",
                pattern=SLUG_RE,
                expected=f"a slug matching {SLUG_RE.pattern}",
            )
        version = self.version(data.get("version"))
        kind = data.get("package_type")
        if kind == "upgrade":
            raise self.fail(
                "package_type", "upgrade packages are not installed by this host", hint=_UPGRADE_HINT
            )
        if kind not in ("agent", "toolpack"):
            got = "nothing" if kind is None else _describe(kind)
            raise self.fail("package_type", f'expected "agent" or "toolpack", got {got}')
        if self.published:
            name = self.sized(data.get("name"), "name", 3, 100)
            publisher = self.text(data.get("publisher"), "publisher")
            summary = self.sized(data.get("summary"), "summary", 20, 200)
        else:  # this host's form: publisher and summary are catalogue metadata, neither read nor kept
            name = self.text(data.get("name"), "name", default=slug)
            publisher = summary = ""
        self.combination(data, kind)
        permissions = self.permissions(data)
        pack_dependencies = self.dependencies(data.get("dependencies"))
        capabilities = self.mapping(data.get("capabilities"), "capabilities")
        self.keys(capabilities, frozenset({"tools", "resources", "prompts"}), "capabilities")
        if self.published:
            self.discovery(capabilities)
            self.metadata(data)
            if "connector" in data and kind != "toolpack":
                raise self.fail("connector", "only toolpacks may declare a connector")
        common: dict[str, Any] = {
            "slug": slug,
            "version": version,
            "name": name,
            "dependencies": tuple(d.slug for d in pack_dependencies),
            "pack_dependencies": pack_dependencies,
            "manifest_version": self.form,
            "publisher": publisher,
            "summary": summary,
            "permissions": permissions,
        }
        if kind == "agent":
            if self.published and capabilities.get("tools"):
                self.tools_described(capabilities["tools"])
            return self.agent(data, common)
        return self.toolpack(data, capabilities, common)

    def manifest_version(self, data: Mapping[str, Any]) -> str:
        if "manifest_version" not in data:
            return ""
        value = data["manifest_version"]
        if isinstance(value, str) and value in MANIFEST_VERSIONS:
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            got = f'the number {_describe(value)}; quote it: manifest_version: "0.2"'
        elif isinstance(value, str) and re.fullmatch(r"[0-9A-Za-z.]{1,10}", value):
            got = f'"{value}"'  # short and plain: safe to name
        else:
            got = _describe(value)
        raise self.fail("manifest_version", f'expected "0.1" or "0.2" (or no manifest_version), got {got}')

    def optional_text(self, value: Any, key: str, limit: int = 200) -> str:
        """Optional metadata: kept when a string of at most `limit` characters, else warned about."""
        if value is None:
            return ""
        if not isinstance(value, str) or len(value) > limit:
            self.warn(key, f"expected a string of at most {limit} characters, got {_describe_text(value)}; "
                      "ignored")  # fmt: skip
            return ""
        return value

    def combination(self, data: Mapping[str, Any], kind: str) -> None:
        """runtime, install_mode and hosting_type: required in 0.1, defaulted in 0.2 and this host's form."""
        values: dict[str, str] = {}
        for key, allowed, default in (
            ("runtime", ("python", "mcp", "remote"), "python"),
            ("install_mode", ("package", "remote_endpoint"), "package"),
            ("hosting_type", ("agentnode_hosted",), "agentnode_hosted"),
        ):
            absent = key not in data or (data[key] is None and not self.published)
            if absent and self.form != "0.1":
                values[key] = default
            else:  # 0.2 keeps a key given as null (and then refuses it), as the publisher's defaults do
                values[key] = self.choice(data.get(key), key, allowed)
        combo = (kind, values["runtime"], values["install_mode"])
        if combo not in _VALID_COMBINATIONS:
            raise self.fail(
                "install_mode",
                f"package_type {kind} with runtime {combo[1]} takes install_mode "
                f"{'remote_endpoint' if combo[1] == 'remote' else 'package'}, got {combo[2]}",
            )
        if values["runtime"] != "python":
            raise self.fail(
                "runtime", f"{values['runtime']} toolpacks are not supported by this host", hint=_RUNTIME_HINT
            )

    def permissions(self, data: Mapping[str, Any]) -> dict[str, str]:
        """The five permission levels: required in 0.1; 0.2 (and this host's form) default absent ones."""
        required = "required in manifest_version 0.1: network, filesystem, code_execution, data_access and "
        required += "user_approval, each with its level"
        raw = data.get("permissions")
        if "permissions" not in data or (raw is None and not self.published):
            if self.form == "0.1":
                raise self.fail("permissions", required)
            return dict(DEFAULT_PERMISSIONS)
        if not isinstance(raw, dict):
            raise self.fail("permissions", f"expected a mapping, got {_describe(raw)}")
        if self.form == "0.1" and not raw:
            raise self.fail("permissions", required)
        self.keys(raw, frozenset({*PERMISSION_LEVELS, "external_integrations"}), "permissions")
        out: dict[str, str] = {}
        for name, (level_key, allowed) in PERMISSION_LEVELS.items():
            key = f"permissions.{name}"
            if self.form != "0.1" and (name not in raw or (raw[name] is None and not self.published)):
                out[name] = DEFAULT_PERMISSIONS[name]  # merged one level deep, as 0.2 normalizes
                continue
            block = raw.get(name, {})
            if not isinstance(block, dict):
                raise self.fail(key, f"expected a mapping with {level_key}, got {_describe(block)}")
            known = {level_key, "allowed_domains"} if name == "network" else {level_key}
            self.keys(block, frozenset(known), key)
            out[name] = self.choice(block.get(level_key), f"{key}.{level_key}", allowed)
        return out

    def dependencies(self, value: Any) -> tuple[PackDependency, ...]:
        """Pack references (strings or objects, both spellings); anything else is ignored with a warning."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.warn("dependencies", f"expected a list of pack references, got {_describe(value)}; ignored")
            return ()
        out: list[PackDependency] = []
        for i, item in enumerate(value):
            key = f"dependencies[{i}]"
            role, required, min_version = "", True, None
            if isinstance(item, str):
                slug: Any = item.strip()
            elif isinstance(item, dict):
                self.keys(item, _DEPENDENCY_KEYS, key)
                slug = item.get("package_slug")
                if slug is None:
                    slug = item.get("package_id")
                role = self.optional_text(item.get("role"), f"{key}.role", limit=100)
                flag = item.get("required", item.get("is_required"))
                required = True if flag is None else bool(flag)  # the publisher's reading: truthiness
                if item.get("min_version") is not None:
                    min_version = self.optional_text(item["min_version"], f"{key}.min_version",
                                                     limit=MAX_VERSION_CHARS) or None  # fmt: skip
            else:
                self.warn(key, f"expected a pack slug or a mapping, got {_describe(item)}; ignored")
                continue
            if not isinstance(slug, str) or not (
                SLUG_RE.fullmatch(slug) or PUBLISHED_SLUG_RE.fullmatch(slug)
            ):
                self.warn(
                    key,
                    f"expected a pack slug, got {_describe_text(slug)}; ignored (dependencies name other "
                    "packs; Python requirements belong in the pack's pyproject.toml)",
                )
                continue
            if any(d.slug == slug for d in out):
                self.warn(key, f"{slug} is listed again; the first entry is kept")
                continue
            out.append(PackDependency(slug=slug, role=role, required=required, min_version=min_version))
        return tuple(out)

    # --- publisher-only metadata (0.1/0.2): validated, not stored ----------------------------------------

    def schema(self, value: Any, key: str) -> Mapping[str, Any] | None:
        """A tool's input/output schema: a mapping; in 0.1/0.2 the publisher's shallow JSON Schema checks."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        if not self.published:
            return value
        kind = value.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind is not None and not all(isinstance(k, str) and k in JSON_SCHEMA_TYPES for k in kinds):
            allowed = ", ".join(JSON_SCHEMA_TYPES)
            raise self.fail(f"{key}.type", f"expected one of {allowed} or a list of them")
        props = value.get("properties")
        if props is not None and (
            not isinstance(props, dict) or not all(isinstance(p, dict) for p in props.values())
        ):
            raise self.fail(f"{key}.properties", "expected a mapping of property names to schema mappings")
        required = value.get("required")
        if required is not None:
            if not isinstance(required, list):
                raise self.fail(f"{key}.required", f"expected a list, got {_describe(required)}")
            if props and not all(isinstance(r, str) and r in props for r in required):
                raise self.fail(f"{key}.required", "names a property that properties does not define")
        return value

    def tools_described(self, items: Any) -> None:
        """An agent's capabilities.tools (0.1/0.2): descriptive only, checked as the publisher checks them."""
        for i, item in enumerate(self.listing(items, "capabilities.tools")):
            key = f"capabilities.tools[{i}]"
            tool = self.item(item, key)
            self.keys(tool, _TOOL_KEYS, key)
            for required in ("name", "capability_id"):
                if not tool.get(required):
                    got = _describe_text(tool.get(required))
                    raise self.fail(f"{key}.{required}", f"required, got {got}")
            self.schema(tool.get("input_schema"), f"{key}.input_schema")
            self.schema(tool.get("output_schema"), f"{key}.output_schema")

    def discovery(self, capabilities: Mapping[str, Any]) -> None:
        """capabilities.prompts and .resources: discovery-only (never run), checked, not stored."""
        for kind, needed in (("prompts", ("name", "capability_id", "template")),
                             ("resources", ("name", "capability_id", "uri"))):  # fmt: skip
            items = capabilities.get(kind)
            if not items:
                continue
            for i, item in enumerate(self.listing(items, f"capabilities.{kind}")):
                key = f"capabilities.{kind}[{i}]"
                entry = self.item(item, key)
                for name in needed:
                    if not entry.get(name):
                        raise self.fail(f"{key}.{name}", f"required, got {_describe_text(entry.get(name))}")
                for executable in ("entrypoint", "input_schema"):
                    if executable in entry:
                        raise self.fail(f"{key}.{executable}", f"not allowed: {kind} are not executable")
                if kind == "prompts":
                    for j, arg in enumerate(self.listing(entry.get("arguments"), f"{key}.arguments")):
                        if not self.item(arg, f"{key}.arguments[{j}]").get("name"):
                            raise self.fail(f"{key}.arguments[{j}].name", "required")
                    continue
                uri = entry["uri"]
                if not isinstance(uri, str) or not uri.startswith(("resource://", "https://")):
                    raise self.fail(f"{key}.uri", "expected a URI starting with resource:// or https://")
                path = entry.get("content_path")
                if path is not None and (
                    not isinstance(path, str) or not path or ".." in path or path.startswith("/")
                ):
                    raise self.fail(f"{key}.content_path", "expected a relative path without '..'")

    def metadata(self, data: Mapping[str, Any]) -> None:
        """The publisher's checks of connector, compatibility, verification and the enrichment fields."""
        if data.get("connector") is not None and data.get("package_type") == "toolpack":
            self.connector(data["connector"])
        self.mapping(data.get("compatibility"), "compatibility")
        for i, req in enumerate(self.listing(data.get("env_requirements"), "env_requirements")):
            if not self.item(req, f"env_requirements[{i}]").get("name"):
                raise self.fail(f"env_requirements[{i}].name", "required")
        for i, case in enumerate(self.listing(data.get("use_cases"), "use_cases")):
            if not isinstance(case, str):
                raise self.fail(f"use_cases[{i}]", f"expected a string, got {_describe(case)}")
        for i, example in enumerate(self.listing(data.get("examples"), "examples")):
            entry = self.item(example, f"examples[{i}]")
            for name in ("title", "code"):
                if not entry.get(name):
                    raise self.fail(f"examples[{i}].{name}", "required")
        for key in ("homepage_url", "docs_url", "source_url"):
            url = data.get(key)
            if url is not None and (not isinstance(url, str) or (url and not url.startswith(
                ("http://", "https://")
            ))):  # fmt: skip
                raise self.fail(key, "expected a URL starting with http:// or https://")
        if data.get("package_type") == "toolpack" and data.get("verification") is not None:
            self.toolpack_verification(data["verification"])

    def connector(self, value: Any) -> None:
        block = self.item(value, "connector")
        if not block.get("provider"):
            raise self.fail("connector.provider", "required when connector is present")
        if block.get("auth_type") is not None:
            self.choice(block["auth_type"], "connector.auth_type", ("api_key", "oauth2"))
        self.strings(block.get("scopes"), "connector.scopes")
        if block.get("token_refresh") is not None and not isinstance(block["token_refresh"], bool):
            got = _describe(block["token_refresh"])
            raise self.fail("connector.token_refresh", f"expected true or false, got {got}")
        for name, needed, number in (("health_check", "endpoint", "interval_seconds"),
                                     ("rate_limits", None, "requests_per_minute")):  # fmt: skip
            if block.get(name) is None:
                continue
            sub = self.item(block[name], f"connector.{name}")
            if needed and not sub.get(needed):
                raise self.fail(f"connector.{name}.{needed}", "required")
            count = sub.get(number)
            if count is not None and (not isinstance(count, int) or count < 1):
                got = _describe(count)
                raise self.fail(f"connector.{name}.{number}", f"expected a positive integer, got {got}")

    def toolpack_verification(self, value: Any) -> None:
        """A toolpack's `verification.cases` (server verification only): checked, not stored."""
        block = self.item(value, "verification")
        cases = self.listing(block.get("cases"), "verification.cases")
        if len(cases) > MAX_VERIFICATION_CASES:
            most = MAX_VERIFICATION_CASES
            raise self.fail("verification.cases", f"expected at most {most} cases, got {len(cases)}")
        seen: set[str] = set()
        for i, item in enumerate(cases):
            key = f"verification.cases[{i}]"
            case = self.item(item, key)
            name = self.sized(case.get("name"), f"{key}.name", 3)
            if name in seen:
                raise self.fail(f"{key}.name", "duplicate case name")
            seen.add(name)
            if not isinstance(case.get("input"), dict):
                what = _describe_text(case.get("input"))
                raise self.fail(f"{key}.input", f"expected a mapping, got {what}")
            if case.get("tool") is not None:
                self.text(case["tool"], f"{key}.tool")
            cassette = case.get("cassette")
            if cassette is not None and (
                not isinstance(cassette, str)
                or not cassette.startswith("fixtures/cassettes/")
                or ".." in cassette
            ):
                raise self.fail(f"{key}.cassette", "expected a path under fixtures/cassettes/")
            self.mapping(case.get("expected"), f"{key}.expected")

    # --- agents ----------------------------------------------------------------------------------------

    def agent(self, data: Mapping[str, Any], common: dict[str, Any]) -> AgentManifest:
        if data.get("agent") is None:
            raise self.fail("agent", "required for package_type agent")
        agent = self.mapping(data["agent"], "agent")
        self.keys(agent, _AGENT_KEYS | {"max_tokens", "planning"}, "agent")
        for unsupported in ("max_tokens", "planning"):
            if unsupported in agent:
                raise self.fail(f"agent.{unsupported}", "not supported by the agentnode format; remove it")
        orchestration = self.orchestration(agent.get("orchestration"))
        tool_access = self.mapping(agent.get("tool_access"), "agent.tool_access")
        self.keys(tool_access, frozenset({"allowed_packages"}), "agent.tool_access")
        allowed = tool_access.get("allowed_packages")
        limits = self.mapping(agent.get("limits"), "agent.limits")
        self.keys(limits, frozenset(LIMITS), "agent.limits")
        termination = self.mapping(agent.get("termination"), "agent.termination")
        self.keys(termination, _TERMINATION_KEYS, "agent.termination")
        stop_final = termination.get("stop_on_final_answer")
        if stop_final is not None and not isinstance(stop_final, bool):
            raise self.fail(
                "agent.termination.stop_on_final_answer",
                f"expected true or false, got {_describe(stop_final)}",
            )
        state = self.mapping(agent.get("state"), "agent.state")
        self.keys(state, frozenset({"persistence"}), "agent.state")
        if state.get("persistence") is not None:
            self.choice(state["persistence"], "agent.state.persistence", ("none", "session"))
        if agent.get("isolation") is not None:
            self.choice(agent["isolation"], "agent.isolation", ("process", "thread"))
        llm = self.mapping(agent.get("llm"), "agent.llm")  # free-form: only `required` is read
        tier = agent.get("tier")
        self.agent_verification(agent.get("verification"))
        return AgentManifest(
            **common,
            entrypoint=self.agent_entrypoint(agent.get("entrypoint"), sequential=orchestration is not None),
            goal=self.goal(agent.get("goal")),
            system_prompt=self.system_prompt(agent.get("system_prompt")),
            allowed_packages=None if allowed is None else self.allowed(allowed),
            max_tool_calls=self.bounded_int(
                limits.get("max_tool_calls"), "agent.limits.max_tool_calls", LIMITS["max_tool_calls"],
                zero="no tool calls",
            ),
            max_runtime_seconds=self.bounded_int(
                limits.get("max_runtime_seconds"), "agent.limits.max_runtime_seconds",
                LIMITS["max_runtime_seconds"],
            ),
            max_iterations=self.bounded_int(
                limits.get("max_iterations"), "agent.limits.max_iterations", LIMITS["max_iterations"]
            ),
            llm_access=self.llm_access(agent.get("llm_access")),
            llm_required=bool(llm.get("required")),
            tier="" if tier is None else self.choice(tier, "agent.tier", TIERS),
            stop_on_consecutive_errors=self.bounded_int(
                termination.get("stop_on_consecutive_errors"),
                "agent.termination.stop_on_consecutive_errors",
                STOP_ON_CONSECUTIVE_ERRORS,
            ),
            orchestration=orchestration,
        )

    def agent_entrypoint(self, value: Any, *, sequential: bool) -> str:
        """module:function (the format's v2 form in 0.1/0.2); not needed by a sequential orchestration."""
        if sequential and not value:
            return ""
        if self.published:
            if not value:
                raise self.fail(
                    "agent.entrypoint",
                    f'expected an entrypoint like "package.module:function", got {_describe_text(value)}',
                )
            return self.text(
                value,
                "agent.entrypoint",
                pattern=FORMAT_ENTRYPOINT_RE,
                expected='an entrypoint like "package.module:function" (lower case, at least two '
                "module segments)",
            )
        return self.text(
            value,
            "agent.entrypoint",
            pattern=_ENTRYPOINT_RE,
            expected='an entrypoint like "package.module:function"',
        )

    def goal(self, value: Any) -> str:
        if self.published:  # required, and a string: it is sent as text
            return self.text(value, "agent.goal")
        return self.string(value, "agent.goal")

    def system_prompt(self, value: Any) -> str:
        """A string; a falsy value (null, "", an empty list) is no system prompt (the publisher's reading)."""
        if not value:
            return ""
        return self.string(value, "agent.system_prompt")

    def allowed(self, value: Any) -> tuple[str, ...]:
        """The allowlist: strings, stripped; an empty entry can name no package and is dropped."""
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(
                "agent.tool_access.allowed_packages",
                f"expected a list of package slugs, got {_describe(value)}",
            )
        return tuple(v.strip() for v in value if v.strip())

    def orchestration(self, value: Any) -> tuple[OrchestrationStep, ...] | None:
        """Sequential steps, or None (no orchestration, or one without a mode, which the SDK ignores)."""
        block = self.mapping(value, "agent.orchestration")
        self.keys(block, frozenset({"mode", "steps"}), "agent.orchestration")
        mode = block.get("mode")
        if mode is None:
            return None
        if mode != "sequential":
            raise self.fail("agent.orchestration.mode", f'expected "sequential", got {_describe(mode)}')
        steps = block.get("steps")
        if not steps:
            raise self.fail(
                "agent.orchestration.steps", f"required for mode sequential, got {_describe_text(steps)}"
            )
        if not isinstance(steps, list):
            raise self.fail("agent.orchestration.steps", f"expected a list, got {_describe(steps)}")
        out: list[OrchestrationStep] = []
        for i, item in enumerate(steps):
            key = f"agent.orchestration.steps[{i}]"
            step = self.item(item, key)
            self.keys(step, _STEP_KEYS, key)
            tool = self.text(step.get("tool"), f"{key}.tool")
            name = step.get("name")
            if name is not None:
                name = self.string(name, f"{key}.name")
                if any(s.name == name for s in out):
                    raise self.fail(f"{key}.name", "duplicate step name")
            mapping = self.mapping(step.get("input_mapping"), f"{key}.input_mapping")
            self.json_data(mapping, f"{key}.input_mapping")
            when = step.get("when")
            if when is not None:
                when = self.string(when, f"{key}.when")
                problem = _when_problem(when)
                if problem:
                    raise self.fail(f"{key}.when", problem)
            out.append(OrchestrationStep(tool=tool, name=name, input_mapping=mapping, when=when))
        return tuple(out)

    def agent_verification(self, value: Any) -> None:
        """agent.verification.cases (server verification only): checked, not stored."""
        block = self.mapping(value, "agent.verification")
        self.keys(block, frozenset({"cases"}), "agent.verification")
        cases = self.listing(block.get("cases"), "agent.verification.cases")
        if len(cases) > MAX_VERIFICATION_CASES:
            raise self.fail(
                "agent.verification.cases",
                f"expected at most {MAX_VERIFICATION_CASES} cases, got {len(cases)}",
            )
        names: set[str] = set()
        goals: set[str] = set()
        for i, item in enumerate(cases):
            key = f"agent.verification.cases[{i}]"
            case = self.item(item, key)
            self.keys(case, _CASE_KEYS, key)
            for field_name, low, seen in (("name", 3, names), ("goal", 20, goals)):
                text = self.sized(case.get(field_name), f"{key}.{field_name}", low)
                if text in seen:
                    raise self.fail(f"{key}.{field_name}", f"duplicate case {field_name}")
                seen.add(text)
            expected = self.mapping(case.get("expected"), f"{key}.expected")
            self.keys(expected, _EXPECTED_KEYS, f"{key}.expected")
            self.strings(expected.get("required_keys"), f"{key}.expected.required_keys")
            self.strings(expected.get("llm_prompt_contains"), f"{key}.expected.llm_prompt_contains")
            done = expected.get("done")
            if done is not None and not isinstance(done, bool):
                raise self.fail(f"{key}.expected.done", f"expected true or false, got {_describe(done)}")
            lengths = self.mapping(expected.get("min_lengths"), f"{key}.expected.min_lengths")
            for length in lengths.values():
                if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                    raise self.fail(
                        f"{key}.expected.min_lengths",
                        f"expected positive integers as values, got {_describe(length)}",
                    )

    def llm_access(self, value: Any) -> Mapping[str, Any]:
        """The validated block: caps and model list type-checked, other keys dropped.

        `enabled` is deliberately not type-checked: only a literal `true` enables, so it is kept as that bool.
        """
        block = self.mapping(value, "agent.llm_access")
        self.keys(block, _LLM_ACCESS_KEYS, "agent.llm_access")
        out: dict[str, Any] = {}
        if "enabled" in block:
            out["enabled"] = block["enabled"] is True
        for cap in (*LLM_CAP_KEYS, *LLM_TOKEN_CAP_KEYS):
            if block.get(cap) is not None:
                out[cap] = self.positive_int(block[cap], f"agent.llm_access.{cap}", 0)
        cost = block.get(LLM_COST_CAP_KEY)
        if cost is not None:
            number = isinstance(cost, int | float) and not isinstance(cost, bool)
            if not number or not math.isfinite(cost) or not 0 < cost <= MAX_COST_USD:
                raise self.fail(
                    f"agent.llm_access.{LLM_COST_CAP_KEY}",
                    f"expected a positive number of USD up to {MAX_COST_USD:.0f}, got {_describe(cost)}",
                )
            out[LLM_COST_CAP_KEY] = float(cost)
        if block.get("allowed_models") is not None:
            out["allowed_models"] = list(
                self.names(block["allowed_models"], "agent.llm_access.allowed_models")
            )
        return out

    # --- toolpacks -------------------------------------------------------------------------------------

    def toolpack(
        self, data: Mapping[str, Any], capabilities: Mapping[str, Any], common: dict[str, Any]
    ) -> ToolpackManifest:
        raw = data.get("entrypoint")
        if self.form == "0.1" or (self.form == "0.2" and raw):
            entrypoint = self.text(
                raw,
                "entrypoint",
                pattern=FORMAT_MODULE_RE,
                expected='a module path like "package.tools" (lower case, at least two segments)',
            )
        elif self.form == "0.2":
            entrypoint = ""
        else:
            entrypoint = self.text(
                raw,
                "entrypoint",
                default="",
                pattern=_MODULE_RE,
                expected='a module path like "package.tools"',
            )
        items = self.listing(capabilities.get("tools"), "capabilities.tools")
        if self.published and not items:
            raise self.fail("capabilities.tools", "a toolpack declares at least one tool")
        tools: list[ToolSpec] = []
        for i, item in enumerate(items):
            key = f"capabilities.tools[{i}]"
            spec = self.tool(item, key, entrypoint, count=len(items))
            if any(t.name == spec.name for t in tools):
                self.warn(f"{key}.name", "duplicate tool name; only the first tool so named can be called")
                continue
            tools.append(spec)
        return ToolpackManifest(**common, entrypoint=entrypoint, tools=tuple(tools))

    def tool(self, item: Any, key: str, pack_entrypoint: str, *, count: int) -> ToolSpec:
        tool = self.item(item, key)
        self.keys(tool, _TOOL_KEYS, key)
        name = self.text(tool.get("name"), f"{key}.name")
        if self.published:
            capability_id = self.text(tool.get("capability_id"), f"{key}.capability_id")
        else:
            capability_id = self.optional_text(tool.get("capability_id"), f"{key}.capability_id", limit=100)
        description = tool.get("description")
        if description and not isinstance(description, str):
            self.warn(f"{key}.description", f"expected a string, got {_describe(description)}; ignored")
        schema = self.schema(tool.get("input_schema"), f"{key}.input_schema")
        if schema is not None:
            self.json_data(schema, f"{key}.input_schema")
        self.schema(tool.get("output_schema"), f"{key}.output_schema")
        raw = tool.get("entrypoint")
        entry = self.tool_entrypoint(raw, f"{key}.entrypoint", pack_entrypoint, count)
        own = entry if raw else ""  # a tool without its own is resolved by name at call time (§3.3)
        return ToolSpec(
            name=name,
            entrypoint=own if ":" in own or not own else f"{own}:run",
            description=description if isinstance(description, str) else "",
            input_schema=schema,
            capability_id=capability_id,
        )

    def tool_entrypoint(self, raw: Any, key: str, pack_entrypoint: str, count: int) -> str:
        """0.2: module.path:function, required with several tools or without a package entrypoint. 0.1 and
        this host's form: module[:function] (the publisher does not check 0.1's; this host imports it)."""
        if self.form == "0.2":
            if not raw:
                if count > 1:
                    raise self.fail(key, "required when the toolpack has more than one tool")
                if not pack_entrypoint:
                    raise self.fail(key, "required when the toolpack has no top-level entrypoint")
                return pack_entrypoint
            return self.text(
                raw,
                key,
                pattern=FORMAT_ENTRYPOINT_RE,
                expected='an entrypoint like "package.module:function" (lower case, at least two '
                "module segments)",
            )
        if raw is None and not pack_entrypoint:
            raise self.fail(key, "required when the toolpack has no top-level entrypoint")
        return self.text(
            raw,
            key,
            default=pack_entrypoint,
            pattern=_ENTRYPOINT_RE,
            expected='an entrypoint like "package.module:function"',
        )
