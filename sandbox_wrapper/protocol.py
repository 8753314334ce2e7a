"""The sandbox wire protocol's generated modules, public for agents that speak gRPC to the host directly.

AgentContext is the supported way in; these are for agents (and wrappers in other languages, by example)
that want the raw stubs. They follow protos/agentnode/sandbox/v1 and PROTOCOL_VERSION.
"""

from __future__ import annotations

from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
    errors_pb2,
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

__all__ = [
    "errors_pb2",
    "llm_pb2",
    "llm_pb2_grpc",
    "session_pb2",
    "session_pb2_grpc",
    "tools_pb2",
    "tools_pb2_grpc",
]
