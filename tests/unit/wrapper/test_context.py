"""AgentContext against a real gRPC fake host: refusals map to the documented exceptions and results."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from sandbox_wrapper import (
    AgentContext,
    AgentLimitExceeded,
    AgentTerminated,
    HostUnavailableError,
    LlmAccessError,
    LLMResult,
    RunToolResult,
    ToolAccessError,
    ToolContext,
    ToolResult,
)
from sandbox_wrapper._client import open_channel
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2, session_pb2, tools_pb2
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


class Clock:
    """A monotonic clock the tests move by hand; its sleep records the delay and advances time instantly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ctx(served: Served, clock: Clock) -> Iterator[AgentContext]:
    channel = open_channel(served.socket_path)
    yield AgentContext(channel, served.host.task, sleep=clock.sleep, clock=clock)
    channel.close()


def ok_tool(result_json: str, made: int, remaining: int) -> tools_pb2.RunToolResponse:
    return tools_pb2.RunToolResponse(
        success=True, result_json=result_json, mode_used="host_worker",
        tool_calls_made=made, tools_remaining=remaining,
    )


def failed_tool(
    made: int, remaining: int, error: str = "tool raised ValueError"
) -> tools_pb2.RunToolResponse:
    return tools_pb2.RunToolResponse(
        success=False, error=error, mode_used="host_worker", tool_calls_made=made, tools_remaining=remaining,
    )


def completion(content: str, **kw: Any) -> llm_pb2.CallLlmResponse:
    return llm_pb2.CallLlmResponse(content=content, finish_reason=llm_pb2.FINISH_REASON_STOP, **kw)


def core(result: ToolResult) -> tuple[bool, Any, str | None, str]:
    """The fields a host answer decides (duration_ms is measured)."""
    return result.success, result.result, result.error, result.mode_used


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
    assert core(result) == (True, {"count": 3, "ratio": 1.0}, None, "host_worker")
    assert result.duration_ms >= 0 and result.timed_out is False and result.run_id is None
    assert isinstance(result.result["count"], int) and isinstance(result.result["ratio"], float)
    (request,) = host.tool_requests
    assert (request.package_slug, request.tool_name, request.arguments_json) == (
        "word-tools", "count_words", '{"text": "a b c"}',
    )
    assert (ctx.tool_calls_made, ctx.tools_remaining) == (1, 4)


def test_a_tool_that_ran_and_failed_is_a_failed_result(host: FakeHost, ctx: AgentContext) -> None:
    host.tools.append(tools_pb2.RunToolResponse(success=False, error="tool raised ValueError", mode_used="w"))
    result = ctx.run_tool("word-tools")
    assert core(result) == (False, None, "tool raised ValueError", "w")
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
    tried = ctx.try_tool("word-tools", "count_words", text="x")
    assert tried is not None and core(tried) == (True, 7, None, "host_worker")


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
    assert core(ctx.run_tool("word-tools", "nope")) == (False, None, f"{reason}: no such luck", "")


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
    assert result.usage == {
        "prompt_tokens": 12, "completion_tokens": 3, "input_tokens": 12, "output_tokens": 3,
    }
    assert result.tool_calls is None
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


# --- AgentContext compatibility: the agentnode runtime's and the seed sandbox's contracts (issue 14) ------


@contextmanager
def context_for(served: Served, clock: Clock, task: Any) -> Iterator[AgentContext]:
    """An AgentContext on `task` (a FetchTaskResponse, or a stand-in with fields a newer host sends)."""
    channel = open_channel(served.socket_path)
    try:
        yield AgentContext(channel, task, sleep=clock.sleep, clock=clock)
    finally:
        channel.close()


def task_with_limits(**limits: Any) -> Any:
    """A task whose limits carry fields this protocol version's RunLimits lacks (read with getattr)."""
    base = make_task()
    fields = {"max_tool_calls": 5, "max_iterations": 3, "max_runtime_seconds": 60, **limits}
    return SimpleNamespace(
        goal=base.goal, run_id=base.run_id, system_prompt="", allowed_packages=list(base.allowed_packages),
        limits=SimpleNamespace(**fields),
    )


