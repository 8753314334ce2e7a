"""The egress policy's names (host/spec/egress.py): one normalization for hosts and NAME[:PORT] rules, every
look-alike of an address refused as a name, wildcards that never cover their apex or a neighbour, and the
operator's `agent_sandbox.egress` section read with its key paths."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import ConfigError
from host.spec.config import load_config
from host.spec.egress import (
    DEFAULT_PORTS,
    MAX_RULES,
    BadName,
    EgressConfig,
    Host,
    Rule,
    address_refusal,
    egress_config,
    merge,
    parse_cidr,
    parse_host,
    parse_rule,
    split_port,
)


def _fail(key: str, expected: str, value: Any) -> Exception:
    return ValueError(f"{key}: {expected}")


@pytest.mark.parametrize(
    ("text", "name"),
    [("Example.COM", "example.com"), ("example.com.", "example.com"),
     ("xn--bcher-kva.example", "xn--bcher-kva.example"), ("a-b.c1.io", "a-b.c1.io"),
     ("localhost", "localhost")],
)  # fmt: skip
def test_names_are_normalized(text: str, name: str) -> None:
    assert parse_host(text) == Host(name)


@pytest.mark.parametrize(
    ("text", "address"),
    [("127.0.0.1", "127.0.0.1"), ("[::1]", "::1"), ("[2001:DB8::1]", "2001:db8::1"),
     ("10.1.2.3", "10.1.2.3")],
)  # fmt: skip
def test_ip_literals_are_addresses(text: str, address: str) -> None:
    host = parse_host(text)
    assert host.address == ipaddress.ip_address(address) and host.name == address


@pytest.mark.parametrize(
    "text",
    [
        # addresses in disguise
        "127.1", "2130706433", "0x7f.0x1", "0x7f000001", "017700000001", "1.2.3.4.5", "999.1.1.1",
        # IPv6 without brackets, unclosed, zoned; IPv4 in brackets
        "::1", "[::1", "[fe80::1%eth0]", "[127.0.0.1]",
        "exa mple.com", "ex%41mple.com", "user@example.com", "http://example.com", "example.com/path",
        "exam_ple.com", "-example.com", "example-.com", "a..b", ".", "", "bücher.example", "example.com\x00",
        "a" * 64 + ".com", ("a" * 63 + ".") * 4 + "com", "*.example.com", "example.com:443",
    ],
)  # fmt: skip
def test_anything_else_is_not_a_host_and_is_not_quoted(text: str) -> None:
    with pytest.raises(BadName) as info:
        parse_host(text)
    if len(text) > 3:
        assert text not in str(info.value)


@pytest.mark.parametrize(
    ("text", "split"),
    [("example.com", ("example.com", None)), ("example.com:8443", ("example.com", 8443)),
     ("[::1]:443", ("[::1]", 443)), ("[::1]", ("[::1]", None)), ("*.example.com:80", ("*.example.com", 80))],
)  # fmt: skip
def test_ports_split_off(text: str, split: tuple[str, int | None]) -> None:
    assert split_port(text) == split


@pytest.mark.parametrize("text", ["example.com:0", "example.com:65536", "example.com:", "example.com:https",
                                  "example.com:+443", "::1:443", "[::1]x", "example.com:4 43"])  # fmt: skip
def test_bad_ports_are_refused(text: str) -> None:
    with pytest.raises(BadName):
        split_port(text)


def test_a_rule_without_a_port_grants_https_and_http() -> None:
    assert parse_rule("api.example.com") == Rule(Host("api.example.com"), False, DEFAULT_PORTS)
    assert parse_rule("*.Example.com:8443") == Rule(Host("example.com"), True, frozenset({8443}))
    assert parse_rule("[::1]:9000").host.address == ipaddress.ip_address("::1")


@pytest.mark.parametrize("text", ["*", "*.com", "*.*.example.com", "**.example.com", "*example.com",
                                  "*.127.0.0.1", "*.[::1]", 42, None, "é.example", "x" * 300])  # fmt: skip
def test_bad_rules_are_refused(text: Any) -> None:
    with pytest.raises(BadName):
        parse_rule(text)


def test_a_wildcard_covers_names_below_it_only() -> None:
    rule = parse_rule("*.example.com")
    assert rule.covers(Host("api.example.com")) and rule.covers(Host("a.b.example.com"))
    assert not rule.covers(Host("example.com"))  # not the apex
    assert not rule.covers(Host("evilexample.com")) and not rule.covers(Host("example.com.evil.net"))
    assert not rule.covers(parse_host("93.184.216.34"))
    assert rule.allows(Host("api.example.com"), 443) and not rule.allows(Host("api.example.com"), 22)


def test_an_exact_rule_covers_its_name_or_address_only() -> None:
    assert parse_rule("example.com").covers(Host("example.com"))
    assert not parse_rule("example.com").covers(Host("api.example.com"))
    assert parse_rule("127.0.0.1:8080").allows(parse_host("127.0.0.1"), 8080)
    assert not parse_rule("127.0.0.1:8080").allows(Host("localhost"), 8080)


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        ("api.example.com", "api.example.com", "api.example.com"),
        ("api.example.com", "*.example.com", "api.example.com"),
        ("*.example.com", "api.example.com", "api.example.com"),
        ("*.example.com", "*.api.example.com", "*.api.example.com"),
        ("*.api.example.com", "*.example.com", "*.api.example.com"),
        ("*.example.com", "*.example.com:443", "*.example.com:443"),
        ("api.example.com:8443", "api.example.com", None),  # no port in common
        ("api.example.com", "other.example.com", None),
        ("*.example.com", "*.example.org", None),
        ("example.com", "*.example.com", None),  # the apex is not below its wildcard
    ],
)
def test_narrowing_keeps_what_both_grant(a: str, b: str, both: str | None) -> None:
    got = parse_rule(a).narrowed(parse_rule(b))
    assert got == (None if both is None else parse_rule(both))
    assert parse_rule(b).narrowed(parse_rule(a)) == got


def test_rules_merge_by_host_and_read_back_as_texts() -> None:
    merged = merge([parse_rule(text) for text in ("a.example.com:8080", "a.example.com", "*.a.example.com")])
    assert [str(rule) for rule in merged] == ["a.example.com:80, a.example.com:443, a.example.com:8080",
                                              "*.a.example.com"]  # fmt: skip
    assert merge(parse_rule(text) for rule in merged for text in rule.texts()) == merged


def test_cidrs_are_strict() -> None:
    assert parse_cidr("127.0.0.1/32") == ipaddress.ip_network("127.0.0.1/32")
    assert parse_cidr("fd00::/8") == ipaddress.ip_network("fd00::/8")
    for bad in ("127.0.0.1/8", "10.0.0.0/33", "example.com/8", "", 10):
        with pytest.raises(BadName):
            parse_cidr(bad)  # type: ignore[arg-type]


def test_the_section_reads_every_key() -> None:
    config = egress_config(
        {
            "allow": ["api.example.com", "*.wikipedia.org:443"],
            "packs": {"web-search": ["api.duckduckgo.com"]},
            "trust": {"verified": ["*.github.com"]},
            "hosts": {"API.example.com": "127.0.0.1", "v6.example": "[::1]"},
            "private_cidrs": ["127.0.0.1/32"],
        },
        "agent_sandbox.egress",
        _fail,
    )
    assert [str(r) for r in config.granted("web-search", "Verified")] == [
        "api.example.com", "*.wikipedia.org:443", "api.duckduckgo.com", "*.github.com"]  # fmt: skip
    others = config.granted("other", "unverified")
    assert [str(r) for r in others] == ["api.example.com", "*.wikipedia.org:443"]
    assert config.hosts == {"api.example.com": ipaddress.ip_address("127.0.0.1"),
                            "v6.example": ipaddress.ip_address("::1")}  # fmt: skip
    assert config.private_cidrs == (ipaddress.ip_network("127.0.0.1/32"),)
    assert egress_config({}, "e", _fail) == EgressConfig() and EgressConfig().empty


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"alow": []}, "agent_sandbox.egress: expected only the keys"),
        ({"allow": "example.com"}, "agent_sandbox.egress.allow: expected a list"),
        ({"allow": ["example.com", "127.1"]}, "agent_sandbox.egress.allow[1]: expected NAME[:PORT]"),
        ({"allow": ["x.example"] * (MAX_RULES + 1)}, "agent_sandbox.egress.allow: expected a list of at"),
        ({"packs": {"../x": []}}, "agent_sandbox.egress.packs: expected pack slugs"),
        ({"packs": {"p": ["*"]}}, "agent_sandbox.egress.packs.p[0]: expected NAME[:PORT]"),
        ({"trust": {"root": []}}, "agent_sandbox.egress.trust: expected trust levels"),
        ({"hosts": {"127.0.0.1": "127.0.0.1"}}, "agent_sandbox.egress.hosts: expected DNS names as keys, n"),
        ({"hosts": {"a.example": "localhost"}}, "agent_sandbox.egress.hosts.a.example: expected an IP"),
        ({"private_cidrs": ["127.0.0.1/8"]}, "agent_sandbox.egress.private_cidrs[0]: expected ADDRESS/"),
    ],
)
def test_a_bad_section_names_the_key(section: dict[str, Any], where: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(where)):
        egress_config(section, "agent_sandbox.egress", _fail)


def test_the_host_config_carries_it_and_defaults_to_nothing(tmp_path: Path) -> None:
    env = {"AGENTNODE_CONFIG": str(tmp_path)}
    (tmp_path / "config.json").write_text(json.dumps({"agent_sandbox": {}}))
    assert load_config(env).agent_sandbox.egress == EgressConfig()
    allow = {"agent_sandbox": {"egress": {"allow": ["example.com:8443"]}}}
    (tmp_path / "config.json").write_text(json.dumps(allow))
    assert [str(r) for r in load_config(env).agent_sandbox.egress.allow] == ["example.com:8443"]
    (tmp_path / "config.json").write_text(json.dumps({"agent_sandbox": {"egress": {"allow": ["http://x"]}}}))
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert str(info.value).startswith("agent_sandbox.egress.allow[0]: expected NAME[:PORT]")
    assert "config.json" in info.value.hint


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("93.184.216.34", None), ("2001:4860::8888", None),
        ("127.0.0.1", "private_address"), ("10.1.2.3", "private_address"), ("192.168.1.1", "private_address"),
        ("172.16.0.1", "private_address"), ("100.64.0.1", "private_address"), ("0.0.0.0", "private_address"),
        ("224.0.0.1", "private_address"), ("255.255.255.255", "private_address"),
        ("192.0.2.1", "private_address"),
        ("::1", "private_address"), ("fe80::1", "private_address"), ("fc00::1", "private_address"),
        ("ff02::1", "private_address"), ("::", "private_address"),
        ("::ffff:127.0.0.1", "private_address"), ("64:ff9b::a00:1", "private_address"),
        ("2002:7f00:1::", "private_address"), ("64:ff9b::5db8:d822", None),
        ("169.254.169.254", "metadata_address"), ("fd00:ec2::254", "metadata_address"),
        ("::ffff:169.254.169.254", "metadata_address"), ("100.100.100.200", "metadata_address"),
    ],
)  # fmt: skip
def test_addresses_a_granted_name_may_not_lead_to(address: str, reason: str | None) -> None:
    assert address_refusal(ipaddress.ip_address(address)) == reason


def test_the_operator_can_except_a_private_range_but_never_metadata() -> None:
    loopback = [ipaddress.ip_network("127.0.0.1/32")]
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), loopback) is None
    assert address_refusal(ipaddress.ip_address("::ffff:127.0.0.1"), loopback) is None  # the same address
    assert address_refusal(ipaddress.ip_address("127.0.0.2"), loopback) == "private_address"
    assert address_refusal(ipaddress.ip_address("::1"), loopback) == "private_address"
    everything = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    assert address_refusal(ipaddress.ip_address("169.254.169.254"), everything) == "metadata_address"
