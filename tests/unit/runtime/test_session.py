"""The per-run gRPC server over a real Unix socket, driven by the generated stubs: handover once, result
once, size caps both ways, the wire error model per errors.proto, atomic caps under concurrency, no leaks."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import socket
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from host.llm.broker import LlmBroker
from host.llm.session import LlmSession
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.runserver import MAX_MESSAGE_BYTES, build_run_server
from host.runtime.session import RefusalBudget, RunOutcome, RunSession, RunTask
from host.spec.config import LlmHostConfig
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from host.tools.gate import InstalledToolpack, ToolGate, ToolOutcome, ToolRunner
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
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer
from tests.support.run_server_probe import ServerProbe

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


# --- harness -------------------------------------------------------------------------------------------


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


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    sock_dir = tempfile.mkdtemp(dir="/tmp", prefix="ses-")  # a Unix socket path must fit 108 bytes
    runner = ToolRunner()
    with FakeLlmServer() as fake_llm:
        e = Env(tmp=tmp_path, fake_llm=fake_llm, runner=runner, sock_dir=sock_dir)
        e.packs["word-tools"] = write_toolpack(tmp_path / "packs", "word-tools")
        e.packs["community-tools"] = write_toolpack(tmp_path / "packs", "community-tools", trust="unverified")
        try:
            yield e
        finally:
            for run in e.runs:
                run.channel.close()
                run.server.stop(grace=None).wait(5)
            runner.close()
            shutil.rmtree(sock_dir, ignore_errors=True)


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


# --- the contract table --------------------------------------------------------------------------------


def test_errors_proto_names_a_status_for_every_reason() -> None:
    names = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}
    assert set(PROTO_STATUS) == names and len(names) == 24


def test_server_status_table_matches_errors_proto() -> None:
    from host.runtime import rpcwire as _rpcwire

    assert _rpcwire._STATUS == PROTO_STATUS


# --- building and serving -----------------------------------------------------------------------------------


def bare_session(env: Env) -> RunSession:
    gate = ToolGate(
        allowed_packages=(), max_tool_calls=1, lookup=env.packs.get, runner=env.runner, deadline=0
    )
    task = RunTask("r", "agent:run", "", "{}", RunPolicy((), 1, 1, 1, GRANT, ()), "")
    return RunSession(task=task, tools=gate, llm=env.broker().session(GRANT))


def test_the_server_is_built_unstarted(env: Env) -> None:
    path = f"{env.sock_dir}/unstarted.sock"
    server = build_run_server(bare_session(env), path)
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            stub = session_pb2_grpc.SessionServiceStub(channel)
            request = session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION)
            with pytest.raises(grpc.RpcError) as info:
                stub.FetchTask(request, timeout=0.5)
            assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            server.start()
            assert stub.FetchTask(request, timeout=10).run_id == "r"
    finally:
        server.stop(grace=None).wait(5)


def test_an_unbindable_socket_path_is_an_os_error(env: Env) -> None:
    with pytest.raises(OSError, match="could not bind"):
        build_run_server(bare_session(env), "/nonexistent/dir/x.sock")


# --- handover once, result once ----------------------------------------------------------------------------


def test_fetch_task_hands_over_the_task_and_policy(env: Env) -> None:
    run = env.start(llm=LlmPolicy(enabled=True, max_calls=3, max_input_chars=40, max_output_chars=50))
    task = run.fetch()
    assert (task.run_id, task.entrypoint, task.goal, task.kwargs_json) == (
        "run-abc",
        "agent:run",
        "count words",
        '{"n": 1}',
    )
    assert (task.limits.max_tool_calls, task.limits.max_iterations, task.limits.max_runtime_seconds) == (
        20,
        7,
        60,
    )
    assert list(task.allowed_packages) == ["word-tools", "community-tools", "ghost"]
    assert task.system_prompt == "be terse"
    assert (task.llm.enabled, task.llm.max_calls, task.llm.max_input_chars, task.llm.max_output_chars) == (
        True,
        3,
        40,
        50,
    )
    assert task.max_result_bytes == 1024 * 1024 and task.protocol_version == PROTOCOL_VERSION
    assert run.session.fetched


def test_task_can_be_fetched_once(env: Env) -> None:
    run = env.start()
    run.fetch()
    err = refused(run.fetch)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert_refused(err, "TASK_ALREADY_FETCHED")


@pytest.mark.parametrize("version", [0, PROTOCOL_VERSION + 1, 999])
def test_protocol_mismatch_is_refused_and_fetches_nothing(env: Env, version: int) -> None:
    run = env.start()
    err = refused(run.fetch, version)
    assert_refused(err, "INVALID_REQUEST")
    assert str(version) in err.details()
    assert not run.session.fetched
    assert_refused(refused(run.call_llm), "TASK_NOT_FETCHED")


def test_calls_before_fetch_task_are_refused_and_run_nothing(env: Env) -> None:
    run = env.start()
    marker = env.tmp / "ran.txt"
    for err in (
        refused(run.run_tool, "word-tools", "append", {"path": str(marker)}),
        refused(run.call_llm),
        refused(run.stream_llm),
        refused(run.report, {"done": True}),
    ):
        assert_refused(err, "TASK_NOT_FETCHED")
    assert not marker.exists() and env.fake_llm.requests == []
    assert run.session.outcome is None and run.session.tools.calls_made == 0


def test_calls_after_the_result_are_refused(env: Env) -> None:
    run = env.started()
    run.report({"answer": 42})
    assert run.session.outcome is not None and run.session.outcome.value_json == '{"answer": 42}'
    assert run.session.reported.is_set()
    marker = env.tmp / "ran.txt"
    for err in (
        refused(run.run_tool, "word-tools", "append", {"path": str(marker)}),
        refused(run.call_llm),
        refused(run.stream_llm),
        refused(run.report, {"again": True}),
        refused(run.fetch),
    ):
        assert_refused(err, "RUN_FINISHED")
    assert not marker.exists() and env.fake_llm.requests == []
    assert run.session.outcome.value_json == '{"answer": 42}'


def test_oversized_result_is_too_large_and_recorded(env: Env) -> None:
    run = env.started()
    err = refused(run.report, "x" * (1024 * 1024))  # 1 MiB + 2 quote bytes of JSON
    assert_refused(err, "TOO_LARGE")
    outcome = run.session.outcome
    assert outcome is not None and not outcome.success and outcome.failure_code == "result_too_large"
    assert run.session.reported.is_set()
    assert_refused(refused(run.report, 1), "RUN_FINISHED")


def test_result_cap_counts_bytes_not_characters(env: Env) -> None:
    def request(chars: int) -> session_pb2.ReportResultRequest:
        return session_pb2.ReportResultRequest(value_json=json.dumps("é" * chars, ensure_ascii=False))

    run = env.started(max_result_bytes=100)
    err = refused(run.sessions.ReportResult, request(60))  # 62 characters, 122 bytes
    assert_refused(err, "TOO_LARGE")
    run2 = env.started(max_result_bytes=100)
    run2.sessions.ReportResult(request(40), timeout=10)  # 42 characters, 82 bytes
    assert run2.session.outcome is not None and run2.session.outcome.value_json == '"' + "é" * 40 + '"'


def test_invalid_json_result_is_refused_and_recorded(env: Env) -> None:
    run = env.started()
    request = session_pb2.ReportResultRequest(value_json="{not json")
    assert_refused(refused(run.sessions.ReportResult, request), "INVALID_REQUEST")
    outcome = run.session.outcome
    assert outcome is not None and outcome.failure_code == "result_not_serializable"


def test_a_result_needs_an_outcome(env: Env) -> None:
    """A report without an outcome is still the run's one report: recorded as a failure, then refused."""
    run = env.started()
    assert_refused(refused(run.sessions.ReportResult, session_pb2.ReportResultRequest()), "INVALID_REQUEST")
    outcome = run.session.outcome
    assert outcome is not None and outcome.failure_code == "result_not_serializable"
    assert run.session.reported.is_set()
    assert_refused(refused(run.report, {"late": True}), "RUN_FINISHED")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (session_pb2.AGENT_ERROR_CODE_AGENT_EXCEPTION, "agent_exception"),
        (session_pb2.AGENT_ERROR_CODE_IMPORT_FAILED, "import_failed"),
        (session_pb2.AGENT_ERROR_CODE_UNSPECIFIED, "agent_exception"),
        (session_pb2.AGENT_ERROR_CODE_AGENT_LIMIT, "agent_limit"),
        (999, "agent_exception"),  # outside the enum (proto3 enums are open): used to be a HOST_ERROR
        (-1, "agent_exception"),
    ],
)
def test_reported_failures_keep_their_code_and_a_bounded_message(env: Env, code: int, expected: str) -> None:
    run = env.started()
    failure = session_pb2.AgentFailure(code=code, message="m" * 5000)
    run.sessions.ReportResult(session_pb2.ReportResultRequest(failure=failure), timeout=10)
    outcome = run.session.outcome
    assert outcome is not None and not outcome.success
    assert outcome.failure_code == expected and outcome.failure_message == "m" * 2000


