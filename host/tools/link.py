"""The host's end of a tool sandbox's socket: exactly one connection, a hello, then one framed call at a time.

The tool sandbox connects (it is the client, as every sandbox is) and the host sends it calls; whatever
comes back is read with the call's deadline, within a size cap, and only while that call is in flight, so
an untrusted sandbox can make the host hold at most one bounded reply. The wire format is in
protos/agentnode/sandbox/v1/toolsandbox.proto; replies become the same dict the host's tool worker writes,
so host/tools/calls.py `reply_outcome` turns both into ToolOutcomes alike.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox_wrapper.protocol import FRAME_HEADER, MAX_RESULT_BYTES, PROTOCOL_VERSION, frame, toolsandbox_pb2

MAX_REPLY_BYTES = MAX_RESULT_BYTES + 4096
"""The largest reply frame: a result at the result cap (ASCII JSON) plus the envelope."""
MAX_HELLO_BYTES = 64
_POLL_SLICE = 0.05
_READ_CHUNK = 1 << 16

_FAILURE_NAMES: dict[int, str] = {
    toolsandbox_pb2.TOOL_FAILURE_LOAD: "load",
    toolsandbox_pb2.TOOL_FAILURE_RAISED: "raised",
    toolsandbox_pb2.TOOL_FAILURE_NOT_SERIALIZABLE: "not_serializable",
    toolsandbox_pb2.TOOL_FAILURE_TOO_LARGE: "too_large",
    toolsandbox_pb2.TOOL_FAILURE_MISSING: "missing",
}


class LinkBroken(Exception):
    """The sandbox is gone (closed, died) or broke the protocol; it is never asked again."""


class LinkTimeout(Exception):
    """No complete reply (or hello) before the deadline."""


def call_message(
    call_id: int, entrypoint: str, fallback: str, arguments_json: str
) -> toolsandbox_pb2.SandboxToolCall:
    """One admitted call as the sandbox receives it."""
    return toolsandbox_pb2.SandboxToolCall(
        call_id=call_id, entrypoint=entrypoint, fallback=fallback, arguments_json=arguments_json
    )


def reply_dict(reply: toolsandbox_pb2.ToolReply) -> dict[str, Any]:
    """A ToolReply as the tool worker's reply dict; a reply without an outcome reads as not serializable."""
    which = reply.WhichOneof("outcome")
    if which == "result_json":
        return {"ok": True, "result_json": reply.result_json}
    failure = _FAILURE_NAMES.get(reply.failure, "not_serializable") if which == "failure" else ""
    return {"ok": False, "failure": failure or "not_serializable", "error_type": reply.error_type}


def _decode(message_type: Any, body: bytes) -> Any:
    """A frame's message; anything undecodable (DecodeError, bad UTF-8 in a string field) breaks the link."""
    try:
        return message_type.FromString(body)
    except Exception:  # noqa: BLE001 (the peer is untrusted: whatever it sent, it is broken)
        raise LinkBroken from None


