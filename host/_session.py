"""The per-run gRPC services: the socket is the run's identity, so one server serves exactly one run."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import grpc

from host._broker import Completion, LlmSession
from host._errors import CallRefusal
from host._policy import RunPolicy
from host._tools import ToolGate
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

logger = logging.getLogger("agentnode.sandbox.session")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC message cap, both directions: larger than any legal payload, small enough to bound host memory."""

MAX_RESULT_BYTES = 1024 * 1024
"""Largest JSON result a run may report."""

REASON_METADATA_KEY = "agentnode-reason"

_STATUS: dict[str, grpc.StatusCode] = {
    "TASK_ALREADY_FETCHED": grpc.StatusCode.FAILED_PRECONDITION,
    "TASK_NOT_FETCHED": grpc.StatusCode.FAILED_PRECONDITION,
    "RUN_FINISHED": grpc.StatusCode.FAILED_PRECONDITION,
    "INVALID_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "TOO_LARGE": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "TOOL_NOT_ALLOWED": grpc.StatusCode.PERMISSION_DENIED,
    "TOOL_CALL_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "TOOL_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "TOOL_PACK_UNTRUSTED": grpc.StatusCode.PERMISSION_DENIED,
    "TOOL_ARGUMENTS_INVALID": grpc.StatusCode.INVALID_ARGUMENT,
    "LLM_NOT_GRANTED": grpc.StatusCode.PERMISSION_DENIED,
    "LLM_CALL_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "LLM_INPUT_TOO_LARGE": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "LLM_OUTPUT_TOO_LARGE": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "LLM_MODEL_NOT_ALLOWED": grpc.StatusCode.PERMISSION_DENIED,
    "LLM_RATE_LIMITED": grpc.StatusCode.UNAVAILABLE,
    "LLM_TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "LLM_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "RUN_DEADLINE": grpc.StatusCode.DEADLINE_EXCEEDED,
    "HOST_ERROR": grpc.StatusCode.INTERNAL,
}

_FINISH = {
    "stop": llm_pb2.FINISH_REASON_STOP,
    "length": llm_pb2.FINISH_REASON_LENGTH,
    "content_filter": llm_pb2.FINISH_REASON_CONTENT_FILTER,
    "other": llm_pb2.FINISH_REASON_OTHER,
}


@dataclass(frozen=True)
class RunTask:
    """What FetchTask hands to the wrapper."""

    run_id: str
    entrypoint: str
    goal: str
    kwargs_json: str
    policy: RunPolicy
    system_prompt: str
    max_result_bytes: int = MAX_RESULT_BYTES


@dataclass
class RunOutcome:
    """What the wrapper reported: a JSON value or a failure."""

    value_json: str | None = None
    failure_code: str = ""
    failure_message: str = ""

    @property
    def success(self) -> bool:
        return self.value_json is not None


@dataclass
class RunSession:
    """Per-run state shared by the three servicers: handover once, result once, activity clock.

    A session may be built before its task exists (a warm pool member): FetchTask then waits until
    `assign` hands the task over, or until the session is cancelled.
    """

    task: RunTask | None = None
    tools: ToolGate | None = None
    llm: LlmSession | None = None
    clock: Callable[[], float] = time.monotonic
    fetched_at: float | None = None
    """When FetchTask handed the task over (`clock`): splits a warm run's wait from the agent's own time."""
    cancelled: bool = False
    outcome: RunOutcome | None = None
    last_activity: float = field(default_factory=time.monotonic)
    inflight: int = 0
    reported: threading.Event = field(default_factory=threading.Event)
    assigned: threading.Event = field(default_factory=threading.Event)
    _fetching: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.task is not None:
            self.assigned.set()

    def assign(self, task: RunTask, tools: ToolGate, llm: LlmSession) -> None:
        """Hand a task to a session built without one; it can happen once."""
        with self._lock:
            if self.task is not None or self.cancelled:
                raise RuntimeError("this session already has a task or was cancelled")
            self.task, self.tools, self.llm = task, tools, llm
        self.touch()
        self.assigned.set()

    def cancel(self) -> None:
        """End the session from the host side: a waiting FetchTask returns an error, the watcher wakes."""
        with self._lock:
            self.cancelled = True
        self.assigned.set()
        self.reported.set()

    @property
    def fetched(self) -> bool:
        return self.fetched_at is not None

    def touch(self) -> None:
        self.last_activity = self.clock()

    def begin_call(self) -> None:
        with self._lock:
            self.inflight += 1
        self.touch()

    def end_call(self) -> None:
        with self._lock:
            self.inflight -= 1
        self.touch()

    def idle_since(self) -> float | None:
        """When the run went idle (no call in flight), or None while a call is being served."""
        return None if self.inflight else self.last_activity

    def _check_open(self) -> None:
        if self.cancelled:
            raise CallRefusal("RUN_FINISHED", "the run was cancelled")
        if self.outcome is not None:
            raise CallRefusal("RUN_FINISHED", "the run already reported its result")

    def require_open(self) -> tuple[ToolGate, LlmSession]:
        """Refuse calls before the task was fetched or after the result was reported."""
        with self._lock:
            self._check_open()
            if not self.fetched or self.tools is None or self.llm is None:
                raise CallRefusal("TASK_NOT_FETCHED", "fetch the task first")
            return self.tools, self.llm

    def fetch(self, protocol_version: int, is_active: Callable[[], bool] = lambda: True) -> RunTask:
        with self._lock:
            self._check_open()
            if self._fetching:
                raise CallRefusal("TASK_ALREADY_FETCHED", "the task can be fetched once per run")
            if protocol_version != PROTOCOL_VERSION:
                raise CallRefusal(
                    "INVALID_REQUEST",
                    f"protocol version {protocol_version} is not the host's {PROTOCOL_VERSION}",
                )
            self._fetching = True
        while not self.assigned.wait(0.5):
            if not is_active():
                raise CallRefusal("RUN_FINISHED", "the caller went away before a task was assigned")
        with self._lock:
            self._check_open()
            assert self.task is not None
            self.fetched_at = self.clock()
            return self.task

    def report(self, outcome: RunOutcome) -> None:
        with self._lock:
            self._check_open()
            if not self.fetched:
                raise CallRefusal("TASK_NOT_FETCHED", "fetch the task first")
            self.outcome = outcome
        self.reported.set()


