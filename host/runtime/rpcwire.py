"""The run server's wire boundary: handlers that take requests as raw bytes, the one translation of every
error into a gRPC status with a stable reason, the refusal charge, and a bounded decoding of requests."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Protocol

import grpc

from host.core.errors import CallRefusal
from host.core.logs import set_run_id
from host.core.vocab import WireReason
from host.runtime.session import RunSession

logger = logging.getLogger("agentnode.sandbox.session")

REFUSAL_BYTES_PER_TOKEN = 64 * 1024
"""A refusal costs one token, plus one for every this many bytes of request the host decoded for it, so
a flood of big refused requests is throttled by what it costs, not by how many there are."""
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


class Call:
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


def _note_refusal(session: RunSession, call: Call, exc: Exception, throttled: bool) -> None:
    """Charge the refusal budget for a refused tool or LLM request (see _UNMETERED)."""
    if throttled and isinstance(exc, CallRefusal) and exc.reason not in _UNMETERED:
        session.refusals.spend(1 + call.decoded // REFUSAL_BYTES_PER_TOKEN)


_Serve = Callable[[bytes, Call, grpc.ServicerContext], Any]
_ServeStream = Callable[[bytes, Call, grpc.ServicerContext], Iterator[Any]]


class _Message(Protocol):
    def SerializeToString(self) -> bytes: ...


@contextlib.contextmanager
def _serving(
    session: RunSession, name: str, context: grpc.ServicerContext, *, throttled: bool
) -> Iterator[Call]:
    """One call's prologue and epilogue, for every handler: the run id on its log records, the refusal
    throttle, the one translation boundary (a refusal charged, any error aborted with its reason), the
    call's end."""
    call = Call(session)
    try:
        set_run_id(session.task.run_id if session.task is not None else "")  # for its log records
        if throttled:
            session.throttle()
        yield call
    except Exception as exc:  # noqa: BLE001 (the one translation boundary)
        _note_refusal(session, call, exc, throttled)
        _translate(exc, context, name, session)
    finally:
        call.finish()
        set_run_id("")


def unary(session: RunSession, name: str, serve: _Serve, *, throttled: bool) -> grpc.RpcMethodHandler:
    """A unary handler that receives the request as raw bytes, so `serve` decides what decoding is worth."""

    def handler(raw: bytes, context: grpc.ServicerContext) -> Any:
        with _serving(session, name, context, throttled=throttled) as call:
            return serve(raw, call, context)

    return grpc.unary_unary_rpc_method_handler(handler, response_serializer=_serialize)


def unary_stream(
    session: RunSession, name: str, serve: _ServeStream, *, throttled: bool
) -> grpc.RpcMethodHandler:
    """The streaming twin of unary: chunks already sent stay sent, the error ends the stream."""

    def handler(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
        with _serving(session, name, context, throttled=throttled) as call:
            for item in serve(raw, call, context):
                session.touch()
                yield item

    return grpc.unary_stream_rpc_method_handler(handler, response_serializer=_serialize)


def _serialize(message: _Message) -> bytes:
    return message.SerializeToString()


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


def field_counts(raw: bytes, max_fields: int, what: str) -> dict[int, int] | None:
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


def decode(message_type: Any, raw: bytes, max_fields: int) -> Any:
    """Decode a request whose size was already checked; a bounded field count first, then protobuf."""
    what = str(message_type.DESCRIPTOR.name)
    if field_counts(raw, max_fields, what) is None:
        raise _malformed(what)
    try:
        return message_type.FromString(raw)
    except Exception:  # noqa: BLE001  DecodeError, bad UTF-8 in a string field: a malformed request
        raise _malformed(what) from None


__all__ = [
    "REASON_METADATA_KEY",
    "REFUSAL_BYTES_PER_TOKEN",
    "Call",
    "decode",
    "field_counts",
    "unary",
    "unary_stream",
]
