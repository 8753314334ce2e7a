"""A Docker-compatible engine stand-in: a real HTTP server on a Unix socket with scripted answers."""

from __future__ import annotations

import json
import shutil
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from host.engine.http import LIBPOD


class FakeEngine:
    """A Docker-compatible engine stand-in: a real HTTP server on a Unix socket with scripted answers.

    `status` answers every request with that error status; otherwise /version, /_ping and /info answer
    like an engine (`info` is the /info body, `version` adds to the /version body: Podman's names itself
    in `Components`, and its /_ping then says libpod's API version, as Podman's does); Podman's own
    /libpod/info answers `libpod_info` and its container inspect answers with `oci_runtime` as the
    container's runtime; a container's logs answer `log_chunks` (the engine's framed stream), if given.
    """

    def __init__(
        self, *, status: int | None = None, info: dict[str, Any] | None = None,
        version: dict[str, Any] | None = None, oci_runtime: str = "",
        libpod_info: dict[str, Any] | None = None, log_chunks: list[bytes] | None = None,
    ) -> None:  # fmt: skip
        self.status = status
        self.info = info or {}
        self.version = version or {}
        self.oci_runtime = oci_runtime
        self.libpod_info = libpod_info
        self.log_chunks = log_chunks
        """A container's followed log, as the chunks of its chunked answer (then the stream ends)."""
        self.created: list[tuple[str, Any]] = []
        """Each `POST /containers/create`: (its request target, its JSON body); answered 201 with an id."""
        self.create_status = 201
        self.start_status = 204
        self.chunked_create = False
        """Answer a create in chunked encoding (as an engine behind a proxy may)."""
        self.started: list[str] = []
        self.volumes: set[str] = set()
        """The volumes that exist (`GET /volumes/NAME` answers 200 for these, else 404)."""
        self.removed: list[str] = []
        self.paths: list[str] = []  # without the /v1.NN prefix
        self.raw_paths: list[str] = []
        self.connections = 0  # accepted client connections (each may carry many requests)
        self._dir = tempfile.mkdtemp(dir="/tmp", prefix="fe-")  # a Unix socket path must fit 108 bytes
        self.socket_path = f"{self._dir}/engine.sock"
        self._server = _UnixHttpServer(self.socket_path, _engine_handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket_path}"

    def __enter__(self) -> FakeEngine:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)


_LOG_STREAM = "application/vnd.docker.multiplexed-stream"


class _UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _engine_handler(engine: FakeEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet (and a Unix peer has no address to format)."""

        def setup(self) -> None:
            engine.connections += 1  # one handler per accepted connection
            super().setup()

        def _route(self) -> str:
            """The request's path without its query and /v1.NN prefix, recorded both ways."""
            engine.raw_paths.append(self.path)
            path = "/" + self.path.split("?")[0].lstrip("/")
            if path.startswith("/v1."):
                path = "/" + path.split("/", 2)[2]
            engine.paths.append(path)
            return path

        def do_GET(self) -> None:
            path = self._route()
            if engine.status is not None:
                self._send(engine.status, {"message": "authorization denied by plugin"})
            elif path == "/version":
                self._send(
                    200, {"ApiVersion": "1.45", "Version": "fake", "MinAPIVersion": "1.24", **engine.version}
                )
            elif path == "/_ping":
                names = [str(c.get("Name", "")) for c in engine.version.get("Components", [])]
                podman = any(name.startswith("Podman") for name in names)
                headers = {"Api-Version": "1.45", **({"Libpod-Api-Version": "4.3.1"} if podman else {})}
                self._send(200, "OK", headers)
            elif path.startswith("/volumes/"):
                if path.split("/")[2] in engine.volumes:
                    self._send(200, {"Name": path.split("/")[2], "Labels": {}})
                else:
                    self._send(404, {"message": "no such volume"})
            elif path == "/info":
                self._send(200, engine.info)
            elif engine.libpod_info is not None and path == f"{LIBPOD}/info":
                self._send(200, engine.libpod_info)
            elif engine.log_chunks is not None and path.startswith("/containers/") and path.endswith("/logs"):
                self._send_chunked(engine.log_chunks)
            elif engine.oci_runtime and path.startswith(f"{LIBPOD}/containers/") and path.endswith("/json"):
                self._send(200, {"OCIRuntime": engine.oci_runtime, "HostConfig": {"Runtime": "oci"}})
            else:
                self._send(404, {"message": "no such route"})

        do_HEAD = do_GET

        def do_POST(self) -> None:
            path = self._route()
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            if path == "/containers/create":
                engine.created.append((self.path, json.loads(body or b"null")))
                answer = {"Id": f"{len(engine.created):064x}", "Warnings": []}
                if engine.chunked_create and engine.create_status == 201:
                    self._send_chunked([json.dumps(answer).encode()], status=201, kind="application/json")
                else:
                    self._send(engine.create_status, answer)
            elif path.startswith("/containers/") and path.endswith("/start"):
                engine.started.append(path.split("/")[2])
                self._send(engine.start_status, "")
            else:
                self._send(404, {"message": "no such route"})

        def do_DELETE(self) -> None:
            path = self._route()
            engine.removed.append(path.split("/")[2])
            self._send(204, "")

        def _send_chunked(self, chunks: list[bytes], *, status: int = 200, kind: str = _LOG_STREAM) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            if status in (204, 304):
                payload = b""  # no body, and no Content-Length either: as an engine answers
                self.send_response(status)
                self.end_headers()
                return
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


__all__ = ["FakeEngine"]