_F = TypeVar("_F", bound=Callable[..., Any])


def _abort(context: grpc.ServicerContext, reason: str, message: str) -> NoReturn:
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason),))
    context.abort(_STATUS.get(reason, grpc.StatusCode.INTERNAL), f"{reason}: {message}")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def _translate(exc: Exception, context: grpc.ServicerContext, name: str) -> NoReturn:
    """The one boundary: refusals keep their reason, anything else becomes a generic HOST_ERROR."""
    if isinstance(exc, CallRefusal):
        _abort(context, exc.reason, exc.message)
    logger.warning("host error in %s: %s", name, type(exc).__name__)
    _abort(context, "HOST_ERROR", "the host failed to serve this call")


def _boundary(method: _F) -> _F:
    """Wrap a unary servicer method so no exception escapes untranslated (it would become UNKNOWN)."""

    @functools.wraps(method)
    def wrapper(self: _Servicer, request: Any, context: grpc.ServicerContext) -> Any:
        self.session.begin_call()
        try:
            return method(self, request, context)
        except Exception as exc:  # noqa: BLE001 (the one translation boundary)
            _translate(exc, context, method.__name__)
        finally:
            self.session.end_call()

    return wrapper  # type: ignore[return-value]


def _stream_boundary(method: _F) -> _F:
    """The streaming twin of _boundary: chunks already sent stay sent, the error ends the stream."""

    @functools.wraps(method)
    def wrapper(self: _Servicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.session.begin_call()
        try:
            for item in method(self, request, context):
                self.session.touch()
                yield item
        except Exception as exc:  # noqa: BLE001 (the one translation boundary)
            _translate(exc, context, method.__name__)
        finally:
            self.session.end_call()

    return wrapper  # type: ignore[return-value]


class _Servicer:
    def __init__(self, session: RunSession) -> None:
        self.session = session


class SessionServicer(_Servicer, session_pb2_grpc.SessionServiceServicer):
    """Hands over the task once and takes the result once."""

    @_boundary
    def FetchTask(
        self, request: session_pb2.FetchTaskRequest, context: grpc.ServicerContext
    ) -> session_pb2.FetchTaskResponse:
        task = self.session.fetch(request.protocol_version, context.is_active)
        p = task.policy
        return session_pb2.FetchTaskResponse(
            run_id=task.run_id,
            entrypoint=task.entrypoint,
            goal=task.goal,
            kwargs_json=task.kwargs_json,
            limits=session_pb2.RunLimits(
                max_tool_calls=p.max_tool_calls,
                max_iterations=p.max_iterations,
                max_runtime_seconds=p.max_runtime_seconds,
            ),
            allowed_packages=list(p.allowed_packages),
            system_prompt=task.system_prompt,
            llm=session_pb2.LlmGrant(
                enabled=p.llm.enabled,
                max_calls=p.llm.max_calls,
                max_input_chars=p.llm.max_input_chars,
                max_output_chars=p.llm.max_output_chars,
            ),
            max_result_bytes=task.max_result_bytes,
            protocol_version=PROTOCOL_VERSION,
        )

    @_boundary
    def ReportResult(
        self, request: session_pb2.ReportResultRequest, context: grpc.ServicerContext
    ) -> session_pb2.ReportResultResponse:
        which = request.WhichOneof("outcome")
        if which == "value_json":
            raw = request.value_json
            task = self.session.task
            if len(raw.encode("utf-8")) > (task.max_result_bytes if task else MAX_RESULT_BYTES):
                self.session.report(
                    RunOutcome(
                        failure_code="result_too_large", failure_message="the result exceeds the size cap"
                    )
                )
                raise CallRefusal("TOO_LARGE", "the result exceeds the size cap")
            try:
                json.loads(raw)
            except ValueError:
                self.session.report(
                    RunOutcome(
                        failure_code="result_not_serializable", failure_message="the result is not valid JSON"
                    )
                )
                raise CallRefusal("INVALID_REQUEST", "the result is not valid JSON") from None
            self.session.report(RunOutcome(value_json=raw))
        elif which == "failure":
            name = session_pb2.AgentErrorCode.Name(request.failure.code)
            code = name.removeprefix("AGENT_ERROR_CODE_").lower()
            if code == "unspecified":
                code = "agent_exception"
            self.session.report(RunOutcome(failure_code=code, failure_message=request.failure.message[:2000]))
        else:
            raise CallRefusal("INVALID_REQUEST", "a result needs value_json or failure")
        return session_pb2.ReportResultResponse()


class ToolServicer(_Servicer, tools_pb2_grpc.ToolServiceServicer):
    """Passes the closed tool envelope to the run's gate."""

    @_boundary
    def RunTool(
        self, request: tools_pb2.RunToolRequest, context: grpc.ServicerContext
    ) -> tools_pb2.RunToolResponse:
        gate, _ = self.session.require_open()
        outcome = gate.call(request.package_slug, request.tool_name, request.arguments_json)
        result_json = ""
        if outcome.success:
            result_json = json.dumps(outcome.result, allow_nan=False)
        return tools_pb2.RunToolResponse(
            success=outcome.success,
            result_json=result_json,
            error=outcome.error,
            mode_used=outcome.mode_used,
            tool_calls_made=gate.calls_made,
            tools_remaining=gate.remaining,
        )


def _messages(request: llm_pb2.CallLlmRequest | llm_pb2.StreamLlmRequest) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in request.messages]