def test_tool_results_read_as_attributes_and_as_a_mapping(host: FakeHost, ctx: AgentContext) -> None:
    host.tools.append(ok_tool('{"count": 3}', made=1, remaining=4))
    r = ctx.run_tool("word-tools", "count_words", text="a b c")
    assert r["success"] is True and r["result"] == {"count": 3} and r["error"] is None
    assert r.get("mode_used") == "host_worker" and r.get("missing", "d") == "d"
    assert "success" in r and "duration_ms" in r and "nope" not in r
    assert set(r.keys()) == {"success", "result", "error", "mode_used", "duration_ms", "timed_out", "run_id"}
    assert isinstance(r, dict) and isinstance(r, RunToolResult)
    assert json.loads(json.dumps(r))["result"] == {"count": 3}  # an agent may return or log it as is
    assert repr(r).startswith("ToolResult(success=True, result={'count': 3}, error=None, mode_used=")
    r.error = "overwritten"  # type: ignore[misc]  # attributes and keys are one thing
    assert r["error"] == "overwritten"
    with pytest.raises(AttributeError):
        r.unknown = 1


def test_llm_results_read_as_attributes_and_as_the_seed_completion(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [completion("first", usage=llm_pb2.Usage(input_tokens=5, output_tokens=2)), completion("2nd")]
    c = ctx.call_llm("q")
    assert (c["role"], c["content"], c.get("finish_reason"), c["model"]) == ("assistant", "first", "stop", "")
    assert c["usage"]["prompt_tokens"] == 5 and c.usage["completion_tokens"] == 2
    assert "tool_calls" in c and c["tool_calls"] is None
    assert isinstance(c, LLMResult) and json.loads(json.dumps(c))["content"] == "first"
    # seed-style: the completion dict goes straight back into the conversation
    ctx.call_llm([{"role": "user", "content": "q"}, c, {"role": "user", "content": "more"}])
    assert host.llm_requests[1] == [
        ("system", "Be brief."), ("user", "q"), ("assistant", "first"), ("user", "more"),
    ]


def test_exceptions_are_the_runtimes_classes_and_runtime_errors() -> None:
    import sandbox_wrapper

    for name in ("AgentLimitExceeded", "AgentTerminated", "ToolAccessError", "LlmAccessError"):
        assert issubclass(getattr(sandbox_wrapper, name), RuntimeError), name
    assert issubclass(ToolAccessError, PermissionError) and issubclass(ToolAccessError, OSError)
    assert not issubclass(AgentTerminated, (AgentLimitExceeded, PermissionError))
    refused = ToolAccessError("TOOL_NOT_ALLOWED: x", reason="TOOL_NOT_ALLOWED")
    assert refused.errno is None and str(refused) == "TOOL_NOT_ALLOWED: x"
    assert type(refused).__name__ == "PermissionError"  # what agents that log the type name saw before
    for name in ("RunToolResult", "LLMResult", "ToolContext", "RetryConfig", "AgentTerminated"):
        assert name in sandbox_wrapper.__all__


def test_an_allowlist_refusal_is_caught_as_permission_error_and_as_runtime_error(
    host: FakeHost, ctx: AgentContext
) -> None:
    host.tools += [Refusal(PD, "TOOL_NOT_ALLOWED", "nope"), Refusal(PD, "TOOL_PACK_UNTRUSTED", "nope")]
    with pytest.raises(PermissionError) as info:
        ctx.run_tool("shell-tools")
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ToolAccessError)
    assert info.value.reason == "TOOL_NOT_ALLOWED" and str(info.value) == "TOOL_NOT_ALLOWED: nope"
    with pytest.raises(RuntimeError, match=r"^TOOL_PACK_UNTRUSTED: nope$"):  # how the seed sandbox caught it
        ctx.run_tool("word-tools")


def test_properties_and_the_llm_binding(served: Served, clock: Clock) -> None:
    with context_for(served, clock, make_task(allowed_packages=[])) as ctx:
        assert ctx.allowed_packages == [] and ctx.llm is None and ctx.llm_calls_made == 0
        tools = ctx.allowed_tool_context()
        assert isinstance(tools, ToolContext) and tools.allowed_packages == [] and not tools.has_tools
    with context_for(served, clock, make_task(allowed_packages=["a", "b"])) as ctx:
        tools = ctx.allowed_tool_context()
        assert tools.allowed_packages == ["a", "b"] and tools.tool_specs == [] and not tools.has_tools
        tools.allowed_packages.append("c")
        assert ctx.allowed_packages == ["a", "b"]
        with pytest.raises(AttributeError):
            ctx.tool_calls_made = 0  # type: ignore[misc]


def test_an_absent_allowlist_is_none_and_every_slug_is_available(served: Served, clock: Clock) -> None:
    # The host sends any_package when the manifest declares no tool_access.allowed_packages (format §4.1).
    with context_for(served, clock, make_task(allowed_packages=[], any_package=True)) as ctx:
        assert ctx.allowed_packages is None
        assert ctx.is_tool_available("anything") and ctx.tool_health("anything")["allowed"] is True
        assert ctx.allowed_tool_context().allowed_packages == []


