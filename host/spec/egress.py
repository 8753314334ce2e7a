"""Network names as the egress policy reads them: `NAME[:PORT]` rules (exact names, `*.suffix` wildcards, IP
literals), one normalization for what a pack declares, what the operator grants and what a sandbox asks
to reach, and the operator's `agent_sandbox.egress` section.

Everything here is pure and bounded: a name is at most 253 characters and parsed without a resolver, so
checking a hostile name costs nothing and tells no DNS server anything. A name is ASCII LDH (an
internationalized name is given in its IDNA form, `xn--...`); its last label is never all digits, so
`127.1`, `2130706433` and `0x7f.1` are not names, and an address is only ever an IP literal.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from host.core.vocab import Trust
from host.spec.sections import Fail, numbers, section

DEFAULT_PORTS = frozenset({443, 80})
"""The ports a rule without one grants: HTTPS and HTTP."""
MAX_NAME_CHARS = 253
MAX_RULES = 256
"""Rules one list may hold (a pack's declared domains, one operator list)."""
MAX_HOSTS = 1024
"""Entries of `egress.hosts`."""

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PORT = re.compile(r"[0-9]{1,5}")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class BadName(ValueError):
    """Not a network name, wildcard or address this policy accepts; the message never quotes the input."""


@dataclass(frozen=True)
class Host:
    """A normalized host: a DNS name (lowercase, no trailing dot) or an IP address (`address` set)."""

    name: str
    address: IpAddress | None = None

    def __str__(self) -> str:
        if isinstance(self.address, ipaddress.IPv6Address):
            return f"[{self.address}]"
        return self.name


def _dns_name(text: str) -> str:
    name = text.lower().removesuffix(".")
    if not name or len(name) > MAX_NAME_CHARS:
        raise BadName(f"a name is 1 to {MAX_NAME_CHARS} characters")
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise BadName("a name is letters, digits and inner hyphens between dots (IDNA form for others)")
    if re.fullmatch(r"[0-9]+|0x[0-9a-f]*", labels[-1]):  # inet_aton would read such a name as an address
        raise BadName("a name's last label is not a number (an address is written as an IP literal)")
    return name


def parse_host(text: str) -> Host:
    """`text` as a Host: a DNS name, a dotted IPv4 address or a bracketed IPv6 one (`[::1]`); BadName
    otherwise (URLs, ports, user info, percent-escapes, whitespace, non-ASCII)."""
    if not isinstance(text, str) or not text.isascii() or len(text) > MAX_NAME_CHARS + 2:
        raise BadName("a host is ASCII and at most 255 characters")
    if text.startswith("["):
        if not text.endswith("]"):
            raise BadName("an IPv6 literal is written in brackets")
        try:
            v6 = ipaddress.IPv6Address(text[1:-1])
        except ValueError:
            raise BadName("not an IPv6 address") from None
        if v6.scope_id is not None:
            raise BadName("an IPv6 literal carries no zone")
        return Host(str(v6), v6)
    if re.fullmatch(r"[0-9.]+", text):
        try:
            v4 = ipaddress.IPv4Address(text)
        except ValueError:
            raise BadName("not a dotted IPv4 address") from None
        return Host(str(v4), v4)
    return Host(_dns_name(text))


def split_port(text: str) -> tuple[str, int | None]:
    """`HOST[:PORT]` as (host text, port or None); BadName for a port outside 1-65535 or an IPv6 literal
    without its brackets."""
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end != -1 else ""
        if not rest:
            return text, None
        if not rest.startswith(":"):
            raise BadName("an IPv6 literal is followed by nothing or :PORT")
        host, port = text[: end + 1], rest[1:]
    elif text.count(":") == 0:
        return text, None
    elif text.count(":") > 1:
        raise BadName("an IPv6 literal is written in brackets")
    else:
        host, _, port = text.partition(":")
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise BadName("a port is a number from 1 to 65535")
    return host, int(port)


@dataclass(frozen=True)
class Rule:
    """One grant: an exact host or every name under `suffix` (`*.suffix`: not the suffix itself), on
    `ports`."""

    host: Host
    wildcard: bool = False
    ports: frozenset[int] = DEFAULT_PORTS

    def covers(self, host: Host) -> bool:
        """Whether `host` is this rule's host or, for a wildcard, a name below it."""
        if not self.wildcard:
            return host == self.host
        return host.address is None and host.name.endswith("." + self.host.name)

    def allows(self, host: Host, port: int) -> bool:
        return port in self.ports and self.covers(host)

    def narrowed(self, other: Rule) -> Rule | None:
        """What both this rule and `other` grant, as one rule; None when they share nothing."""
        ports = self.ports & other.ports
        if not ports:
            return None
        if self.wildcard and other.wildcard:
            if self.host == other.host or self.covers(other.host):
                return Rule(other.host, True, ports)
            return Rule(self.host, True, ports) if other.covers(self.host) else None
        if self.wildcard:
            return Rule(other.host, False, ports) if self.covers(other.host) else None
        if other.wildcard:
            return Rule(self.host, False, ports) if other.covers(self.host) else None
        return Rule(self.host, False, ports) if self.host == other.host else None

    def texts(self) -> tuple[str, ...]:
        """The rule as `NAME[:PORT]` texts that parse_rule and merge read back to this rule."""
        shown = f"*.{self.host}" if self.wildcard else str(self.host)
        if self.ports == DEFAULT_PORTS:
            return (shown,)
        return tuple(f"{shown}:{port}" for port in sorted(self.ports))

    def __str__(self) -> str:
        return ", ".join(self.texts())


def parse_rule(text: str) -> Rule:
    """`NAME[:PORT]`, `*.SUFFIX[:PORT]`, `IPV4[:PORT]` or `[IPV6][:PORT]` as a Rule (no port: 443 and 80)."""
    if not isinstance(text, str) or not text.isascii() or len(text) > MAX_NAME_CHARS + 10:
        raise BadName("a rule is ASCII NAME[:PORT] of at most 263 characters")
    host_text, port = split_port(text.strip())
    wildcard = host_text.startswith("*.")
    host = parse_host(host_text[2:] if wildcard else host_text)
    if wildcard and (host.address is not None or "." not in host.name):
        raise BadName("a wildcard is *. and a name of two labels or more (*.example.com)")
    return Rule(host, wildcard, DEFAULT_PORTS if port is None else frozenset({port}))


def merge(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    """Rules for one host and kind joined (their ports united), in first-seen order."""
    ports: dict[tuple[Host, bool], frozenset[int]] = {}
    for rule in rules:
        key = (rule.host, rule.wildcard)
        ports[key] = ports.get(key, frozenset()) | rule.ports
    return tuple(Rule(host, wildcard, found) for (host, wildcard), found in ports.items())


@dataclass(frozen=True)
class EgressLimits:
    """Per-run caps of the egress path (`agent_sandbox.egress.limits`); the defaults are documented."""

    max_connections: int = 256
    """Connections one run may open in all (refused ones count too: each costs the host a thread's start)."""
    max_concurrent: int = 16
    max_bytes_out: int = 64 * 1024 * 1024
    """Bytes the run may send to origins, request heads and bodies and tunnelled bytes alike."""
    max_bytes_in: int = 1024 * 1024 * 1024
    connection_seconds: float = 300.0
    """The longest one connection lives."""
    idle_seconds: float = 30.0
    """How long a connection may pass no byte either way (a slow reader or writer is cut after it)."""
    head_seconds: float = 10.0
    """How long a request head (and a tunnel's ClientHello) may take to arrive."""
    connect_seconds: float = 10.0


@dataclass(frozen=True)
class EgressConfig:
    """`agent_sandbox.egress`: what the operator grants (default: nothing at all).

    `allow` is granted to any pack that asks for it, `packs` to one pack (by slug), `trust` to every pack of
    a trust level; `hosts` are addresses the host uses instead of DNS for those names; `private_cidrs` are
    the address ranges excepted from the refusal of private, loopback and link-local addresses; `limits`
    are the per-run caps of the egress path.
    """

    allow: tuple[Rule, ...] = ()
    packs: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)
    trust: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)
    hosts: Mapping[str, IpAddress] = field(default_factory=dict)
    private_cidrs: tuple[IpNetwork, ...] = ()
    grantable: tuple[Rule, ...] = ()
    """What a caller may grant one run on top of the standing grants (`run --allow-egress`, the Runner RPC);
    a per-run grant never reaches beyond these and the standing ones."""
    limits: EgressLimits = field(default_factory=EgressLimits)

    def granted(self, slug: str, trust: str) -> tuple[Rule, ...]:
        """Everything the operator grants a pack of this slug and trust level, before its declaration."""
        return merge((*self.allow, *self.packs.get(slug, ()), *self.trust.get(trust.lower(), ())))

    @property
    def empty(self) -> bool:
        return not (self.allow or any(self.packs.values()) or any(self.trust.values()))


