"""A pack's egress grant (host/policy/egress.py) is its declaration intersected with the operator's config:
neither side alone opens anything, and what both grant is narrowed to the stricter name and ports."""

from __future__ import annotations

from typing import Any

import pytest

from host.policy.egress import NO_EGRESS, manifest_grant, pack_grant, ungranted
from host.spec.egress import EgressConfig, Host, egress_config, parse_host
from host.spec.manifest.load import parse_manifest
from host.spec.manifest.model import ManifestWarnings, ToolpackManifest


def _config(**section: Any) -> EgressConfig:
    def fail(key: str, expected: str, value: Any) -> Exception:
        return ValueError(f"{key}: {expected}")

    return egress_config(section, "agent_sandbox.egress", fail)


OPERATOR = _config(
    allow=["api.example.com", "*.wikipedia.org", "search.example.net:8443"],
    packs={"fetcher": ["*.fetch.example"]},
    trust={"verified": ["*.github.com:443"]},
)


def _grant(level: str, *declared: str, slug: str = "tools", trust: str = "unverified",
           config: EgressConfig = OPERATOR) -> list[str]:  # fmt: skip
    return list(pack_grant(level, declared, config, slug=slug, trust=trust).texts())


def test_none_and_an_empty_config_grant_nothing() -> None:
    assert _grant("none", "api.example.com") == []
    assert _grant("restricted", "api.example.com", config=EgressConfig()) == []
    assert _grant("unrestricted", config=EgressConfig()) == []
    assert pack_grant("bogus", ["api.example.com"], OPERATOR, slug="t", trust="verified") is NO_EGRESS


def test_restricted_gets_what_it_declares_and_the_operator_grants() -> None:
    assert _grant("restricted", "api.example.com", "evil.example.org") == ["api.example.com"]
    both = ["en.wikipedia.org", "*.wikipedia.org"]
    assert _grant("restricted", *both) == both
    assert _grant("restricted", "*.example.com") == ["api.example.com"]  # narrowed to the operator's name
    assert _grant("restricted", "search.example.net") == []  # the operator grants only port 8443 there
    assert _grant("restricted", "search.example.net:8443") == ["search.example.net:8443"]
    assert _grant("restricted") == []


def test_unrestricted_gets_exactly_what_the_operator_grants_that_pack() -> None:
    assert _grant("unrestricted") == ["api.example.com", "*.wikipedia.org", "search.example.net:8443"]
    assert "*.fetch.example" in _grant("unrestricted", slug="fetcher")
    assert "*.github.com:443" in _grant("unrestricted", trust="Verified")
    assert "*.github.com:443" not in _grant("unrestricted", trust="unverified")


def test_the_grant_checks_names_and_ports_without_resolving() -> None:
    grant = pack_grant("restricted", ["*.wikipedia.org"], OPERATOR, slug="t", trust="unverified")
    assert grant.allows(Host("en.wikipedia.org"), 443) and grant.allows(Host("de.m.wikipedia.org"), 80)
    assert not grant.allows(Host("wikipedia.org"), 443)
    assert not grant.allows(Host("en.wikipedia.org"), 22)
    assert not grant.allows(parse_host("208.80.154.224"), 443)  # an address is not a name the pack asked for


@pytest.mark.parametrize(
    ("domains", "kept", "warned"),
    [
        (["API.example.com", "api.example.com.", "*.cdn.example"], ("api.example.com", "*.cdn.example"), 0),
        (["https://api.example.com/v1", "127.1", 7, "ok.example:8443"], ("ok.example:8443",), 3),
        ("api.example.com", (), 1),
    ],
)
def test_a_manifest_keeps_the_domains_it_can_read_and_warns_of_the_rest(
    domains: Any, kept: tuple[str, ...], warned: int
) -> None:
    data = {"package_id": "net-tools", "version": "1.0.0", "package_type": "toolpack", "entrypoint": "net",
            "permissions": {"network": {"level": "restricted", "allowed_domains": domains}}}  # fmt: skip
    sink = ManifestWarnings()
    manifest = parse_manifest(data, source="x", warnings=sink)
    assert isinstance(manifest, ToolpackManifest)
    assert manifest.network_domains == kept
    assert len(sink.lines()) == warned
    assert all("https://" not in line for line in sink.lines())  # refused entries are not echoed


def test_the_manifest_grant_reads_the_manifests_fields() -> None:
    network = {"level": "restricted", "allowed_domains": ["api.example.com"]}
    data = {"package_id": "net-tools", "version": "1.0.0", "package_type": "toolpack", "entrypoint": "net",
            "permissions": {"network": network}}  # fmt: skip
    manifest = parse_manifest(data, source="x")
    grant = manifest_grant(manifest.permissions, manifest.network_domains, OPERATOR, slug="net-tools",
                           trust="verified")  # fmt: skip
    assert grant.texts() == ("api.example.com",)


def test_install_names_what_the_config_does_not_grant() -> None:
    def warned(level: str, *declared: str, config: EgressConfig = OPERATOR) -> list[str]:
        return ungranted(level, declared, config, slug="net-tools", trust="Verified")

    assert warned("none", "anything.example") == []
    assert warned("restricted", "api.example.com", "*.wikipedia.org") == []
    (line,) = warned("restricted", "api.example.com", "other.example", "search.example.net")
    assert "asks for other.example, search.example.net," in line and "api.example.com" not in line
    assert "packs.net-tools or trust.verified" in line
    assert warned("restricted") == ["permissions.network is restricted but names no allowed_domains: "
                                    "it gets no network"]  # fmt: skip
    assert warned("unrestricted") == []
    (nothing,) = warned("unrestricted", config=EgressConfig())
    assert "unrestricted, and nothing is granted to this pack" in nothing
    many = warned("restricted", *(f"n{i}.example" for i in range(20)))
    assert many[0].count(".example") == 8 and "and 12 more" in many[0]
