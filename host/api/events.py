"""The admin API's wire, once for the sync and async clients: requests, typed events, results, errors.

A caller switching on strings breaks silently when a stage is renamed; a followed run's events are
dataclasses matched by type (`match event: case RunLog(text=...)`). An RPC failure becomes one of the
host's documented errors (`rpc_error`), so a malformed request is never reported as a host that is down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import grpc

from host._proto.agentnode.sandbox.v1 import runner_pb2
from host.core.errors import AuditReason, EngineError, InvalidRequest, SandboxError
from host.core.strictjson import JsonRejected, dumps_strict, loads_strict
from host.core.terminal import safe_line
from host.files.run import FilesRequest
from host.policy.caller import CallerInfo, RunOverrides
from host.runtime.result import RunResult

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The admin server's message cap, both directions."""


@dataclass(frozen=True)
class RunStarted:
    """The run has its id (after the first stages; before any RunLog)."""

    run_id: str


@dataclass(frozen=True)
class RunStage:
    """The run passed a stage (routed, verified, claimed, started, agent_done, ...)."""

    name: str


@dataclass(frozen=True)
class RunLog:
    """One line the agent wrote, as it wrote it (bounded like the run's logs). The agent's text: escape it
    (host.core.terminal.safe_line) before it reaches a terminal."""

    run_id: str
    text: str


@dataclass(frozen=True)
class RunFinished:
    """The run ended (last event; every RunLog of the run came before it)."""

    result: RunResult


RunEvent = RunStarted | RunStage | RunLog | RunFinished


def event_from(message: runner_pb2.StreamRunResponse) -> RunEvent | None:
    """The typed event of one StreamRun message; None for an event this client does not know (a newer
    host's), which a caller can skip."""
    which = message.WhichOneof("event")
    if which == "started_run_id":
        return RunStarted(message.started_run_id)
    if which == "stage":
        return RunStage(message.stage)
    if which == "log":
        return RunLog(message.log.run_id, message.log.text)
    if which == "report":
        return RunFinished(result_from(message.report))
    return None


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
        files=_files_of(report.files_json),
    )


