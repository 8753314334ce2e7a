"""In-container side of agentnode-sandbox: the agent's AgentContext over the generated gRPC stubs."""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""The sandbox protocol version; the host refuses a wrapper (and an image) that carries another one."""

__all__ = ["PROTOCOL_VERSION"]