class ToolLink:
    """Listens on one tool sandbox's socket, accepts its one connection and exchanges frames with it.

    It is the sandbox's socket server (`start`/`stop`, as the Workload base expects). `connect` and `call`
    run on the caller's thread, one at a time; `stop` may come from any thread: it shuts the sockets down
    first, which wakes a caller waiting on them, then closes them once that caller has left.
    """

    def __init__(self, path: str) -> None:
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(path)
        except OSError:
            self._listener.close()
            raise
        self._conn: socket.socket | None = None
        self._buffer = bytearray()
        self._calls = 0
        self._stopped = False
        self._io = threading.RLock()

    def start(self) -> None:
        assert self._listener is not None
        self._listener.listen(1)

    def stop(self, grace: float | None = None) -> None:
        """Close both sockets; a call or connect in flight fails as broken. Idempotent."""
        self._stopped = True
        for sock in (self._listener, self._conn):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        with self._io:
            for sock in (self._listener, self._conn):
                if sock is not None:
                    sock.close()
            self._listener = self._conn = None

    @property
    def calls(self) -> int:
        """Calls sent so far."""
        return self._calls

    def connect(self, deadline: float, alive: Callable[[], bool]) -> None:
        """Accept the sandbox's connection and read its hello; no second connection is ever accepted.

        Raises LinkTimeout past `deadline`, LinkBroken when `alive()` turns false, the link is stopped or
        the hello is not this host's protocol version.
        """
        with self._io:
            listener = self._listener
            if listener is None or self._stopped:
                raise LinkBroken
            poller = select.poll()
            poller.register(listener, select.POLLIN)
            while not poller.poll(_POLL_SLICE * 1000):
                if self._stopped or not alive():
                    raise LinkBroken
                if time.monotonic() >= deadline:
                    raise LinkTimeout
            try:
                conn, _ = listener.accept()
            except OSError:
                raise LinkBroken from None
            listener.close()  # the socket file stays; a second connect is refused by the kernel
            self._listener = None
            conn.setblocking(False)
            self._conn = conn
            hello = _decode(toolsandbox_pb2.ToolServerHello, self._read_frame(MAX_HELLO_BYTES, deadline))
            if hello.protocol_version != PROTOCOL_VERSION:
                raise LinkBroken

    def idle_ok(self) -> bool:
        """Between calls nothing may arrive: data nobody asked for, or the connection's end, means the
        sandbox is broken (or gone) and must not be given the next call."""
        conn = self._conn
        if conn is None or self._stopped or self._buffer:
            return False
        poller = select.poll()
        poller.register(conn, select.POLLIN)
        return not poller.poll(0)

    def call(self, entrypoint: str, fallback: str, arguments_json: str, deadline: float) -> dict[str, Any]:
        """Send one call and return its reply as the tool worker's dict; LinkTimeout past `deadline`,
        LinkBroken when the sandbox closes, dies or answers anything but this call."""
        with self._io:
            if self._conn is None or self._stopped:
                raise LinkBroken
            self._calls += 1
            self._send(frame(call_message(self._calls, entrypoint, fallback, arguments_json)), deadline)
            reply = _decode(toolsandbox_pb2.ToolReply, self._read_frame(MAX_REPLY_BYTES, deadline))
            if reply.call_id != self._calls:
                raise LinkBroken
            return reply_dict(reply)

    def _wait(self, conn: socket.socket, events: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(conn, events)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LinkTimeout
            if poller.poll(remaining * 1000):
                return
            if self._stopped:
                raise LinkBroken

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            conn = self._conn
            if conn is None or self._stopped:
                raise LinkBroken
            try:
                view = view[conn.send(view) :]
            except BlockingIOError:
                self._wait(conn, select.POLLOUT, deadline)
            except OSError:
                raise LinkBroken from None

    def _fill(self, need: int, deadline: float) -> None:
        while len(self._buffer) < need:
            conn = self._conn
            if conn is None or self._stopped:
                raise LinkBroken
            try:
                chunk = conn.recv(max(_READ_CHUNK, need - len(self._buffer)))
            except BlockingIOError:
                self._wait(conn, select.POLLIN, deadline)
                continue
            except OSError:
                raise LinkBroken from None
            if not chunk:
                raise LinkBroken
            self._buffer += chunk

    def _read_frame(self, max_bytes: int, deadline: float) -> bytes:
        self._fill(FRAME_HEADER.size, deadline)
        (size,) = FRAME_HEADER.unpack_from(self._buffer)
        if size > max_bytes:
            raise LinkBroken
        end = FRAME_HEADER.size + size
        self._fill(end, deadline)
        body = bytes(self._buffer[FRAME_HEADER.size : end])
        del self._buffer[:end]
        return body


__all__ = ["MAX_REPLY_BYTES", "LinkBroken", "LinkTimeout", "ToolLink", "call_message", "reply_dict"]
