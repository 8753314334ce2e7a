"""The engine's HTTP API with the standard library alone: the run path's few calls without the docker SDK,
whose import (requests, urllib3 and its own modules: ~120 ms) every cold `run` used to pay first."""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl

DEFAULT_HOST = "unix:///var/run/docker.sock"
IDLE_CONNECTIONS = 16
"""Idle connections kept for reuse. Every live run holds two streams (its logs and its exit) besides its
short calls; connections past this many are opened while needed and closed when returned, so a burst of
runs leaves no crowd of idle connections (each also holds one in the engine)."""
MAX_ANSWER_BYTES = 64 * 2**20
"""Largest non-streamed answer read: an engine's JSON (a container listing, `info`) is far smaller."""
LIBPOD = "/v4.0.0/libpod"
"""Podman's own API, beside its compatible one on the same socket: it answers what the compatible one does
not say truly (the runtime a container got, rootless mode, usable cgroup controllers)."""
MIN_API_VERSION = "1.24"
"""The oldest Engine API spoken (what the docker SDK still supports): asked of an engine whose /_ping does
not name its own version."""
_EXPLANATION_BYTES = 8192
"""How much of an error answer its explanation is read from: the engine's own text, bounded."""
_IMAGE_MISSING = ("no such image", "repository does not exist", "not found: does not exist or no pull access")
"""How an engine's 404 says that what is missing is an image (Docker and Podman)."""


class EngineApiError(Exception):
    """The engine answered with an error status. `explanation` is the engine's own text (its JSON
    `message`): engine-written and unbounded, so it is classified (`host.engine.errors`), never shown raw."""

    def __init__(self, status: int, explanation: str) -> None:
        super().__init__(f"engine answered {status}")
        self.status = status
        self.explanation = explanation

    @property
    def image_missing(self) -> bool:
        """A 404 that says the missing object is an image."""
        text = self.explanation.lower()
        return self.status == 404 and any(fragment in text for fragment in _IMAGE_MISSING)