def _files_of(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        found = loads_strict(text)
    except JsonRejected:
        return None
    return found if isinstance(found, dict) else None


class RunArgs(TypedDict, total=False):
    """What a run asks for besides the agent's slug: one argument model for both clients (blocking and
    asyncio) and both calls (submit, stream), so a new field is added once and typed everywhere."""

    goal: str | None
    """The run's goal (the agent's default when None)."""
    kwargs: Mapping[str, Any] | None
    """The agent's keyword arguments (strict JSON)."""
    runtime: str | None
    """The sandbox runtime to ask for (the host's default when None)."""
    caller: CallerInfo | None
    """Who asks (tenant, request id, labels), for the audit record."""
    limits: RunOverrides | None
    """Caps tighter than the host's for this run."""
    files: FilesRequest | None
    """Files the run is handed and what it hands back (host.files.run.FilesRequest; paths on the host's
    machine, read and written by the host's user)."""


_RUN_ARGS = RunArgs.__optional_keys__

RequestT = TypeVar("RequestT", runner_pb2.SubmitRunRequest, runner_pb2.StreamRunRequest)


def run_request(kind: type[RequestT], slug: str, args: RunArgs) -> RequestT:
    """The SubmitRun / StreamRun request for `slug` and `args` (a keyword that is not a RunArgs field is a
    TypeError, as it is for a plain signature)."""
    for name in args:
        if name not in _RUN_ARGS:
            raise TypeError(f"unexpected keyword argument {name!r}")
    fields: dict[str, Any] = {
        "slug": slug,
        "kwargs_json": dumps_strict(dict(args.get("kwargs") or {})),
        "runtime": args.get("runtime") or "",
    }
    if (goal := args.get("goal")) is not None:
        fields["goal"] = goal
    if (caller := args.get("caller")) is not None:
        fields["caller"] = runner_pb2.CallerMetadata(
            tenant=caller.tenant, request_id=caller.request_id, labels=dict(caller.labels)
        )
    if (limits := args.get("limits")) is not None and not limits.empty:
        given: dict[str, Any] = {
            name: value for name in RunOverrides.__dataclass_fields__
            if (value := getattr(limits, name)) is not None
        }  # fmt: skip
        if "egress" in given:
            given["egress"] = runner_pb2.EgressOverride(allow=list(given["egress"]))
        fields["limits"] = runner_pb2.RunLimitOverrides(**given)
    if (files := args.get("files")) is not None and not files.empty:
        fields["files"] = files_message(files)
    return kind(**fields)


def files_message(files: FilesRequest) -> runner_pb2.RunFiles:
    """The wire form of a files request."""
    inputs = [
        runner_pb2.RunInput(name=name, data=source) if isinstance(source, bytes)
        else runner_pb2.RunInput(name=name, path=str(source))
        for name, source in files.inputs
    ]  # fmt: skip
    return runner_pb2.RunFiles(
        workspace=str(files.workspace or ""), apply=files.apply, export_tar=str(files.export_tar or ""),
        export_patch=str(files.export_patch or ""), inputs=inputs, output_dir=str(files.output_dir or ""),
    )  # fmt: skip


def files_request(message: runner_pb2.RunFiles) -> FilesRequest | None:
    """The files request a wire message names (None for none); every path as given, absolute or not."""

    def path(text: str) -> Path | None:
        return Path(text) if text else None

    inputs: list[tuple[str, Path | bytes]] = []
    for item in message.inputs:
        inputs.append((item.name, item.data if item.WhichOneof("source") == "data" else Path(item.path)))
    found = FilesRequest(
        workspace=path(message.workspace), apply=message.apply, export_tar=path(message.export_tar),
        export_patch=path(message.export_patch), inputs=tuple(inputs), output_dir=path(message.output_dir),
    )  # fmt: skip
    return None if found.empty and not (found.apply or found.exports) else found


def rpc_error(err: grpc.RpcError, socket_path: str) -> SandboxError:
    """The documented error for a failed admin RPC (cancellation is not one: callers re-raise it):

    - INVALID_ARGUMENT (reason INVALID_REQUEST) and RESOURCE_EXHAUSTED: InvalidRequest, with the host's
      message: the request was refused, the host is fine;
    - UNAVAILABLE: EngineError "nothing answers" (no host, or it is shutting down);
    - anything else: EngineError naming the status.
    """
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else ""
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        message = safe_line(str(details or "the host refused the request")).removeprefix("INVALID_REQUEST: ")
        return InvalidRequest(message, hint="fix the request; nothing ran")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return InvalidRequest("a message was over 16 MiB (the request, or the host's answer to it)",
                              hint="send less, or ask for less")  # fmt: skip
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return EngineError(
            "the call took longer than its timeout (the run, if it started, was cancelled)",
            reason=AuditReason.ENGINE_UNAVAILABLE,
            hint="pass a longer timeout, or none",
            check="serve",
        )
    if code is grpc.StatusCode.UNAVAILABLE:
        return EngineError(
            f"nothing answers on {socket_path}",
            reason=AuditReason.ENGINE_UNAVAILABLE,
            hint="start the host: agentnode-sandbox serve (the admin socket is owner-only)",
            check="serve",
        )
    name = code.name if code is not None else "UNKNOWN"
    return EngineError(
        f"the host at {socket_path} did not answer ({name})",
        reason=AuditReason.ENGINE_UNAVAILABLE,
        hint="see the host's log; restart it if it is stuck: agentnode-sandbox serve",
        check="serve",
    )


__all__ = [
    "MAX_MESSAGE_BYTES",
    "RunArgs",
    "RunEvent",
    "RunFinished",
    "RunLog",
    "RunStage",
    "RunStarted",
    "event_from",
    "result_from",
    "rpc_error",
    "run_request",
]
