"""The asyncio client for a long-running host (`agentnode-sandbox serve`), for operators' async services.

    async with AsyncRunnerClient(socket) as client:
        result = await client.submit("hello-agent", goal="say hi", caller=CallerInfo.parse(tenant="acme"))
        async for event in client.stream("hello-agent"):
            match event:
                case RunLog(text=text): print(safe_line(text))
                case RunFinished(result=result): ...

Cancelling the task that awaits `submit` (or leaves `stream`) cancels the run on the host: its sandbox is
killed and its audit record says `cancelled`. Errors, as for the blocking client: InvalidRequest (a
ValueError too) for a request the host refused as malformed, nothing ran; EngineError when nothing answers
on the socket or the host failed the call; asyncio.CancelledError is never translated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Unpack

import grpc
import grpc.aio

from host._proto.agentnode.sandbox.v1 import runner_pb2, runner_pb2_grpc
from host.api.events import (
    MAX_MESSAGE_BYTES,
    RunArgs,
    RunEvent,
    RunFinished,
    RunLog,
    RunStage,
    RunStarted,
    event_from,
    result_from,
    rpc_error,
    run_request,
)
from host.core.errors import EngineError, InvalidRequest, SandboxError
from host.files.run import FilesRequest
from host.policy.caller import CallerInfo, InvalidCaller, RunOverrides
from host.runtime.result import RunResult


class AsyncRunnerClient:
    """Submits runs to `agentnode-sandbox serve` from asyncio; it holds one channel, opened on first use in
    the event loop that uses it (so it may be built anywhere), for that loop only."""

    def __init__(self, socket_path: str | Path, *, connect_timeout: float = 5.0) -> None:
        self.socket_path = str(socket_path)
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._connect_timeout = connect_timeout
        self._ready = False

    async def __aenter__(self) -> AsyncRunnerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls still open are cancelled (and with them their runs)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel, self._stub, self._ready = None, None, False

    async def _ensure_ready(self) -> None:
        """Open the channel in this loop, failing fast (with the fix) when nothing serves the socket."""
        if self._ready:
            return
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix:{self.socket_path}",
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._stub = runner_pb2_grpc.RunnerServiceStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self._connect_timeout)
        except TimeoutError:
            raise rpc_error(_Unavailable(), self.socket_path) from None
        self._ready = True

    async def submit(
        self,
        slug: str,
        *,
        timeout: float | None = None,
        **run: Unpack[RunArgs],
    ) -> RunResult:
        """Run an installed agent on the host and return its result; `run` is goal, kwargs, runtime,
        caller, limits (host/api/events.RunArgs)."""
        request = run_request(runner_pb2.SubmitRunRequest, slug, run)
        await self._ensure_ready()
        try:
            response = await self._stub.SubmitRun(request, timeout=timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.socket_path) from None
        return result_from(response.report)

    async def stream(
        self,
        slug: str,
        **run: Unpack[RunArgs],
    ) -> AsyncIterator[RunEvent]:
        """Run an agent, yielding RunStarted, RunStage and RunLog as they happen, then RunFinished (after
        every RunLog of the run). Leaving the loop early, or cancelling its task, cancels the run."""
        request = run_request(runner_pb2.StreamRunRequest, slug, run)
        await self._ensure_ready()
        call = self._stub.StreamRun(request, wait_for_ready=True)
        try:
            async for message in call:
                event = event_from(message)
                if event is not None:
                    yield event
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.socket_path) from None
        finally:
            call.cancel()  # a no-op once the stream ended

    async def cancel(self, run_id: str) -> bool:
        """Cancel a run in progress by id; False when no such run is running."""
        await self._ensure_ready()
        try:
            response = await self._stub.CancelRun(runner_pb2.CancelRunRequest(run_id=run_id), timeout=10)
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.socket_path) from None
        return bool(response.cancelled)


class _Unavailable(grpc.RpcError):  # type: ignore[misc]
    """Stands for an UNAVAILABLE status when the channel never became ready."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the channel never became ready"


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
