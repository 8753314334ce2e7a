"""AgentContext against a real gRPC fake host: refusals map to the documented exceptions and results."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sandbox_wrapper import (
    AgentContext,
    AgentLimitExceeded,
    HostUnavailableError,
    LlmAccessError,
    ToolResult,
)
from sandbox_wrapper._client import open_channel
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2, tools_pb2
from tests.support.fake_host import FakeHost, Refusal, Served, Stream, make_task, serve

PD = grpc.StatusCode.PERMISSION_DENIED
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def host() -> FakeHost:
    return FakeHost(task=make_task(system_prompt="Be brief."))


@pytest.fixture
def served(host: FakeHost) -> Iterator[Served]:
    running = serve(host)
    yield running
    running.stop()


@pytest.fixture
def ctx(served: Served) -> Iterator[AgentContext]:
    channel = open_channel(served.socket_path)
    yield AgentContext(channel, served.host.task)
    channel.close()


def ok_tool(result_json: str, made: int, remaining: int) -> tools_pb2.RunToolResponse:
    return tools_pb2.RunToolResponse(
        success=True, result_json=result_json, mode_used="host_worker",
        tool_calls_made=made, tools_remaining=remaining,
    )


def completion(content: str, **kw: Any) -> llm_pb2.CallLlmResponse:
    return llm_pb2.CallLlmResponse(content=content, finish_reason=llm_pb2.FINISH_REASON_STOP, **kw)


def test_task_fields_and_counters_start_from_the_task(ctx: AgentContext) -> None:
    assert (ctx.goal, ctx.run_id, ctx.system_prompt) == ("count these words", "run-test", "Be brief.")
    assert (ctx.iteration, ctx.max_iterations) == (0, 3)
    assert (ctx.tool_calls_made, ctx.tools_remaining, ctx.max_tool_calls) == (0, 5, 5)
    assert ctx.is_tool_available("word-tools") and not ctx.is_tool_available("shell-tools")
    ctx.allowed_packages.append("shell-tools")
    assert ctx.allowed_packages == ["word-tools"]


def test_next_iteration_counts_up_to_the_limit_then_raises(ctx: AgentContext) -> None:
    assert [ctx.next_iteration() for _ in range(3)] == [1, 2, 3]
    with pytest.raises(AgentLimitExceeded, match="iteration limit"):
        ctx.next_iteration()
    assert ctx.iteration == 3


def test_run_tool_sends_the_envelope_and_mirrors_host_counters(host: FakeHost, ctx: AgentContext) -> None:
    host.tools.append(ok_tool('{"count": 3, "ratio": 1.0}', made=1, remaining=4))
    result = ctx.run_tool("word-tools", "count_words", text="a b c")
    assert result == ToolResult(True, {"count": 3, "ratio": 1.0}, None, "host_worker")
    assert isinstance(result.result["count"], int) and isinstance(result.result["ratio"], float)
    (request,) = host.tool_requests
    assert (request.package_slug, request.tool_name, request.arguments_json) == (
        "word-tools", "count_words", '{"text": "a b c"}',
    )
    assert (ctx.tool_calls_made, ctx.tools_remaining) == (1, 4)


def test_a_tool_that_ran_and_failed_is_a_failed_result(host: FakeHost, ctx: AgentContext) -> None:
    host.tools.append(tools_pb2.RunToolResponse(success=False, error="tool raised ValueError", mode_used="w"))
    result = ctx.run_tool("word-tools")
    assert result == ToolResult(False, None, "tool raised ValueError", "w")
    assert host.tool_requests[0].tool_name == ""


@pytest.mark.parametrize("reason", ["TOOL_NOT_ALLOWED", "TOOL_PACK_UNTRUSTED"])
def test_permission_refusals_raise_permission_error(host: FakeHost, ctx: AgentContext, reason: str) -> None:
    host.tools.append(Refusal(PD, reason, "not for you"))
    with pytest.raises(PermissionError, match=f"^{reason}: not for you$"):
        ctx.run_tool("shell-tools")


def test_tool_call_limit_raises_agent_limit_exceeded(host: FakeHost, ctx: AgentContext) -> None:
    host.tools.append(Refusal(RE, "TOOL_CALL_LIMIT", "cap used up"))
    with pytest.raises(AgentLimitExceeded, match="TOOL_CALL_LIMIT"):
        ctx.run_tool("word-tools")
    assert ctx.tools_remaining == 0


def test_try_tool_returns_none_instead_of_raising(host: FakeHost, ctx: AgentContext) -> None:
    host.tools += [Refusal(PD, "TOOL_NOT_ALLOWED"), Refusal(RE, "TOOL_CALL_LIMIT"), ok_tool("7", 1, 4)]
    assert ctx.try_tool("shell-tools") is None
    assert ctx.try_tool("word-tools") is None
    assert ctx.try_tool("word-tools", "count_words", text="x") == ToolResult(True, 7, None, "host_worker")


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (grpc.StatusCode.NOT_FOUND, "TOOL_NOT_FOUND"),
        (grpc.StatusCode.INVALID_ARGUMENT, "TOOL_ARGUMENTS_INVALID"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
        (RE, "TOO_LARGE"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "RUN_DEADLINE"),
    ],
)
def test_other_tool_refusals_are_failed_results(
    host: FakeHost, ctx: AgentContext, code: grpc.StatusCode, reason: str
) -> None:
    host.tools.append(Refusal(code, reason, "no such luck"))
    assert ctx.run_tool("word-tools", "nope") == ToolResult(False, None, f"{reason}: no such luck", "")


def test_unserializable_tool_arguments_never_reach_the_host(host: FakeHost, ctx: AgentContext) -> None:
    result = ctx.run_tool("word-tools", text=object())
    assert not result.success and result.error is not None and result.error.startswith("INVALID_REQUEST:")
    assert host.tool_requests == []


def test_call_llm_prepends_system_prompt_and_hides_the_model(host: FakeHost, ctx: AgentContext) -> None:
    host.llm.append(
        llm_pb2.CallLlmResponse(
            content="hi", finish_reason=llm_pb2.FINISH_REASON_LENGTH,
            usage=llm_pb2.Usage(input_tokens=12, output_tokens=3), calls_remaining=2,
        )
    )
    result = ctx.call_llm([{"role": "user", "content": "hello"}])
    assert (result.content, result.finish_reason, result.model) == ("hi", "length", "")
    assert result.usage == {"input_tokens": 12, "output_tokens": 3}
    assert host.llm_requests == [[("system", "Be brief."), ("user", "hello")]]


def test_own_system_message_is_not_doubled_and_str_is_one_user_message(
    host: FakeHost, ctx: AgentContext
) -> None:
    host.llm += [completion("a"), completion("b")]
    ctx.call_llm([{"role": "system", "content": "mine"}, {"role": "user", "content": "q"}])
    assert ctx.call_llm_text("just text") == "b"
    assert host.llm_requests == [
        [("system", "mine"), ("user", "q")],
        [("system", "Be brief."), ("user", "just text")],
    ]


def test_no_system_prompt_sends_messages_unchanged(served: Served) -> None:
    served.host.llm.append(completion("ok"))
    channel = open_channel(served.socket_path)
    try:
        ctx = AgentContext(channel, make_task(system_prompt=""))
        ctx.call_llm("q")
    finally:
        channel.close()
    assert served.host.llm_requests == [[("user", "q")]]


def test_malformed_messages_raise_type_error_locally(host: FakeHost, ctx: AgentContext) -> None:
    with pytest.raises(TypeError, match="role"):
        ctx.call_llm([{"role": "user", "content": 5}])  # type: ignore[dict-item]
    assert host.llm_requests == []


@pytest.mark.parametrize(
    ("code", "reason"),
    [(PD, "LLM_NOT_GRANTED"), (RE, "LLM_CALL_LIMIT"), (grpc.StatusCode.UNAVAILABLE, "LLM_UNAVAILABLE")],
)
def test_llm_refusals_raise_llm_access_error_with_reason(
    host: FakeHost, ctx: AgentContext, code: grpc.StatusCode, reason: str
) -> None:
    host.llm.append(Refusal(code, reason, "denied"))
    with pytest.raises(LlmAccessError) as info:
        ctx.call_llm_text("q")
    assert isinstance(info.value, RuntimeError)
    assert info.value.reason == reason
    assert str(info.value) == f"{reason}: denied"


def test_stream_yields_chunks_then_ends(host: FakeHost, ctx: AgentContext) -> None:
    host.streams.append(Stream(("Hel", "", "lo")))
    assert list(ctx.stream_llm("q")) == ["Hel", "lo"]
    assert host.llm_requests == [[("system", "Be brief."), ("user", "q")]]


def test_stream_raises_at_the_cap_after_the_chunks_that_fit(host: FakeHost, ctx: AgentContext) -> None:
    host.streams.append(Stream(("ab", "cd"), then=Refusal(RE, "LLM_OUTPUT_TOO_LARGE", "cap")))
    received: list[str] = []
    with pytest.raises(LlmAccessError) as info:
        for chunk in ctx.stream_llm("q"):
            received.append(chunk)
    assert received == ["ab", "cd"]
    assert info.value.reason == "LLM_OUTPUT_TOO_LARGE"


def test_reasonless_errors_are_host_errors(host: FakeHost, ctx: AgentContext) -> None:
    host.llm.append(Refusal(grpc.StatusCode.INTERNAL, "", "boom"))
    with pytest.raises(LlmAccessError) as info:
        ctx.call_llm("q")
    assert info.value.reason == "HOST_ERROR"


def test_host_gone_raises_host_unavailable(served: Served, ctx: AgentContext) -> None:
    served.stop()
    with pytest.raises(HostUnavailableError):
        ctx.run_tool("word-tools")
    with pytest.raises(HostUnavailableError):
        ctx.call_llm("q")
    with pytest.raises(HostUnavailableError):
        list(ctx.stream_llm("q"))
    assert issubclass(HostUnavailableError, RuntimeError)