# --- warm sessions: the task comes later ---------------------------------------------------------------


def test_a_warm_fetch_waits_for_its_task(env: Env) -> None:
    run = env.start(warm=True)
    assert run.pending is not None
    marker = env.tmp / "ran.txt"
    assert_refused(refused(run.run_tool, "word-tools", "append", {"path": str(marker)}), "TASK_NOT_FETCHED")
    waiting = run.sessions.FetchTask.future(
        session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION), timeout=30
    )
    time.sleep(0.5)
    assert not waiting.done() and run.session.inflight == 1  # the wrapper is connected and waiting
    assert_refused(refused(run.fetch), "TASK_ALREADY_FETCHED")
    assert run.session.fetched_at is None
    assigned_at = time.monotonic()
    run.session.assign(*run.pending)
    task = waiting.result(timeout=10)
    assert task.run_id == "run-abc" and task.goal == "count words" and run.session.fetched
    assert run.session.fetched_at is not None and run.session.fetched_at >= assigned_at  # handed over after
    assert run.run_tool("word-tools", "append", {"path": str(marker)}).success
    with pytest.raises(RuntimeError):
        run.session.assign(*run.pending)  # a session takes one task


def test_cancelling_a_waiting_fetch_finishes_the_run(env: Env) -> None:
    run = env.start(warm=True)
    assert run.pending is not None
    waiting = run.sessions.FetchTask.future(
        session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION), timeout=30
    )
    time.sleep(0.3)
    run.session.cancel()
    with pytest.raises(grpc.RpcError) as info:
        waiting.result(timeout=10)
    assert_refused(info.value, "RUN_FINISHED")
    assert not run.session.fetched and run.session.reported.is_set()
    with pytest.raises(RuntimeError):
        run.session.assign(*run.pending)
    assert_refused(refused(run.report, 1), "RUN_FINISHED")


@pytest.mark.parametrize("end", ["release", "cancel"])
def test_a_held_report_is_answered_once_the_host_releases_it(env: Env, end: str) -> None:
    run = env.started()
    run.session.hold_report = True  # a long-lived host: the wrapper exits only once the end record is written
    answer = run.sessions.ReportResult.future(session_pb2.ReportResultRequest(value_json="1"), timeout=30)
    assert run.session.reported.wait(10) and run.session.outcome is not None  # the result is in at once
    time.sleep(0.3)
    assert not answer.done()  # ... but the wrapper's answer waits
    run.session.release() if end == "release" else run.session.cancel()
    assert answer.result(timeout=10) == session_pb2.ReportResultResponse()
    assert run.session.outcome.value_json == "1"


def test_an_unheld_report_is_answered_at_once(env: Env) -> None:
    run = env.started()
    assert not run.session.hold_report  # the default (a one-shot host tears the workload down first)
    assert run.report(1) == session_pb2.ReportResultResponse()
    assert run.session.outcome is not None and not run.session.released.is_set()


# --- message size caps, both directions ---------------------------------------------------------------------


def test_oversized_request_is_refused_before_the_host_reads_it(env: Env) -> None:
    run = env.started(llm=LlmPolicy(enabled=True, max_calls=5, max_input_chars=10**8, max_output_chars=100))
    big = [llm_pb2.ChatMessage(role="user", content="x" * (MAX_MESSAGE_BYTES + 1024))]
    err = refused(run.call_llm, big)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(err) is None  # refused by gRPC itself, before any servicer ran
    assert env.fake_llm.requests == [] and run.session.llm.usage()["requests"] == 0
    assert run.call_llm().content == "fake reply"  # the run goes on


def test_oversized_response_is_never_sent(env: Env) -> None:
    env.fake_llm.default = Behaviour(text="y" * (MAX_MESSAGE_BYTES + 1024))
    run = env.started(llm=LlmPolicy(enabled=True, max_calls=5, max_input_chars=100, max_output_chars=10**8))
    err = refused(run.call_llm)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    env.fake_llm.default = Behaviour()
    assert run.call_llm().content == "fake reply"


# --- every refusal reason, through the wire -----------------------------------------------------------------


