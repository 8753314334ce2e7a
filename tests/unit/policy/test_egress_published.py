"""The network declarations agentnode's published starter packs make (agentnode-ai/agentnode, starter-packs/,
read at 765aba4: of 107 packs, 45 ask for `unrestricted` network and 6 for `restricted`, two of those naming
`allowed_domains: ["duckduckgo.com"]` and four naming none), run through the manifest parser and the egress
policy as a run would: a `restricted` pack gets exactly the names it declares that the operator grants, on the
default ports, and nothing it does not declare; one that names no domain gets no path at all."""

from __future__ import annotations

from typing import Any

import pytest

from host.policy.egress import manifest_grant, ungranted
from host.spec.egress import EgressConfig, egress_config, parse_host
from host.spec.manifest.load import parse_manifest
from tests.unit.spec.manifest._support import _pub_agent, _pub_toolpack, _v01

PUBLISHED: list[tuple[str, str, str, str, list[str] | None]] = [
    # (slug, package_type, manifest_version, network level, allowed_domains as published; None: key absent)
    ("web-search-pack", "toolpack", "0.1", "restricted", ["duckduckgo.com"]),
    ("research-agent-pack", "agent", "0.2", "restricted", ["duckduckgo.com"]),
    ("cloud-cost-agent", "agent", "0.2", "restricted", None),
    ("data-pipeline-agent", "agent", "0.2", "restricted", None),
    ("email-triage-agent", "agent", "0.2", "restricted", None),
    ("sql-report-agent", "agent", "0.2", "restricted", None),
]


def _manifest(slug: str, kind: str, version: str, level: str, domains: list[str] | None) -> Any:
    network: dict[str, Any] = {"level": level}
    if domains is not None:
        network["allowed_domains"] = list(domains)
    if kind == "toolpack":
        data = _pub_toolpack(package_id=slug)
    else:
        data = _pub_agent()
        data["package_id"] = slug
    data["permissions"] = {**data.get("permissions", {}), "network": network}
    if version == "0.1":
        data = _v01(data)
        data["permissions"]["network"] = network
    return parse_manifest(data, source=slug)


def _config(**section: Any) -> EgressConfig:
    def fail(key: str, expected: str, value: Any) -> Exception:
        return ValueError(f"{key}: {expected}")

    return egress_config(section, "agent_sandbox.egress", fail)


# What an operator plausibly writes: the search engine the packs name, plus unrelated names and a wildcard
# that must not leak into any pack's grant.
OPERATOR = {"allow": ["duckduckgo.com", "api.github.com", "*.wikipedia.org"]}


FIELDS = ("slug", "kind", "version", "level", "domains")


@pytest.mark.parametrize(FIELDS, PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_a_published_restricted_pack_gets_exactly_its_declared_domains_when_granted(
    slug: str, kind: str, version: str, level: str, domains: list[str] | None
) -> None:
    manifest = _manifest(slug, kind, version, level, domains)
    grant = manifest_grant(manifest.permissions, manifest.network_domains, _config(**OPERATOR), slug=slug,
                           trust="unverified")  # fmt: skip
    if not domains:
        assert grant.empty  # `restricted` naming nothing: no egress path at all
        (warning,) = ungranted(level, manifest.network_domains, _config(**OPERATOR), slug=slug,
                               trust="unverified")  # fmt: skip
        assert "names no allowed_domains" in warning
        return
    assert grant.texts() == ("duckduckgo.com",)  # ports 443 and 80, the name alone: not api.github.com
    assert grant.allows(parse_host("duckduckgo.com"), 443) and grant.allows(parse_host("duckduckgo.com"), 80)
    for other, port in (("api.github.com", 443), ("en.wikipedia.org", 443), ("www.duckduckgo.com", 443),
                        ("duckduckgo.com", 8443), ("duckduckgo.com.evil.test", 443)):  # fmt: skip
        assert not grant.allows(parse_host(other), port), (other, port)


@pytest.mark.parametrize(FIELDS, PUBLISHED[:2], ids=["toolpack", "agent"])
def test_a_published_restricted_pack_gets_nothing_the_operator_does_not_grant(
    slug: str, kind: str, version: str, level: str, domains: list[str] | None
) -> None:
    manifest = _manifest(slug, kind, version, level, domains)

    def grant_under(**section: Any) -> tuple[str, ...]:
        return manifest_grant(manifest.permissions, manifest.network_domains, _config(**section), slug=slug,
                              trust="unverified").texts()  # fmt: skip

    assert grant_under() == ()
    assert grant_under(allow=["*.duckduckgo.com"]) == ()  # a wildcard covers subdomains, not the name itself
    assert grant_under(allow=["duckduckgo.com:443"]) == ("duckduckgo.com:443",)
    assert grant_under(packs={slug: ["duckduckgo.com"]}) == ("duckduckgo.com",)
    assert grant_under(packs={"someone-else": ["duckduckgo.com"]}) == ()
    assert grant_under(trust={"unverified": ["duckduckgo.com:80"]}) == ("duckduckgo.com:80",)
    assert grant_under(trust={"verified": ["duckduckgo.com"]}) == ()
