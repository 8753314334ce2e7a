"""The run server is built unstarted on its socket; its SessionService hands the task over and reads the one
report: size caps in bytes, strict JSON, failure codes, every report past the state checks ends the run."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession, RunTask
from host.tools.gate import ToolGate
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import session_pb2, session_pb2_grpc
from tests.unit.runtime._support import (
    GRANT,
    HOST_SECRET,
    REPORT_METHOD,
    Env,
    MiB,
    assert_refused,
    field,
    raw_call,
    refused,
)

# --- building and serving ------------------------------------------------------------------------------


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


# --- FetchTask -----------------------------------------------------------------------------------------


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


# --- ReportResult: the one result ----------------------------------------------------------------------


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


# --- non-finite numbers never cross --------------------------------------------------------------------


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