def test_max_tool_calls_zero_refuses_the_first_call(served: Served, clock: Clock) -> None:
    served.host.tools += [Refusal(RE, "TOOL_CALL_LIMIT", "cap used up")] * 2
    limits = session_pb2.RunLimits(max_tool_calls=0, max_iterations=0, max_runtime_seconds=60)
    with context_for(served, clock, make_task(limits=limits)) as ctx:
        assert (ctx.tools_remaining, ctx.max_tool_calls) == (0, 0)
        with pytest.raises(AgentLimitExceeded, match=r"^TOOL_CALL_LIMIT: "):
            ctx.run_tool("word-tools")
        assert ctx.try_tool("word-tools") is None
        with pytest.raises(AgentLimitExceeded):
            ctx.next_iteration()  # max_iterations 0: not even one
        assert ctx.iteration == 0


def test_exactly_max_iterations_calls_succeed(ctx: AgentContext) -> None:
    done = 0
    with pytest.raises(AgentLimitExceeded):
        while True:
            ctx.next_iteration()
            done += 1
    assert done == ctx.max_iterations == 3


def test_entry_is_not_a_tool_argument(host: FakeHost, ctx: AgentContext) -> None:
    for call in (ctx.run_tool, ctx.try_tool, ctx.run_tool_with_retry, ctx.run_tool_with_fallback):
        with pytest.raises(TypeError, match="entry"):
            call("word-tools", entry={})
    assert host.tool_requests == []


def test_three_failed_tools_in_a_row_terminate_inside_the_third_call(
    host: FakeHost, ctx: AgentContext
) -> None:
    host.tools += [failed_tool(1, 4), failed_tool(2, 3), failed_tool(3, 2)]
    assert not ctx.run_tool("word-tools").success
    assert not ctx.run_tool("word-tools").success
    with pytest.raises(AgentTerminated, match="stopped after 3 consecutive tool errors") as info:
        ctx.run_tool("word-tools")
    assert isinstance(info.value, RuntimeError) and "tool raised ValueError" in str(info.value)
    assert len(host.tool_requests) == 3 and ctx.tool_calls_made == 3
    host.tools.append(failed_tool(4, 1))
    with pytest.raises(AgentTerminated, match="after 4 consecutive"):  # try_tool never swallows it
        ctx.try_tool("other-tools")  # (word-tools' breaker is open by now: it would not be called)


def test_a_success_resets_the_error_run_and_refusals_returned_as_results_count(
    host: FakeHost, ctx: AgentContext
) -> None:
    # The format's arithmetic (§4.4): every failed dispatch counts, a pack that is not found included.
    host.tools += [failed_tool(1, 4), failed_tool(2, 3), ok_tool("1", 3, 2), failed_tool(4, 1)]
    host.tools += [Refusal(grpc.StatusCode.NOT_FOUND, "TOOL_NOT_FOUND")]
    host.tools += [Refusal(grpc.StatusCode.INVALID_ARGUMENT, "TOOL_ARGUMENTS_INVALID")]
    results = [ctx.run_tool("word-tools", "t") for _ in range(5)]
    assert [r.success for r in results] == [False, False, True, False, False]
    assert ctx.tool_health("word-tools")["circuit_breaker"]["failure_count"] == 2
    with pytest.raises(AgentTerminated, match="after 3 consecutive"):
        ctx.run_tool("word-tools", "t")


def test_the_threshold_comes_from_the_task_when_the_host_sends_one(served: Served, clock: Clock) -> None:
    served.host.tools += [failed_tool(1, 4)]
    with context_for(served, clock, task_with_limits(stop_on_consecutive_errors=1)) as ctx:
        with pytest.raises(AgentTerminated, match="after 1 consecutive"):
            ctx.run_tool("word-tools")
    served.host.tools += [failed_tool(2, 3)] * 3 + [ok_tool("1", 5, 0)]
    with context_for(served, clock, task_with_limits(stop_on_consecutive_errors=0)) as ctx:  # 0 = default
        ctx.run_tool("word-tools")
        ctx.run_tool("word-tools")
        with pytest.raises(AgentTerminated, match="after 3 consecutive"):
            ctx.run_tool("word-tools")


