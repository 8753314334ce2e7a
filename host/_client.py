"""A Python client for the long-running host's admin socket (what `run --via SOCKET` uses)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from host._errors import AuditReason, EngineError
from host._json import JsonRejected, dumps_strict, loads_strict
from host._proto.agentnode.sandbox.v1 import runner_pb2, runner_pb2_grpc
from host._runner import RunResult

_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def result_from(report: runner_pb2.RunReport) -> RunResult:
    """The host-side RunResult of a wire report; a result that is not strict JSON is a failed run."""
    result: Any = None
    if report.result_json:  # a failed run may carry one too (a sequential run's steps_completed)
        try:
            result = loads_strict(report.result_json)
        except JsonRejected:
            if report.success:  # a failed run's own result that is not strict JSON is dropped
                return RunResult(
                    success=False,
                    error="the run's result is not strict JSON (a non-finite number?)",
                    error_code="result_not_serializable",
                    mode_used=report.mode_used,
                    run_id=report.run_id,
                    duration_ms=report.duration_ms,
                    logs=report.logs,
                )
    return RunResult(
        success=report.success,
        result=result,
        error=report.error,
        error_code=report.error_code,
        mode_used=report.mode_used,
        run_id=report.run_id,
        timed_out=report.timed_out,
        duration_ms=report.duration_ms,
        hint=report.hint,
        logs=report.logs,
        warm=report.warm,
        stages=dict(report.stages_ms),
    )


class RunnerClient:
    """Submits runs to `agentnode-sandbox serve`; keep one per process, it holds a persistent channel."""

    def __init__(self, socket_path: str | Path, *, connect_timeout: float = 5.0) -> None:
        self.socket_path = str(socket_path)
        self._channel = grpc.insecure_channel(
            f"unix:{self.socket_path}",
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = runner_pb2_grpc.RunnerServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._connect_timeout = connect_timeout
        self._ready = False

    def _ensure_ready(self) -> None:
        """Fail fast (with the fix) when nothing serves the socket, instead of waiting forever."""
        if self._ready:
            return
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self._connect_timeout)
        except grpc.FutureTimeoutError:
            raise EngineError(
                f"nothing answers on {self.socket_path}",
                reason=AuditReason.ENGINE_UNAVAILABLE,
                hint="start the host: agentnode-sandbox serve (the admin socket is owner-only)",
                check="serve",
            ) from None
        self._ready = True

    def __enter__(self) -> RunnerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _unreachable(self, err: grpc.RpcError) -> EngineError:
        return EngineError(
            f"the host at {self.socket_path} did not answer ({err.code().name})",
            reason=AuditReason.ENGINE_UNAVAILABLE,
            hint="start it: agentnode-sandbox serve (the admin socket is owner-only)",
            check="serve",
        )

    @staticmethod
    def _request_fields(
        slug: str, goal: str | None, kwargs: Mapping[str, Any] | None, runtime: str | None
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "slug": slug,
            "kwargs_json": dumps_strict(dict(kwargs or {})),
            "runtime": runtime or "",
        }
        if goal is not None:
            fields["goal"] = goal
        return fields

    def submit(
        self,
        slug: str,
        *,
        goal: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        runtime: str | None = None,
        timeout: float | None = None,
    ) -> RunResult:
        """Run an installed agent on the host and wait for its result."""
        request = runner_pb2.SubmitRunRequest(**self._request_fields(slug, goal, kwargs, runtime))
        self._ensure_ready()
        try:
            response = self._stub.SubmitRun(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            raise self._unreachable(err) from None
        return result_from(response.report)

    def stream(
        self,
        slug: str,
        *,
        goal: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        runtime: str | None = None,
    ) -> Iterator[str | RunResult]:
        """Run an agent, yielding `started:<run id>` and stage names, then the final RunResult."""
        request = runner_pb2.StreamRunRequest(**self._request_fields(slug, goal, kwargs, runtime))
        self._ensure_ready()
        try:
            for event in self._stub.StreamRun(request, wait_for_ready=True):
                which = event.WhichOneof("event")
                if which == "started_run_id":
                    yield f"started:{event.started_run_id}"
                elif which == "stage":
                    yield event.stage
                elif which == "report":
                    yield result_from(event.report)
        except grpc.RpcError as err:
            raise self._unreachable(err) from None

    def cancel(self, run_id: str) -> bool:
        """Cancel a run in progress; False when no such run is running."""
        self._ensure_ready()
        try:
            response = self._stub.CancelRun(runner_pb2.CancelRunRequest(run_id=run_id), timeout=10)
        except grpc.RpcError as err:
            raise self._unreachable(err) from None
        return bool(response.cancelled)


__all__ = ["RunnerClient", "result_from"]
