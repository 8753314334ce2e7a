"""A scripted in-process host on a real Unix-socket gRPC server, so wrapper tests exercise the real wire."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import grpc

from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper.protocol import (
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)


@dataclass(frozen=True)
class Refusal:
    """An RPC refusal in the wire error model: status code + `agentnode-reason` + "REASON: message"."""

    code: grpc.StatusCode
    reason: str
    message: str = "refused by the fake host"


@dataclass(frozen=True)
class Stream:
    """A scripted StreamLlm answer: these chunks (text, or whole chunks such as tool-call deltas), then a
    final chunk (with `tool_calls`, finish reason TOOL_CALLS when there are any) or the given refusal."""

    chunks: tuple[str | llm_pb2.StreamLlmResponse, ...]
    then: Refusal | None = None
    tool_calls: tuple[llm_pb2.ToolCall, ...] = ()


def make_task(**overrides: Any) -> session_pb2.FetchTaskResponse:
    """A FetchTask answer with test defaults; keyword arguments replace top-level fields."""
    fields: dict[str, Any] = {
        "run_id": "run-test",
        "entrypoint": "agent:run",
        "goal": "count these words",
        "kwargs_json": "{}",
        "limits": session_pb2.RunLimits(max_tool_calls=5, max_iterations=3, max_runtime_seconds=60),
        "allowed_packages": ["word-tools"],
        "system_prompt": "",
        "llm": session_pb2.LlmGrant(enabled=True, max_calls=3, max_input_chars=4000, max_output_chars=2000),
        "max_result_bytes": 1 << 16,
        "protocol_version": PROTOCOL_VERSION,
    }
    fields.update(overrides)
    return session_pb2.FetchTaskResponse(**fields)


def _abort(context: Any, refusal: Refusal) -> NoReturn:
    """Refuse exactly as the real host does (trailing reason first; abort raises)."""
    details = refusal.message
    if refusal.reason:  # an empty reason is a fault outside the error model, for negative tests
        context.set_trailing_metadata((("agentnode-reason", refusal.reason),))
        details = f"{refusal.reason}: {refusal.message}"
    context.abort(refusal.code, details)
    raise AssertionError("context.abort always raises")


_UNSCRIPTED = Refusal(grpc.StatusCode.INTERNAL, "HOST_ERROR", "nothing scripted for this call")


@dataclass
class FakeHost:
    """Scripted behaviour plus everything the host received; scripts are consumed first to last."""

    task: session_pb2.FetchTaskResponse = field(default_factory=make_task)
    fetch_refusal: Refusal | None = None
    report_refusal: Refusal | None = None
    tools: list[tools_pb2.RunToolResponse | Refusal] = field(default_factory=list)
    llm: list[llm_pb2.CallLlmResponse | Refusal] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    tool_definitions: list[llm_pb2.ToolDefinition] = field(default_factory=list)
    list_tools_refusal: Refusal | None = None
    fetches: list[session_pb2.FetchTaskRequest] = field(default_factory=list)
    reports: list[session_pb2.ReportResultRequest] = field(default_factory=list)
    tool_requests: list[tools_pb2.RunToolRequest] = field(default_factory=list)
    llm_requests: list[list[tuple[str, str]]] = field(default_factory=list)
    llm_calls: list[llm_pb2.CallLlmRequest | llm_pb2.StreamLlmRequest] = field(default_factory=list)
    list_tools_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def report(self) -> session_pb2.ReportResultRequest:
        """The single ReportResult the wrapper sent (fails the test when there is not exactly one)."""
        assert len(self.reports) == 1, f"expected one ReportResult, got {len(self.reports)}"
        return self.reports[0]

    def FetchTask(self, request: session_pb2.FetchTaskRequest, context: Any) -> session_pb2.FetchTaskResponse:
        with self._lock:
            self.fetches.append(request)
            first = len(self.fetches) == 1
        if self.fetch_refusal is not None:
            _abort(context, self.fetch_refusal)
        if not first:
            _abort(context, Refusal(grpc.StatusCode.FAILED_PRECONDITION, "TASK_ALREADY_FETCHED"))
        return self.task

    def ReportResult(
        self, request: session_pb2.ReportResultRequest, context: Any
    ) -> session_pb2.ReportResultResponse:
        if self.report_refusal is not None:
            _abort(context, self.report_refusal)
        with self._lock:
            self.reports.append(request)
        return session_pb2.ReportResultResponse()

    def RunTool(self, request: tools_pb2.RunToolRequest, context: Any) -> tools_pb2.RunToolResponse:
        with self._lock:
            self.tool_requests.append(request)
            answer = self.tools.pop(0) if self.tools else _UNSCRIPTED
        if isinstance(answer, Refusal):
            _abort(context, answer)
        return answer

    def CallLlm(self, request: llm_pb2.CallLlmRequest, context: Any) -> llm_pb2.CallLlmResponse:
        with self._lock:
            self.llm_requests.append([(m.role, m.content) for m in request.messages])
            self.llm_calls.append(request)
            answer = self.llm.pop(0) if self.llm else _UNSCRIPTED
        if isinstance(answer, Refusal):
            _abort(context, answer)
        return answer

    def StreamLlm(
        self, request: llm_pb2.StreamLlmRequest, context: Any
    ) -> Iterator[llm_pb2.StreamLlmResponse]:
        with self._lock:
            self.llm_requests.append([(m.role, m.content) for m in request.messages])
            self.llm_calls.append(request)
            script = self.streams.pop(0) if self.streams else Stream((), _UNSCRIPTED)
        for chunk in script.chunks:
            yield llm_pb2.StreamLlmResponse(delta=chunk) if isinstance(chunk, str) else chunk
        if script.then is not None:
            _abort(context, script.then)
        calls = bool(script.tool_calls)
        yield llm_pb2.StreamLlmResponse(
            finish_reason=llm_pb2.FINISH_REASON_TOOL_CALLS if calls else llm_pb2.FINISH_REASON_STOP,
            usage=llm_pb2.Usage(input_tokens=1, output_tokens=len(script.chunks)),
            done=True,
            tool_calls=script.tool_calls,
        )

    def ListTools(self, request: llm_pb2.ListToolsRequest, context: Any) -> llm_pb2.ListToolsResponse:
        with self._lock:
            self.list_tools_calls += 1
        if self.list_tools_refusal is not None:
            _abort(context, self.list_tools_refusal)
        return llm_pb2.ListToolsResponse(tools=self.tool_definitions)


@dataclass
class Served:
    """A FakeHost listening on `socket_path` until stop()."""

    host: FakeHost
    socket_path: str
    server: Any
    _dir: str

    def stop(self) -> None:
        """Stop the server at once (in-flight calls fail UNAVAILABLE) and remove the socket dir."""
        self.server.stop(grace=None).wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def serve(host: FakeHost) -> Served:
    """Serve `host` on a fresh Unix socket in a short tmp dir (sun_path is limited to ~107 bytes)."""
    sock_dir = tempfile.mkdtemp(prefix="an-fake-")
    socket_path = str(Path(sock_dir) / "sandbox.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    session_pb2_grpc.add_SessionServiceServicer_to_server(host, server)  # type: ignore[no-untyped-call]
    tools_pb2_grpc.add_ToolServiceServicer_to_server(host, server)  # type: ignore[no-untyped-call]
    llm_pb2_grpc.add_LlmServiceServicer_to_server(host, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    return Served(host, socket_path, server, sock_dir)
