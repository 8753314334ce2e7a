"""Origins for the egress tests: real HTTP and HTTPS servers on 127.0.0.1, with a CA the test makes (openssl),
that record what reached them. No test traffic leaves the machine's loopback."""

from __future__ import annotations

import contextlib
import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LocalCa:
    """A CA and one server certificate for `names`, as PEM files."""

    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def make_ca(where: Path, names: list[str]) -> LocalCa:
    """A throwaway CA (openssl CLI) and a leaf certificate for `names` signed by it."""
    where.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=where)

    run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=agentnode test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    )
    run(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        f"/CN={names[0]}",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
    )
    (where / "leaf.ext").write_text(
        "subjectAltName=" + ",".join(f"DNS:{n}" for n in names) + "\nextendedKeyUsage=serverAuth\n"
    )
    run(
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
        "-out",
        "leaf.pem",
    )
    return LocalCa(where / "ca.pem", where / "leaf.pem", where / "leaf.key")


@dataclass
class Origin:
    """A running origin: its port, what reached it (request lines and Host headers), its server."""

    port: int
    tls: bool
    seen: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    server: Any = None

    @property
    def address(self) -> str:
        return "127.0.0.1"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    origin: Origin

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body_in = self.rfile.read(length) if length else b""
        self.origin.seen.append({"method": self.command, "path": self.path, "host": self.headers.get("host"),
                                 "headers": dict(self.headers.items()), "body": body_in})  # fmt: skip
        if self.path.startswith("/bytes/"):
            size = int(self.path.removeprefix("/bytes/"))
            self.send_response(200)
            self.send_header("content-length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            left = size
            while left > 0:
                piece = chunk[: min(left, len(chunk))]
                self.wfile.write(piece)
                left -= len(piece)
            return
        body = b"hello from the origin\n" if not body_in else b"got " + str(len(body_in)).encode() + b"\n"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer
    do_HEAD = _answer


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, origin: Origin, context: ssl.SSLContext | None) -> None:
        handler = type("Handler", (_Handler,), {"origin": origin})
        super().__init__(("127.0.0.1", 0), handler)
        self._context = context
        self._origin = origin

    def get_request(self) -> Any:
        sock, address = super().get_request()
        self._origin.connections += 1
        if self._context is not None:
            sock = self._context.wrap_socket(sock, server_side=True)
        return sock, address


@contextlib.contextmanager
def origin(ca: LocalCa | None = None) -> Iterator[Origin]:
    """A plain HTTP origin on 127.0.0.1, or an HTTPS one serving `ca`'s certificate."""
    context = None
    if ca is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(ca.cert_pem, ca.key_pem)
    found = Origin(port=0, tls=ca is not None)
    server = _Server(found, context)
    found.port = server.server_address[1]
    found.server = server
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


__all__ = ["LocalCa", "Origin", "make_ca", "origin"]