def test_tool_refusals_map_to_their_canonical_status(env: Env) -> None:
    run = env.started(max_tool_calls=1)
    marker = str(env.tmp / "ran.txt")
    cases: list[tuple[str, grpc.RpcError]] = [
        ("TOOL_NOT_ALLOWED", refused(run.run_tool, "other-tools", "echo", {})),
        ("TOOL_NOT_FOUND", refused(run.run_tool, "ghost", "echo", {})),
        ("TOOL_NOT_FOUND", refused(run.run_tool, "word-tools", "nope", {})),
        ("TOOL_PACK_UNTRUSTED", refused(run.run_tool, "community-tools", "echo", {})),
        ("TOOL_ARGUMENTS_INVALID", refused(run.run_tool, "word-tools", "append", {"wrong": 1})),
        ("INVALID_REQUEST", refused(run.run_tool, "word-tools", "echo", "{not json")),
        ("INVALID_REQUEST", refused(run.run_tool, "", "echo", {})),
        ("TOO_LARGE", refused(run.run_tool, "word-tools", "echo", {"x": "y" * (1 << 20)})),
    ]
    ok = run.run_tool("word-tools", "append", {"path": marker})
    assert ok.success and json.loads(ok.result_json) == "appended"
    assert (ok.tool_calls_made, ok.tools_remaining, ok.mode_used) == (1, 0, "host_worker")
    cases.append(("TOOL_CALL_LIMIT", refused(run.run_tool, "word-tools", "append", {"path": marker})))
    for expected, err in cases:
        assert_refused(err, expected)
    assert Path(marker).read_text() == "ran\n"
    assert run.session.tools.refusals == len(cases)


def test_spent_time_budget_is_run_deadline(env: Env) -> None:
    run = env.started(deadline=time.monotonic() - 1)
    assert_refused(refused(run.run_tool, "word-tools", "echo", {}), "RUN_DEADLINE")


@pytest.mark.parametrize(
    ("expected", "policy", "host", "keys"),
    [
        ("LLM_NOT_GRANTED", LlmPolicy(), {}, True),
        ("LLM_INPUT_TOO_LARGE", LlmPolicy(True, 5, 3, 100), {}, True),
        ("LLM_MODEL_NOT_ALLOWED", LlmPolicy(True, 5, 100, 100, frozenset({"other-model"})), {}, True),
        ("LLM_UNAVAILABLE", GRANT, {}, False),
        ("LLM_CALL_LIMIT", LlmPolicy(True, 0, 100, 100), {}, True),
    ],
)
def test_llm_refusals_map_to_their_canonical_status(
    env: Env, expected: str, policy: LlmPolicy, host: dict[str, Any], keys: bool
) -> None:
    run = env.started(llm=policy, broker=env.broker(None if keys else {}, **host))
    assert_refused(refused(run.call_llm), expected)
    assert_refused(refused(run.stream_llm), expected)
    assert env.fake_llm.requests == []


def test_llm_call_limit_after_the_budget_is_spent(env: Env) -> None:
    run = env.started(llm=LlmPolicy(enabled=True, max_calls=1, max_input_chars=100, max_output_chars=100))
    first = run.call_llm()
    assert first.content == "fake reply" and first.calls_remaining == 0
    assert first.finish_reason == llm_pb2.FINISH_REASON_STOP and first.usage.output_tokens == 10
    assert_refused(refused(run.call_llm), "LLM_CALL_LIMIT")
    assert len(env.fake_llm.requests) == 1


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        (Behaviour(status=500), "LLM_UNAVAILABLE"),
        (Behaviour(status=429), "LLM_RATE_LIMITED"),
        (Behaviour(garbage=True), "LLM_UNAVAILABLE"),
        (Behaviour(text="z" * 200), "LLM_OUTPUT_TOO_LARGE"),
    ],
)
def test_provider_failures_map_to_their_canonical_status(
    env: Env, behaviour: Behaviour, expected: str
) -> None:
    env.fake_llm.default = behaviour
    run = env.started(llm=LlmPolicy(enabled=True, max_calls=5, max_input_chars=100, max_output_chars=100))
    err = refused(run.call_llm)
    assert_refused(err, expected)
    assert SECRET_IN_ERROR_BODY not in err.details()


def test_provider_timeout_is_llm_timeout(env: Env) -> None:
    env.fake_llm.default = Behaviour(hang=True)
    run = env.started(broker=env.broker(timeout_seconds=0.5))
    assert_refused(refused(run.call_llm), "LLM_TIMEOUT")


def test_invalid_messages_are_invalid_requests(env: Env) -> None:
    run = env.started()
    assert_refused(refused(run.call_llm, [llm_pb2.ChatMessage(role="tool", content="x")]), "INVALID_REQUEST")
    assert_refused(refused(run.call_llm, []), "INVALID_REQUEST")
    assert env.fake_llm.requests == []


# --- the translation boundary -------------------------------------------------------------------------------


class ExplodingGate(ToolGate):
    """A gate with a bug: the servicer must turn it into a generic HOST_ERROR."""

    def call(
        self, slug: str, tool_name: str, arguments_json: str, *, on_admit: Callable[[], None] | None = None
    ) -> ToolOutcome:
        raise RuntimeError(HOST_SECRET)


def test_unexpected_exception_is_a_generic_host_error(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    run = env.started(gate_class=ExplodingGate)
    err = refused(run.run_tool, "word-tools", "echo", {})
    assert err.code() == grpc.StatusCode.INTERNAL
    assert_refused(err, "HOST_ERROR")
    assert err.details() == "HOST_ERROR: the host failed to serve this call"
    crossed = err.details() + repr(err.trailing_metadata()) + repr(err.initial_metadata())
    assert "secret-ish" not in crossed and "private.key" not in crossed
    assert "secret-ish" not in caplog.text
    assert any("RuntimeError" in r.getMessage() for r in caplog.records)  # the type is logged, not the text
    assert run.session.inflight == 0
    assert run.call_llm().content == "fake reply"  # the run's server survives


# --- concurrency: caps are atomic across the wire -----------------------------------------------------------


def test_fifty_concurrent_llm_calls_reach_the_provider_exactly_max_calls_times(env: Env) -> None:
    env.fake_llm.default = Behaviour(delay=0.3)
    run = env.started(llm=LlmPolicy(enabled=True, max_calls=5, max_input_chars=100, max_output_chars=100))
    request = llm_pb2.CallLlmRequest(messages=HELLO)
    calls = [run.llm.CallLlm.future(request, timeout=60) for _ in range(50)]
    errors = [f.exception() for f in calls]
    ok = [e for e in errors if e is None]
    refusals = [e for e in errors if e is not None]
    assert len(ok) == 5 and len(refusals) == 45
    for err in refusals:
        assert_refused(err, "LLM_CALL_LIMIT")
    assert len(env.fake_llm.requests) == 5
    usage = run.session.llm.usage()
    assert (usage["calls"], usage["ok"], usage["refused_limit"]) == (5, 5, 45)


def test_fifty_concurrent_tool_calls_run_exactly_the_cap(env: Env) -> None:
    run = env.started(max_tool_calls=5)
    marker = env.tmp / "lines.txt"
    request = tools_pb2.RunToolRequest(
        package_slug="word-tools", tool_name="append", arguments_json=json.dumps({"path": str(marker)})
    )
    with futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: _outcome(run.tools.RunTool, request), range(50)))
    ok = [r for r in results if isinstance(r, tools_pb2.RunToolResponse)]
    refusals = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(ok) == 5 and all(r.success for r in ok) and len(refusals) == 45
    for err in refusals:
        assert_refused(err, "TOOL_CALL_LIMIT")
    assert marker.read_text() == "ran\n" * 5
    assert run.session.tools.calls_made == 5 and run.session.tools.refusals == 45


