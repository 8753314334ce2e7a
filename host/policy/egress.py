"""A pack's egress grant: what it declares it needs (`permissions.network`) intersected with what the operator
grants (`agent_sandbox.egress`), so neither a pack nor a config alone opens the network.

`none` (the default) and a grant with no rule mean no egress path at all. `restricted` asks for its
`allowed_domains` and gets each one the operator's rules cover (narrowed to both sides' ports, a wildcard
narrowed to the other side's name); `unrestricted` asks for anything and gets exactly what the operator
grants that pack. Operator rules come from `allow` (any pack that asks), `packs.<slug>` and
`trust.<level>`; a host (trusted) toolpack runs outside any sandbox and is out of this policy's reach.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from host.spec.egress import EgressConfig, Host, Rule, merge, parse_rule

NETWORK_LEVELS = ("none", "restricted", "unrestricted")


@dataclass(frozen=True)
class EgressGrant:
    """The names and ports one pack's code may reach through the host's egress path; empty: none."""

    rules: tuple[Rule, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.rules

    def allows(self, host: Host, port: int) -> bool:
        """Whether a connection to `host`:`port` is granted (a name is checked before it is resolved)."""
        return any(rule.allows(host, port) for rule in self.rules)

    def texts(self) -> tuple[str, ...]:
        """The grant as `NAME[:PORT]` texts (for `policy explain`, the audit record's shape)."""
        return tuple(text for rule in self.rules for text in rule.texts())


NO_EGRESS = EgressGrant()


def intersect(asked: Iterable[Rule], granted: Iterable[Rule]) -> tuple[Rule, ...]:
    """Every part of `asked` that some rule of `granted` covers too."""
    granted = tuple(granted)
    return merge(both for rule in asked for other in granted if (both := rule.narrowed(other)) is not None)


def ceiling(config: EgressConfig, *, slug: str, trust: str) -> tuple[Rule, ...]:
    """The most one run of this pack may be granted by its caller: the standing grants and `grantable`."""
    return merge((*config.granted(slug, trust), *config.grantable))


def beyond_ceiling(
    asked: Iterable[Rule], config: EgressConfig, *, slug: str, trust: str
) -> list[str]:
    """The parts of a caller's per-run grant that the operator's config does not let a caller give (as
    normalized texts, for the refusal's message)."""
    top = ceiling(config, slug=slug, trust=trust)
    return [text for rule in asked for text in rule.texts()
            if intersect([parse_rule(text)], top) != (parse_rule(text),)]  # fmt: skip


def pack_grant(
    level: str, declared: Iterable[str], config: EgressConfig, *, slug: str, trust: str,
    per_run: tuple[Rule, ...] | None = None,
) -> EgressGrant:  # fmt: skip
    """The grant of a pack that declares network `level` with `declared` domains (the manifest's
    normalized texts), under the operator's `config`, for its slug and trust level. `per_run` (a caller's
    grant for one run, checked against `beyond_ceiling` first) replaces the standing grants, within the
    ceiling: it narrows them, or widens them to what `grantable` holds."""
    if level not in NETWORK_LEVELS or level == "none":
        return NO_EGRESS
    granted = config.granted(slug, trust)
    if per_run is not None:
        granted = intersect(per_run, ceiling(config, slug=slug, trust=trust))
    if not granted:
        return NO_EGRESS
    if level == "unrestricted":
        return EgressGrant(granted)
    return EgressGrant(intersect((parse_rule(text) for text in declared), granted))


def manifest_grant(
    permissions: Mapping[str, str], network_domains: Iterable[str], config: EgressConfig, *, slug: str,
    trust: str, per_run: tuple[Rule, ...] | None = None,
) -> EgressGrant:
    """pack_grant from a manifest's fields (`permissions`, `network_domains`)."""
    return pack_grant(permissions.get("network", "none"), network_domains, config, slug=slug, trust=trust,
                      per_run=per_run)  # fmt: skip


def grant_hint(slug: str, trust: str) -> str:
    """Where in the operator's config a pack that asks for network is granted it."""
    where = f"allow, packs.{slug} or trust.{trust.lower()}"
    return f"grant it under agent_sandbox.egress ({where}) if it may reach it"


def ungranted(
    level: str, declared: Iterable[str], config: EgressConfig, *, slug: str, trust: str
) -> list[str]:
    """What a pack asks to reach that the operator's config does not grant, as install warnings (the
    texts are normalized names: letters, digits, dots, hyphens, brackets and ports only)."""
    if level not in ("restricted", "unrestricted"):
        return []
    hint = grant_hint(slug, trust)
    granted = config.granted(slug, trust)
    if level == "unrestricted":
        if granted:
            return []
        return [f"permissions.network is unrestricted, and nothing is granted to this pack; {hint}"]
    rules = [parse_rule(text) for text in declared]
    if not rules:
        return ["permissions.network is restricted but names no allowed_domains: it gets no network"]
    missing = [text for rule in rules if not intersect([rule], granted) for text in rule.texts()]
    if not missing:
        return []
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return [f"permissions.network asks for {shown}, which agent_sandbox.egress does not grant; {hint}"]


__all__ = [
    "NETWORK_LEVELS",
    "NO_EGRESS",
    "EgressGrant",
    "beyond_ceiling",
    "ceiling",
    "grant_hint",
    "intersect",
    "manifest_grant",
    "pack_grant",
    "ungranted",
]
