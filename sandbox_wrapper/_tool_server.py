"""`python -m sandbox_wrapper tool-server`: a tool sandbox's process, serving a community tool pack's calls.

The host starts it in a container of its own (hardened like an agent's, the tool pack's volume read-only at
/pack, its own socket directory) the first time a run calls that pack. It connects to the host's socket for
this sandbox, says hello before it imports any pack code, then answers the calls the host sends, one at a
time, with `_tool_exec.handle`: the executor the host's tool worker runs too, so a tool resolves, fails and
is bounded the same way wherever it runs. Frames, not gRPC: see protos/agentnode/sandbox/v1/toolsandbox.proto.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from typing import Any

from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import toolsandbox_pb2
from sandbox_wrapper._strictjson import loads_finite
from sandbox_wrapper._tool_exec import handle

TOOL_SERVER_ARG = "tool-server"
"""The argument after `-m sandbox_wrapper` that selects this mode."""
FRAME_HEADER = struct.Struct(">I")
"""Every frame: this big-endian length, then that many bytes of one serialized message."""
MAX_CALL_BYTES = 8 * 2**20
"""The largest call frame read; the host's own cap on a call's arguments is far lower (1 MiB)."""
DEFAULT_SOCKET = "/run/agentnode/sandbox.sock"
DEFAULT_IMPORT_ROOT = "/pack"
EXIT_OK, EXIT_NO_HOST, EXIT_PROTOCOL = 0, 3, 5

_FAILURES: dict[str, toolsandbox_pb2.ToolFailure] = {
    "load": toolsandbox_pb2.TOOL_FAILURE_LOAD,
    "raised": toolsandbox_pb2.TOOL_FAILURE_RAISED,
    "not_serializable": toolsandbox_pb2.TOOL_FAILURE_NOT_SERIALIZABLE,
    "too_large": toolsandbox_pb2.TOOL_FAILURE_TOO_LARGE,
    "missing": toolsandbox_pb2.TOOL_FAILURE_MISSING,
}


def frame(message: Any) -> bytes:
    """One message as a frame."""
    body: bytes = message.SerializeToString()
    return FRAME_HEADER.pack(len(body)) + body


def _read_exact(sock: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None when the host closed the connection first."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buffer)


def read_frame(sock: socket.socket, max_bytes: int = MAX_CALL_BYTES) -> bytes | None:
    """The next frame's body; None when the connection ended. A frame over `max_bytes` is a ValueError."""
    header = _read_exact(sock, FRAME_HEADER.size)
    if header is None:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    if size > max_bytes:
        raise ValueError("a frame exceeds its size cap")
    return _read_exact(sock, size)


def reply_message(call_id: int, reply: dict[str, Any]) -> toolsandbox_pb2.ToolReply:
    """`_tool_exec.handle`'s reply as a ToolReply (the host maps it back to the same dict)."""
    if reply.get("ok") is True:
        return toolsandbox_pb2.ToolReply(call_id=call_id, result_json=str(reply["result_json"]))
    failure = _FAILURES.get(str(reply.get("failure")), toolsandbox_pb2.TOOL_FAILURE_NOT_SERIALIZABLE)
    return toolsandbox_pb2.ToolReply(
        call_id=call_id, failure=failure, error_type=str(reply.get("error_type", ""))
    )


def answer(call: toolsandbox_pb2.SandboxToolCall) -> toolsandbox_pb2.ToolReply:
    """Run one call with the shared executor."""
    try:
        arguments = loads_finite(call.arguments_json)
    except ValueError:  # the host sends strict JSON objects only: nothing of the tool ran
        return reply_message(call.call_id, {"ok": False, "failure": "load", "error_type": "ValueError"})
    request = {"entrypoint": call.entrypoint, "fallback": call.fallback, "arguments": arguments}
    return reply_message(call.call_id, handle(request))


def main() -> int:
    """Serve the host's calls until it closes the connection (or the container is destroyed)."""
    # Here, not at the top: the host imports this module for its framing, and the agent runner's imports
    # (gRPC stubs, the AgentContext) are no business of a host process.
    from sandbox_wrapper._egress import open_egress  # noqa: PLC0415
    from sandbox_wrapper._runner import add_import_root  # noqa: PLC0415

    socket_path = os.environ.get("AGENTNODE_SOCKET", DEFAULT_SOCKET)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except OSError as exc:
        sock.close()
        return _die(EXIT_NO_HOST, f"cannot connect to {socket_path} ({type(exc).__name__})")
    with sock:
        open_egress(socket_path)  # the host made the tool pack's egress socket (if any) before this started
        sock.sendall(frame(toolsandbox_pb2.ToolServerHello(protocol_version=PROTOCOL_VERSION)))
        add_import_root(os.environ.get("AGENTNODE_IMPORT_ROOT", DEFAULT_IMPORT_ROOT))  # as the agent wrapper
        while True:
            try:
                body = read_frame(sock)
                if body is None:
                    return EXIT_OK
                call = toolsandbox_pb2.SandboxToolCall.FromString(body)
            except Exception as exc:  # noqa: BLE001 (DecodeError, an oversized frame, a broken socket)
                return _die(EXIT_PROTOCOL, f"the host's call could not be read ({type(exc).__name__})")
            sock.sendall(frame(answer(call)))


def _die(code: int, message: str) -> int:
    print(f"sandbox_wrapper tool-server: {message}", file=sys.stderr)
    return code


__all__ = ["FRAME_HEADER", "MAX_CALL_BYTES", "TOOL_SERVER_ARG", "answer", "frame", "main", "read_frame",
           "reply_message"]
