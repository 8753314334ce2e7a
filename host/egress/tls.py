"""The server name a TLS client asks for, read from its ClientHello before a byte of it reaches the origin,
so the egress path can hold it to the name the client's CONNECT was granted for (no domain fronting).

A bounded, allocation-light reader of the first handshake message only (RFC 8446 §4.1.2, RFC 6066 §3):
handshake records are joined up to MAX_HELLO_BYTES, every length is checked against what contains it, and
anything it cannot vouch for is refused with a fixed reason: not TLS, a second server_name extension, more
than one host name, a name that is not a host, or an Encrypted ClientHello (whose outer name is not the one
the client talks to).
"""

from __future__ import annotations

from dataclasses import dataclass

from host.spec.egress import BadName, Host, parse_host

MAX_HELLO_BYTES = 64 * 1024
"""The most of a ClientHello the path reads (a post-quantum key share makes one ~2 KiB; TLS allows 16 MiB)."""
_RECORD_MAX = 2**14 + 256
_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_ECH = 0xFE0D
_HOST_NAME = 0x00


@dataclass(frozen=True)
class Hello:
    """What the ClientHello says: `more` (not all of it arrived yet), else `refusal` (a fixed reason) or
    the requested `host` (None: the client sent no server name)."""

    more: bool = False
    host: Host | None = None
    refusal: str = ""


_MORE = Hello(more=True)


def _refused(reason: str) -> Hello:
    return Hello(refusal=reason)


def _handshake_bytes(data: bytes) -> bytes | Hello:
    """The first handshake message, joined from the leading records, or what to say when it is not (yet)
    there: more bytes needed, or a refusal."""
    out = bytearray()
    at, partial = 0, False
    while True:
        if len(out) >= 4:  # the message's length is known: bound it before waiting for the rest
            need = 4 + int.from_bytes(out[1:4], "big")
            if need > MAX_HELLO_BYTES:
                return _refused("hello_too_large")
            if len(out) >= need:
                return bytes(out[:need])
        if partial or len(data) - at < 5:
            return _MORE
        kind, major, length = data[at], data[at + 1], int.from_bytes(data[at + 3 : at + 5], "big")
        if kind != _HANDSHAKE or major != 3 or not 0 < length <= _RECORD_MAX:
            return _refused("not_tls")
        body = data[at + 5 : at + 5 + length]
        out += body
        partial = len(body) < length  # the record has not all arrived
        at += 5 + length


class _Reader:
    """Reads length-prefixed fields; any overrun is a malformed hello."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def block(self, size: int) -> _Reader:
        return _Reader(self.take(self.number(size)))

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def read_hello(data: bytes) -> Hello:
    """What the client's first bytes ask for; call again with more bytes while the answer is `more`."""
    joined = _handshake_bytes(data)
    if isinstance(joined, Hello):
        return joined
    if joined[0] != _CLIENT_HELLO:
        return _refused("not_client_hello")
    try:
        return _server_name(_Reader(joined[4:]))
    except ValueError:
        return _refused("malformed_hello")


def _server_name(hello: _Reader) -> Hello:
    hello.take(2 + 32)  # legacy_version, random
    hello.block(1)  # legacy_session_id
    suites = hello.block(2)
    if len(suites.data) < 2 or len(suites.data) % 2:
        raise ValueError
    hello.block(1)  # legacy_compression_methods
    if hello.done:
        return Hello()  # no extensions at all: no server name
    extensions = hello.block(2)
    if not hello.done:
        raise ValueError
    seen: set[int] = set()
    host: Host | None = None
    while not extensions.done:
        kind = extensions.number(2)
        body = extensions.block(2)
        if kind in seen:
            return _refused("duplicate_extension")
        seen.add(kind)
        if kind == _ECH:
            return _refused("encrypted_client_hello")
        if kind == _SERVER_NAME:
            names = body.block(2)
            if not body.done:
                raise ValueError
            found = []
            while not names.done:
                name_type = names.number(1)
                name = names.block(2).data
                if name_type == _HOST_NAME:
                    found.append(name)
            if len(found) != 1:
                return _refused("server_name_count")
            try:
                host = parse_host(found[0].decode("ascii"))
            except (UnicodeDecodeError, BadName):
                return _refused("bad_server_name")
            if host.address is not None:  # RFC 6066: literal addresses are not permitted in server_name
                return _refused("bad_server_name")
    return Hello(host=host)


__all__ = ["MAX_HELLO_BYTES", "Hello", "read_hello"]