def _outcome(call: Callable[..., Any], request: Any) -> Any:
    try:
        return call(request, timeout=60)
    except grpc.RpcError as err:
        return err


# --- streaming ----------------------------------------------------------------------------------------------


def test_stream_forwards_chunks_then_one_final_message(env: Env) -> None:
    env.fake_llm.default = Behaviour(text="abcdefghijklmnop", chunks=4)
    run = env.started()
    messages = list(run.stream_llm())
    deltas = [m.delta for m in messages if not m.done]
    assert deltas == ["abcd", "efgh", "ijkl", "mnop"]
    final = messages[-1]
    assert final.done and final.delta == "" and final.finish_reason == llm_pb2.FINISH_REASON_STOP
    assert sum(m.done for m in messages) == 1
    assert run.session.llm.usage()["ok"] == 1


def test_stream_is_cut_exactly_at_max_output_chars(env: Env) -> None:
    env.fake_llm.default = Behaviour(text="0123456789" * 5, chunks=5)
    run = env.started(llm=LlmPolicy(enabled=True, max_calls=5, max_input_chars=100, max_output_chars=23))
    received: list[str] = []
    with pytest.raises(grpc.RpcError) as info:
        for message in run.stream_llm():
            assert not message.done
            received.append(message.delta)
    assert "".join(received) == "0123456789" * 2 + "012"
    assert_refused(info.value, "LLM_OUTPUT_TOO_LARGE")
    assert run.session.inflight == 0


class _FailingSession:
    """Stands in for the run's LlmSession (our own class): one chunk, then a host bug."""

    calls_remaining = 1

    def screen(self, **checks: Any) -> None:
        pass

    def stream(self, messages: Any, *, on_admit: Callable[[], None] | None = None) -> Iterator[str]:
        if on_admit is not None:
            on_admit()
        yield "partial"
        raise RuntimeError(HOST_SECRET)


def test_a_host_bug_mid_stream_ends_it_with_a_generic_host_error(env: Env) -> None:
    run = env.started()
    run.session.llm = _FailingSession()  # type: ignore[assignment]
    received: list[str] = []
    with pytest.raises(grpc.RpcError) as info:
        for message in run.stream_llm():
            received.append(message.delta)
    assert received == ["partial"]
    assert_refused(info.value, "HOST_ERROR")
    assert "secret-ish" not in info.value.details()


# --- nothing secret crosses ---------------------------------------------------------------------------------


