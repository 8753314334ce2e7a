"""The per-run gRPC services: the socket is the run's identity, so one server serves exactly one run."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import grpc

from host.core.errors import CallRefusal
from host.core.logs import set_run_id
from host.core.strictjson import JsonRejected, dumps_strict, loads_strict
from host.core.vocab import WireReason
from host.llm.admission import MAX_MESSAGES
from host.llm.providers import Completion
from host.llm.session import LlmSession
from host.llm.toolcalls import MAX_TOOLS, LlmCall, ModelToolCall
from host.llm.translate import CallDelta
from host.policy.rules import RunPolicy
from host.tools.gate import ToolGate, ToolRefusal
from sandbox_wrapper.protocol import PROTOCOL_VERSION, llm_pb2, session_pb2, tools_pb2

logger = logging.getLogger("agentnode.sandbox.session")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The run server's gRPC message cap, both directions (the wrapper's channel allows 8 MiB, so this one
binds): it bounds what one request makes the host hold. Each method has its own cap, checked before the
request is decoded and, at the default limits, far below this one: FETCH_REQUEST_MAX_BYTES, a result of
max_result_bytes plus REPORT_ENVELOPE_BYTES, a tool request of MAX_REQUEST_BYTES (host/tools/gate.py), an LLM
request of max_input_chars plus framing. A larger message never reaches a method: gRPC refuses it with a
bare RESOURCE_EXHAUSTED (no reason)."""

MAX_RESULT_BYTES = 1024 * 1024
"""Largest JSON result a run may report."""

FETCH_REQUEST_MAX_BYTES = 64
"""A FetchTask request is one small integer."""
REPORT_ENVELOPE_BYTES = 16 * 1024
"""What a ReportResult request may carry besides the result's own bytes (framing, a failure message)."""

MAX_CONNECTIONS_PER_RUN = 8
"""Connections one run's socket holds at once. gRPC core accepts and closes any beyond this before the
HTTP/2 handshake, so a run costs the host at most this many descriptors for its socket, whatever its agent
does. The wrapper uses one; an agent with generated stubs opens its own."""
MAX_STREAMS_PER_CONNECTION = 512
"""Open HTTP/2 streams per connection (gRPC core's own default is unbounded): bounds the per-connection
stream state an agent can make the host keep. It is a memory bound, not the concurrency limit: a client
at this limit that opens a new stream as an old one ends can be refused (RST_STREAM, seen as UNAVAILABLE),
so it sits far above MAX_CONCURRENT_RPCS_PER_RUN, which is what sheds load."""
MAX_CONCURRENT_RPCS_PER_RUN = 64
"""Calls one run's server holds at once, queued or served; beyond it gRPC sheds calls with a bare
RESOURCE_EXHAUSTED. Bounds the requests (each at most MAX_MESSAGE_BYTES) a run can make the host hold."""
RUN_SERVER_THREADS = 8
"""Threads that serve one run's calls."""
HANDSHAKE_TIMEOUT_MS = 5000
"""A connection that has not completed its HTTP/2 handshake by then is closed, freeing its slot."""
REPORT_HOLD_SECONDS = 5.0
"""Longest a held ReportResult answer waits for the host to release it (`RunSession.hold_report`)."""

REFUSAL_BURST = 32
"""Refused tool and LLM requests a run may make back to back before it is throttled."""
REFUSAL_REFILL_PER_SECOND = 4.0
"""How fast a throttled run earns back refusals."""
REFUSAL_BYTES_PER_TOKEN = 64 * 1024
"""A refusal costs one token, plus one for every this many bytes of request the host decoded for it, so
a flood of big refused requests is throttled by what it costs, not by how many there are."""

HOST_ERROR_LOG_BURST = 5
"""HOST_ERROR warnings one run may log back to back; past them the host counts instead of logging."""
HOST_ERROR_LOG_REFILL_PER_SECOND = 1 / 60
"""How fast a run earns back a HOST_ERROR warning: whatever an agent provokes, its run logs at most
HOST_ERROR_LOG_BURST lines at once and one a minute after that."""

REASON_METADATA_KEY = "agentnode-reason"

