"""Pure policy decisions: trust routing, effective tool and LLM limits; the host ceiling always wins."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from host.core.errors import AuditReason, ConfigError
from host.core.vocab import HOST_TRUST, Route, Trust
from host.spec.config import HOST_TRUST_POLICIES, AgentSandboxConfig, LlmHostConfig
from host.spec.manifest.load import check_llm_access
from host.spec.manifest.model import LLM_CAP_KEYS, LLM_COST_CAP_KEY, LLM_TOKEN_CAP_KEYS, AgentManifest

# Conservative built-in LLM ceilings for borrowed host credentials, used where the host sets none.
BUILTIN_LLM_CEILINGS: Mapping[str, int] = {
    "max_calls": 20,
    "max_input_chars": 24_000,
    "max_output_chars": 24_000,
}
# Which trust levels each host_trust_policy still lets run on the host; the rest need the sandbox.
_HOST_ROUTED: Mapping[str, frozenset[Trust]] = {
    "default": HOST_TRUST,
    "curated_only": frozenset({Trust.CURATED}),
    "none": frozenset(),
}


@dataclass(frozen=True)
class RouteDecision:
    """A routing decision with its audit reason and operator message."""

    route: Route
    reason: str
    message: str


@dataclass(frozen=True)
class LlmPolicy:
    """The effective llm_access policy of one run."""

    enabled: bool = False
    max_calls: int = 0
    max_input_chars: int = 0
    max_output_chars: int = 0
    allowed_models: frozenset[str] | None = None
    clamped: tuple[str, ...] = ()
    granted_by: str = ""
    """What granted it: GRANT_LLM_ACCESS, GRANT_DECLARED or GRANT_HOST_PATH; "" when not granted."""
    max_input_tokens: int | None = None
    """Token budgets (host/llm/budget.py), reserved before each provider call: the input estimate per call,
    the output tokens asked for per call, and all tokens of the run; None: no token cap (the character
    caps still bound every call)."""
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    """The run's provider cost budget in USD, priced by the host's `agent_sandbox.llm.prices`; None: none."""


@dataclass(frozen=True)
class RunPolicy:
    """Every effective limit of one run."""

    allowed_packages: tuple[str, ...] | None
    """The tool packs the run may call; None: any installed tool pack (the format's absent allowlist)."""
    max_tool_calls: int
    max_runtime_seconds: int
    max_iterations: int
    llm: LlmPolicy
    clamped: tuple[str, ...]
    stop_on_consecutive_errors: int = 3
    """agent.termination.stop_on_consecutive_errors: failed tool calls in a row that end the agent."""


GRANT_LLM_ACCESS = "llm_access"
"""The manifest's `llm_access.enabled: true`."""
GRANT_DECLARED = "grant_declared"
"""The host's `agent_sandbox.llm.grant_declared` for a pack that declares it needs an LLM."""
GRANT_HOST_PATH = "host_path"
"""A host-path run (operator-trusted)."""
LLM_DECLARING_TIERS = frozenset({"llm_only"})
"""Tiers that declare LLM use, as the agentnode SDK reads them: only llm_only triggers its auto-detection
(llm_plus_tools and llm_plus_credentials agents declare it with agent.llm.required)."""

# Host-path agents are operator-trusted: no llm_access caps, only these sanity bounds.
HOST_PATH_LLM = LlmPolicy(
    enabled=True,
    max_calls=10_000,
    max_input_chars=10_000_000,
    max_output_chars=10_000_000,
    granted_by=GRANT_HOST_PATH,
)


def route_run(trust: str | None, *, sandbox_enabled: bool, host_trust_policy: str) -> RouteDecision:
    """Decide where an agent runs; `reason` is an AuditReason for REFUSED and "" otherwise."""
    host_routed = _HOST_ROUTED.get(host_trust_policy)
    if host_routed is None:
        raise ConfigError(
            f"agent_sandbox.host_trust_policy: expected one of {', '.join(HOST_TRUST_POLICIES)}, "
            f"got {host_trust_policy!r}",
            hint="Edit agent_sandbox.host_trust_policy in the host config.",
        )
    level = Trust.parse(trust)
    if level is None:
        return RouteDecision(
            Route.REFUSED,
            AuditReason.REFUSED_TRUST,
            "the agent has no known trust level (verified, unverified, trusted or curated); "
            "refusing to run it",
        )
    if level in host_routed:
        return RouteDecision(Route.HOST, "", f"{level} agents run on the host")
    if sandbox_enabled:
        return RouteDecision(Route.SANDBOX, "", f"{level} agents run in the sandbox")
    return RouteDecision(
        Route.REFUSED,
        AuditReason.REFUSED_FLAG_OFF,
        f"{level} agents run only in the sandbox, which is off; enable it with AGENTNODE_AGENT_SANDBOX=1 "
        "or agent_sandbox.enabled: true in the host config",
    )


def declares_llm(manifest: AgentManifest) -> bool:
    """The pack says it needs an LLM the way the agentnode SDK reads it: agent.llm.required is truthy or
    agent.tier is llm_only (format §1.8, §4.5)."""
    return manifest.llm_required or manifest.tier in LLM_DECLARING_TIERS


def resolve_llm_policy(
    llm_access: Mapping[str, Any], host: LlmHostConfig, *, declared: bool = False
) -> LlmPolicy:
    """Default-deny LLM access to borrowed host credentials, capped by the host ceiling.

    Granted when the host does not disable it (`agent_sandbox.llm.enabled: false`) and either the block says
    `enabled: true`, or it has no `enabled` at all while the pack `declared` it needs an LLM and the host
    sets `grant_declared`. An explicit `enabled` always decides (`false` wins over grant_declared); caps and
    allowed_models in the block apply either way, and only ever lower the host ceiling.

    Token and cost budgets (`max_input_tokens`, `max_output_tokens`, `max_total_tokens`, `max_cost_usd`)
    have no built-in ceiling: the lower of the block's request and the host's ceiling, whichever are set;
    None when neither is.

    Raises ManifestError for a malformed block so a typo never silently widens or drops a restriction.
    """
    check_llm_access(llm_access)
    if host.enabled is False:
        return LlmPolicy()
    if "enabled" in llm_access:
        if llm_access["enabled"] is not True:
            return LlmPolicy()
        granted_by = GRANT_LLM_ACCESS
    elif declared and host.grant_declared:
        granted_by = GRANT_DECLARED
    else:
        return LlmPolicy()
    host_caps = {"max_calls": host.max_calls, "max_input_chars": host.max_input_chars,
                 "max_output_chars": host.max_output_chars}
    caps: dict[str, int] = {}
    clamped: list[str] = []
    for key in LLM_CAP_KEYS:
        ceiling = host_caps[key] or BUILTIN_LLM_CEILINGS[key]
        requested: int | None = llm_access.get(key)
        caps[key] = ceiling if requested is None else min(requested, ceiling)
        if requested is not None and requested > ceiling:
            clamped.append(key)
    budgets: dict[str, float | None] = {}
    for key in (*LLM_TOKEN_CAP_KEYS, LLM_COST_CAP_KEY):
        budgets[key] = _lower(llm_access.get(key), getattr(host, key), key, clamped)
    raw_models = llm_access.get("allowed_models")
    wanted = None if raw_models is None else frozenset(m.strip() for m in raw_models)
    offered = None if host.allowed_models is None else frozenset(host.allowed_models)
    if wanted is None or offered is None:
        models = offered if wanted is None else wanted
    else:
        models = wanted & offered
        if wanted - offered:
            clamped.append("allowed_models")
    return LlmPolicy(
        enabled=True,
        max_calls=caps["max_calls"],
        max_input_chars=caps["max_input_chars"],
        max_output_chars=caps["max_output_chars"],
        allowed_models=models,
        clamped=tuple(clamped),
        granted_by=granted_by,
        max_input_tokens=_whole(budgets["max_input_tokens"]),
        max_output_tokens=_whole(budgets["max_output_tokens"]),
        max_total_tokens=_whole(budgets["max_total_tokens"]),
        max_cost_usd=budgets[LLM_COST_CAP_KEY],
    )


def _lower(requested: float | None, ceiling: float | None, key: str, clamped: list[str]) -> float | None:
    """The lower of a request and a ceiling where both are set, else whichever is; names a lowered request."""
    if requested is None or ceiling is None:
        return ceiling if requested is None else requested
    if requested > ceiling:
        clamped.append(key)
        return ceiling
    return requested


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def resolve_run_policy(manifest: AgentManifest, cfg: AgentSandboxConfig, *, sandboxed: bool) -> RunPolicy:
    """Combine the manifest's requests with the operator's ceilings; `clamped` names what the host lowered."""
    clamped: list[str] = []

    def cap(name: str, requested: int, ceiling: int | None, applies: bool = True) -> int:
        if applies and ceiling is not None and ceiling < requested:
            clamped.append(name)
            return ceiling
        return requested

    limits = cfg.limits
    # A sequential orchestration makes at most one call per step; its limits.max_tool_calls does not apply.
    steps = manifest.orchestration
    requested_calls = manifest.max_tool_calls if steps is None else len(steps)
    tool_calls = cap("max_tool_calls", requested_calls, limits.max_tool_calls, sandboxed)
    runtime = cap("max_runtime_seconds", manifest.max_runtime_seconds, limits.max_runtime_seconds)
    iterations = cap("max_iterations", manifest.max_iterations, limits.max_iterations, sandboxed)
    stop = manifest.stop_on_consecutive_errors
    # The format's absent `tool_access.allowed_packages` means unrestricted (§1.8); [] means no tools.
    packages = None if manifest.allowed_packages is None else _dedupe(manifest.allowed_packages)
    if not sandboxed:
        return RunPolicy(packages, tool_calls, runtime, iterations, HOST_PATH_LLM, tuple(clamped), stop)
    if cfg.tools_allowed_packages is not None:
        ceiling = cfg.tools_allowed_packages
        kept = ceiling if packages is None else tuple(p for p in packages if p in ceiling)
        if kept != packages:
            clamped.append("tools.allowed_packages")
        packages = kept
    llm = resolve_llm_policy(manifest.llm_access, cfg.llm, declared=declares_llm(manifest))
    clamped.extend(f"llm.{name}" for name in llm.clamped)
    return RunPolicy(packages, tool_calls, runtime, iterations, llm, tuple(clamped), stop)


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
