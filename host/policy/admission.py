"""Admission: one immutable decision per run request (route, effective policy, runtime, or why not).

Its parts (the installed agent, the route, the effective policy, the refusal) are what `policy explain`
and `doctor` show, computed by the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from host.core.errors import AuditReason, PackError, RefusedError, SandboxError
from host.core.vocab import COMMUNITY_TRUST, Route, Source, Trust
from host.policy.rules import RouteDecision, RunPolicy, resolve_run_policy, route_run
from host.spec.config import HostConfig, sandbox_enabled
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.model import AgentManifest


def installed_agent(lockfile: Lockfile, slug: str) -> LockEntry:
    """The lockfile entry of an installed agent, or the PackError a run of `slug` fails with."""
    entry = lockfile.get(slug)
    if entry is None:
        raise PackError(
            f"{slug} is not installed",
            reason=AuditReason.NOT_INSTALLED,
            hint=f"install it: agentnode-sandbox install PATH --trust {Trust.UNVERIFIED}",
        )
    if entry.package_type != "agent":
        raise PackError(
            f"{slug} is a {entry.package_type}, not an agent",
            reason=AuditReason.NOT_AN_AGENT,
            hint="tool packs are called by agents, not run; see the installed agents: agentnode-sandbox list",
        )
    return entry


def refusal_error(decision: RouteDecision) -> RefusedError:
    """The error (and the operator's way out) of a refused route."""
    hint = (
        "enable the sandbox: export AGENTNODE_AGENT_SANDBOX=1 (or agent_sandbox.enabled: true)"
        if decision.reason == AuditReason.REFUSED_FLAG_OFF
        else "reinstall with a known trust level: agentnode-sandbox install <path-to-pack> "
        f"--trust {Trust.UNVERIFIED}"
    )
    return RefusedError(decision.message, reason=AuditReason(decision.reason), hint=hint)


def host_copy_error(slug: str) -> PackError:
    """A host-routed agent installed without a host copy cannot run on the host."""
    return PackError(
        f"{slug} has no host copy",
        reason=AuditReason.NOT_INSTALLED,
        hint=f"reinstall it with --trust {Trust.TRUSTED}: agentnode-sandbox install <path-to-{slug}>",
    )


def decide_route(entry: LockEntry, cfg: HostConfig, env: Mapping[str, str]) -> RouteDecision:
    """Where a run of `entry` goes, decided exactly as the runner decides it."""
    return route_run(
        entry.trust_level,
        sandbox_enabled=sandbox_enabled(cfg, env),
        host_trust_policy=cfg.agent_sandbox.host_trust_policy,
    )


def effective_policy(entry: LockEntry, cfg: HostConfig, route: Route) -> tuple[AgentManifest, RunPolicy]:
    """The manifest and the run policy; a refused run is shown with the sandbox policy it would get."""
    manifest = entry.parsed_manifest()
    assert isinstance(manifest, AgentManifest)  # installed_agent() checked the package type
    return manifest, resolve_run_policy(manifest, cfg.agent_sandbox, sandboxed=route is not Route.HOST)


@dataclass(frozen=True)
class Admission:
    """What a run request was granted, decided before anything starts and never changed after.

    `refusal` set means the run does not start; the other fields still say what the audit record of the
    refusal carries (the trust as recorded, and whether it would have been a sandboxed run).
    """

    slug: str
    route: Route
    source: Source
    recorded_trust: str | None = None
    entry: LockEntry | None = None
    manifest: AgentManifest | None = None
    policy: RunPolicy | None = None
    runtime: str | None = None
    """The sandbox runtime (sandboxed runs only)."""
    image: str | None = None
    """The pinned image reference (sandboxed runs only)."""
    refusal: SandboxError | None = None

    @property
    def sequential(self) -> bool:
        """A sequential orchestration: it runs no pack code, so it runs on the host whatever its route."""
        return self.source is Source.AGENT_SEQUENTIAL

    @property
    def sandboxed(self) -> bool:
        return self.route is Route.SANDBOX and not self.sequential


def admit(
    slug: str, *, lockfile: Lockfile, config: HostConfig, env: Mapping[str, str], runtime: str | None = None
) -> Admission:
    """Decide one run request: installed agent, route by trust and host policy, effective policy.

    Every refusal the operator can act on comes back as `refusal` (a SandboxError with its reason and
    hint); anything else raised here is a host fault.
    """
    try:
        entry = installed_agent(lockfile, slug)
    except SandboxError as exc:
        return Admission(slug, Route.REFUSED, Source.AGENT_SANDBOX, refusal=exc)
    recorded = entry.trust_level
    try:
        decision = decide_route(entry, config, env)
    except SandboxError as exc:
        return Admission(slug, Route.REFUSED, Source.AGENT_SANDBOX, recorded, entry, refusal=exc)
    if decision.route is Route.REFUSED:
        # Refused for want of the sandbox, it would have been a sandboxed run; else by trust level.
        would_sandbox = (
            decision.reason == AuditReason.REFUSED_FLAG_OFF or Trust.parse(recorded) in COMMUNITY_TRUST
        )
        source = Source.AGENT_SANDBOX if would_sandbox else Source.AGENT_HOST
        return Admission(slug, Route.REFUSED, source, recorded, entry, refusal=refusal_error(decision))
    sandboxed = decision.route is Route.SANDBOX
    source = Source.AGENT_SANDBOX if sandboxed else Source.AGENT_HOST
    try:
        manifest, policy = effective_policy(entry, config, decision.route)
    except SandboxError as exc:
        return Admission(slug, decision.route, source, recorded, entry, refusal=exc)
    if manifest.orchestration is not None:  # every step is a tool call through the run's gate (§5.5)
        return Admission(slug, decision.route, Source.AGENT_SEQUENTIAL, recorded, entry, manifest, policy)
    cfg = config.agent_sandbox
    return Admission(
        slug,
        decision.route,
        source,
        recorded,
        entry,
        manifest,
        policy,
        runtime=(runtime or cfg.runtime) if sandboxed else None,
        image=cfg.image if sandboxed else None,
    )


__all__ = [
    "Admission",
    "admit",
    "decide_route",
    "effective_policy",
    "host_copy_error",
    "installed_agent",
    "refusal_error",
]
