"""The sandbox wire protocol: the generated modules and constants, the one way into this package from outside.

AgentContext is the supported way in for agents; these are for agents (and wrappers in other languages, by
example) that want the raw stubs. They follow protos/agentnode/sandbox/v1 and PROTOCOL_VERSION. The host
imports the in-container package only through this module (scripts/lint's import contract): the protocol
version, the generated messages, the tool sandbox's frames and result bound, where the tool worker's
script is, and the interpreter's import deferral its cold start shares with the wrapper.

Every name is imported on first use, so importing this module costs neither gRPC nor protobuf.
"""

from __future__ import annotations

from sandbox_wrapper import PROTOCOL_VERSION

TYPE_CHECKING = False  # not typing's: a sandbox imports typing from its boot bundle (see _boot.py)
if TYPE_CHECKING:
    from typing import Any

    from sandbox_wrapper._defer import defer
    from sandbox_wrapper._egress import EGRESS_SOCKET_NAME
    from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
        errors_pb2,
        llm_pb2,
        llm_pb2_grpc,
        session_pb2,
        session_pb2_grpc,
        tools_pb2,
        tools_pb2_grpc,
        toolsandbox_pb2,
    )
    from sandbox_wrapper._tool_exec import MAX_RESULT_BYTES
    from sandbox_wrapper._tool_server import FRAME_HEADER, frame

_PROTO = "sandbox_wrapper._proto.agentnode.sandbox.v1"
_FROM = {
    **{
        name: (f"{_PROTO}.{name}", None)
        for name in ("errors_pb2", "llm_pb2", "llm_pb2_grpc", "session_pb2", "session_pb2_grpc", "tools_pb2",
                     "tools_pb2_grpc", "toolsandbox_pb2")
    },
    "MAX_RESULT_BYTES": ("sandbox_wrapper._tool_exec", "MAX_RESULT_BYTES"),
    "FRAME_HEADER": ("sandbox_wrapper._tool_server", "FRAME_HEADER"),
    "frame": ("sandbox_wrapper._tool_server", "frame"),
    "defer": ("sandbox_wrapper._defer", "defer"),
    "EGRESS_SOCKET_NAME": ("sandbox_wrapper._egress", "EGRESS_SOCKET_NAME"),
}


def tool_worker_script() -> str:
    """The tool worker's script (sandbox_wrapper/_tool_exec.py), which the host's tool runner starts as a
    program of its own: a path, so asking for it imports nothing."""
    import os  # noqa: PLC0415

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tool_exec.py")


def __getattr__(name: str) -> Any:
    """A name of `__all__`, imported on first use."""
    where = _FROM.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    module = importlib.import_module(where[0])
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


__all__ = [
    "EGRESS_SOCKET_NAME",
    "FRAME_HEADER",
    "MAX_RESULT_BYTES",
    "PROTOCOL_VERSION",
    "defer",
    "errors_pb2",
    "frame",
    "llm_pb2",
    "llm_pb2_grpc",
    "session_pb2",
    "session_pb2_grpc",
    "tool_worker_script",
    "tools_pb2",
    "tools_pb2_grpc",
    "toolsandbox_pb2",
]
