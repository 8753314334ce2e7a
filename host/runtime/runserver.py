"""The per-run gRPC services: the socket is the run's identity, so one server serves exactly one run."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

from host.core.errors import CallRefusal
from host.core.strictjson import JsonRejected, dumps_strict, loads_strict
from host.core.vocab import WireReason
from host.llm.admission import MAX_MESSAGES
from host.llm.providers import Completion
from host.llm.session import LlmSession
from host.llm.toolcalls import MAX_TOOLS, LlmCall, ModelToolCall
from host.llm.translate import CallDelta
from host.runtime.rpcwire import Call, decode, field_counts, unary, unary_stream
from host.runtime.session import REPORT_HOLD_SECONDS, RunOutcome, RunSession
from host.tools.calls import ToolRefusal
from sandbox_wrapper.protocol import PROTOCOL_VERSION, llm_pb2, session_pb2, tools_pb2

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The run server's gRPC message cap, both directions (the wrapper's channel allows 8 MiB, so this one
binds): it bounds what one request makes the host hold. Each method has its own cap, checked before the
request is decoded and, at the default limits, far below this one: FETCH_REQUEST_MAX_BYTES, a result of
max_result_bytes plus REPORT_ENVELOPE_BYTES, a tool request of MAX_REQUEST_BYTES (host/tools/calls.py), an LLM
request of max_input_chars plus framing. A larger message never reaches a method: gRPC refuses it with a
bare RESOURCE_EXHAUSTED (no reason)."""

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


_LlmRequest = llm_pb2.CallLlmRequest | llm_pb2.StreamLlmRequest


class _RunServices:
    """Every method of the three services for one run. Each checks, in this order: the run's state and
    grants, the request's encoded size against the method's own cap, its field count, and only then
    decodes it and does the work; the first failed check refuses without the later ones' cost."""

    def __init__(self, session: RunSession) -> None:
        self.session = session

    # SessionService

    def fetch_task(
        self, raw: bytes, call: Call, context: grpc.ServicerContext
    ) -> session_pb2.FetchTaskResponse:
        self.session.require_fetchable()
        if len(raw) > FETCH_REQUEST_MAX_BYTES:
            raise CallRefusal(
                WireReason.TOO_LARGE, f"a FetchTask request is at most {FETCH_REQUEST_MAX_BYTES} bytes"
            )
        call.decoded = len(raw)
        request: session_pb2.FetchTaskRequest = decode(session_pb2.FetchTaskRequest, raw, 4)
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
        self, raw: bytes, call: Call, context: grpc.ServicerContext
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
    def _read_report(raw: bytes, call: Call, cap: int) -> RunOutcome:
        """The outcome a ReportResult request carries, or _BadReport with the failure that stands for it."""
        if len(raw) > cap + REPORT_ENVELOPE_BYTES:
            raise _BadReport("result_too_large", WireReason.TOO_LARGE, "the result exceeds the size cap")
        call.decoded = len(raw)
        try:
            request: session_pb2.ReportResultRequest = decode(session_pb2.ReportResultRequest, raw, 4)
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

    def run_tool(self, raw: bytes, call: Call, context: grpc.ServicerContext) -> tools_pb2.RunToolResponse:
        gate, _ = self.session.require_open()
        gate.screen(len(raw))
        call.decoded = len(raw)
        try:
            request: tools_pb2.RunToolRequest = decode(tools_pb2.RunToolRequest, raw, 8)
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
        self, raw: bytes, call: Call, message_type: type[_LlmRequest]
    ) -> tuple[LlmSession, LlmCall]:
        """Screen, bound and decode an LLM request; the request as the broker takes it."""
        _, llm = self.session.require_open()
        llm.screen(request_bytes=len(raw))
        max_fields = MAX_MESSAGES + MAX_TOOLS + 8
        counts = field_counts(raw, max_fields, message_type.DESCRIPTOR.name)
        if counts is None:
            llm.screen(message_count=MAX_MESSAGES + 1)
        else:
            llm.screen(message_count=counts.get(1, 0), tool_count=counts.get(2, 0))
        call.decoded = len(raw)
        request: _LlmRequest = decode(message_type, raw, max_fields)
        return llm, _llm_call(request)

    def call_llm(self, raw: bytes, call: Call, context: grpc.ServicerContext) -> llm_pb2.CallLlmResponse:
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
        self, raw: bytes, call: Call, context: grpc.ServicerContext
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

    def list_tools(self, raw: bytes, call: Call, context: grpc.ServicerContext) -> llm_pb2.ListToolsResponse:
        """The run's tool definitions (host/llm/toolcalls.py: built once per run from the lockfile); no LLM
        grant needed."""
        _, llm = self.session.require_open()
        if len(raw) > LIST_TOOLS_REQUEST_MAX_BYTES:
            raise CallRefusal(
                WireReason.TOO_LARGE, f"a ListTools request is at most {LIST_TOOLS_REQUEST_MAX_BYTES} bytes"
            )
        call.decoded = len(raw)
        decode(llm_pb2.ListToolsRequest, raw, 4)
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
            "FetchTask": unary(session, "FetchTask", svc.fetch_task, throttled=False),
            "ReportResult": unary(session, "ReportResult", svc.report_result, throttled=False),
        },
        _service(tools_pb2, "ToolService"): {
            "RunTool": unary(session, "RunTool", svc.run_tool, throttled=True),
        },
        _service(llm_pb2, "LlmService"): {
            "CallLlm": unary(session, "CallLlm", svc.call_llm, throttled=True),
            "StreamLlm": unary_stream(session, "StreamLlm", svc.stream_llm, throttled=True),
            "ListTools": unary(session, "ListTools", svc.list_tools, throttled=True),
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
    "FETCH_REQUEST_MAX_BYTES",
    "HANDSHAKE_TIMEOUT_MS",
    "LIST_TOOLS_REQUEST_MAX_BYTES",
    "MAX_CONCURRENT_RPCS_PER_RUN",
    "MAX_CONNECTIONS_PER_RUN",
    "MAX_MESSAGE_BYTES",
    "MAX_STREAMS_PER_CONNECTION",
    "REPORT_ENVELOPE_BYTES",
    "RUN_SERVER_THREADS",
    "build_run_server",
]