def test_the_key_never_crosses_the_socket_or_reaches_a_log(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wire: list[str] = []  # everything the sandbox side receives

    def note(err: grpc.RpcError) -> None:
        wire.extend([err.details() or "", repr(err.trailing_metadata()), repr(err.initial_metadata())])

    run = env.started(llm=LlmPolicy(enabled=True, max_calls=20, max_input_chars=100, max_output_chars=50))
    wire.append(repr(run.call_llm()))
    wire.extend(repr(m) for m in run.stream_llm())
    for behaviour in (
        Behaviour(status=401),
        Behaviour(status=500),
        Behaviour(garbage=True),
        Behaviour(text="q" * 60),
    ):
        env.fake_llm.script(*[behaviour] * (3 if behaviour.status == 500 else 1))  # a 5xx is tried 3 times
        note(refused(run.call_llm))
    env.fake_llm.script(*[Behaviour(status=500)] * 3)
    note(refused(run.stream_llm))
    note(refused(run.call_llm, [llm_pb2.ChatMessage(role="user", content="x" * 101)]))
    note(refused(run.run_tool, "community-tools", "echo", {}))
    wire.append(repr(run.run_tool("word-tools", "echo", {"a": 1})))
    logs = caplog.text + "\n".join(repr(r.__dict__) for r in caplog.records)
    assert CANARY in json.dumps(env.fake_llm.requests[0].headers)  # the provider did get the key
    for text in ("\n".join(wire), logs):
        assert CANARY not in text
        assert SECRET_IN_ERROR_BODY not in text and "internal.provider.example" not in text
    assert "gpt-4o-mini" not in "\n".join(wire)  # the model name stays on the host


# --- cost before authorization: state and grants, then sizes, then decoding (red-team issue 12) -----------

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


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request types the run servers decoded (our own decoding step, counted)."""
    from host.runtime import runserver as _runserver

    seen: list[str] = []
    real = _runserver.decode

    def counting(message_type: Any, raw: bytes, max_fields: int) -> Any:
        seen.append(str(message_type.DESCRIPTOR.name))
        return real(message_type, raw, max_fields)

    monkeypatch.setattr(_runserver, "decode", counting)
    return seen


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


@pytest.mark.parametrize(
    ("grant", "expected"),
    [
        ({}, "LLM_NOT_GRANTED"),  # refused before anything is looked at
        (SMALL_CAP, "LLM_INPUT_TOO_LARGE"),  # 4 MB cannot fit 2,000 characters: refused by size, unread
        (HUGE_CAP, "LLM_INPUT_TOO_LARGE"),  # the size fits a 10M cap: the bounded field walk refuses it
    ],
    ids=["ungranted", "granted-small-cap", "granted-huge-cap"],
)
def test_two_million_empty_messages_cost_the_host_almost_nothing(
    grant: dict[str, Any], expected: str
) -> None:
    """Finding 2: the same request used to cost ~500 MB and ~24 s of host CPU per call (~4 GB for eight)."""
    with ServerProbe({"llm": grant}) as probe, grpc.insecure_channel(
        f"unix:{probe.socket_path}", options=[("grpc.max_send_message_length", 64 * MiB)]
    ) as channel:
        raw_call(channel, LLM_METHOD, b"")  # connect and warm up first
        mark = probe.command("mark")
        with futures.ThreadPoolExecutor(8) as pool:  # eight in parallel, like the report
            errors = list(pool.map(lambda _: raw_call(channel, LLM_METHOD, EMPTY_MESSAGES), range(8)))
        report = probe.command("report")
    assert {reason(e) for e in errors} == {expected}
    growth = report["peak_rss"] - mark["rss"]
    # Measured here: ~0.04 s of CPU and ~30 MB of peak growth for all eight (each request's 4 MB crosses).
    assert report["cpu_s"] < 1.0, report
    assert growth < 100 * MiB, (growth, report)
    assert report["llm"]["requests"] == 9 and report["llm"]["calls"] == 0
    assert not report["activity_moved"] and report["inflight"] == 0


def test_refusals_before_decoding_need_no_decoding(env: Env, decodes: list[str]) -> None:
    ungranted = env.started(llm=LlmPolicy(), allowed=())
    capped = env.started(max_tool_calls=1)
    assert capped.run_tool("word-tools", "echo", {}).success  # the cap is used up
    decodes.clear()
    for err, expected in [
        (raw_call(ungranted.channel, LLM_METHOD, EMPTY_MESSAGES), "LLM_NOT_GRANTED"),
        (raw_stream(ungranted.channel, STREAM_METHOD, EMPTY_MESSAGES), "LLM_NOT_GRANTED"),
        (raw_call(ungranted.channel, TOOL_METHOD, b"\xff" * MiB), "TOOL_NOT_ALLOWED"),  # empty allowlist
        (raw_call(capped.channel, TOOL_METHOD, b"\xff" * MiB), "TOOL_CALL_LIMIT"),
        (raw_call(ungranted.channel, FETCH_METHOD, b"\xff" * MiB), "TASK_ALREADY_FETCHED"),
    ]:
        assert_refused(err, expected)
    assert decodes == []  # not one byte of those requests was decoded
    assert env.fake_llm.requests == [] and ungranted.session.llm.usage()["refused_disabled"] == 2


def test_each_method_has_its_own_byte_cap_checked_before_decoding(env: Env, decodes: list[str]) -> None:
    from host.runtime.runserver import FETCH_REQUEST_MAX_BYTES, REPORT_ENVELOPE_BYTES
    from host.tools.gate import MAX_REQUEST_BYTES

    fresh = env.start()
    fetch = session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION).SerializeToString()
    padded = fetch + field(15, b"x" * FETCH_REQUEST_MAX_BYTES)
    assert_refused(raw_call(fresh.channel, FETCH_METHOD, padded), "TOO_LARGE")
    assert fresh.fetch().run_id == "run-abc"  # a proper fetch still works

    llm = LlmPolicy(enabled=True, max_calls=5, max_input_chars=100, max_output_chars=100)
    run = env.started(llm=llm, max_result_bytes=100)
    decodes.clear()
    tool = tools_pb2.RunToolRequest(
        package_slug="word-tools", tool_name="echo", arguments_json='"' + "x" * MAX_REQUEST_BYTES + '"'
    )
    assert_refused(raw_call(run.channel, TOOL_METHOD, tool.SerializeToString()), "TOO_LARGE")
    assert run.session.tools.refusals == 1
    # The input cap in bytes plus framing (of messages, tool definitions and tool calls), no more.
    assert run.session.llm.max_request_bytes < 8600
    over = messages_request(1, content="x" * 9000)
    assert_refused(raw_call(run.channel, LLM_METHOD, over), "LLM_INPUT_TOO_LARGE")
    assert_refused(raw_stream(run.channel, STREAM_METHOD, over), "LLM_INPUT_TOO_LARGE")
    assert run.session.llm.usage()["refused_input"] == 2
    report = session_pb2.ReportResultRequest(value_json='"' + "r" * (100 + REPORT_ENVELOPE_BYTES) + '"')
    assert_refused(raw_call(run.channel, REPORT_METHOD, report.SerializeToString()), "TOO_LARGE")
    assert run.session.outcome is not None and run.session.outcome.failure_code == "result_too_large"
    assert decodes == [] and env.fake_llm.requests == []


def test_a_call_carries_at_most_max_messages(env: Env, decodes: list[str]) -> None:
    from host.llm.admission import MAX_MESSAGES
    from host.llm.toolcalls import MAX_TOOLS

    llm = LlmPolicy(enabled=True, max_calls=5, max_input_chars=10**6, max_output_chars=100)
    run = env.started(llm=llm)
    decodes.clear()
    too_many = messages_request(MAX_MESSAGES + 1)
    assert_refused(raw_call(run.channel, LLM_METHOD, too_many), "LLM_INPUT_TOO_LARGE")
    unknown = messages_request(2, content="hi") + b"\x78\x01" * (MAX_MESSAGES + MAX_TOOLS + 16)  # field 15
    assert_refused(raw_call(run.channel, LLM_METHOD, unknown), "LLM_INPUT_TOO_LARGE")
    assert decodes == []
    answer = llm_pb2.CallLlmResponse.FromString(
        raw_call(run.channel, LLM_METHOD, messages_request(MAX_MESSAGES, content="hi"))
    )
    assert answer.content == "fake reply"
    [sent] = env.fake_llm.requests
    assert len(sent.body["messages"]) == MAX_MESSAGES
    assert run.session.llm.usage()["refused_input"] == 2


def test_malformed_request_bytes_are_invalid_requests(env: Env) -> None:
    run = env.started()
    for method, payload in [
        (TOOL_METHOD, b"\xff\xff\xff\xff\x0f\x0a\x80"),  # a truncated length
        (TOOL_METHOD, b"\x0b\x0c"),  # a group: nothing of ours sends one
        (TOOL_METHOD, field(1, b"\xff\xfe")),  # a slug that is not UTF-8
        (LLM_METHOD, b"\x0a\x05ab"),  # a message longer than the request
    ]:
        assert_refused(raw_call(run.channel, method, payload), "INVALID_REQUEST")
    assert run.session.tools.refusals == 3 and run.session.outcome is None
    assert run.run_tool("word-tools", "echo", {"ok": 1}).success


def _report_bytes() -> list[tuple[str, bytes]]:
    failure = session_pb2.ReportResultRequest(failure=session_pb2.AgentFailure(code=999, message="m"))
    return [
        ("truncated", b"\x0a"),
        ("group", b"\x0b\x0c"),
        ("value not UTF-8", field(1, b"\xff\xfe")),
        ("failure message not UTF-8", field(2, b"\x12\x02\xff\xfe")),
        ("too many fields", field(15, b"") * 5),
        ("no outcome, 1 MiB unknown field", field(15, b"") + b"\x7a" + _varint(MiB - 64) + b"u" * (MiB - 64)),
        ("unknown field, then an outcome", field(15, b"x") + failure.SerializeToString()),
    ]


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out, n = out + bytes([(n & 0x7F) | 0x80]), n >> 7
    return out + bytes([n])


@pytest.mark.parametrize(("shape", "payload"), _report_bytes(), ids=[s for s, _ in _report_bytes()])
def test_any_report_past_the_state_checks_ends_the_run(
    env: Env, decodes: list[str], shape: str, payload: bytes
) -> None:
    """Issue 12 review: malformed reports, reports without an outcome and unknown failure codes used to be
    refused (or HOST_ERROR) without ending the run, so an agent could repeat them forever, each decoded
    and each HOST_ERROR logged. Now the first report ends the run and every later one is refused unread."""
    run = env.started()
    decodes.clear()
    answer = raw_call(run.channel, REPORT_METHOD, payload)
    outcome = run.session.outcome
    assert outcome is not None and run.session.reported.is_set()
    if shape.startswith("unknown field"):
        assert isinstance(answer, bytes) and outcome.failure_code == "agent_exception"
    else:
        assert_refused(answer, "INVALID_REQUEST")
        assert outcome.failure_code == "result_not_serializable"
    assert decodes == ["ReportResultRequest"]
    for _ in range(20):
        assert_refused(raw_call(run.channel, REPORT_METHOD, payload), "RUN_FINISHED")
    assert decodes == ["ReportResultRequest"]  # the repeats were never decoded
    assert run.session.host_errors == 0


def test_a_host_fault_while_reading_a_report_still_ends_the_run(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from host.runtime import runserver as _runserver

    def broken(text: str, max_bytes: int) -> Any:
        raise RecursionError(HOST_SECRET)

    monkeypatch.setattr(_runserver, "loads_strict", broken)
    run = env.started()
    assert_refused(refused(run.report, {"a": 1}), "HOST_ERROR")
    outcome = run.session.outcome
    assert outcome is not None and outcome.failure_code == "result_not_serializable"
    assert_refused(refused(run.report, {"a": 1}), "RUN_FINISHED")
    assert run.session.host_errors == 1 and "secret-ish" not in caplog.text


def test_host_error_warnings_are_rate_limited_per_run(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """An agent that can provoke a HOST_ERROR cannot flood the host log: a few lines at once, then one a
    minute, each saying how many were not logged; every one is counted."""
    from host.runtime.session import HOST_ERROR_LOG_BURST, HOST_ERROR_LOG_REFILL_PER_SECOND, RefusalBudget

    caplog.set_level(logging.WARNING, logger="agentnode.sandbox.session")
    now = [50.0]
    run = env.started(
        gate_class=ExplodingGate, clock=lambda: now[0], refusals=RefusalBudget(clock=lambda: now[0])
    )
    other = env.started(gate_class=ExplodingGate)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("host error in")]

    for _ in range(HOST_ERROR_LOG_BURST + 40):
        assert_refused(refused(run.run_tool, "word-tools", "echo", {}), "HOST_ERROR")
    assert run.session.host_errors == HOST_ERROR_LOG_BURST + 40
    assert lines() == ["host error in RunTool: RuntimeError"] * HOST_ERROR_LOG_BURST
    assert_refused(refused(other.run_tool, "word-tools", "echo", {}), "HOST_ERROR")  # its own budget
    assert len(lines()) == HOST_ERROR_LOG_BURST + 1
    now[0] += 1 / HOST_ERROR_LOG_REFILL_PER_SECOND
    assert_refused(refused(run.run_tool, "word-tools", "echo", {}), "HOST_ERROR")
    resumed = "host error in RunTool: RuntimeError (40 more in this run since the last one logged)"
    assert lines()[-1] == resumed
    assert_refused(refused(run.run_tool, "word-tools", "echo", {}), "HOST_ERROR")
    assert len(lines()) == HOST_ERROR_LOG_BURST + 2 and "secret-ish" not in caplog.text


def test_llm_input_counts_roles_and_overhead_on_the_wire(env: Env) -> None:
    """Finding 3: many empty messages used to reach the provider as megabytes under a 2,000-character cap."""
    from host.llm.admission import MESSAGE_OVERHEAD_CHARS

    llm = LlmPolicy(enabled=True, max_calls=5, max_input_chars=2000, max_output_chars=100)
    run = env.started(llm=llm)
    per_message = len("user") + MESSAGE_OVERHEAD_CHARS
    fits = 2000 // per_message
    assert_refused(raw_call(run.channel, LLM_METHOD, messages_request(fits + 1)), "LLM_INPUT_TOO_LARGE")
    assert isinstance(raw_call(run.channel, LLM_METHOD, messages_request(fits)), bytes)
    [sent] = env.fake_llm.requests
    body = sent.body["messages"]
    assert len(body) == fits and sum(len(m["role"]) + len(m["content"]) for m in body) <= 2000


# --- refusals are rate-limited per run ------------------------------------------------------------------


def test_refusals_are_throttled_per_run_until_the_budget_refills(env: Env, decodes: list[str]) -> None:
    from host.runtime.session import REFUSAL_BURST, REFUSAL_REFILL_PER_SECOND

    now = [1000.0]
    run = env.started(refusals=RefusalBudget(clock=lambda: now[0]))
    other = env.started()  # another run's budget is its own
    got = [reason(refused(run.run_tool, "other-tools", "echo", {})) for _ in range(REFUSAL_BURST + 8)]
    assert got == ["TOOL_NOT_ALLOWED"] * REFUSAL_BURST + ["TOO_MANY_REFUSALS"] * 8
    decodes.clear()
    err = refused(run.run_tool, "word-tools", "echo", {"fine": True})  # good calls wait too, unread
    assert_refused(err, "TOO_MANY_REFUSALS")
    assert_refused(refused(run.call_llm), "TOO_MANY_REFUSALS")
    assert_refused(refused(run.stream_llm), "TOO_MANY_REFUSALS")
    assert decodes == [] and env.fake_llm.requests == []
    assert run.session.throttled == 11 and run.session.tools.refusals == REFUSAL_BURST
    assert other.run_tool("word-tools", "echo", {"fine": True}).success
    now[0] += 1 / REFUSAL_REFILL_PER_SECOND  # one refusal's worth comes back
    assert run.run_tool("word-tools", "echo", {"fine": True}).success
    assert_refused(refused(run.run_tool, "word-tools", "echo", "{bad"), "INVALID_REQUEST")
    assert_refused(refused(run.run_tool, "word-tools", "echo", {}), "TOO_MANY_REFUSALS")
    run.report({"done": True})  # session calls are never throttled: the result always gets through
    assert run.session.outcome is not None and run.session.outcome.success


def test_budget_and_state_refusals_do_not_drain_the_refusal_budget(env: Env) -> None:
    from host.runtime.session import REFUSAL_BURST

    run = env.started(max_tool_calls=1, broker=env.broker({}))  # no provider configured on the host
    assert run.run_tool("word-tools", "echo", {}).success
    for _ in range(REFUSAL_BURST + 10):
        assert reason(refused(run.run_tool, "word-tools", "echo", {})) == "TOOL_CALL_LIMIT"
        assert reason(refused(run.call_llm)) == "LLM_UNAVAILABLE"
        assert reason(refused(run.fetch)) == "TASK_ALREADY_FETCHED"
    bad_role = [llm_pb2.ChatMessage(role="tool", content="x")]
    assert reason(refused(run.call_llm, bad_role)) == "INVALID_REQUEST"  # a bad request still is one
    assert run.session.throttled == 0


# --- only accepted calls are activity --------------------------------------------------------------------


def test_refused_calls_never_count_as_activity(env: Env) -> None:
    """Finding 9: every call, refused or not, used to reset the idle clock, so spam kept a run alive."""
    now = [100.0]
    run = env.started(clock=lambda: now[0], llm=LlmPolicy(), refusals=RefusalBudget(clock=lambda: now[0]))
    assert run.session.idle_since() == 100.0
    now[0] = 500.0
    attempts: list[Callable[[], Any]] = [
        lambda: run.run_tool("other-tools", "echo", {}),
        lambda: run.run_tool("word-tools", "echo", "{bad json"),
        lambda: run.run_tool("word-tools", "append", {"wrong": 1}),
        lambda: run.run_tool("ghost", "echo", {}),
        run.call_llm,
        lambda: list(run.stream_llm()),
        run.fetch,
        lambda: raw_call(run.channel, TOOL_METHOD, b"\x0b"),
    ]
    samples: list[float | None] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(run.session.idle_since())

    sampler = threading.Thread(target=sample)
    sampler.start()
    with futures.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: _outcome_of(attempts[i % len(attempts)]), range(200)))
    stop.set()
    sampler.join()
    assert all(isinstance(o, grpc.RpcError) for o in outcomes)
    assert "TOO_MANY_REFUSALS" in {reason(o) for o in outcomes}  # throttled calls are not activity either
    assert samples and set(samples) == {100.0}  # never "in flight", never reset
    assert run.session.last_activity == 100.0 and run.session.inflight == 0
    now[0] = 600.0  # the budget has refilled by now
    assert run.run_tool("word-tools", "echo", {}).success  # an accepted call is activity
    assert run.session.idle_since() == 600.0
    now[0] = 700.0
    empty = session_pb2.ReportResultRequest()
    assert_refused(refused(run.sessions.ReportResult, empty), "INVALID_REQUEST")  # ends the run, unaccepted
    assert run.session.outcome is not None and run.session.last_activity == 600.0


def _outcome_of(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except grpc.RpcError as err:
        return err
    return result


# --- connections are bounded before the handshake --------------------------------------------------------


def test_a_connection_flood_is_bounded_before_the_handshake() -> None:
    from host.runtime.runserver import HANDSHAKE_TIMEOUT_MS, MAX_CONNECTIONS_PER_RUN

    with ServerProbe({}) as probe:
        base = probe.command("report")["fds"]
        flood: list[socket.socket] = []
        try:
            for _ in range(500):
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                flood.append(conn)
                conn.connect(probe.socket_path)
            time.sleep(0.5)
            during = probe.command("report")["fds"]
            assert during - base <= MAX_CONNECTIONS_PER_RUN + 2, (base, during)
            # The bare connections that got a slot never handshake: they are closed after the timeout,
            # so a legitimate client gets in even while the flood's sockets stay open on its side.
            time.sleep(HANDSHAKE_TIMEOUT_MS / 1000 + 0.5)
            with grpc.insecure_channel(f"unix:{probe.socket_path}") as channel:
                stub = llm_pb2_grpc.LlmServiceStub(channel)
                with pytest.raises(grpc.RpcError) as info:
                    stub.CallLlm(llm_pb2.CallLlmRequest(messages=HELLO), timeout=10, wait_for_ready=True)
                assert_refused(info.value, "LLM_NOT_GRANTED")  # served: an answer of the run's own
        finally:
            for conn in flood:
                conn.close()
        time.sleep(0.5)
        after = probe.command("report")["fds"]
        assert after - base <= 2, (base, after)
        with grpc.insecure_channel(f"unix:{probe.socket_path}") as channel:
            err = raw_call(channel, LLM_METHOD, b"")
            assert_refused(err, "LLM_NOT_GRANTED")


# --- non-finite numbers never cross ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1e999", "[-1e999]", '{"a": 1E400}', '{"a": NaN}', "[Infinity]"])
def test_a_non_finite_result_is_not_serializable(env: Env, text: str) -> None:
    """Finding 8: 1e999 passed the NaN/Infinity ban and `run --json` printed Infinity."""
    run = env.started()
    request = session_pb2.ReportResultRequest(value_json=text)
    assert_refused(refused(run.sessions.ReportResult, request), "INVALID_REQUEST")
    outcome = run.session.outcome
    assert outcome is not None and outcome.failure_code == "result_not_serializable"


def test_a_result_nested_deeper_than_64_is_not_serializable(env: Env) -> None:
    run = env.started()
    request = session_pb2.ReportResultRequest(value_json="[" * 65 + "]" * 65)
    assert_refused(refused(run.sessions.ReportResult, request), "INVALID_REQUEST")
    run2 = env.started()
    run2.sessions.ReportResult(session_pb2.ReportResultRequest(value_json="[" * 64 + "]" * 64), timeout=10)
    assert run2.session.outcome is not None and run2.session.outcome.success


@pytest.mark.parametrize("arguments", ['{"x": 1e999}', '{"x": [-1e999]}', '{"x": 1E309}', '{"x": -Infinity}'])
def test_non_finite_tool_arguments_never_reach_a_tool(env: Env, arguments: str) -> None:
    run = env.started()
    assert_refused(refused(run.run_tool, "word-tools", "echo", arguments), "INVALID_REQUEST")
    assert run.session.tools.calls_made == 0


# --- tool definitions and the model's tool calls (issue 15) ------------------------------------------------


def _with_tools(run: Run, env: Env) -> None:
    """The run's catalog, as host/runtime/wiring.py builds it: the allowlisted packs' declared tools."""
    from host.llm.toolcalls import build_catalog

    packs = [env.packs[slug] for slug in ("word-tools", "community-tools")]
    run.session.llm.use_tools(lambda: build_catalog((p.slug, p.manifest.tools) for p in packs))  # type: ignore[union-attr]


def test_list_tools_serves_the_runs_definitions_without_an_llm_grant(env: Env) -> None:
    run = env.started(llm=LlmPolicy())
    _with_tools(run, env)
    answer = run.llm.ListTools(llm_pb2.ListToolsRequest(), timeout=10)
    assert [(t.name, t.parameters_json) for t in answer.tools] == [
        ("word-tools:append", '{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],'
                              '"additionalProperties":false}'),
        ("word-tools:echo", "{}"),
        ("community-tools:append", answer.tools[0].parameters_json),
        ("community-tools:echo", "{}"),
    ]  # fmt: skip
    assert env.fake_llm.requests == []


def test_list_tools_fails_like_every_call(env: Env) -> None:
    run = env.start()
    assert_refused(refused(run.llm.ListTools, llm_pb2.ListToolsRequest()), "TASK_NOT_FETCHED")
    run.fetch()
    padded = b"\x0a\x00" * 40  # a ListToolsRequest has no fields
    assert_refused(raw_call(run.channel, "/agentnode.sandbox.v1.LlmService/ListTools", padded), "TOO_LARGE")
    assert len(run.llm.ListTools(llm_pb2.ListToolsRequest(), timeout=10).tools) == 0  # no catalog: no tools
    run.report({"ok": True})
    assert_refused(refused(run.llm.ListTools, llm_pb2.ListToolsRequest()), "RUN_FINISHED")


def test_tools_round_trip_over_the_wire(env: Env) -> None:
    from tests.support.fake_llm import FakeToolCall

    run = env.started()
    _with_tools(run, env)
    calls = (FakeToolCall("word-tools:echo", {"ok": 1}), FakeToolCall("evil:rm"))
    env.fake_llm.default = Behaviour(text="done", tool_calls=calls, echo_results=True)
    echo = llm_pb2.ToolDefinition(name="word-tools:echo", description="ignored", parameters_json='{"x": 1}')
    offered = [echo]
    first = run.llm.CallLlm(llm_pb2.CallLlmRequest(messages=HELLO, tools=offered), timeout=30)
    assert first.finish_reason == llm_pb2.FINISH_REASON_TOOL_CALLS
    assert [(c.name, c.arguments_json, c.refused) for c in first.tool_calls] == [
        ("word-tools:echo", '{"ok":1}', False), ("evil:rm", "{}", True),
    ]  # fmt: skip
    # The provider got the host's definition, never the agent's description or schema.
    [tool] = env.fake_llm.requests[0].body["tools"]
    function = {"name": "word-tools__echo", "parameters": {"type": "object"}}
    assert tool == {"type": "function", "function": function}
    results = [llm_pb2.ChatMessage(role="tool", tool_call_id=c.id, content="1") for c in first.tool_calls]
    history = [*HELLO, llm_pb2.ChatMessage(role="assistant", tool_calls=first.tool_calls), *results]
    chunks = list(run.llm.StreamLlm(llm_pb2.StreamLlmRequest(messages=history, tools=offered), timeout=30))
    assert "".join(c.delta for c in chunks) == "done: 1 | 1"
    assert chunks[-1].done and chunks[-1].finish_reason == llm_pb2.FINISH_REASON_STOP
    usage = run.session.llm.usage()  # type: ignore[union-attr]
    assert (usage["tool_calls"], usage["tool_calls_refused"]) == (2, 1)
    assert env.fake_llm.problems == []


def test_a_streamed_tool_call_arrives_as_deltas_then_whole(env: Env) -> None:
    from tests.support.fake_llm import FakeToolCall

    run = env.started()
    _with_tools(run, env)
    env.fake_llm.default = Behaviour(tool_calls=(FakeToolCall("word-tools:append", {"path": "/tmp/x"}),))
    offered = [llm_pb2.ToolDefinition(name="word-tools:append")]
    chunks = list(run.llm.StreamLlm(llm_pb2.StreamLlmRequest(messages=HELLO, tools=offered), timeout=30))
    deltas = [d for c in chunks for d in c.tool_call_deltas]
    assert deltas[0].name == "word-tools:append" and deltas[0].id
    assert json.loads("".join(d.arguments_delta for d in deltas)) == {"path": "/tmp/x"}
    final = chunks[-1]
    assert final.done and final.finish_reason == llm_pb2.FINISH_REASON_TOOL_CALLS
    assert [(c.id, c.name, c.arguments_json) for c in final.tool_calls] == [
        (deltas[0].id, "word-tools:append", '{"path":"/tmp/x"}')
    ]


def test_a_tool_outside_the_runs_definitions_is_refused_before_the_provider(env: Env) -> None:
    run = env.started()
    _with_tools(run, env)
    ghost = [llm_pb2.ToolDefinition(name="ghost:run")]
    err = refused(run.llm.CallLlm, llm_pb2.CallLlmRequest(messages=HELLO, tools=ghost))
    assert_refused(err, "LLM_TOOL_NOT_ALLOWED")
    err = refused(run.llm.StreamLlm, llm_pb2.StreamLlmRequest(messages=HELLO, tools=ghost))
    assert_refused(err, "LLM_TOOL_NOT_ALLOWED")
    bad = llm_pb2.CallLlmRequest(messages=HELLO, tool_choice=77)  # type: ignore[arg-type]  # an open enum
    assert_refused(refused(run.llm.CallLlm, bad), "INVALID_REQUEST")
    orphan = llm_pb2.CallLlmRequest(messages=[*HELLO, llm_pb2.ChatMessage(role="tool", tool_call_id="c1")])
    assert_refused(refused(run.llm.CallLlm, orphan), "INVALID_REQUEST")
    assert env.fake_llm.requests == []
    assert run.session.llm.usage()["refused_tool"] == 2  # type: ignore[union-attr]


def test_the_grant_carries_the_budgets_and_usage_the_tokens_left(env: Env) -> None:
    budgets = LlmPolicy(enabled=True, max_calls=3, max_input_chars=400, max_output_chars=400,
                        max_input_tokens=300, max_output_tokens=20, max_total_tokens=1000,
                        max_cost_usd=0.5)  # fmt: skip
    run = env.start(llm=budgets)
    grant = run.fetch().llm
    assert (grant.max_input_tokens, grant.max_output_tokens, grant.max_total_tokens, grant.max_cost_usd) == (
        300, 20, 1000, 0.5,
    )  # fmt: skip
    # (no price for the model under a cost cap: this run's calls are refused, so drop the cost cap)
    run = env.started(llm=dataclasses.replace(budgets, max_cost_usd=None))
    usage = run.call_llm().usage
    assert usage.HasField("tokens_remaining") and 0 < usage.tokens_remaining < 1000
    assert usage.tokens_remaining == 1000 - usage.input_tokens - usage.output_tokens
    plain = env.started()  # a run without token caps: the fields are absent
    assert not plain.call_llm().usage.HasField("tokens_remaining")
    plain_grant = env.start().fetch().llm
    assert not plain_grant.HasField("max_total_tokens") and not plain_grant.HasField("max_cost_usd")


class _ClosingLlm:
    """Records close(): the only part of an LLM session RunSession's ending touches."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("ending", ["report", "cancel"])
def test_the_runs_end_closes_its_llm_session(env: Env, ending: str) -> None:
    llm = _ClosingLlm()
    task = env.start().pending[0]  # type: ignore[index]
    session = RunSession(task=task, tools=None, llm=llm)  # type: ignore[arg-type]
    session.fetch(PROTOCOL_VERSION)
    if ending == "report":
        session.report(RunOutcome(value_json="1"))
    else:
        session.cancel()
    assert llm.closed == 1  # a provider retry waiting in its backoff gives up now
