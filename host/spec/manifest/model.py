"""Manifest data and rules as constants: parse results, limits, patterns, key sets; no parsing, so cheap."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    network_domains: tuple[str, ...] = ()
    """permissions.network.allowed_domains as the egress policy reads them (host/spec/egress.py rules,
    normalized); an entry it cannot read is dropped with a warning at install."""

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
    network_domains: tuple[str, ...] = ()
    """permissions.network.allowed_domains as the egress policy reads them (host/spec/egress.py rules,
    normalized); an entry it cannot read is dropped with a warning at install."""


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


__all__ = [
    "DEFAULT_PERMISSIONS",
    "FORMAT_ENTRYPOINT_RE",
    "FORMAT_MODULE_RE",
    "JSON_SCHEMA_TYPES",
    "LIMITS",
    "LLM_CAP_KEYS",
    "LLM_COST_CAP_KEY",
    "LLM_TOKEN_CAP_KEYS",
    "MANIFEST_NAME",
    "MANIFEST_VERSIONS",
    "MAX_COST_USD",
    "MAX_MANIFEST_BYTES",
    "MAX_VERIFICATION_CASES",
    "MAX_VERSION_CHARS",
    "MAX_WARNINGS",
    "MAX_YAML_DEPTH",
    "PERMISSION_LEVELS",
    "PUBLISHED_SLUG_RE",
    "SLUG_RE",
    "STOP_ON_CONSECUTIVE_ERRORS",
    "TIERS",
    "UINT32_MAX",
    "VERSION_RE",
    "_AGENT_KEYS",
    "_CASE_KEYS",
    "_DEPENDENCY_KEYS",
    "_ENTRYPOINT_RE",
    "_EXPECTED_KEYS",
    "_FILE_HINT",
    "_HINT",
    "_LLM_ACCESS_KEYS",
    "_MODULE_RE",
    "_RUNTIME_HINT",
    "_STEP_KEYS",
    "_STRICT_HINT",
    "_TERMINATION_KEYS",
    "_TOOL_KEYS",
    "_TOP_KEYS",
    "_UPGRADE_HINT",
    "_VALID_COMBINATIONS",
    "AgentManifest",
    "ManifestWarnings",
    "OrchestrationStep",
    "PackDependency",
    "ToolSpec",
    "ToolpackManifest",
]