def test_no_transparent_retry_unless_asked(host: FakeHost, ctx: AgentContext, clock: Clock) -> None:
    host.tools += [failed_tool(1, 4), ok_tool("1", 2, 3)]
    assert not ctx.run_tool("word-tools").success
    assert len(host.tool_requests) == 1 and clock.sleeps == []


def test_each_retry_is_a_tool_call_the_host_counts(host: FakeHost, ctx: AgentContext, clock: Clock) -> None:
    host.tools += [failed_tool(1, 4), failed_tool(2, 3), ok_tool('"third time"', 3, 2)]
    r = ctx.run_tool("word-tools", "t", retry=True, text="x")
    assert r.success and r.result == "third time"
    assert clock.sleeps == [1.0, 2.0]  # min(base·2^(n-1), max) with the runtime's defaults
    assert [q.arguments_json for q in host.tool_requests] == ['{"text": "x"}'] * 3
    assert (ctx.tool_calls_made, ctx.tools_remaining) == (3, 2)


def test_retries_stop_at_the_cap(host: FakeHost, ctx: AgentContext, clock: Clock) -> None:
    host.tools += [failed_tool(5, 0)]
    assert ctx.run_tool_with_retry("word-tools", max_retries=9).error == "tool raised ValueError"
    assert len(host.tool_requests) == 1 and clock.sleeps == []  # the host said no calls are left


def test_retries_stop_quietly_when_the_host_refuses_the_cap(host: FakeHost, ctx: AgentContext) -> None:
    host.tools += [failed_tool(4, 1), Refusal(RE, "TOOL_CALL_LIMIT")]  # another thread took the last call
    r = ctx.run_tool("word-tools", retry=True)
    assert core(r) == (False, None, "tool raised ValueError", "host_worker")
    assert len(host.tool_requests) == 2 and ctx.tools_remaining == 0


def test_refusals_are_never_retried(served: Served, clock: Clock) -> None:
    served.host.tools += [Refusal(grpc.StatusCode.NOT_FOUND, "TOOL_NOT_FOUND"), failed_tool(1, 4), Refusal(
        grpc.StatusCode.DEADLINE_EXCEEDED, "RUN_DEADLINE")]  # fmt: skip
    with context_for(served, clock, task_with_limits(stop_on_consecutive_errors=9)) as ctx:
        assert ctx.run_tool_with_retry("word-tools").error == "TOOL_NOT_FOUND: refused by the fake host"
        assert ctx.run_tool_with_retry("word-tools").error == "RUN_DEADLINE: refused by the fake host"
    assert len(served.host.tool_requests) == 3 and clock.sleeps == [1.0]


def test_backoff_is_clamped_and_never_runs_past_the_deadline(served: Served, clock: Clock) -> None:
    served.host.tools += [failed_tool(1, 9), failed_tool(2, 8), ok_tool("1", 3, 7)]
    with context_for(served, clock, task_with_limits(stop_on_consecutive_errors=9)) as ctx:
        r = ctx.run_tool_with_retry("word-tools", backoff_base=10, backoff_max=1e9)
        assert r.success and clock.sleeps == [10.0, 15.0]  # at most MAX_BACKOFF_SECONDS a sleep
    clock.sleeps.clear()
    served.host.tools += [failed_tool(4, 6)]
    limits = session_pb2.RunLimits(max_tool_calls=9, max_iterations=1, max_runtime_seconds=3)
    with context_for(served, clock, make_task(limits=limits)) as ctx:
        assert not ctx.run_tool_with_retry("word-tools", backoff_base=5).success
        assert clock.sleeps == []  # a 5 s sleep would end after the run's 3 s budget


def test_the_breaker_opens_after_three_failures_and_half_opens_after_the_cooldown(
    served: Served, clock: Clock
) -> None:
    host = served.host
    with context_for(served, clock, make_task(allowed_packages=["flaky", "steady"])) as ctx:
        for i in range(3):  # the steady successes keep the consecutive-error run short
            host.tools += [failed_tool(2 * i + 1, 9), ok_tool("1", 2 * i + 2, 8)]
            assert not ctx.run_tool("flaky").success and ctx.run_tool("steady").success
        sent = len(host.tool_requests)
        held = ctx.run_tool("flaky", retry=True)
        assert (held.success, held.mode_used) == (False, "circuit_breaker") and "flaky" in (held.error or "")
        assert len(host.tool_requests) == sent  # never sent, so the host counts nothing
        assert not ctx.is_tool_available("flaky") and ctx.is_tool_available("steady")
        assert ctx.tool_health("flaky") == {
            "slug": "flaky",
            "allowed": True,
            "circuit_breaker": {
                "state": "open", "failure_count": 3, "failure_threshold": 3, "cooldown": 30.0,
            },
        }
        assert ctx.tool_health("other")["allowed"] is False
        clock.now += 30
        assert ctx.is_tool_available("flaky")
        assert ctx.tool_health("flaky")["circuit_breaker"]["state"] == "half_open"
        host.tools.append(ok_tool("1", 7, 2))
        assert ctx.run_tool("flaky").success
        assert ctx.tool_health("flaky")["circuit_breaker"] == {
            "state": "closed", "failure_count": 0, "failure_threshold": 3, "cooldown": 30.0,
        }


