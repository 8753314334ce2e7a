"""Host side of agentnode-sandbox: policy, LLM broker, audit, Docker runtime and the per-run gRPC services."""

from __future__ import annotations

__all__: list[str] = []
