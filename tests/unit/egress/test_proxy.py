"""The host's egress listener (host/egress/proxy.py) driven over its real Unix socket, against real origins on
127.0.0.1 (plain HTTP, and HTTPS with a CA this test makes): what it lets through reaches exactly the granted
origin, and every hostile request is refused or cut with a fixed reason, counted, never looked up when its
name was not granted, and never echoed."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from host.egress.ledger import REFUSALS, EgressLedger
from host.egress.proxy import EgressProxy, EgressRoute
from host.policy.egress import EgressGrant
from host.spec.egress import EgressConfig, EgressLimits, IpAddress, parse_cidr, parse_rule
from tests.support.origins import LocalCa, Origin, make_ca, origin

LOOPBACK = ipaddress.ip_address("127.0.0.1")


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCa:
    return make_ca(tmp_path_factory.mktemp("ca"), ["api.example.test", "other.example.test"])


@pytest.fixture
def plain() -> Iterator[Origin]:
    with origin() as found:
        yield found


@pytest.fixture
def secure(ca: LocalCa) -> Iterator[Origin]:
    with origin(ca) as found:
        yield found


class Resolver:
    """Records every name the proxy looks up (there must be none for a refused name)."""

    def __init__(self, answers: dict[str, list[IpAddress]] | None = None) -> None:
        self.asked: list[str] = []
        self.answers = answers or {}

    def __call__(self, name: str, port: int) -> list[IpAddress]:
        self.asked.append(name)
        return self.answers.get(name, [])


def make_proxy(
    tmp_path: Path,
    rules: list[str],
    *,
    hosts: dict[str, str] | None = None,
    cidrs: tuple[str, ...] = ("127.0.0.1/32",),
    resolver: Resolver | None = None,
    **limits: float,
) -> EgressProxy:
    config = EgressConfig(
        hosts={k: ipaddress.ip_address(v) for k, v in (hosts or {}).items()},
        private_cidrs=tuple(parse_cidr(c) for c in cidrs),
    )
    ledger = EgressLedger(EgressLimits(**limits))  # type: ignore[arg-type]
    route = EgressRoute(EgressGrant(tuple(parse_rule(r) for r in rules)), config, ledger,
                        resolver or Resolver())  # fmt: skip
    proxy = route.serve(str(tmp_path / "egress.sock"))
    proxy.start()
    return proxy


@pytest.fixture
def proxies() -> Iterator[list[EgressProxy]]:
    made: list[EgressProxy] = []
    yield made
    for proxy in made:
        proxy.stop(grace=2.0)


def dial(proxy: EgressProxy) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(proxy.path)
    except OSError:
        sock.close()
        raise
    return sock


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def head_of(data: bytes) -> tuple[int, dict[str, str]]:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(head[0].split()[1]), headers


def refused_with(proxy: EgressProxy, request: bytes) -> tuple[int, str]:
    """The refusal the proxy answers `request` with; one refused on admission may be written (and the
    connection closed) before the request is sent, and is still there to read."""
    with dial(proxy) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        status, headers = head_of(read_all(sock))
    return status, headers.get("x-agentnode-egress", "")


def tunnel(proxy: EgressProxy, authority: str) -> socket.socket:
    sock = dial(proxy)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return sock


def https_get(sock: socket.socket, ca: LocalCa, name: str, path: str = "/") -> bytes:
    context = ssl.create_default_context(cafile=str(ca.ca_pem))
    with context.wrap_socket(sock, server_hostname=name) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        return read_all(tls)


def wait_for(check: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if callable(check) and check():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


# -- what passes ---------------------------------------------------------------------------------------


def test_a_granted_https_name_reaches_its_origin_through_a_checked_tunnel(
    tmp_path: Path, secure: Origin, ca: LocalCa, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{secure.port}"], hosts={"api.example.test": "127.0.0.1"})
    proxies.append(proxy)
    body = https_get(tunnel(proxy, f"api.example.test:{secure.port}"), ca, "api.example.test")
    assert body.startswith(b"HTTP/1.1 200") and body.endswith(b"hello from the origin\n")
    wait_for(lambda: proxy.route.ledger.active == 0)
    summary = proxy.route.ledger.summary()
    rule = summary["rules"][f"api.example.test:{secure.port}"]
    assert rule["connections"] == 1 and rule["bytes_out"] > 0 and rule["bytes_in"] > len(body) - 1
    assert summary["refused"] == {} and summary["cut"] == {}
    spans = proxy.route.ledger.trace.spans()
    assert [s.attributes["agentnode.egress.outcome"] for s in spans] == ["closed"]


def test_a_plain_request_goes_in_origin_form_with_the_granted_host_and_one_request_only(
    tmp_path: Path, plain: Origin, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{plain.port}"], hosts={"api.example.test": "127.0.0.1"})
    proxies.append(proxy)
    with dial(proxy) as sock:
        # a second request smuggled behind the first, and a Host header that names another site
        sock.sendall(
            f"GET http://api.example.test:{plain.port}/first?q=1 HTTP/1.1\r\nHost: evil.test\r\n"
            f"Proxy-Authorization: secret\r\nConnection: keep-alive\r\n\r\n"
            f"GET http://api.example.test:{plain.port}/second HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello from the origin\n")
    assert answer.count(b"HTTP/1.1 200") == 1
    time.sleep(0.2)
    assert [seen["path"] for seen in plain.seen] == ["/first?q=1"]
    assert plain.seen[0]["host"] == f"api.example.test:{plain.port}"
    assert plain.seen[0]["headers"] == {"host": f"api.example.test:{plain.port}", "connection": "close"}


def test_a_request_body_is_passed_on_within_its_framing(
    tmp_path: Path, plain: Origin, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{plain.port}"], hosts={"api.example.test": "127.0.0.1"})
    proxies.append(proxy)
    with dial(proxy) as sock:
        sock.sendall(f"POST http://api.example.test:{plain.port}/up HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: 5\r\n\r\nhello".encode())  # fmt: skip
        answer = read_all(sock)
    assert answer.endswith(b"got 5\n")
    assert plain.seen[0]["body"] == b"hello"


# -- the policy: before any lookup ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_line", "reason"),
    [
        ("CONNECT evil.test:443", "name_not_granted"),
        ("CONNECT api.example.test:8443", "port_not_granted"),
        ("CONNECT sub.api.example.test:443", "name_not_granted"),
        ("CONNECT 127.0.0.1:443", "address_not_granted"),
        ("CONNECT [::1]:443", "address_not_granted"),
        ("GET http://evil.test/ HTTP/1.1", "name_not_granted"),
    ],
)
def test_a_name_port_or_address_outside_the_grant_is_refused_and_never_looked_up(
    tmp_path: Path, proxies: list[EgressProxy], request_line: str, reason: str
) -> None:
    resolver = Resolver()
    proxy = make_proxy(tmp_path, ["api.example.test"], resolver=resolver)
    proxies.append(proxy)
    line = request_line if request_line.endswith("HTTP/1.1") else request_line + " HTTP/1.1"
    status, said = refused_with(proxy, f"{line}\r\nHost: x\r\n\r\n".encode())
    assert (status, said) == (403, reason)
    assert resolver.asked == []
    assert proxy.route.ledger.summary()["refused"] == {reason: 1}


@pytest.mark.parametrize(
    "target",
    [
        "/relative",  # origin form: not a proxy request
        "http://user@api.example.test/",
        "http://api.example.test%2eevil.test/",
        "https://api.example.test/",  # the proxy does no TLS for a client
        "http://[::1/",
        "http://127.1/",
        "http://2130706433/",
        "http://0x7f.0.0.1/",
        "ftp://api.example.test/",
    ],
)
def test_targets_a_proxy_client_never_sends_are_refused(
    tmp_path: Path, proxies: list[EgressProxy], target: str
) -> None:
    resolver = Resolver()
    proxy = make_proxy(tmp_path, ["api.example.test"], resolver=resolver)
    proxies.append(proxy)
    assert refused_with(proxy, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()) == (400, "bad_target")
    assert resolver.asked == []


def test_a_connect_without_a_port_is_refused(tmp_path: Path, proxies: list[EgressProxy]) -> None:
    proxy = make_proxy(tmp_path, ["api.example.test"])
    proxies.append(proxy)
    assert refused_with(proxy, b"CONNECT api.example.test HTTP/1.1\r\nHost: x\r\n\r\n") == (400, "bad_target")


@pytest.mark.parametrize(
    ("address", "cidrs", "reason"),
    [
        ("10.1.2.3", ("127.0.0.1/32",), "private_address"),
        ("127.0.0.2", ("127.0.0.1/32",), "private_address"),  # the exception is one address, not loopback
        ("169.254.169.254", ("169.254.0.0/16",), "metadata_address"),  # never, whatever the ranges
        ("::ffff:10.0.0.1", (), "private_address"),
        ("::1", (), "private_address"),
    ],
)
def test_a_granted_name_that_leads_to_a_private_address_is_refused(
    tmp_path: Path, proxies: list[EgressProxy], address: str, cidrs: tuple[str, ...], reason: str
) -> None:
    proxy = make_proxy(tmp_path, ["api.example.test"], hosts={"api.example.test": address}, cidrs=cidrs)
    proxies.append(proxy)
    assert refused_with(proxy, b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: x\r\n\r\n") == (403, reason)


def test_the_system_resolvers_private_answer_is_refused_too(
    tmp_path: Path, proxies: list[EgressProxy]
) -> None:
    resolver = Resolver({"api.example.test": [ipaddress.ip_address("192.168.1.1")]})
    proxy = make_proxy(tmp_path, ["api.example.test"], resolver=resolver, cidrs=())
    proxies.append(proxy)
    status, said = refused_with(proxy, b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, said) == (403, "private_address")
    assert resolver.asked == ["api.example.test"]


def test_a_granted_name_with_no_address_or_no_listener_is_a_bad_gateway(
    tmp_path: Path, proxies: list[EgressProxy]
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens here once closed
    proxy = make_proxy(tmp_path, [f"api.example.test:{port}", "gone.example.test"],
                       hosts={"api.example.test": "127.0.0.1"})  # fmt: skip
    proxies.append(proxy)
    assert refused_with(proxy, f"CONNECT api.example.test:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()) == (
        502, "connect_failed")  # fmt: skip
    assert refused_with(proxy, b"CONNECT gone.example.test:443 HTTP/1.1\r\nHost: x\r\n\r\n") == (
        502,
        "resolve_failed",
    )


# -- the tunnel holds to its name ----------------------------------------------------------------------------


def test_a_client_hello_for_another_name_is_cut_before_it_reaches_the_origin(
    tmp_path: Path, secure: Origin, ca: LocalCa, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{secure.port}"], hosts={"api.example.test": "127.0.0.1"})
    proxies.append(proxy)
    sock = tunnel(proxy, f"api.example.test:{secure.port}")
    with pytest.raises((ssl.SSLError, OSError)):
        https_get(sock, ca, "other.example.test")  # a fronted name: the certificate would even match
    wait_for(lambda: proxy.route.ledger.active == 0)
    assert proxy.route.ledger.summary()["refused"] == {"sni_mismatch": 1}
    assert secure.seen == []


def test_plain_bytes_in_a_tunnel_are_refused(
    tmp_path: Path, plain: Origin, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{plain.port}"], hosts={"api.example.test": "127.0.0.1"})
    proxies.append(proxy)
    with tunnel(proxy, f"api.example.test:{plain.port}") as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
        assert read_all(sock) == b""
    wait_for(lambda: proxy.route.ledger.active == 0)
    assert proxy.route.ledger.summary()["refused"] == {"not_tls": 1}
    assert plain.seen == []


# -- bounds -------------------------------------------------------------------------------------------------


def test_a_header_flood_and_a_header_count_flood_are_refused(
    tmp_path: Path, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, ["api.example.test"])
    proxies.append(proxy)
    big = b"GET http://api.example.test/ HTTP/1.1\r\nX-A: " + b"a" * 20000 + b"\r\n\r\n"
    assert refused_with(proxy, big) == (431, "head_too_large")
    many = b"GET http://api.example.test/ HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(150)
    )
    assert refused_with(proxy, many + b"\r\n") == (431, "head_too_large")
    line = b"GET http://api.example.test/" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"
    assert refused_with(proxy, line)[0] in (400, 431)


def test_a_slow_writer_is_cut_at_the_head_deadline(tmp_path: Path, proxies: list[EgressProxy]) -> None:
    proxy = make_proxy(tmp_path, ["api.example.test"], head_seconds=1)
    proxies.append(proxy)
    with dial(proxy) as sock:
        started = time.monotonic()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for byte in b"GET http://api.example.test/ HTTP/1.1\r\n":
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
        status, headers = head_of(read_all(sock))
        assert time.monotonic() - started < 5
    assert (status, headers["x-agentnode-egress"]) == (408, "slow_request")


def test_an_idle_tunnel_is_cut(
    tmp_path: Path, secure: Origin, ca: LocalCa, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{secure.port}"], hosts={"api.example.test": "127.0.0.1"},
                       idle_seconds=1)  # fmt: skip
    proxies.append(proxy)
    context = ssl.create_default_context(cafile=str(ca.ca_pem))
    with context.wrap_socket(tunnel(proxy, f"api.example.test:{secure.port}"),
                             server_hostname="api.example.test") as tls:  # fmt: skip
        started = time.monotonic()
        assert read_all(tls) == b""  # nothing asked, nothing said: cut after a second
        assert time.monotonic() - started < 5
    wait_for(lambda: proxy.route.ledger.summary()["cut"] == {"idle": 1})


def test_the_runs_byte_cap_cuts_a_download(tmp_path: Path, plain: Origin, proxies: list[EgressProxy]) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{plain.port}"], hosts={"api.example.test": "127.0.0.1"},
                       max_bytes_in=100_000)  # fmt: skip
    proxies.append(proxy)
    with dial(proxy) as sock:
        sock.sendall(
            f"GET http://api.example.test:{plain.port}/bytes/1000000 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        got = read_all(sock)
    assert len(got) <= 100_000
    wait_for(lambda: proxy.route.ledger.summary()["cut"] == {"bytes_in_cap": 1})
    assert proxy.route.ledger.bytes_in <= 100_000


def test_concurrent_and_total_connections_are_capped(tmp_path: Path, proxies: list[EgressProxy]) -> None:
    proxy = make_proxy(tmp_path, ["api.example.test"], max_concurrent=2, max_connections=4, head_seconds=5)
    proxies.append(proxy)
    held = [dial(proxy), dial(proxy)]  # each waits for its head
    wait_for(lambda: proxy.route.ledger.active == 2)
    assert refused_with(proxy, b"") == (429, "too_many_connections")
    for sock in held:
        sock.close()
    wait_for(lambda: proxy.route.ledger.active == 0)
    # the refused attempt counted: this is the fourth, and the last
    assert refused_with(proxy, b"CONNECT evil.test:443 HTTP/1.1\r\nHost: x\r\n\r\n") == (
        403,
        "name_not_granted",
    )
    assert refused_with(proxy, b"CONNECT evil.test:443 HTTP/1.1\r\nHost: x\r\n\r\n") == (
        429,
        "connection_cap",
    )
    refused = proxy.route.ledger.summary()["refused"]
    assert refused["too_many_connections"] == 1 and refused["connection_cap"] == 1


def test_ten_thousand_connection_attempts_cost_a_bounded_host(
    tmp_path: Path, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, ["api.example.test"], max_connections=256, max_concurrent=16)
    proxies.append(proxy)
    threads_before = threading.active_count()
    peak = 0
    for _ in range(10_000):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(proxy.path)
        peak = max(peak, threading.active_count() - threads_before)
    wait_for(lambda: proxy.route.ledger.active == 0, timeout=30)
    summary = proxy.route.ledger.summary()
    assert summary["attempts"] <= 256 + summary["refused"].get("too_many_connections", 0)
    assert sum(summary["refused"].values()) >= 10_000 - 256
    assert peak <= 16 + 2
    assert set(summary["refused"]) <= set(REFUSALS)


def test_stop_ends_every_connection_and_later_ones_are_refused(
    tmp_path: Path, secure: Origin, ca: LocalCa, proxies: list[EgressProxy]
) -> None:
    proxy = make_proxy(tmp_path, [f"api.example.test:{secure.port}"], hosts={"api.example.test": "127.0.0.1"})
    context = ssl.create_default_context(cafile=str(ca.ca_pem))
    tls = context.wrap_socket(
        tunnel(proxy, f"api.example.test:{secure.port}"), server_hostname="api.example.test"
    )
    proxy.route.ledger.end()
    proxy.stop(grace=5.0)
    with tls:
        assert read_all(tls) == b""
    assert proxy.route.ledger.active == 0
    assert proxy.route.ledger.summary()["cut"] == {"run_ended": 1}
    with pytest.raises(OSError):
        dial(proxy)