class UnsupportedEngineHost(ValueError):
    """DOCKER_HOST names a scheme this client does not speak (ssh://, npipe://)."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over the engine's Unix socket."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _tls_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """The TLS context `docker` itself would use for a tcp:// engine (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
    if not env.get("DOCKER_TLS_VERIFY") and not env.get("DOCKER_TLS"):
        return None
    import ssl  # noqa: PLC0415 (a Unix-socket engine, the usual one, never needs it)

    certs = Path(env.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
    verify = bool(env.get("DOCKER_TLS_VERIFY"))
    context = ssl.create_default_context(cafile=str(certs / "ca.pem") if verify else None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if (certs / "cert.pem").is_file():
        context.load_cert_chain(str(certs / "cert.pem"), str(certs / "key.pem"))
    return context


class EngineClient:
    """A thread-safe client of one engine: a small pool of kept-alive connections, JSON in and out.

    Errors: an error status raises EngineApiError; a transport failure raises OSError or
    http.client.HTTPException. `host.engine.errors.engine_errors` classifies all three.
    """

    def __init__(
        self, docker_host: str = DEFAULT_HOST, *, timeout: float = 60.0, env: Mapping[str, str] | None = None
    ) -> None:
        parsed = urllib.parse.urlsplit(docker_host)
        self.docker_host = docker_host
        self.timeout = timeout
        self.api_version = ""
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False
        if parsed.scheme == "unix":
            self.socket_path: str | None = parsed.path
            self._address: tuple[str, int] | None = None
            self._tls: ssl.SSLContext | None = None
        elif parsed.scheme in ("tcp", "http", "https"):
            self.socket_path = None
            self._address = (parsed.hostname or "localhost", parsed.port or 2375)
            self._tls = _tls_context(os.environ if env is None else env)
            if parsed.scheme == "https" and self._tls is None:
                import ssl  # noqa: PLC0415

                self._tls = ssl.create_default_context()
        else:
            raise UnsupportedEngineHost(f"DOCKER_HOST scheme {parsed.scheme or '(none)'!r} is not supported")

    # --- transport ----------------------------------------------------------------------------------------

    def _open(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, timeout)
        assert self._address is not None
        host, port = self._address
        if self._tls is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _take(self, timeout: float | None) -> tuple[http.client.HTTPConnection, bool]:
        """A connection for one request: (it, whether it was kept from an earlier one)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return self._open(timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def url(self, path: str, params: Mapping[str, Any] | None = None, *, versioned: bool = True) -> str:
        """The request target of `path` (already quoted by the caller where it holds an id or a name)."""
        prefix = f"/v{self.api_version}" if versioned and self.api_version else ""
        query = urllib.parse.urlencode(params or {}, doseq=True)
        return f"{prefix}{path}{'?' + query if query else ''}"

    def _send(
        self, method: str, target: str, body: bytes | None, timeout: float | None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (0, 1):
            conn, reused = self._take(timeout)
            try:
                conn.request(method, target, body=body, headers=headers)
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                # A kept connection the engine closed while it sat idle: the request never reached it.
                if not reused or attempt:
                    raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        versioned: bool = True,
        timeout: float | None = -1.0,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One whole request: (status, headers, body); an error status raises EngineApiError. `timeout`:
        seconds, None to wait as long as the engine takes, negative for the client's own."""
        wait = self.timeout if timeout is not None and timeout < 0 else timeout
        payload = None if body is None else json.dumps(body).encode()
        conn, response = self._send(method, self.url(path, params, versioned=versioned), payload, wait)
        try:
            data = response.read(MAX_ANSWER_BYTES + 1)
            if len(data) > MAX_ANSWER_BYTES:
                raise http.client.HTTPException("the engine's answer is too large")
        except BaseException:
            conn.close()
            raise
        headers = {k.lower(): v for k, v in response.getheaders()}
        if response.will_close:
            conn.close()
        else:
            self._give_back(conn)
        if response.status >= 400:
            raise EngineApiError(response.status, _explanation(data))
        return response.status, headers, data

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A request whose answer is JSON (None for an empty answer)."""
        _, _, data = self.request(method, path, **kwargs)
        return json.loads(data) if data.strip() else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- the engine calls the host makes ------------------------------------------------------------------

    def negotiate(self) -> Mapping[str, str]:
        """`GET /_ping`, adopting the API version it names (what `docker` itself uses); its headers."""
        headers = self.ping()
        self.api_version = headers.get("api-version", "") or MIN_API_VERSION
        return headers

    def ping(self) -> Mapping[str, str]:
        """`GET /_ping` (unversioned): the engine's headers (API version; Podman's libpod version)."""
        return self.request("GET", "/_ping", versioned=False)[1]

    def info(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.json("GET", "/info")
        return answer

    def libpod(self, path: str) -> dict[str, Any]:
        """GET `path` from Podman's own API (LIBPOD)."""
        answer: dict[str, Any] = self.json("GET", f"{LIBPOD}{path}", versioned=False)
        return answer

    def create_container(self, body: Mapping[str, Any], name: str) -> str:
        answer = self.json("POST", "/containers/create", params={"name": name}, body=body)
        return str(answer["Id"])

    def start(self, container: str) -> None:
        self.request("POST", f"/containers/{_q(container)}/start")

    def inspect_container(self, container: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.json("GET", f"/containers/{_q(container)}/json")
        return answer

    def wait(self, container: str) -> dict[str, Any]:
        """Block until the container exits: its exit answer ({"StatusCode": ...})."""
        answer: dict[str, Any] = self.json("POST", f"/containers/{_q(container)}/wait", timeout=None)
        return answer

    def remove_container(self, container: str, *, force: bool = True) -> None:
        self.request("DELETE", f"/containers/{_q(container)}", params={"force": int(force), "v": 0})

    def containers(
        self, *, labels: list[str] | None = None, volume: str = "", stopped: bool = True
    ) -> list[dict[str, Any]]:
        """The containers (with `stopped`, exited ones too) carrying every label in `labels` (and using
        `volume`)."""
        filters: dict[str, list[str]] = {}
        if labels:
            filters["label"] = list(labels)
        if volume:
            filters["volume"] = [volume]
        params = {"all": int(stopped), **({"filters": json.dumps(filters)} if filters else {})}
        answer: list[dict[str, Any]] = self.json("GET", "/containers/json", params=params)
        return answer

    def inspect_image(self, ref: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.json("GET", f"/images/{_q(ref)}/json")
        return answer

    def inspect_volume(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.json("GET", f"/volumes/{_q(name)}")
        return answer

    def remove_volume(self, name: str, *, force: bool = False) -> None:
        self.request("DELETE", f"/volumes/{_q(name)}", params={"force": int(force)} if force else None)

    def logs(self, container: str, *, follow: bool = True) -> LogStream:
        """The container's stdout and stderr from its start (no TTY: framed), followed until it exits unless
        `follow` is false (then what the engine holds now)."""
        params = {"stdout": 1, "stderr": 1, "timestamps": 0, "follow": int(follow), "tail": "all"}
        conn, response = self._send("GET", self.url(f"/containers/{_q(container)}/logs", params), None, None)
        if response.status >= 400:
            try:
                data = response.read(_EXPLANATION_BYTES)  # all an error's explanation is read from
            finally:
                conn.close()
            raise EngineApiError(response.status, _explanation(data))
        return LogStream(conn, response)


class LogStream:
    """A container's log: an iterator of (stream, chunk) frames, stream 1 stdout and 2 stderr, as written,
    that `close` ends from any thread. Its connection is never reused: a followed log ends only when the
    container exits."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._response = response

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        try:
            while True:
                header = self._response.read(8)
                if len(header) < 8:
                    return
                stream, size = struct.unpack(">BxxxL", header)
                while size > 0:
                    chunk = self._response.read(min(size, 65536))
                    if not chunk:
                        return
                    size -= len(chunk)
                    yield stream, chunk
        finally:
            self.close()

    def close(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()


def _q(part: str) -> str:
    """An id or a name as one path segment."""
    return urllib.parse.quote(part, safe="/:")


def _explanation(data: bytes) -> str:
    """The engine's error text: its JSON `message`, else the answer as text (bounded)."""
    text = data[:_EXPLANATION_BYTES].decode("utf-8", "replace")
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        return text.strip()
    return str(message if message is not None else text).strip()


__all__ = ["EngineApiError", "EngineClient", "LogStream", "UnsupportedEngineHost"]