def parse_cidr(text: str) -> IpNetwork:
    """An address range (`10.0.0.0/8`, `127.0.0.1/32`, `fd00::/8`); BadName when not one (host bits set
    included: `127.0.0.1/8` is refused rather than widened)."""
    if not isinstance(text, str) or not text.isascii() or len(text) > 64:
        raise BadName("an address range is ADDRESS/PREFIX")
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError:
        raise BadName("not an address range ADDRESS/PREFIX with its host bits zero") from None


_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SECTION_KEYS = ("allow", "packs", "trust", "hosts", "private_cidrs", "grantable", "limits")
_LIMIT_KEYS = {
    "max_connections": (1, 100_000), "max_concurrent": (1, 1024), "max_bytes_out": (0, 2**40),
    "max_bytes_in": (0, 2**40), "connection_seconds": (1, 86_400), "idle_seconds": (1, 3600),
    "head_seconds": (1, 300), "connect_seconds": (1, 300),
}  # fmt: skip
"""`limits` keys and the range each may take."""


def _rules(value: Any, key: str, fail: Fail) -> tuple[Rule, ...]:
    if not isinstance(value, list) or len(value) > MAX_RULES:
        raise fail(key, f"expected a list of at most {MAX_RULES} NAME[:PORT] patterns", value)
    found: list[Rule] = []
    for index, item in enumerate(value):
        try:
            found.append(parse_rule(item))
        except BadName as exc:
            expected = f"expected NAME[:PORT], *.SUFFIX[:PORT] or an IP literal: {exc}"
            raise fail(f"{key}[{index}]", expected, item) from None
    return merge(found)


