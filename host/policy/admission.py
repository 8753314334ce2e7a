"""Admission: one immutable decision per run request (route, effective policy, runtime, or why not)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from host.cli.explain import decide_route, effective_policy, installed_agent, refusal_error
from host.core.errors import AuditReason, SandboxError
from host.core.vocab import COMMUNITY_TRUST, Route, Source, Trust
from host.policy.rules import RunPolicy
from host.spec.config import HostConfig
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest import AgentManifest


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


__all__ = ["Admission", "admit"]
