"""The ClientHello reader (host/egress/tls.py) against real ClientHellos (this interpreter's OpenSSL, TLS 1.2
and 1.3), cut anywhere, split across records, and made hostile: it answers `more`, the name, or a fixed
refusal, and never reads past what a length allows."""

from __future__ import annotations

import ssl
import struct

import pytest

from host.egress.tls import MAX_HELLO_BYTES, Hello, read_hello
from host.spec.egress import Host


def client_hello(server_name: str | None, *, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3) -> bytes:
    """The first flight of a real TLS client asking for `server_name` (None: no SNI)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.maximum_version = version
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def records(message: bytes, size: int) -> bytes:
    """`message` (a handshake message) as TLS records of at most `size` bytes each."""
    out = b""
    for at in range(0, len(message), size):
        chunk = message[at : at + size]
        out += b"\x16\x03\x01" + struct.pack(">H", len(chunk)) + chunk
    return out


def message_of(hello: bytes) -> bytes:
    assert hello[0] == 0x16
    return hello[5 : 5 + struct.unpack(">H", hello[3:5])[0]]


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_real_client_hello_gives_its_server_name(version: ssl.TLSVersion) -> None:
    assert read_hello(client_hello("api.example.com", version=version)) == Hello(host=Host("api.example.com"))


def test_no_server_name_is_said_so() -> None:
    assert read_hello(client_hello(None)) == Hello()


def test_every_prefix_asks_for_more_and_the_whole_answers() -> None:
    hello = client_hello("api.example.com")
    assert all(read_hello(hello[:cut]) == Hello(more=True) for cut in range(len(hello)))
    assert read_hello(hello + b"\x17\x03\x03\x00\x05extra").host == Host("api.example.com")  # what follows


@pytest.mark.parametrize("size", [1, 7, 64, 300])
def test_a_hello_split_across_records_is_joined(size: int) -> None:
    split = records(message_of(client_hello("split.example.com")), size)
    assert read_hello(split).host == Host("split.example.com")
    assert read_hello(split[:-1]).more


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"CONNECT x:443 HTTP/1.1\r\n\r\n", "not_tls"),
        (b"\x17\x03\x03\x00\x10" + b"\x00" * 16, "not_tls"),  # application data first
        (b"\x16\x02\x00\x00\x10" + b"\x00" * 16, "not_tls"),  # SSL 2-ish version
        (b"\x16\x03\x01\x00\x00", "not_tls"),  # an empty record
        (b"\x16\x03\x01\xff\xff" + b"\x00" * 10, "not_tls"),  # a record over the TLS maximum
        (records(b"\x02\x00\x00\x04abcd", 100), "not_client_hello"),
        (records(b"\x01\xff\xff\xff", 100), "hello_too_large"),
        (records(b"\x01\x00\x00\x04abcd", 100), "malformed_hello"),
    ],
)
def test_what_is_not_a_client_hello_is_refused(data: bytes, reason: str) -> None:
    assert read_hello(data) == Hello(refusal=reason)


def _hello(extensions: bytes) -> bytes:
    """A minimal well-formed ClientHello carrying `extensions` (already encoded)."""
    body = b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack(">H", len(extensions)) + extensions
    return records(b"\x01" + len(body).to_bytes(3, "big") + body, 2**14)


def _sni(*names: tuple[int, bytes]) -> bytes:
    entries = b"".join(bytes([kind]) + struct.pack(">H", len(name)) + name for kind, name in names)
    listed = struct.pack(">H", len(entries)) + entries
    return b"\x00\x00" + struct.pack(">H", len(listed)) + listed


@pytest.mark.parametrize(
    ("extensions", "reason"),
    [
        (_sni((0, b"a.example")) + _sni((0, b"b.example")), "duplicate_extension"),
        (_sni((0, b"a.example"), (0, b"b.example")), "server_name_count"),
        (_sni(), "server_name_count"),
        (_sni((0, b"a.example\x00.evil")), "bad_server_name"),
        (_sni((0, b"127.0.0.1")), "bad_server_name"),
        (_sni((0, "bücher.example".encode())), "bad_server_name"),
        (_sni((0, b"a.example")) + b"\xfe\x0d\x00\x00", "encrypted_client_hello"),
        (b"\x00\x00\x00\x05\x00\x03\x00\x00\x09", "malformed_hello"),  # a name longer than its list
    ],
)
def test_a_hostile_server_name_is_refused(extensions: bytes, reason: str) -> None:
    assert read_hello(_hello(extensions)) == Hello(refusal=reason)


def test_other_name_types_are_passed_over_and_a_good_name_read() -> None:
    assert read_hello(_hello(_sni((0, b"Good.Example.")))).host == Host("good.example")
    assert read_hello(_hello(_sni((7, b"ignored"), (0, b"good.example")))).host == Host("good.example")


def test_a_hello_larger_than_the_bound_is_refused_before_it_all_arrives() -> None:
    huge = b"\x01" + (MAX_HELLO_BYTES).to_bytes(3, "big") + b"\x03\x03" + b"\x00" * 100
    assert read_hello(records(huge, 2**14)) == Hello(refusal="hello_too_large")