_STATUS: dict[WireReason, grpc.StatusCode] = {
    WireReason.TASK_ALREADY_FETCHED: grpc.StatusCode.FAILED_PRECONDITION,
    WireReason.TASK_NOT_FETCHED: grpc.StatusCode.FAILED_PRECONDITION,
    WireReason.RUN_FINISHED: grpc.StatusCode.FAILED_PRECONDITION,
    WireReason.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    WireReason.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WireReason.TOOL_NOT_ALLOWED: grpc.StatusCode.PERMISSION_DENIED,
    WireReason.TOOL_CALL_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WireReason.TOOL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    WireReason.TOOL_PACK_UNTRUSTED: grpc.StatusCode.PERMISSION_DENIED,
    WireReason.TOOL_ARGUMENTS_INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    WireReason.LLM_NOT_GRANTED: grpc.StatusCode.PERMISSION_DENIED,
    WireReason.LLM_CALL_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WireReason.LLM_INPUT_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WireReason.LLM_OUTPUT_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WireReason.LLM_MODEL_NOT_ALLOWED: grpc.StatusCode.PERMISSION_DENIED,
    WireReason.LLM_TOOL_NOT_ALLOWED: grpc.StatusCode.PERMISSION_DENIED,
    WireReason.LLM_RATE_LIMITED: grpc.StatusCode.UNAVAILABLE,
    WireReason.LLM_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    WireReason.LLM_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    WireReason.RUN_DEADLINE: grpc.StatusCode.DEADLINE_EXCEEDED,
    WireReason.HOST_ERROR: grpc.StatusCode.INTERNAL,
    WireReason.TOO_MANY_REFUSALS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WireReason.LLM_TOKEN_BUDGET: grpc.StatusCode.RESOURCE_EXHAUSTED,  # host/llm/budget.py (metered)
    WireReason.LLM_COST_BUDGET: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# Refusals that report the run's state, its spent budget or the provider, not a bad request: answered
# before any decoding (or after a call slot was spent), they never drain the refusal budget. Every other
# reason does, including any added later.
_UNMETERED: frozenset[WireReason] = frozenset(
    {
        WireReason.TASK_ALREADY_FETCHED,
        WireReason.TASK_NOT_FETCHED,
        WireReason.RUN_FINISHED,
        WireReason.RUN_DEADLINE,
        WireReason.TOOL_CALL_LIMIT,
        WireReason.LLM_CALL_LIMIT,
        WireReason.LLM_OUTPUT_TOO_LARGE,
        WireReason.LLM_RATE_LIMITED,
        WireReason.LLM_TIMEOUT,
        WireReason.LLM_UNAVAILABLE,
        WireReason.HOST_ERROR,
        WireReason.TOO_MANY_REFUSALS,
    }
)

_FINISH = {
    "stop": llm_pb2.FINISH_REASON_STOP,
    "length": llm_pb2.FINISH_REASON_LENGTH,
    "content_filter": llm_pb2.FINISH_REASON_CONTENT_FILTER,
    "other": llm_pb2.FINISH_REASON_OTHER,
    "tool_calls": llm_pb2.FINISH_REASON_TOOL_CALLS,
}
_TOOL_CHOICE = {
    llm_pb2.TOOL_CHOICE_UNSPECIFIED: "",
    llm_pb2.TOOL_CHOICE_AUTO: "auto",
    llm_pb2.TOOL_CHOICE_NONE: "none",
    llm_pb2.TOOL_CHOICE_REQUIRED: "required",
}
_RESPONSE_FORMAT = {
    llm_pb2.RESPONSE_FORMAT_TYPE_UNSPECIFIED: "",
    llm_pb2.RESPONSE_FORMAT_TYPE_TEXT: "text",
    llm_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT: "json_object",
    llm_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA: "json_schema",
}
_UNKNOWN_ENUM = "unknown"  # an open enum carries any number: one we do not know is an invalid request
LIST_TOOLS_REQUEST_MAX_BYTES = 64
"""A ListTools request has no fields."""


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
    """What the wrapper (or a host-side runner: host/runtime/backends/sequential.py) reported: a JSON value or
    a failure."""

    value_json: str | None = None
    failure_code: str = ""
    failure_message: str = ""
    failure_value_json: str | None = None
    """A failure's own JSON result (a sequential pipeline's `steps_completed`); never read from the wire."""
    timed_out: bool = False
    """The run's deadline ended it, says a host-side runner that enforces it itself; never from the wire."""

    @property
    def success(self) -> bool:
        return self.value_json is not None


class RefusalBudget:
    """A per-run token bucket of refusals, so bad requests cannot buy unbounded host work.

    Every metered refusal spends its cost in tokens; tokens come back at `per_second` up to `burst`.
    While less than one is left, tool and LLM calls are refused before they are even decoded. Calls
    that were let in together may overspend: the debt (at most `burst`) is paid back before the next
    call is looked at. Thread-safe.
    """

    def __init__(
        self,
        burst: int = REFUSAL_BURST,
        per_second: float = REFUSAL_REFILL_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_second)
        self._at = now

    def allows(self) -> bool:
        """Whether a call may be looked at now."""
        with self._lock:
            self._refill()
            return self._tokens >= 1.0

    def spend(self, tokens: float = 1.0) -> None:
        """Charge one refusal of `tokens`."""
        with self._lock:
            self._refill()
            self._tokens = max(-float(self.burst), self._tokens - tokens)


@dataclass
class RunSession:
    """Per-run state shared by the three services: handover once, result once, activity clock.

    A session may be built before its task exists (a warm pool member): FetchTask then waits until
    `assign` hands the task over, or until the session is cancelled. Only accepted calls (past every
    check, about to do their work) count as activity: refused calls neither hold off nor reset the idle
    limit, so an agent that only gets refused is idle.
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
    refusals: RefusalBudget = field(default_factory=RefusalBudget)
    throttled: int = 0
    """Calls refused unread (TOO_MANY_REFUSALS) because the refusal budget was empty."""
    host_errors: int = 0
    """Calls answered HOST_ERROR (a host fault, never the agent's text); see `note_host_error`."""
    hold_report: bool = False
    """Answer ReportResult only once the host has the run's end record written (`release`), at most
    REPORT_HOLD_SECONDS: the wrapper exits on that answer, and a container's exit (the interpreter's own
    shutdown, the engine's state writes and their fsyncs) would otherwise share the machine and the disk's
    journal with the result's audit fsync. Set where teardown follows the result (a long-lived host); a
    one-shot host tears the workload down before its result and answers at once."""
    released: threading.Event = field(default_factory=threading.Event)
    output_mark: bytes = b""
    """What the wrapper writes to each output stream once the agent returned (FetchTask hands it over);
    set by a workload that reads the output (host/runtime/workload.py), empty where nothing looks for it."""
    _fetching: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _host_error_log: RefusalBudget = field(init=False)
    _host_errors_unlogged: int = 0
    _log_listener: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self._host_error_log = RefusalBudget(
            burst=HOST_ERROR_LOG_BURST, per_second=HOST_ERROR_LOG_REFILL_PER_SECOND, clock=self.clock
        )
        if self.task is not None:
            self.assigned.set()

    def note_host_error(self) -> int | None:
        """Count a HOST_ERROR answer; None when its warning is not to be logged (the run's log budget is
        spent), else how many earlier ones went unlogged, so a flood costs the host log a few lines."""
        with self._lock:
            self.host_errors += 1
            if not self._host_error_log.allows():
                self._host_errors_unlogged += 1
                return None
            self._host_error_log.spend()
            unlogged, self._host_errors_unlogged = self._host_errors_unlogged, 0
            return unlogged

    def listen_logs(self, listener: Callable[[str], None] | None) -> None:
        """Where the agent's output lines go as they are written (host/runtime/workload.py feeds `log_line`);
        lines written before a listener is set (a warm member's boot) are kept in the logs only."""
        self._log_listener = listener

    def log_line(self, line: str) -> None:
        """One line of the agent's output, for the listener; a failing listener never stops the drain."""
        listener = self._log_listener
        if listener is not None:
            with contextlib.suppress(Exception):
                listener(line)

    def assign(self, task: RunTask, tools: ToolGate, llm: LlmSession) -> None:
        """Hand a task to a session built without one; it can happen once."""
        with self._lock:
            if self.task is not None or self.cancelled:
                raise RuntimeError("this session already has a task or was cancelled")
            self.task, self.tools, self.llm = task, tools, llm
        self.touch()
        self.assigned.set()

    def cancel(self) -> None:
        """End the session from the host side: a waiting FetchTask returns an error, the watcher wakes, and
        an LLM call waiting to retry its provider gives up."""
        with self._lock:
            self.cancelled = True
            llm = self.llm
        self.assigned.set()
        self.reported.set()
        self.released.set()
        if llm is not None:
            llm.close()

    def release(self) -> None:
        """The host is done with the report: a held ReportResult answer may go (see `hold_report`)."""
        self.released.set()

    @property
    def fetched(self) -> bool:
        return self.fetched_at is not None

    def touch(self) -> None:
        self.last_activity = self.clock()

    def begin_call(self) -> None:
        """An accepted call starts: the run is not idle while it is served."""
        with self._lock:
            self.inflight += 1
        self.touch()

    def end_call(self) -> None:
        """An accepted call ended; the idle clock restarts from now."""
        with self._lock:
            self.inflight -= 1
        self.touch()

    def idle_since(self) -> float | None:
        """When the run went idle (no accepted call in flight), or None while one is being served."""
        return None if self.inflight else self.last_activity

    def throttle(self) -> None:
        """Refuse a tool or LLM call unread while the run's refusal budget is empty."""
        if not self.refusals.allows():
            with self._lock:
                self.throttled += 1
            raise CallRefusal(
                WireReason.TOO_MANY_REFUSALS, "too many refused requests in a short time; wait and retry"
            )

    def _check_open(self) -> None:
        if self.cancelled:
            raise CallRefusal(WireReason.RUN_FINISHED, "the run was cancelled")
        if self.outcome is not None:
            raise CallRefusal(WireReason.RUN_FINISHED, "the run already reported its result")

    def require_open(self) -> tuple[ToolGate, LlmSession]:
        """Refuse calls before the task was fetched or after the result was reported."""
        with self._lock:
            self._check_open()
            if not self.fetched or self.tools is None or self.llm is None:
                raise CallRefusal(WireReason.TASK_NOT_FETCHED, "fetch the task first")
            return self.tools, self.llm

    def require_fetchable(self) -> None:
        """The state checks of FetchTask, which need nothing from the request."""
        with self._lock:
            self._check_open()
            if self._fetching:
                raise CallRefusal(WireReason.TASK_ALREADY_FETCHED, "the task can be fetched once per run")

    def require_reportable(self) -> RunTask:
        """The state checks of ReportResult; the task (its result cap) once they pass."""
        with self._lock:
            self._check_open()
            if not self.fetched or self.task is None:
                raise CallRefusal(WireReason.TASK_NOT_FETCHED, "fetch the task first")
            return self.task

    def fetch(
        self,
        protocol_version: int,
        is_active: Callable[[], bool] = lambda: True,
        on_admit: Callable[[], None] | None = None,
    ) -> RunTask:
        """Hand the task over once; a warm session waits for `assign`. `on_admit` runs once the fetch is
        accepted, before any wait (a waiting wrapper is a call in flight, never an idle run)."""
        with self._lock:
            self._check_open()
            if self._fetching:
                raise CallRefusal(WireReason.TASK_ALREADY_FETCHED, "the task can be fetched once per run")
            if protocol_version != PROTOCOL_VERSION:
                raise CallRefusal(
                    WireReason.INVALID_REQUEST,
                    f"protocol version {protocol_version} is not the host's {PROTOCOL_VERSION}",
                )
            self._fetching = True
        if on_admit is not None:
            on_admit()
        while not self.assigned.wait(0.5):
            if not is_active():
                raise CallRefusal(WireReason.RUN_FINISHED, "the caller went away before a task was assigned")
        with self._lock:
            self._check_open()
            assert self.task is not None
            self.fetched_at = self.clock()
            return self.task

    def report(self, outcome: RunOutcome) -> None:
        with self._lock:
            self._check_open()
            if not self.fetched:
                raise CallRefusal(WireReason.TASK_NOT_FETCHED, "fetch the task first")
            self.outcome = outcome
            llm = self.llm
        self.reported.set()
        if llm is not None:
            llm.close()  # the outcome is fixed: a call waiting to retry its provider gives up now


# --- the wire boundary ---------------------------------------------------------------------------------


def _abort(context: grpc.ServicerContext, reason: WireReason, message: str) -> NoReturn:
    context.set_trailing_metadata(((REASON_METADATA_KEY, str(reason)),))
    context.abort(_STATUS.get(reason, grpc.StatusCode.INTERNAL), f"{reason}: {message}")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def _translate(exc: Exception, context: grpc.ServicerContext, name: str, session: RunSession) -> NoReturn:
    """The one boundary: refusals keep their reason, anything else becomes a generic HOST_ERROR, whose
    warning (the exception's type, never its text) is rate-limited per run."""
    if isinstance(exc, CallRefusal):
        _abort(context, exc.reason, exc.message)
    unlogged = session.note_host_error()
    if unlogged is not None:
        more = f" ({unlogged} more in this run since the last one logged)" if unlogged else ""
        logger.warning("host error in %s: %s%s", name, type(exc).__name__, more)
    _abort(context, WireReason.HOST_ERROR, "the host failed to serve this call")


class _Call:
    """One RPC's bookkeeping: it counts as the run's activity only from `accept` on; `decoded` is how many
    request bytes the host decoded for it (what a refusal of it is charged by)."""

    def __init__(self, session: RunSession) -> None:
        self.session = session
        self.accepted = False
        self.decoded = 0

    def accept(self) -> None:
        if not self.accepted:
            self.accepted = True
            self.session.begin_call()

    def finish(self) -> None:
        if self.accepted:
            self.session.end_call()


def _note_refusal(session: RunSession, call: _Call, exc: Exception, throttled: bool) -> None:
    """Charge the refusal budget for a refused tool or LLM request (see _UNMETERED)."""
    if throttled and isinstance(exc, CallRefusal) and exc.reason not in _UNMETERED:
        session.refusals.spend(1 + call.decoded // REFUSAL_BYTES_PER_TOKEN)


_Serve = Callable[[bytes, _Call, grpc.ServicerContext], Any]
_ServeStream = Callable[[bytes, _Call, grpc.ServicerContext], Iterator[Any]]


class _Message(Protocol):
    def SerializeToString(self) -> bytes: ...


def _unary(session: RunSession, name: str, serve: _Serve, *, throttled: bool) -> grpc.RpcMethodHandler:
    """A unary handler that receives the request as raw bytes, so `serve` decides what decoding is worth."""

    def handler(raw: bytes, context: grpc.ServicerContext) -> Any:
        call = _Call(session)
        try:
            set_run_id(session.task.run_id if session.task is not None else "")  # for its log records
            if throttled:
                session.throttle()
            return serve(raw, call, context)
        except Exception as exc:  # noqa: BLE001 (the one translation boundary)
            _note_refusal(session, call, exc, throttled)
            _translate(exc, context, name, session)
        finally:
            call.finish()
            set_run_id("")

    return grpc.unary_unary_rpc_method_handler(handler, response_serializer=_serialize)


def _unary_stream(
    session: RunSession, name: str, serve: _ServeStream, *, throttled: bool
) -> grpc.RpcMethodHandler:
    """The streaming twin of _unary: chunks already sent stay sent, the error ends the stream."""

    def handler(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
        call = _Call(session)
        try:
            set_run_id(session.task.run_id if session.task is not None else "")  # for its log records
            if throttled:
                session.throttle()
            for item in serve(raw, call, context):
                session.touch()
                yield item
        except Exception as exc:  # noqa: BLE001 (the one translation boundary)
            _note_refusal(session, call, exc, throttled)
            _translate(exc, context, name, session)
        finally:
            call.finish()
            set_run_id("")

    return grpc.unary_stream_rpc_method_handler(handler, response_serializer=_serialize)


def _serialize(message: _Message) -> bytes:
    return message.SerializeToString()


class _BadReport(CallRefusal):
    """A ReportResult that cannot be accepted: refused with `reason`, recorded as `failure_code`."""

    def __init__(self, failure_code: str, reason: WireReason, message: str) -> None:
        super().__init__(reason, message)
        self.failure_code = failure_code


_AGENT_ERROR_CODES: dict[int, str] = {
    number: value.name.removeprefix("AGENT_ERROR_CODE_").lower()
    for number, value in session_pb2.AgentErrorCode.DESCRIPTOR.values_by_number.items()
} | {session_pb2.AGENT_ERROR_CODE_UNSPECIFIED: "agent_exception"}
"""Failure codes by wire number; a number outside the enum (an open enum carries any) is agent_exception."""


def _malformed(what: str) -> CallRefusal:
    return CallRefusal(WireReason.INVALID_REQUEST, f"the request is not a valid {what}")


def _varint(raw: bytes, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while pos < len(raw) and shift < 64:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _malformed(what)


def _field_counts(raw: bytes, max_fields: int, what: str) -> dict[int, int] | None:
    """How often each top-level field occurs in an encoded message, or None past `max_fields` fields.

    A walk over the protobuf framing that stops after `max_fields + 1` fields, so a request of a million
    tiny repeated fields costs a few hundred steps to refuse instead of a million objects to decode.
    """
    counts: dict[int, int] = {}
    pos = seen = 0
    while pos < len(raw):
        seen += 1
        if seen > max_fields:
            return None
        key = raw[pos]
        if key < 0x80:  # fields 1-15 have a one-byte key: the common case, without a call
            pos += 1
        else:
            key, pos = _varint(raw, pos, what)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(raw, pos, what)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            if pos < len(raw) and raw[pos] < 0x80:  # a length below 128, likewise
                length, pos = raw[pos], pos + 1
            else:
                length, pos = _varint(raw, pos, what)
            pos += length
        elif wire_type == 5:
            pos += 4
        else:  # groups (3, 4) and reserved types: nothing of ours sends them
            raise _malformed(what)
        if number == 0 or pos > len(raw):
            raise _malformed(what)
        counts[number] = counts.get(number, 0) + 1
    return counts


_LlmRequest = llm_pb2.CallLlmRequest | llm_pb2.StreamLlmRequest


def _decode(message_type: Any, raw: bytes, max_fields: int) -> Any:
    """Decode a request whose size was already checked; a bounded field count first, then protobuf."""
    what = str(message_type.DESCRIPTOR.name)
    if _field_counts(raw, max_fields, what) is None:
        raise _malformed(what)
    try:
        return message_type.FromString(raw)
    except Exception:  # noqa: BLE001  DecodeError, bad UTF-8 in a string field: a malformed request
        raise _malformed(what) from None


# --- the services ----------------------------------------------------------------------------------------


class _RunServices:
    """Every method of the three services for one run. Each checks, in this order: the run's state and
    grants, the request's encoded size against the method's own cap, its field count, and only then
    decodes it and does the work; the first failed check refuses without the later ones' cost."""

    def __init__(self, session: RunSession) -> None:
        self.session = session

    # SessionService

    def fetch_task(
        self, raw: bytes, call: _Call, context: grpc.ServicerContext
    ) -> session_pb2.FetchTaskResponse:
        self.session.require_fetchable()
        if len(raw) > FETCH_REQUEST_MAX_BYTES:
            raise CallRefusal(
                WireReason.TOO_LARGE, f"a FetchTask request is at most {FETCH_REQUEST_MAX_BYTES} bytes"
            )
        call.decoded = len(raw)
        request: session_pb2.FetchTaskRequest = _decode(session_pb2.FetchTaskRequest, raw, 4)
        task = self.session.fetch(request.protocol_version, context.is_active, on_admit=call.accept)
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
                stop_on_consecutive_errors=p.stop_on_consecutive_errors,
            ),
            allowed_packages=list(p.allowed_packages or ()),
            any_package=p.allowed_packages is None,
            system_prompt=task.system_prompt,
            llm=session_pb2.LlmGrant(
                enabled=p.llm.enabled,
                max_calls=p.llm.max_calls,
                max_input_chars=p.llm.max_input_chars,
                max_output_chars=p.llm.max_output_chars,
                max_input_tokens=p.llm.max_input_tokens,
                max_output_tokens=p.llm.max_output_tokens,
                max_total_tokens=p.llm.max_total_tokens,
                max_cost_usd=p.llm.max_cost_usd,
            ),
            max_result_bytes=task.max_result_bytes,
            protocol_version=PROTOCOL_VERSION,
            output_mark=self.session.output_mark,
        )

    def report_result(
        self, raw: bytes, call: _Call, context: grpc.ServicerContext
    ) -> session_pb2.ReportResultResponse:
        """The run's one result. Past the state checks every request ends the run, whatever it holds: one
        that cannot be accepted (too large, not a ReportResultRequest, no outcome, a value that is not
        strict JSON) is recorded as the run's failure and then refused, and a host fault while reading it
        records a failure too. So an agent gets exactly one report, and every later ReportResult is a
        RUN_FINISHED answered before a byte of it is decoded: nothing here repeats at the host's cost."""
        session = self.session
        cap = session.require_reportable().max_result_bytes
        try:
            outcome = self._read_report(raw, call, cap)
        except _BadReport as bad:
            session.report(RunOutcome(failure_code=bad.failure_code, failure_message=bad.message))
            raise
        except Exception:
            session.report(
                RunOutcome(
                    failure_code="result_not_serializable",
                    failure_message="the host failed to read the report",
                )
            )
            raise
        call.accept()
        session.report(outcome)
        if session.hold_report:
            session.released.wait(REPORT_HOLD_SECONDS)
        return session_pb2.ReportResultResponse()

    @staticmethod
    def _read_report(raw: bytes, call: _Call, cap: int) -> RunOutcome:
        """The outcome a ReportResult request carries, or _BadReport with the failure that stands for it."""
        if len(raw) > cap + REPORT_ENVELOPE_BYTES:
            raise _BadReport("result_too_large", WireReason.TOO_LARGE, "the result exceeds the size cap")
        call.decoded = len(raw)
        try:
            request: session_pb2.ReportResultRequest = _decode(session_pb2.ReportResultRequest, raw, 4)
        except CallRefusal:
            raise _BadReport(
                "result_not_serializable",
                WireReason.INVALID_REQUEST,
                "the report is not a valid ReportResultRequest",
            ) from None
        which = request.WhichOneof("outcome")
        if which == "value_json":
            text = request.value_json
            if len(text.encode("utf-8")) > cap:
                raise _BadReport("result_too_large", WireReason.TOO_LARGE, "the result exceeds the size cap")
            try:
                loads_strict(text, max_bytes=cap)
            except JsonRejected:
                raise _BadReport(
                    "result_not_serializable",
                    WireReason.INVALID_REQUEST,
                    "the result is not strict JSON (valid, finite numbers, nested at most 64 deep)",
                ) from None
            return RunOutcome(value_json=text)
        if which == "failure":
            code = _AGENT_ERROR_CODES.get(request.failure.code, "agent_exception")
            return RunOutcome(failure_code=code, failure_message=request.failure.message[:2000])
        raise _BadReport(
            "result_not_serializable", WireReason.INVALID_REQUEST, "a result needs value_json or failure"
        )

    # ToolService

    def run_tool(self, raw: bytes, call: _Call, context: grpc.ServicerContext) -> tools_pb2.RunToolResponse:
        gate, _ = self.session.require_open()
        gate.screen(len(raw))
        call.decoded = len(raw)
        try:
            request: tools_pb2.RunToolRequest = _decode(tools_pb2.RunToolRequest, raw, 8)
        except CallRefusal as refusal:
            raise gate.refused(ToolRefusal(refusal.reason, refusal.message)) from None
        outcome = gate.call(
            request.package_slug, request.tool_name, request.arguments_json, on_admit=call.accept
        )
        if not outcome.success:
            result_json = ""
        elif outcome.result_json is not None:
            result_json = outcome.result_json
        else:
            result_json = dumps_strict(outcome.result)
        return tools_pb2.RunToolResponse(
            success=outcome.success,
            result_json=result_json,
            error=outcome.error,
            mode_used=outcome.mode_used,
            tool_calls_made=gate.calls_made,
            tools_remaining=gate.remaining,
        )

    # LlmService

    def _llm_request(
        self, raw: bytes, call: _Call, message_type: type[_LlmRequest]
    ) -> tuple[LlmSession, LlmCall]:
        """Screen, bound and decode an LLM request; the request as the broker takes it."""
        _, llm = self.session.require_open()
        llm.screen(request_bytes=len(raw))
        max_fields = MAX_MESSAGES + MAX_TOOLS + 8
        counts = _field_counts(raw, max_fields, message_type.DESCRIPTOR.name)
        if counts is None:
            llm.screen(message_count=MAX_MESSAGES + 1)
        else:
            llm.screen(message_count=counts.get(1, 0), tool_count=counts.get(2, 0))
        call.decoded = len(raw)
        request: _LlmRequest = _decode(message_type, raw, max_fields)
        return llm, _llm_call(request)

    def call_llm(self, raw: bytes, call: _Call, context: grpc.ServicerContext) -> llm_pb2.CallLlmResponse:
        llm, request = self._llm_request(raw, call, llm_pb2.CallLlmRequest)
        completion = llm.call(request, on_admit=call.accept)
        return llm_pb2.CallLlmResponse(
            content=completion.content,
            finish_reason=_FINISH.get(completion.finish_reason, llm_pb2.FINISH_REASON_UNSPECIFIED),
            usage=_usage(completion, llm.tokens_remaining),
            calls_remaining=llm.calls_remaining,
            tool_calls=_tool_calls(completion.tool_calls),
        )

    def stream_llm(
        self, raw: bytes, call: _Call, context: grpc.ServicerContext
    ) -> Iterator[llm_pb2.StreamLlmResponse]:
        llm, request = self._llm_request(raw, call, llm_pb2.StreamLlmRequest)
        for item in llm.stream(request, on_admit=call.accept):
            if isinstance(item, str):
                if item:
                    yield llm_pb2.StreamLlmResponse(delta=item)
            elif isinstance(item, CallDelta):
                yield llm_pb2.StreamLlmResponse(
                    tool_call_deltas=[
                        llm_pb2.ToolCallDelta(
                            index=item.index, id=item.id, name=item.name, arguments_delta=item.arguments
                        )
                    ]
                )
            else:
                yield llm_pb2.StreamLlmResponse(
                    finish_reason=_FINISH.get(item.finish_reason, llm_pb2.FINISH_REASON_UNSPECIFIED),
                    usage=_usage(item, llm.tokens_remaining),
                    done=True,
                    tool_calls=_tool_calls(item.tool_calls),
                )

    def list_tools(self, raw: bytes, call: _Call, context: grpc.ServicerContext) -> llm_pb2.ListToolsResponse:
        """The run's tool definitions (host/llm/toolcalls.py: built once per run from the lockfile); no LLM
        grant needed."""
        _, llm = self.session.require_open()
        if len(raw) > LIST_TOOLS_REQUEST_MAX_BYTES:
            raise CallRefusal(
                WireReason.TOO_LARGE, f"a ListTools request is at most {LIST_TOOLS_REQUEST_MAX_BYTES} bytes"
            )
        call.decoded = len(raw)
        _decode(llm_pb2.ListToolsRequest, raw, 4)
        call.accept()
        tools = [(t.name, t.description, t.parameters_json) for t in llm.tool_catalog().definitions]
        return llm_pb2.ListToolsResponse(
            tools=[llm_pb2.ToolDefinition(name=n, description=d, parameters_json=p) for n, d, p in tools]
        )


def _llm_call(request: _LlmRequest) -> LlmCall:
    """The decoded request as plain data; tool definitions by name only (the host has its own copies)."""
    messages: list[dict[str, Any]] = []
    for m in request.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments_json, "refused": c.refused}
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    response_format: dict[str, str] | None = None
    if request.HasField("response_format"):
        fmt = request.response_format
        response_format = {
            "type": _RESPONSE_FORMAT.get(fmt.type, _UNKNOWN_ENUM),
            "name": fmt.schema_name,
            "schema": fmt.schema_json,
        }
    return LlmCall(
        messages=messages,
        tools=[t.name for t in request.tools],
        tool_choice=_TOOL_CHOICE.get(request.tool_choice, _UNKNOWN_ENUM),
        response_format=response_format,
    )


def _tool_calls(calls: tuple[ModelToolCall, ...]) -> list[llm_pb2.ToolCall]:
    return [
        llm_pb2.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json, refused=c.refused)
        for c in calls
    ]


def _usage(c: Completion, tokens_remaining: int | None) -> llm_pb2.Usage:
    return llm_pb2.Usage(
        input_tokens=max(0, c.input_tokens),
        output_tokens=max(0, c.output_tokens),
        tokens_remaining=tokens_remaining,
    )


def _service(module: Any, name: str) -> str:
    return str(module.DESCRIPTOR.services_by_name[name].full_name)


def build_run_server(
    session: RunSession, socket_path: str, *, max_workers: int = RUN_SERVER_THREADS
) -> grpc.Server:
    """Build (not start) the run's server bound to its Unix socket; the caller starts and stops it.

    Requests arrive as raw bytes (no deserializer), so each method checks state, grants and sizes before
    it pays for decoding; connections and streams are bounded by gRPC core before anything reaches Python.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentnode-run"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS_PER_RUN),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
            # The core name; "grpc.http2.max_concurrent_streams" is not a gRPC argument and does nothing.
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ],
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS_PER_RUN,
    )
    svc = _RunServices(session)
    services: dict[str, dict[str, grpc.RpcMethodHandler]] = {
        _service(session_pb2, "SessionService"): {
            "FetchTask": _unary(session, "FetchTask", svc.fetch_task, throttled=False),
            "ReportResult": _unary(session, "ReportResult", svc.report_result, throttled=False),
        },
        _service(tools_pb2, "ToolService"): {
            "RunTool": _unary(session, "RunTool", svc.run_tool, throttled=True),
        },
        _service(llm_pb2, "LlmService"): {
            "CallLlm": _unary(session, "CallLlm", svc.call_llm, throttled=True),
            "StreamLlm": _unary_stream(session, "StreamLlm", svc.stream_llm, throttled=True),
            "ListTools": _unary(session, "ListTools", svc.list_tools, throttled=True),
        },
    }
    for name, methods in services.items():
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, methods),))
        server.add_registered_method_handlers(name, methods)
    try:
        server.add_insecure_port(f"unix:{socket_path}")  # grpc raises RuntimeError when it cannot bind
    except RuntimeError:
        raise OSError(f"could not bind the run socket {socket_path}") from None
    return server


__all__ = [
    "HANDSHAKE_TIMEOUT_MS",
    "MAX_CONCURRENT_RPCS_PER_RUN",
    "MAX_CONNECTIONS_PER_RUN",
    "MAX_MESSAGE_BYTES",
    "MAX_STREAMS_PER_CONNECTION",
    "REFUSAL_BURST",
    "REFUSAL_BYTES_PER_TOKEN",
    "REFUSAL_REFILL_PER_SECOND",
    "RUN_SERVER_THREADS",
    "RefusalBudget",
    "RunOutcome",
    "RunSession",
    "RunTask",
    "build_run_server",
]
