"""The run server's test harness: runs served over a real Unix socket and driven by the generated stubs
(`Env`, `Run`; the `env` and `decodes` fixtures are in conftest.py), the wire error model per errors.proto
(`assert_refused`), and raw requests for the size and decoding limits."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from host.llm.broker import LlmBroker
from host.llm.session import LlmSession
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.runserver import build_run_server
from host.runtime.session import RefusalBudget, RunSession, RunTask
from host.spec.config import LlmHostConfig
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from host.tools.calls import InstalledToolpack
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
    errors_pb2,
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)
from tests.support.fake_llm import FakeLlmServer

# --- harness -------------------------------------------------------------------------------------------

CANARY = "sk-canary-session-8c1f20"
HOST_SECRET = "secret-ish text /srv/host/private.key"
REASON_KEY = "agentnode-reason"
GRANT = LlmPolicy(enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000)
HELLO = [llm_pb2.ChatMessage(role="user", content="hello")]

TOOL_MODULE = textwrap.dedent(
    """
    def append(path):
        with open(path, "a") as handle:
            handle.write("ran\\n")
        return "appended"

    def echo(**kwargs):
        return kwargs
    """
)


def proto_status_codes() -> dict[str, grpc.StatusCode]:
    """The canonical status of every reason, read from the generated ErrorReason enum (the contract): each
    value's `grpc_status` option names it. UNSPECIFIED, which is never sent, names none."""
    table: dict[str, grpc.StatusCode] = {}
    for value in errors_pb2.ErrorReason.DESCRIPTOR.values:
        status = value.GetOptions().Extensions[errors_pb2.grpc_status]
        if value.number != errors_pb2.ERROR_REASON_UNSPECIFIED:
            table[value.name.removeprefix("ERROR_REASON_")] = grpc.StatusCode[status]
        else:
            assert status == "", "UNSPECIFIED is never sent, so it has no status"
    return table


PROTO_STATUS = proto_status_codes()


def write_toolpack(base: Path, slug: str, trust: str = "trusted") -> InstalledToolpack:
    root = base / slug
    root.mkdir(parents=True)
    (root / "tools.py").write_text(TOOL_MODULE)
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    }
    tools = (
        ToolSpec(name="append", entrypoint="tools:append", description="", input_schema=schema),
        ToolSpec(name="echo", entrypoint="tools:echo", description="", input_schema=None),
    )
    manifest = ToolpackManifest(
        slug=slug, version="1.0.0", name=slug, entrypoint="", tools=tools, dependencies=()
    )
    return InstalledToolpack(slug=slug, version="1.0.0", trust=trust, root=root, manifest=manifest)


@dataclass
class Run:
    """One served run: the session object, its started server and stubs on a fresh channel."""

    session: RunSession
    server: grpc.Server
    channel: grpc.Channel
    socket_path: str
    sessions: session_pb2_grpc.SessionServiceStub = field(init=False)
    tools: tools_pb2_grpc.ToolServiceStub = field(init=False)
    llm: llm_pb2_grpc.LlmServiceStub = field(init=False)
    pending: tuple[RunTask, ToolGate, LlmSession] | None = None

    def __post_init__(self) -> None:
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.tools = tools_pb2_grpc.ToolServiceStub(self.channel)
        self.llm = llm_pb2_grpc.LlmServiceStub(self.channel)

    def fetch(self, version: int = PROTOCOL_VERSION) -> session_pb2.FetchTaskResponse:
        return self.sessions.FetchTask(session_pb2.FetchTaskRequest(protocol_version=version), timeout=10)

    def report(self, value: Any) -> session_pb2.ReportResultResponse:
        return self.sessions.ReportResult(
            session_pb2.ReportResultRequest(value_json=json.dumps(value)), timeout=10
        )

    def run_tool(self, slug: str, tool: str, arguments: Any) -> tools_pb2.RunToolResponse:
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return self.tools.RunTool(
            tools_pb2.RunToolRequest(package_slug=slug, tool_name=tool, arguments_json=raw), timeout=30
        )

    def call_llm(self, messages: list[llm_pb2.ChatMessage] = HELLO) -> llm_pb2.CallLlmResponse:
        return self.llm.CallLlm(llm_pb2.CallLlmRequest(messages=messages), timeout=30)

    def stream_llm(self, messages: list[llm_pb2.ChatMessage] = HELLO) -> Iterator[llm_pb2.StreamLlmResponse]:
        return self.llm.StreamLlm(llm_pb2.StreamLlmRequest(messages=messages), timeout=30)


