"""The run server's wire limits: the status table per errors.proto, message caps both ways, the one
translation boundary, state and grants before sizes before decoding, the refusal throttle, connections
bounded before the handshake."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import pytest

from host.policy.rules import LlmPolicy
from host.runtime.runserver import MAX_MESSAGE_BYTES
from host.runtime.session import RefusalBudget
from host.tools.calls import ToolOutcome
from host.tools.gate import ToolGate
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import (
    errors_pb2,
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    tools_pb2,
)
from tests.support.fake_llm import Behaviour
from tests.support.run_server_probe import ServerProbe
from tests.unit.runtime._support import (
    EMPTY_MESSAGES,
    FETCH_METHOD,
    HELLO,
    HOST_SECRET,
    HUGE_CAP,
    LLM_METHOD,
    PROTO_STATUS,
    REPORT_METHOD,
    SMALL_CAP,
    STREAM_METHOD,
    TOOL_METHOD,
    Env,
    MiB,
    assert_refused,
    field,
    messages_request,
    raw_call,
    raw_stream,
    reason,
    refused,
)

# --- the contract table --------------------------------------------------------------------------------


def test_errors_proto_names_a_status_for_every_reason() -> None:
    names = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}
    assert set(PROTO_STATUS) == names and len(names) == 24


def test_server_status_table_matches_errors_proto() -> None:
    from host.runtime import rpcwire as _rpcwire

    assert _rpcwire._STATUS == PROTO_STATUS


# --- message size caps, both directions ----------------------------------------------------------------


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


# --- the translation boundary --------------------------------------------------------------------------


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


# --- cost before authorization: state and grants, then sizes, then decoding (red-team issue 12) --------


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
    from host.tools.calls import MAX_REQUEST_BYTES

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


# --- refusals are rate-limited per run -----------------------------------------------------------------


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


# --- connections are bounded before the handshake ------------------------------------------------------


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