def _keyed(value: Any, key: str, limit: int, fail: Fail) -> Mapping[str, Any]:
    """An object whose keys the operator chooses (pack slugs, trust levels, names), bounded in size."""
    value = {} if value is None else value
    if not isinstance(value, dict) or len(value) > limit:
        raise fail(key, f"expected an object of at most {limit} entries", value)
    return value


def _hosts(value: Any, key: str, fail: Fail) -> dict[str, IpAddress]:
    hosts: dict[str, IpAddress] = {}
    for name, address in _keyed(value, key, MAX_HOSTS, fail).items():
        try:
            host = parse_host(name)
        except BadName as exc:
            raise fail(key, f"expected DNS names as keys: {exc}", name) from None
        if host.address is not None:
            raise fail(key, "expected DNS names as keys, not addresses", name)
        try:
            hosts[host.name] = ipaddress.ip_address(address.strip("[]") if isinstance(address, str) else "")
        except ValueError:
            raise fail(f"{key}.{host.name}", "expected an IP address", address) from None
    return hosts


def _cidrs(value: Any, key: str, fail: Fail) -> tuple[IpNetwork, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_RULES:
        raise fail(key, f"expected a list of at most {MAX_RULES} address ranges", value)
    networks: list[IpNetwork] = []
    for index, text in enumerate(value):
        try:
            networks.append(parse_cidr(text))
        except BadName as exc:
            raise fail(f"{key}[{index}]", f"expected ADDRESS/PREFIX: {exc}", text) from None
    return tuple(networks)


def egress_config(value: Any, key: str, fail: Fail) -> EgressConfig:
    """The `agent_sandbox.egress` section read and checked (`key` is its path, for errors)."""
    value = section(value, key, _SECTION_KEYS, fail)
    packs: dict[str, tuple[Rule, ...]] = {}
    for slug, rules in _keyed(value.get("packs"), f"{key}.packs", MAX_RULES, fail).items():
        if not _SLUG.fullmatch(slug):
            raise fail(f"{key}.packs", "expected pack slugs as keys", slug)
        packs[slug] = _rules(rules, f"{key}.packs.{slug}", fail)
    trust: dict[str, tuple[Rule, ...]] = {}
    for level, rules in _keyed(value.get("trust"), f"{key}.trust", len(Trust), fail).items():
        if level not in tuple(Trust):
            raise fail(f"{key}.trust", f"expected trust levels as keys ({', '.join(Trust)})", level)
        trust[level] = _rules(rules, f"{key}.trust.{level}", fail)
    allow, grantable = value.get("allow"), value.get("grantable")
    return EgressConfig(
        allow=() if allow is None else _rules(allow, f"{key}.allow", fail),
        packs=packs,
        trust=trust,
        hosts=_hosts(value.get("hosts"), f"{key}.hosts", fail),
        private_cidrs=_cidrs(value.get("private_cidrs"), f"{key}.private_cidrs", fail),
        grantable=() if grantable is None else _rules(grantable, f"{key}.grantable", fail),
        limits=_limits(value.get("limits"), f"{key}.limits", fail),
    )


def _limits(value: Any, key: str, fail: Fail) -> EgressLimits:
    return EgressLimits(**numbers(value, key, _LIMIT_KEYS, fail))  # type: ignore[arg-type]


__all__ = [
    "DEFAULT_PORTS",
    "METADATA_ADDRESSES",
    "BadName",
    "EgressConfig",
    "EgressLimits",
    "Fail",
    "Host",
    "IpAddress",
    "Rule",
    "address_refusal",
    "egress_config",
    "merge",
    "parse_cidr",
    "parse_host",
    "parse_rule",
    "split_port",
]


# --- where a granted name may lead ------------------------------------------------------------------------

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
"""Cloud instance-metadata endpoints (AWS, ECS, AWS IPv6, Alibaba): refused even inside a granted range."""


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def address_refusal(address: IpAddress, private_cidrs: Iterable[IpNetwork] = ()) -> str | None:
    """Why the host must not connect to `address` (a fixed reason), or None: loopback, private, link-local,
    multicast, reserved, unspecified and shared (CGNAT) addresses are refused unless a range of
    `private_cidrs` contains them; a metadata endpoint always. An IPv6 address that carries an IPv4 one
    (IPv4-mapped, 6to4, the NAT64 prefix) is judged as that IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:  # the well-known NAT64 prefix carries an IPv4 address
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            address = embedded
    if address in METADATA_ADDRESSES:
        return "metadata_address"
    public = address.is_global and not address.is_multicast
    if public:
        return None
    if any(address.version == net.version and address in net for net in private_cidrs):
        return None
    return "private_address"
