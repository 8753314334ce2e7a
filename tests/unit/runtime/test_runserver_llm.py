"""The run server's LlmService: every LLM refusal at its canonical status, the call cap atomic under
concurrency, streaming, the key never crossing, input counted on the wire, tool definitions and the
model's tool calls, the grant's budgets."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from host.policy.rules import LlmPolicy
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour
from tests.unit.runtime._support import (
    CANARY,
    GRANT,
    HELLO,
    HOST_SECRET,
    LLM_METHOD,
    Env,
    Run,
    assert_refused,
    messages_request,
    raw_call,
    refused,
)

# --- every refusal reason, through the wire ------------------------------------------------------------


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


# --- concurrency: the cap is atomic across the wire ----------------------------------------------------


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


# --- streaming -----------------------------------------------------------------------------------------


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


# --- nothing secret crosses ----------------------------------------------------------------------------


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


# --- input is counted on the wire ----------------------------------------------------------------------


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


# --- tool definitions and the model's tool calls (issue 15) --------------------------------------------


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
