"""Host side of agentnode-sandbox: policy, LLM broker, audit, Docker runtime and the per-run gRPC services.

The public names are imported on first use, so `agentnode-sandbox --help` and light commands stay fast.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms of every command's start
if TYPE_CHECKING:
    from typing import Any

    from host.api.client import RunnerClient
    from host.core.errors import (
        AuditReason,
        ConfigError,
        EngineError,
        FilesError,
        ManifestError,
        PackError,
        RefusedError,
        SandboxError,
    )
    from host.files.run import FilesRequest
    from host.runtime.runner import RunResult, SandboxHost

_EXPORTS = {
    "AuditReason": "host.core.errors",
    "ConfigError": "host.core.errors",
    "EngineError": "host.core.errors",
    "FilesError": "host.core.errors",
    "FilesRequest": "host.files.run",
    "ManifestError": "host.core.errors",
    "PackError": "host.core.errors",
    "RefusedError": "host.core.errors",
    "SandboxError": "host.core.errors",
    "RunResult": "host.runtime.runner",
    "SandboxHost": "host.runtime.runner",
    "RunnerClient": "host.api.client",
}

__all__ = [
    "AuditReason",
    "ConfigError",
    "EngineError",
    "FilesError",
    "FilesRequest",
    "ManifestError",
    "PackError",
    "RefusedError",
    "RunResult",
    "RunnerClient",
    "SandboxError",
    "SandboxHost",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'host' has no attribute {name!r}")
