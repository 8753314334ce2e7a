"""What a sandbox asks its egress path for: one HTTP/1.1 request head read with h11 under hard bounds, its
target (`CONNECT host:port`, or an absolute-form `http://host[:port]/...`) and the origin-form request the
host sends on for a plain one.

Bounds come first: a head is at most MAX_HEAD_BYTES (h11's own limit, so a header flood costs that much and
no more) and MAX_HEADERS lines, and must arrive by its deadline (a slow writer is cut, not waited for). A
target is read by host/spec/egress.py's parser, so a name here is exactly a name the policy knows: no user
info, no percent-escapes, no bare IPv6, no `127.1`. Nothing parsed here is ever echoed: a refusal is a
fixed reason.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import h11

from host.spec.egress import BadName, Host, parse_host, split_port

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 100
_RECV = 64 * 1024

_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"proxy-authenticate", b"te",
    b"trailer", b"upgrade", b"host", b"expect",
})  # fmt: skip
"""Headers that concern this hop only (RFC 9110 §7.6.1), and Host and Expect, which the host sets itself."""


class Refused(Exception):
    """The connection ends here, for a fixed reason (host/egress/ledger.py REFUSALS)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    """Where a request asks to go: a host (a normalized name or an address), a port, and whether it is a
    tunnel (CONNECT) or one plain request."""

    host: Host
    port: int
    tunnel: bool
    path: bytes = b"/"
    """A plain request's origin-form target."""

    @property
    def authority(self) -> bytes:
        default = 80
        shown = str(self.host)
        return (shown if self.port == default else f"{shown}:{self.port}").encode("ascii")


def receive(
    sock: socket.socket, deadline: float, *, reason: str = "slow_request", most: int = _RECV
) -> bytes:
    """At most `most` bytes from `sock` before `deadline` (b"" at its end); Refused(`reason`) when none came
    in time."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Refused(reason)
    sock.settimeout(left)
    try:
        return sock.recv(most)
    except TimeoutError:
        raise Refused(reason) from None
    except OSError:
        return b""


def read_head(sock: socket.socket, deadline: float) -> tuple[h11.Connection, h11.Request]:
    """The first request on `sock`, read with h11 (its bytes after the head stay in the returned
    connection); Refused when it is not a bounded HTTP/1.1 head that arrived by `deadline`."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    fed = 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise Refused("head_too_large" if exc.error_status_hint == 431 else "bad_request") from None
        if event is h11.NEED_DATA:
            # never more than the bound in all: h11 holds a head that arrived whole to no limit of its own
            if fed >= MAX_HEAD_BYTES:
                raise Refused("head_too_large")
            data = receive(sock, deadline, most=MAX_HEAD_BYTES - fed)
            fed += len(data)
            if not data:
                raise Refused("bad_request")
            conn.receive_data(data)
            continue
        if not isinstance(event, h11.Request):
            raise Refused("bad_request")
        if len(event.headers) > MAX_HEADERS:
            raise Refused("head_too_large")
        return conn, event


def target_of(request: h11.Request) -> Target:
    """The request's target; Refused("bad_target") unless it is `CONNECT host:port` or absolute-form
    `http://host[:port][/path]` (the only forms a proxy client sends)."""
    raw = bytes(request.target)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise Refused("bad_target") from None
    if request.method == b"CONNECT":
        authority, path = text, "/"
    elif text[:7].lower() == "http://":
        rest = text[7:]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
        authority, path = rest[:cut], rest[cut:] or "/"
        if path.startswith("?"):
            path = "/" + path
        if "#" in path:
            raise Refused("bad_target")
    else:
        raise Refused("bad_target")
    if "@" in authority or "%" in authority:
        raise Refused("bad_target")
    try:
        host_text, port = split_port(authority)
        host = parse_host(host_text)
    except BadName:
        raise Refused("bad_target") from None
    if port is None:
        if request.method == b"CONNECT":
            raise Refused("bad_target")  # a tunnel names its port
        port = 80
    return Target(host, port, tunnel=request.method == b"CONNECT", path=path.encode("ascii"))


def origin_request(request: h11.Request, target: Target) -> h11.Request:
    """The plain request as the origin gets it: origin-form target, Host set to the granted authority, this
    hop's headers (and those its Connection header names) dropped, and `Connection: close`, so one
    connection carries exactly one request."""
    named = {
        token.strip().lower()
        for name, value in request.headers
        if name == b"connection"
        for token in value.split(b",")
    }
    chunked = any(name == b"transfer-encoding" for name, _ in request.headers)
    headers = [(b"host", target.authority)]
    for name, value in request.headers:
        if name in _HOP_BY_HOP or name in named or (chunked and name == b"content-length"):
            continue
        headers.append((name, value))
    headers.append((b"connection", b"close"))
    return h11.Request(method=request.method, target=target.path, headers=headers)


__all__ = ["MAX_HEADERS", "MAX_HEAD_BYTES", "Refused", "Target", "origin_request", "read_head", "receive",
           "target_of"]  # fmt: skip