def test_run_tool_with_retry_tries_once_even_with_the_breaker_open(served: Served, clock: Clock) -> None:
    with context_for(served, clock, task_with_limits(stop_on_consecutive_errors=10)) as ctx:
        served.host.tools += [failed_tool(i, 9) for i in range(1, 4)]
        for _ in range(3):
            ctx.run_tool("word-tools")
        assert ctx.run_tool("word-tools").mode_used == "circuit_breaker"
        served.host.tools.append(ok_tool('"back"', 4, 1))
        assert ctx.run_tool_with_retry("word-tools").result == "back"
        assert len(served.host.tool_requests) == 4


def test_fallback_skips_disallowed_slugs_and_retries_the_allowed_one(served: Served, clock: Clock) -> None:
    host = served.host
    host.tools += [failed_tool(1, 9, "primary down"), failed_tool(2, 8, "alt hiccup"), ok_tool('"alt"', 3, 7)]
    with context_for(served, clock, make_task(allowed_packages=["main-tools", "alt-tools"])) as ctx:
        r = ctx.run_tool_with_fallback("main-tools", "lookup", fallbacks=["shell-tools", "alt-tools"], q=1)
        assert r.success and r.result == "alt"
    assert [(q.package_slug, q.tool_name) for q in host.tool_requests] == [
        ("main-tools", "lookup"), ("alt-tools", "lookup"), ("alt-tools", "lookup"),
    ]
    assert clock.sleeps == [1.0]  # the primary ran once, without retry


def test_fallback_returns_the_last_failure(served: Served, clock: Clock) -> None:
    served.host.tools += [failed_tool(1, 9, "primary down")]
    with context_for(served, clock, make_task(allowed_packages=["main-tools"])) as ctx:
        r = ctx.run_tool_with_fallback("main-tools", fallbacks=["not-allowed"])
        assert r.error == "primary down"
        assert ctx.run_tool_with_fallback("main-tools").error.startswith("HOST_ERROR")  # type: ignore[union-attr]


def test_llm_calls_made_counts_completions_only(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [completion("a"), Refusal(RE, "LLM_CALL_LIMIT"), completion("b")]
    host.streams.append(Stream(("x",)))
    assert ctx.call_llm("q", tool_context=ctx.allowed_tool_context()).content == "a"
    with pytest.raises(LlmAccessError):
        ctx.call_llm_text("q")
    assert ctx.run_llm_tool_loop([{"role": "user", "content": "q"}]).content == "b"
    assert list(ctx.stream_llm("q")) == ["x"]
    assert ctx.llm_calls_made == 3


def test_a_system_message_anywhere_keeps_the_manifest_prompt_out(host: FakeHost, ctx: AgentContext) -> None:
    host.llm.append(completion("ok"))
    ctx.call_llm([{"role": "user", "content": "q"}, {"role": "system", "content": "mine"}])
    assert host.llm_requests == [[("user", "q"), ("system", "mine")]]


def test_finishing_the_run_stops_pending_retries(host: FakeHost, served: Served) -> None:
    host.tools += [failed_tool(1, 4)]
    channel = open_channel(served.socket_path)
    try:
        ctx = AgentContext(channel, host.task)  # the real, event-backed sleep
        ctx._finish()
        assert not ctx.run_tool("word-tools", retry=True).success
    finally:
        channel.close()
    assert len(host.tool_requests) == 1


def test_the_wrapper_finds_the_run_files_where_the_host_mounts_them() -> None:
    from host.engine.contract import INPUTS_IN_CONTAINER, OUTPUTS_IN_CONTAINER, WORKSPACE_IN_CONTAINER
    from sandbox_wrapper import _context

    assert (_context.WORKSPACE_DIR, _context.INPUTS_DIR, _context.OUTPUTS_DIR) == (
        WORKSPACE_IN_CONTAINER, INPUTS_IN_CONTAINER, OUTPUTS_IN_CONTAINER)  # fmt: skip
