"""A Python client for the long-running host's admin socket (what `run --via SOCKET` uses); blocking.

`host.aio` is the asyncio twin; both speak through host/api/events.py, so they map the wire the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Unpack

import grpc

from host._proto.agentnode.sandbox.v1 import runner_pb2, runner_pb2_grpc
from host.api.events import (
    MAX_MESSAGE_BYTES,
    RunArgs,
    RunEvent,
    event_from,
    result_from,
    rpc_error,
    run_request,
)
from host.core.errors import AuditReason, EngineError
from host.runtime.result import RunResult

_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_NOT_SERVING = b"\x08\x02"
"""grpc.health.v1.HealthCheckResponse{status: NOT_SERVING} on the wire (serve says it from its drain on)."""


class RunnerClient:
    """Submits runs to `agentnode-sandbox serve`; keep one per process, it holds a persistent channel.

    Errors (host/api/events.rpc_error): InvalidRequest for a request the host refused as malformed (nothing
    ran), EngineError when nothing answers on the socket or the host failed the call.
    """

    def __init__(self, socket_path: str | Path, *, connect_timeout: float = 5.0) -> None:
        self.socket_path = str(socket_path)
        self._channel = grpc.insecure_channel(
            f"unix:{self.socket_path}",
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = runner_pb2_grpc.RunnerServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._connect_timeout = connect_timeout
        self._ready = False

    def wait_ready(self) -> None:
        """Connect now (EngineError "nothing answers" after `connect_timeout`): a caller that has another
        way to run learns before it submits anything that this one is closed."""
        self._ensure_ready()

    def _ensure_ready(self) -> None:
        """Fail fast (with the fix) when nothing serves the socket, or its host is draining, instead of
        waiting forever. One health check (grpc.health.v1, waiting for the connection up to the timeout):
        any answer, UNIMPLEMENTED included, is a server. Not grpc.channel_ready_future: its connectivity
        poller makes the channel's close wait up to 0.2 s, which a one-shot `run` would pay at exit."""
        if self._ready:
            return
        check = self._channel.unary_unary(_HEALTH_CHECK)
        try:
            answer = check(b"", timeout=self._connect_timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                raise EngineError(
                    f"nothing answers on {self.socket_path}",
                    reason=AuditReason.ENGINE_UNAVAILABLE,
                    hint="start the host: agentnode-sandbox serve (the admin socket is owner-only)",
                    check="serve",
                ) from None
        else:
            if answer == _NOT_SERVING:
                raise EngineError(
                    f"the host on {self.socket_path} is shutting down (it takes no new runs)",
                    reason=AuditReason.ENGINE_UNAVAILABLE,
                    hint="wait for it to stop and start it again, or run without it (--no-serve)",
                    check="serve",
                )
        self._ready = True

    def __enter__(self) -> RunnerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def submit(
        self,
        slug: str,
        *,
        timeout: float | None = None,
        **run: Unpack[RunArgs],
    ) -> RunResult:
        """Run an installed agent on the host and wait for its result; `run` is goal, kwargs, runtime,
        caller, limits (host/api/events.RunArgs)."""
        request = run_request(runner_pb2.SubmitRunRequest, slug, run)
        self._ensure_ready()
        try:
            response = self._stub.SubmitRun(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            raise rpc_error(err, self.socket_path) from None
        return result_from(response.report)

    def stream(
        self,
        slug: str,
        **run: Unpack[RunArgs],
    ) -> Iterator[RunEvent]:
        """Run an agent, yielding its events (host/api/events.py): RunStarted, RunStage and RunLog as they
        happen, then RunFinished with the result (`run` as for submit). Closing the iterator early cancels
        the run."""
        request = run_request(runner_pb2.StreamRunRequest, slug, run)
        self._ensure_ready()
        call = self._stub.StreamRun(request, wait_for_ready=True)
        try:
            for message in call:
                event = event_from(message)
                if event is not None:
                    yield event
        except grpc.RpcError as err:
            raise rpc_error(err, self.socket_path) from None
        finally:
            call.cancel()  # a no-op once the stream ended; an early close cancels the run

    def admin(self, args: list[str], *, timeout: float | None = None) -> tuple[int, str, str]:
        """Run a CLI pack or inspection command (install, uninstall, list, doctor, policy explain) as the
        host: (exit code, stdout, stderr), as the command printed them there."""
        self._ensure_ready()
        request = runner_pb2.RunAdminCommandRequest(args=args)
        try:
            response = self._stub.RunAdminCommand(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            raise rpc_error(err, self.socket_path) from None
        return int(response.exit_code), str(response.stdout), str(response.stderr)

    def cancel(self, run_id: str) -> bool:
        """Cancel a run in progress; False when no such run is running."""
        self._ensure_ready()
        try:
            response = self._stub.CancelRun(runner_pb2.CancelRunRequest(run_id=run_id), timeout=10)
        except grpc.RpcError as err:
            raise rpc_error(err, self.socket_path) from None
        return bool(response.cancelled)


__all__ = ["RunnerClient", "result_from"]