@dataclass
class Env:
    """What the harness builds runs from; tests change fields before calling `start`."""

    tmp: Path
    fake_llm: FakeLlmServer
    runner: ToolRunner
    sock_dir: str
    packs: dict[str, InstalledToolpack] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    def broker(self, env: dict[str, str] | None = None, **host: Any) -> LlmBroker:
        default = {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": self.fake_llm.base_url_openai}
        return LlmBroker(LlmHostConfig(**host), env=default if env is None else env)

    def start(
        self,
        *,
        llm: LlmPolicy = GRANT,
        broker: LlmBroker | None = None,
        allowed: tuple[str, ...] = ("word-tools", "community-tools", "ghost"),
        max_tool_calls: int = 20,
        deadline: float | None = None,
        gate_class: type[ToolGate] = ToolGate,
        max_result_bytes: int | None = None,
        warm: bool = False,
        refusals: RefusalBudget | None = None,
        clock: Callable[[], float] | None = None,
    ) -> Run:
        """Serve a run; a `warm` one starts without its task, which `Run.pending` holds for `assign`."""
        policy = RunPolicy(
            allowed_packages=allowed,
            max_tool_calls=max_tool_calls,
            max_runtime_seconds=60,
            max_iterations=7,
            llm=llm,
            clamped=(),
        )
        task = RunTask(
            run_id="run-abc",
            entrypoint="agent:run",
            goal="count words",
            kwargs_json='{"n": 1}',
            policy=policy,
            system_prompt="be terse",
            **({} if max_result_bytes is None else {"max_result_bytes": max_result_bytes}),
        )
        gate = gate_class(
            allowed_packages=allowed,
            max_tool_calls=max_tool_calls,
            lookup=self.packs.get,
            runner=self.runner,
            deadline=time.monotonic() + 60 if deadline is None else deadline,
        )
        llm_session = (broker or self.broker()).session(llm)
        extra: dict[str, Any] = {}
        if refusals is not None:
            extra["refusals"] = refusals
        if clock is not None:
            extra.update(clock=clock, last_activity=clock())
        session = RunSession(**extra) if warm else RunSession(task=task, tools=gate, llm=llm_session, **extra)
        socket_path = f"{self.sock_dir}/run{len(self.runs)}.sock"
        server = build_run_server(session, socket_path)
        server.start()
        channel = grpc.insecure_channel(
            f"unix:{socket_path}",
            # Far above the server's cap, so that what refuses an oversized message is the server.
            options=[
                ("grpc.max_receive_message_length", 64 * 2**20),
                ("grpc.max_send_message_length", 64 * 2**20),
            ],
        )
        run = Run(session=session, server=server, channel=channel, socket_path=socket_path)
        run.pending = (task, gate, llm_session)
        self.runs.append(run)
        return run

    def started(self, **kwargs: Any) -> Run:
        """A run whose task was already fetched."""
        run = self.start(**kwargs)
        run.fetch()
        return run


def refused(call: Callable[..., Any], *args: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args)
        if isinstance(result, Iterator):
            list(result)
    return info.value


def reason(err: grpc.RpcError) -> str | None:
    return dict(err.trailing_metadata() or ()).get(REASON_KEY)


def assert_refused(err: grpc.RpcError, expected: str) -> None:
    """The wire error model: canonical code per errors.proto, the reason in metadata and details."""
    assert reason(err) == expected, (err.code(), err.details())
    assert err.code() == PROTO_STATUS[expected]
    assert err.details().startswith(f"{expected}: ") and len(err.details()) > len(expected) + 2


# --- raw requests: undecoded bytes on the wire (red-team issue 12) -------------------------------------

LLM_METHOD = "/agentnode.sandbox.v1.LlmService/CallLlm"
STREAM_METHOD = "/agentnode.sandbox.v1.LlmService/StreamLlm"
TOOL_METHOD = "/agentnode.sandbox.v1.ToolService/RunTool"
FETCH_METHOD = "/agentnode.sandbox.v1.SessionService/FetchTask"
REPORT_METHOD = "/agentnode.sandbox.v1.SessionService/ReportResult"
EMPTY_MESSAGES = b"\x0a\x00" * 2_000_000
"""A 4 MB CallLlmRequest of two million empty messages (the report's finding 2)."""
SMALL_CAP = {"enabled": True, "max_calls": 5, "max_input_chars": 2000, "max_output_chars": 100}
HUGE_CAP = {"enabled": True, "max_calls": 5, "max_input_chars": 10**7, "max_output_chars": 100}
MiB = 1 << 20


def raw_call(channel: grpc.Channel, method: str, payload: bytes, **kwargs: Any) -> Any:
    """Send undecoded bytes as a request; the RpcError when refused, else the raw answer."""
    try:
        answer = channel.unary_unary(method)(payload, timeout=30, **kwargs)
    except grpc.RpcError as err:
        return err
    return answer


def raw_stream(channel: grpc.Channel, method: str, payload: bytes) -> Any:
    try:
        return list(channel.unary_stream(method)(payload, timeout=30))
    except grpc.RpcError as err:
        return err


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (small numbers and lengths below 2**14)."""
    length = len(payload)
    prefix = bytes([length]) if length < 0x80 else bytes([(length & 0x7F) | 0x80, length >> 7])
    return bytes([number << 3 | 2]) + prefix + payload


def messages_request(n: int, role: str = "user", content: str = "") -> bytes:
    message = llm_pb2.ChatMessage(role=role, content=content).SerializeToString()
    return field(1, message) * n
