"""`host.aio`, the asyncio client's public name: what host/api/aio.py defines, under the name users import.

    async with AsyncRunnerClient(socket) as client:
        result = await client.submit("hello-agent", goal="say hi")
"""

from __future__ import annotations

from host.api.aio import (
    AsyncRunnerClient,
    CallerInfo,
    EngineError,
    FilesRequest,
    InvalidCaller,
    InvalidRequest,
    RunEvent,
    RunFinished,
    RunLog,
    RunOverrides,
    RunResult,
    RunStage,
    RunStarted,
    SandboxError,
)

__all__ = [
    "AsyncRunnerClient",
    "CallerInfo",
    "EngineError",
    "FilesRequest",
    "InvalidCaller",
    "InvalidRequest",
    "RunEvent",
    "RunFinished",
    "RunLog",
    "RunOverrides",
    "RunResult",
    "RunStage",
    "RunStarted",
    "SandboxError",
]