def _usage(c: Completion) -> llm_pb2.Usage:
    return llm_pb2.Usage(input_tokens=max(0, c.input_tokens), output_tokens=max(0, c.output_tokens))


class LlmServicer(_Servicer, llm_pb2_grpc.LlmServiceServicer):
    """Relays completions through the run's broker session; the model name never appears."""

    @_boundary
    def CallLlm(
        self, request: llm_pb2.CallLlmRequest, context: grpc.ServicerContext
    ) -> llm_pb2.CallLlmResponse:
        _, llm = self.session.require_open()
        completion = llm.call(_messages(request))
        return llm_pb2.CallLlmResponse(
            content=completion.content,
            finish_reason=_FINISH.get(completion.finish_reason, llm_pb2.FINISH_REASON_UNSPECIFIED),
            usage=_usage(completion),
            calls_remaining=llm.calls_remaining,
        )

    @_stream_boundary
    def StreamLlm(
        self, request: llm_pb2.StreamLlmRequest, context: grpc.ServicerContext
    ) -> Iterator[llm_pb2.StreamLlmResponse]:
        _, llm = self.session.require_open()
        for item in llm.stream(_messages(request)):
            if isinstance(item, str):
                if item:
                    yield llm_pb2.StreamLlmResponse(delta=item)
            else:
                yield llm_pb2.StreamLlmResponse(
                    finish_reason=_FINISH.get(item.finish_reason, llm_pb2.FINISH_REASON_UNSPECIFIED),
                    usage=_usage(item),
                    done=True,
                )


def build_run_server(session: RunSession, socket_path: str, *, max_workers: int = 8) -> grpc.Server:
    """Build (not start) the run's server bound to its Unix socket; the caller starts and stops it."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentnode-run"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        maximum_concurrent_rpcs=64,
    )
    registrations: list[tuple[Callable[[Any, grpc.Server], None], _Servicer]] = [
        (session_pb2_grpc.add_SessionServiceServicer_to_server, SessionServicer(session)),
        (tools_pb2_grpc.add_ToolServiceServicer_to_server, ToolServicer(session)),
        (llm_pb2_grpc.add_LlmServiceServicer_to_server, LlmServicer(session)),
    ]
    for register, servicer in registrations:
        register(servicer, server)
    try:
        server.add_insecure_port(f"unix:{socket_path}")  # grpc raises RuntimeError when it cannot bind
    except RuntimeError:
        raise OSError(f"could not bind the run socket {socket_path}") from None
    return server


__all__ = ["MAX_MESSAGE_BYTES", "RunOutcome", "RunSession", "RunTask", "build_run_server"]
