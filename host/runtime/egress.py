"""One run's egress: its ledger (caps and counts shared by all its sandboxes) and the route each sandbox of
the run gets, from that sandbox's own pack: the agent's declaration for the agent's sandbox, a tool pack's
for that pack's tool sandbox (whoever calls it), each intersected with the operator's config."""

from __future__ import annotations

from dataclasses import dataclass, field

from host.core.errors import InvalidRequest
from host.core.terminal import safe_line
from host.egress.ledger import EgressLedger
from host.egress.proxy import EgressRoute, Resolver, system_resolve
from host.policy.egress import beyond_ceiling, manifest_grant
from host.spec.egress import EgressConfig, Rule, parse_rule
from host.spec.lockfile import LockEntry
from host.spec.manifest.model import AgentManifest, ToolpackManifest


@dataclass
class RunEgress:
    """The run's egress account and how its sandboxes' routes are made; `per_run` is the caller's grant
    for this run (None: the standing grants), already held to the operator's ceiling."""

    config: EgressConfig
    per_run: tuple[Rule, ...] | None = None
    resolve: Resolver = system_resolve
    ledger: EgressLedger = field(init=False)
    routed: bool = False
    """Some sandbox of the run was granted egress (then its audit record has an egress section)."""

    def __post_init__(self) -> None:
        self.ledger = EgressLedger(self.config.limits)

    def route(
        self, manifest: AgentManifest | ToolpackManifest, *, slug: str, trust: str
    ) -> EgressRoute | None:
        """The route of a sandbox running this pack's code; None when the pack gets no egress."""
        grant = manifest_grant(manifest.permissions, manifest.network_domains, self.config, slug=slug,
                               trust=trust, per_run=self.per_run)  # fmt: skip
        if grant.empty:
            return None
        self.routed = True
        return EgressRoute(grant, self.config, self.ledger, self.resolve)

    def route_for_entry(self, entry: LockEntry) -> EgressRoute | None:
        return self.route(entry.parsed_manifest(), slug=entry.slug, trust=entry.trust_level)

    def end(self) -> None:
        """The run is over: every later connection of its sandboxes is refused."""
        self.ledger.end()


EGRESS_LISTENER_FDS = 5
"""Descriptors a run's egress listeners hold: one egress.sock for its agent's sandbox and one for each tool
sandbox it may have live at once (toolsandbox.MAX_LIVE_SANDBOXES, 4)."""


def egress_fds(config: EgressConfig) -> int:
    """The descriptors one run's egress may hold at most: both ends of each concurrent connection (the cap is
    the run's, across its sandboxes) and its listeners; none when the config can grant nothing."""
    if config.empty and not config.grantable:
        return 0
    return 2 * config.limits.max_concurrent + EGRESS_LISTENER_FDS


def caller_grant(texts: tuple[str, ...], config: EgressConfig, *, slug: str, trust: str) -> tuple[Rule, ...]:
    """A caller's per-run egress grant (normalized texts, host/policy/caller.py) as rules, once it holds to
    the operator's ceiling for this pack; InvalidRequest naming what reaches beyond it otherwise."""
    rules = tuple(parse_rule(text) for text in texts)
    beyond = beyond_ceiling(rules, config, slug=slug, trust=trust)
    if beyond:
        shown = safe_line(", ".join(beyond[:8]) + (f" and {len(beyond) - 8} more" if len(beyond) > 8 else ""))
        raise InvalidRequest(
            f"the run's egress grant names {shown}, which agent_sandbox.egress does not let a caller grant "
            f"to {slug}",
            hint="a caller grants only what allow, packs, trust or grantable in agent_sandbox.egress hold",
        )
    return rules


__all__ = ["EGRESS_LISTENER_FDS", "RunEgress", "caller_grant", "egress_fds"]
