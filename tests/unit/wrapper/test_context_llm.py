"""AgentContext's model-facing surface (issue 15) against the fake host: the run's tool context, tool calls,
structured output, the tool loop, streams with tool calls, and the awaitable variants."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sandbox_wrapper import AgentContext, AgentTerminated, LlmAccessError, LlmResult, ToolContext
from sandbox_wrapper._client import open_channel
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2, session_pb2, tools_pb2
from sandbox_wrapper._runner import _await, execute
from tests.support.fake_host import FakeHost, Refusal, Served, Stream, make_task, serve

PD = grpc.StatusCode.PERMISSION_DENIED
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
COUNT = llm_pb2.ToolDefinition(
    name="word-tools:count_words",
    description="Count the words of a text.",
    parameters_json='{"type": "object", "properties": {"text": {"type": "string"}}}',
)
UPPER = llm_pb2.ToolDefinition(name="word-tools:upper", description="", parameters_json="{}")
OFFERED = {COUNT.name, UPPER.name}
CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
FRESH_ID = re.compile(r"call_[0-9a-f]{24}")


@pytest.fixture
def host() -> FakeHost:
    return FakeHost(task=make_task(system_prompt="Be brief."), tool_definitions=[COUNT, UPPER])


@pytest.fixture
def served(host: FakeHost) -> Iterator[Served]:
    running = serve(host)
    yield running
    running.stop()


@pytest.fixture
def ctx(served: Served) -> Iterator[AgentContext]:
    channel = open_channel(served.socket_path)
    yield AgentContext(channel, served.host.task, sleep=lambda _: None)
    channel.close()


def context_on(served: Served, task: session_pb2.FetchTaskResponse) -> AgentContext:
    return AgentContext(open_channel(served.socket_path), task, sleep=lambda _: None)


def ok_tool(result_json: str, made: int = 1) -> tools_pb2.RunToolResponse:
    return tools_pb2.RunToolResponse(
        success=True, result_json=result_json, mode_used="host_worker", tool_calls_made=made,
        tools_remaining=5 - made,
    )


def failed_tool(made: int = 1, error: str = "tool raised ValueError") -> tools_pb2.RunToolResponse:
    return tools_pb2.RunToolResponse(
        success=False, error=error, mode_used="host_worker", tool_calls_made=made, tools_remaining=5 - made,
    )


def call(call_id: str, name: str, arguments: str = "{}", refused: bool = False) -> llm_pb2.ToolCall:
    return llm_pb2.ToolCall(id=call_id, name=name, arguments_json=arguments, refused=refused)


def upper(call_id: str, text: str) -> llm_pb2.ToolCall:
    return call(call_id, "word-tools:upper", json.dumps({"text": text}))


def calling(*calls: llm_pb2.ToolCall, content: str = "") -> llm_pb2.CallLlmResponse:
    """A completion in which the model stopped to call tools."""
    return llm_pb2.CallLlmResponse(
        content=content, finish_reason=llm_pb2.FINISH_REASON_TOOL_CALLS, tool_calls=calls,
        usage=llm_pb2.Usage(input_tokens=10, output_tokens=4),
    )


def completion(content: str) -> llm_pb2.CallLlmResponse:
    return llm_pb2.CallLlmResponse(content=content, finish_reason=llm_pb2.FINISH_REASON_STOP)


def wire(message: llm_pb2.ChatMessage) -> dict[str, Any]:
    """A sent message, compactly: role, content, tool calls as (id, name, arguments, refused), call id."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [(c.id, c.name, c.arguments_json, c.refused) for c in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def sent(host: FakeHost, index: int = -1) -> list[dict[str, Any]]:
    return [wire(m) for m in host.llm_calls[index].messages]


def assert_acceptable(messages: list[dict[str, Any]]) -> None:
    """The host's rules for a conversation's tool calls (host/llm/toolcalls.prepare): each call named (an
    offered tool unless refused), arguments a JSON object, its id [A-Za-z0-9_-]{1,128} and used once in the
    conversation; each tool message answers a call of the assistant message right before it, once; every
    call is answered before the next other message."""
    ids: set[str] = set()
    pending: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message.get("tool_call_id") in pending, message
            pending.discard(message["tool_call_id"])
            continue
        assert not pending, f"unanswered calls {pending} before {message}"
        for call_id, name, arguments, refused in message.get("tool_calls", ()):
            assert CALL_ID.fullmatch(call_id) and call_id not in ids, call_id
            assert name and (refused or name in OFFERED), name
            assert isinstance(json.loads(arguments), dict), arguments
            ids.add(call_id)
            pending.add(call_id)
    assert not pending, f"unanswered calls {pending}"


def answers(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The tool messages as (tool_call_id, content read as JSON when it is JSON)."""
    out: list[tuple[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            try:
                content = json.loads(m["content"])
            except ValueError:
                content = m["content"]
            out.append((m["tool_call_id"], content))
    return out


@dataclass
class BudgetHost(FakeHost):
    """A FakeHost whose final stream chunk reports the run's tokens left (None: a run without the cap)."""

    tokens_remaining: int | None = None

    def StreamLlm(
        self, request: llm_pb2.StreamLlmRequest, context: Any
    ) -> Iterator[llm_pb2.StreamLlmResponse]:
        for chunk in super().StreamLlm(request, context):
            if chunk.done and self.tokens_remaining is not None:
                chunk.usage.tokens_remaining = self.tokens_remaining
            yield chunk


# --- allowed_tool_context ----------------------------------------------------------------------------------


def test_the_tool_context_is_the_hosts_list_asked_for_once(host: FakeHost, ctx: AgentContext) -> None:
    tools = ctx.allowed_tool_context()
    assert isinstance(tools, ToolContext) and tools.has_tools
    assert tools.allowed_packages == ["word-tools"]
    assert tools.tool_specs == [
        {
            "name": "word-tools:count_words",
            "description": "Count the words of a text.",
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
        {"name": "word-tools:upper", "description": "", "input_schema": {}},
    ]
    tools.tool_specs[0]["input_schema"]["properties"] = {}  # the agent's copy, not the cache
    tools.tool_specs.pop()
    again = ctx.allowed_tool_context()
    assert len(again.tool_specs) == 2 and again.tool_specs[0]["input_schema"]["properties"] != {}
    assert host.list_tools_calls == 1


def test_an_absent_allowlist_lists_the_slugs_of_the_listed_tools(served: Served) -> None:
    served.host.tool_definitions += [llm_pb2.ToolDefinition(name="text-kit:slugify", parameters_json="{}")]
    ctx = context_on(served, make_task(allowed_packages=[], any_package=True))
    tools = ctx.allowed_tool_context()
    assert tools.allowed_packages == ["word-tools", "text-kit"] and len(tools.tool_specs) == 3


def test_an_empty_allowlist_asks_the_host_nothing(served: Served) -> None:
    ctx = context_on(served, make_task(allowed_packages=[]))
    tools = ctx.allowed_tool_context()
    assert (tools.allowed_packages, tools.tool_specs, tools.has_tools) == ([], [], False)
    assert served.host.list_tools_calls == 0


@pytest.mark.parametrize(
    "refusal",
    [
        Refusal(RE, "TOO_MANY_REFUSALS", "slow down"),
        Refusal(grpc.StatusCode.INTERNAL, "HOST_ERROR", "boom"),
        Refusal(grpc.StatusCode.INTERNAL, "", "outside the error model"),
    ],
)
def test_a_failed_listing_is_an_empty_context_asked_again_later(
    host: FakeHost, ctx: AgentContext, refusal: Refusal
) -> None:
    host.list_tools_refusal = refusal
    tools = ctx.allowed_tool_context()
    assert (tools.allowed_packages, tools.tool_specs, tools.has_tools) == (["word-tools"], [], False)
    host.list_tools_refusal = None
    assert len(ctx.allowed_tool_context().tool_specs) == 2
    assert host.list_tools_calls == 2


def test_a_host_without_list_tools_offers_no_tools_and_is_not_asked_again(
    host: FakeHost, ctx: AgentContext
) -> None:
    host.list_tools_refusal = Refusal(grpc.StatusCode.UNIMPLEMENTED, "", "Method not found!")
    assert not ctx.allowed_tool_context().has_tools
    assert not ctx.allowed_tool_context().has_tools
    assert host.list_tools_calls == 1


def test_the_tool_context_never_raises_even_with_the_host_gone(served: Served, ctx: AgentContext) -> None:
    served.stop()
    tools = ctx.allowed_tool_context()
    assert tools.allowed_packages == ["word-tools"] and tools.tool_specs == []


def test_a_schema_that_is_not_a_json_object_reads_as_empty(host: FakeHost, ctx: AgentContext) -> None:
    host.tool_definitions = [
        llm_pb2.ToolDefinition(name="word-tools:a", parameters_json="[1]"),
        llm_pb2.ToolDefinition(name="word-tools:b", parameters_json='{"x": NaN}'),
        llm_pb2.ToolDefinition(name="word-tools:c"),
    ]
    assert [s["input_schema"] for s in ctx.allowed_tool_context().tool_specs] == [{}, {}, {}]


# --- llm_limits and the token budget in usage --------------------------------------------------------------


def test_llm_limits_are_the_grant_with_none_for_absent_caps(host: FakeHost, ctx: AgentContext) -> None:
    assert ctx.llm_limits == {
        "enabled": True, "max_calls": 3, "max_input_chars": 4000, "max_output_chars": 2000,
        "max_input_tokens": None, "max_output_tokens": None, "max_total_tokens": None, "max_cost_usd": None,
    }  # fmt: skip


def test_llm_limits_carry_the_token_and_cost_caps(served: Served) -> None:
    grant = session_pb2.LlmGrant(
        enabled=True, max_calls=9, max_input_chars=100, max_output_chars=50, max_input_tokens=1000,
        max_output_tokens=0, max_total_tokens=50_000, max_cost_usd=0.25,
    )  # fmt: skip  # a cap present at 0 is a cap, not an absent one
    ctx = context_on(served, make_task(llm=grant))
    limits = ctx.llm_limits
    assert limits == {
        "enabled": True, "max_calls": 9, "max_input_chars": 100, "max_output_chars": 50,
        "max_input_tokens": 1000, "max_output_tokens": 0, "max_total_tokens": 50_000, "max_cost_usd": 0.25,
    }  # fmt: skip
    limits["max_calls"] = 10**6  # the agent's copy, not a lever
    assert ctx.llm_limits["max_calls"] == 9 and ctx.llm_limits is not ctx.llm_limits


def test_llm_limits_without_a_grant_read_as_no_calls(served: Served) -> None:
    ctx = context_on(served, make_task(llm=None))
    assert ctx.llm_limits == dict.fromkeys(
        ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd"), None
    ) | {"enabled": False, "max_calls": 0, "max_input_chars": 0, "max_output_chars": 0}


@pytest.mark.parametrize("left", [None, 0, 4096])
def test_call_usage_has_tokens_remaining_only_when_the_host_reports_it(
    host: FakeHost, ctx: AgentContext, left: int | None
) -> None:
    usage = llm_pb2.Usage(input_tokens=7, output_tokens=2, tokens_remaining=left)
    host.llm.append(llm_pb2.CallLlmResponse(content="x", usage=usage))
    expected = {"prompt_tokens": 7, "completion_tokens": 2, "input_tokens": 7, "output_tokens": 2}
    if left is not None:
        expected["tokens_remaining"] = left
    assert ctx.call_llm("q").usage == expected


@pytest.mark.parametrize("left", [None, 0, 4096])
def test_stream_usage_has_tokens_remaining_only_when_the_host_reports_it(left: int | None) -> None:
    running = serve(BudgetHost(task=make_task(), tokens_remaining=left))
    try:
        running.host.streams.append(Stream(("a", "b")))
        ctx = context_on(running, running.host.task)
        stream = ctx.stream_llm("q")
        assert list(stream) == ["a", "b"] and stream.result is not None
        expected = {"prompt_tokens": 1, "completion_tokens": 2, "input_tokens": 1, "output_tokens": 2}
        if left is not None:
            expected["tokens_remaining"] = left
        assert stream.result.usage == expected
    finally:
        running.stop()


# --- call_llm: requests ------------------------------------------------------------------------------------


def test_without_options_the_request_is_exactly_the_plain_one(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [completion("a"), completion("b")]
    ctx.call_llm("q")
    ctx.call_llm("q", tool_context=ToolContext(allowed_packages=["word-tools"]))  # no specs: no tools
    system = llm_pb2.ChatMessage(role="system", content="Be brief.")
    plain = llm_pb2.CallLlmRequest(messages=[system, llm_pb2.ChatMessage(role="user", content="q")])
    for request in host.llm_calls:
        assert request == plain and request.SerializeToString() == plain.SerializeToString()
        assert not request.HasField("response_format")


def test_a_tool_context_offers_its_tools_by_name(host: FakeHost, ctx: AgentContext) -> None:
    # The host offers the model its own declaration of each named tool, so only names cross.
    host.llm.append(completion("ok"))
    ctx.call_llm("count", tool_context=ctx.allowed_tool_context())
    (request,) = host.llm_calls
    names = ["word-tools:count_words", "word-tools:upper"]
    assert list(request.tools) == [llm_pb2.ToolDefinition(name=n) for n in names]
    assert request.tool_choice == llm_pb2.TOOL_CHOICE_UNSPECIFIED


def test_tool_specs_in_openai_shape_and_a_filtered_context(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [completion("a"), completion("b")]
    mine = ToolContext(tool_specs=[
        {"type": "function", "function": {"name": "word-tools:upper", "parameters": {"type": "object"}}},
        {"name": "word-tools:count_words", "description": None, "input_schema": "not checked"},
        {"name": "word-tools:upper"},
    ])  # fmt: skip
    ctx.call_llm("q", tool_context=mine)
    assert [t.name for t in host.llm_calls[0].tools] == ["word-tools:upper", "word-tools:count_words"]
    full = ctx.allowed_tool_context()
    full.tool_specs = [s for s in full.tool_specs if s["name"].endswith(":upper")]
    ctx.call_llm("q", tool_context=full)
    assert [t.name for t in host.llm_calls[1].tools] == ["word-tools:upper"]


@pytest.mark.parametrize(
    ("choice", "expected", "offered"),
    [
        ("auto", llm_pb2.TOOL_CHOICE_AUTO, 2),
        ("none", llm_pb2.TOOL_CHOICE_NONE, 2),
        ("required", llm_pb2.TOOL_CHOICE_REQUIRED, 2),
        ("any", llm_pb2.TOOL_CHOICE_REQUIRED, 2),
        ({"type": "required"}, llm_pb2.TOOL_CHOICE_REQUIRED, 2),
        ({"type": "function", "function": {"name": "word-tools:upper"}}, llm_pb2.TOOL_CHOICE_REQUIRED, 1),
        ({"type": "tool", "name": "word-tools:upper"}, llm_pb2.TOOL_CHOICE_REQUIRED, 1),
    ],
)
def test_tool_choice_maps_to_the_wire(
    host: FakeHost, ctx: AgentContext, choice: Any, expected: int, offered: int
) -> None:
    host.llm.append(completion("ok"))
    ctx.call_llm("q", tool_context=ctx.allowed_tool_context(), tool_choice=choice)
    (request,) = host.llm_calls
    assert request.tool_choice == expected and len(request.tools) == offered
    if offered == 1:  # a forced tool: required, with only that tool offered
        assert request.tools[0].name == "word-tools:upper"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, llm_pb2.ResponseFormat(type=llm_pb2.RESPONSE_FORMAT_TYPE_TEXT)),
        ({"type": "json_object"}, llm_pb2.ResponseFormat(type=llm_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT)),
        (
            {"type": "json_schema", "json_schema": {"name": "verdict", "strict": True, "schema": {
                "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}},
            llm_pb2.ResponseFormat(
                type=llm_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_name="verdict",
                schema_json='{"type": "object", "properties": {"ok": {"type": "boolean"}}, '
                '"required": ["ok"]}',
            ),
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            llm_pb2.ResponseFormat(type=llm_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_json="{}"),
        ),
    ],
)  # fmt: skip
def test_response_format_maps_to_the_wire(
    host: FakeHost, ctx: AgentContext, fmt: dict[str, Any], expected: llm_pb2.ResponseFormat
) -> None:
    host.llm.append(completion('{"ok": true}'))
    assert ctx.call_llm_text("q", response_format=fmt) == '{"ok": true}'
    (request,) = host.llm_calls
    assert request.response_format == expected and not request.tools


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"response_format": "json"}, TypeError),
        ({"response_format": {"type": "yaml"}}, ValueError),
        ({"response_format": {"type": "json_schema"}}, TypeError),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": 1, "schema": {}}}}, TypeError),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"x": math.nan}}}}, TypeError),
        ({"tool_choice": "sometimes"}, ValueError),
        ({"tool_choice": 1}, TypeError),
        ({"tool_choice": {"type": "function", "function": {"name": "shell:rm"}}}, ValueError),
        ({"tool_context": ["word-tools:upper"]}, TypeError),
        ({"tool_context": ToolContext(tool_specs=[{"name": 3}])}, TypeError),
        ({"tool_context": ToolContext(tool_specs=["word-tools:upper"])}, TypeError),
    ],
)  # fmt: skip
def test_malformed_options_raise_before_anything_is_sent(
    host: FakeHost, ctx: AgentContext, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        ctx.call_llm("q", **kwargs)
    with pytest.raises(error):
        ctx.stream_llm("q", **kwargs)
    assert host.llm_calls == []


def test_assistant_tool_calls_and_tool_results_go_on_the_wire(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [calling(call("c1", "word-tools:count_words", '{"text": "a b"}')), completion("two")]
    first = ctx.call_llm("count a b", tool_context=ctx.allowed_tool_context())
    messages: list[Any] = [
        {"role": "user", "content": "count a b"},
        first,  # an LlmResult is the assistant message, tool calls included
        {"role": "tool", "tool_call_id": "c1", "content": {"count": 2}},
        {"role": "assistant", "content": None, "tool_calls": [  # OpenAI's wire shape, Anthropic's arguments
            {"id": "c2", "type": "function",
             "function": {"name": "word-tools:upper", "arguments": {"t": "é"}}},
        ]},
        {"role": "tool", "tool_call_id": "c2", "content": "A B"},
        {"role": "tool", "tool_call_id": "c3", "content": None},
    ]  # fmt: skip
    assert ctx.call_llm(messages).content == "two"
    assert sent(host) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "count a b"},
        {"role": "assistant", "content": "",
         "tool_calls": [("c1", "word-tools:count_words", '{"text": "a b"}', False)]},
        {"role": "tool", "content": '{"count": 2}', "tool_call_id": "c1"},
        {"role": "assistant", "content": "", "tool_calls": [("c2", "word-tools:upper", '{"t": "é"}', False)]},
        {"role": "tool", "content": "A B", "tool_call_id": "c2"},
        {"role": "tool", "content": "null", "tool_call_id": "c3"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": None},
        {"role": "tool", "tool_call_id": 7, "content": "x"},
        {"role": "tool", "tool_call_id": "c", "content": {"x": object()}},
        {"role": "assistant", "content": "", "tool_calls": "word-tools:upper"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": 5}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": 1, "name": "a:b"}]},
        ("user", "hi"),
    ],
)
def test_malformed_messages_are_type_errors(host: FakeHost, ctx: AgentContext, message: Any) -> None:
    with pytest.raises(TypeError):
        ctx.call_llm([message])
    assert host.llm_calls == []


# --- call_llm: results -------------------------------------------------------------------------------------


def test_tool_calls_come_back_as_ids_names_and_json_text(host: FakeHost, ctx: AgentContext) -> None:
    host.llm.append(calling(
        call("c1", "word-tools:count_words", '{"text": "a b"}'), call("c2", "shell:rm", refused=True),
        call("c3", "word-tools:upper", ""), content="Let me count.",
    ))  # fmt: skip
    result = ctx.call_llm("q", tool_context=ctx.allowed_tool_context())
    assert (result.content, result.finish_reason, result.model) == ("Let me count.", "tool_calls", "")
    assert result.tool_calls == [
        {"id": "c1", "name": "word-tools:count_words", "arguments": '{"text": "a b"}', "refused": False},
        {"id": "c2", "name": "shell:rm", "arguments": "{}", "refused": True},
        {"id": "c3", "name": "word-tools:upper", "arguments": "{}", "refused": False},
    ]
    assert json.loads(result.tool_calls[0]["arguments"]) == {"text": "a b"}
    assert result.usage["prompt_tokens"] == 10 and result.usage["completion_tokens"] == 4
    assert result["tool_calls"] is result.tool_calls and ctx.llm_calls_made == 1


# --- run_llm_tool_loop -------------------------------------------------------------------------------------


def test_the_loop_runs_the_models_calls_and_answers_them_by_id(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [
        calling(call("c1", "word-tools:count_words", '{"text": "a b c"}'), call("c2", "word-tools:upper",
                '{"text": "abc"}'), content="Counting."),
        completion("3 words, ABC"),
    ]  # fmt: skip
    host.tools += [ok_tool('{"count": 3}', 1), ok_tool('"ABC"', 2)]
    messages = [{"role": "user", "content": "count and shout 'a b c'"}]
    result = ctx.run_llm_tool_loop(messages)
    assert (result.content, result.finish_reason, result.tool_calls) == ("3 words, ABC", "stop", None)
    assert messages == [{"role": "user", "content": "count and shout 'a b c'"}]  # not modified
    assert [(r.package_slug, r.tool_name, json.loads(r.arguments_json)) for r in host.tool_requests] == [
        ("word-tools", "count_words", {"text": "a b c"}), ("word-tools", "upper", {"text": "abc"}),
    ]
    assert all(len(r.tools) == 2 for r in host.llm_calls)  # every round offers the run's tools
    assert sent(host, 1)[2:] == [
        {"role": "assistant", "content": "Counting.", "tool_calls": [
            ("c1", "word-tools:count_words", '{"text": "a b c"}', False),
            ("c2", "word-tools:upper", '{"text": "abc"}', False),
        ]},
        {"role": "tool", "content": '{"count": 3}', "tool_call_id": "c1"},
        {"role": "tool", "content": "ABC", "tool_call_id": "c2"},  # a str result as is, as the runtime
    ]  # fmt: skip
    assert (ctx.llm_calls_made, ctx.tool_calls_made) == (2, 2)


def test_the_loop_feeds_failures_and_refusals_back_as_errors(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [
        calling(
            call("c1", "word-tools:count_words", '{"text": 1}'),
            call("c2", "shell:rm", '{"path": "/"}', refused=True),
            call("c3", "word-tools:upper", "[1, 2]"),
            call("c4", "word-tools:upper", '{"entry": "x"}'),
            call("c5", "other-tools:x", "{}"),
            call("c6", "word-tools:count_words", '{"text": "a", "retry": true, "slug": "s", "tool_name": 1}'),
        ),
        completion("done"),
    ]
    host.tools += [failed_tool(1), Refusal(PD, "TOOL_NOT_ALLOWED", "not for you"), ok_tool("null", 2)]
    assert ctx.run_llm_tool_loop("go").content == "done"
    answers = {m["tool_call_id"]: m["content"] for m in sent(host) if m["role"] == "tool"}
    assert {k: json.loads(v) for k, v in answers.items()} == {
        "c1": {"error": "tool raised ValueError"},
        "c2": {"error": "'shell:rm' is not one of the tools offered; it was not run"},
        "c3": {"error": "the arguments for 'word-tools:upper' are not a JSON object; it was not run"},
        "c4": {"error": "'entry' is reserved by the agentnode runtime and cannot be passed to a tool"},
        "c5": {"error": "TOOL_NOT_ALLOWED: not for you"},
        "c6": None,
    }
    # only c1, c5 and c6 reached the host; c6's arguments reach the tool whatever their names
    assert [(r.package_slug, r.tool_name) for r in host.tool_requests] == [
        ("word-tools", "count_words"), ("other-tools", "x"), ("word-tools", "count_words"),
    ]
    assert json.loads(host.tool_requests[2].arguments_json) == {
        "text": "a", "retry": True, "slug": "s", "tool_name": 1,
    }


def test_the_loop_stops_after_max_rounds_with_the_calls_unrun(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [calling(call(f"c{i}", "word-tools:upper", '{"text": "x"}')) for i in range(3)]
    host.tools += [ok_tool('"X"', 1), ok_tool('"X"', 2)]
    result = ctx.run_llm_tool_loop("shout", max_rounds=3)
    assert result.finish_reason == "tool_calls" and result.tool_calls is not None
    assert result.tool_calls[0]["id"] == "c2"
    assert len(host.llm_calls) == 3 and len(host.tool_requests) == 2  # the last round's call is not run
    assert [m.get("tool_call_id") for m in sent(host) if m["role"] == "tool"] == ["c0", "c1"]


def test_the_loop_without_tools_is_one_plain_call(host: FakeHost, ctx: AgentContext) -> None:
    host.tool_definitions = []
    host.llm.append(completion("hi"))
    assert ctx.run_llm_tool_loop([{"role": "user", "content": "q"}], max_rounds=1).content == "hi"
    assert not host.llm_calls[0].tools


def test_the_loop_raises_termination_and_llm_refusals(host: FakeHost, ctx: AgentContext) -> None:
    host.llm.append(calling(*(call(f"c{i}", "word-tools:upper") for i in range(4))))
    host.tools += [failed_tool(i) for i in (1, 2, 3)]
    with pytest.raises(AgentTerminated, match="3 consecutive"):
        ctx.run_llm_tool_loop("q")
    assert len(host.tool_requests) == 3
    host.llm.append(Refusal(RE, "LLM_CALL_LIMIT", "no more"))
    with pytest.raises(LlmAccessError) as info:
        ctx.run_llm_tool_loop("q")
    assert info.value.reason == "LLM_CALL_LIMIT"


@pytest.mark.parametrize(("rounds", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_max_rounds_must_be_a_positive_int(ctx: AgentContext, rounds: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        ctx.run_llm_tool_loop("q", max_rounds=rounds)


def test_the_loop_feeds_back_calls_without_a_slug_and_tool_name(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [
        calling(
            call("c1", ""), call("c2", "upper", '{"text": "a"}'), call("c3", ":upper", "[1]"),
            upper("c4", "a"),
        ),
        completion("done"),
    ]  # fmt: skip
    host.tools.append(ok_tool('"A"', 1))
    assert ctx.run_llm_tool_loop("go").content == "done"
    assert [(r.package_slug, r.tool_name) for r in host.tool_requests] == [("word-tools", "upper")]
    conversation = sent(host)
    assert_acceptable(conversation)
    assert conversation[2]["tool_calls"] == [  # sent back as the host returns a call it did not run
        ("c1", "unnamed", "{}", True), ("c2", "upper", '{"text": "a"}', True), ("c3", ":upper", "{}", True),
        ("c4", "word-tools:upper", '{"text": "a"}', False),
    ]  # fmt: skip
    assert answers(conversation) == [
        ("c1", {"error": "the tool call has no name; it was not run"}),
        ("c2", {"error": "'upper' is not a '<slug>:<tool>' tool name; it was not run"}),
        ("c3", {"error": "':upper' is not a '<slug>:<tool>' tool name; it was not run"}),
        ("c4", "A"),
    ]
    assert ctx.tool_calls_made == 1


def test_the_loop_renames_a_repeated_id_within_one_answer(host: FakeHost, ctx: AgentContext) -> None:
    host.llm += [calling(upper("dup", "a"), upper("dup", "b")), completion("done")]
    host.tools += [ok_tool('"A"', 1), ok_tool('"B"', 2)]
    assert ctx.run_llm_tool_loop("go").content == "done"
    conversation = sent(host)
    assert_acceptable(conversation)
    (first, _, _, _), (second, _, arguments, _) = conversation[2]["tool_calls"]
    assert first == "dup" and FRESH_ID.fullmatch(second) and arguments == '{"text": "b"}'
    assert answers(conversation) == [("dup", "A"), (second, "B")]


def test_the_loop_renames_ids_already_in_the_conversation(host: FakeHost, ctx: AgentContext) -> None:
    earlier = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "name": "word-tools:upper", "arguments": '{"text": "z"}', "refused": False},
    ]}  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "shout"}, earlier, {"role": "tool", "tool_call_id": "c0", "content": "Z"},
    ]  # fmt: skip
    before = copy.deepcopy(messages)
    host.llm += [calling(upper("c0", "a"), upper("c1", "b")), calling(upper("c1", "c")), completion("done")]
    host.tools += [ok_tool('"A"', 1), ok_tool('"B"', 2), ok_tool('"C"', 3)]
    assert ctx.run_llm_tool_loop(messages).content == "done"
    assert messages == before  # the caller's messages and their calls are not modified
    conversation = sent(host)
    assert_acceptable(conversation)
    round1, round2 = conversation[4]["tool_calls"], conversation[7]["tool_calls"]
    assert FRESH_ID.fullmatch(round1[0][0]) and round1[1][0] == "c1" and FRESH_ID.fullmatch(round2[0][0])
    assert answers(conversation) == [("c0", "Z"), (round1[0][0], "A"), ("c1", "B"), (round2[0][0], "C")]
    assert answers(sent(host, 1))[1:] == [(round1[0][0], "A"), ("c1", "B")]  # the same fresh id each round


@pytest.mark.parametrize("bad", ["bad id!", "", "x" * 129, "caf\u00e9", "c 1"])
def test_the_loop_renames_an_id_the_host_would_refuse(host: FakeHost, ctx: AgentContext, bad: str) -> None:
    host.llm += [calling(upper(bad, "a"), upper("ok_1", "b")), completion("done")]
    host.tools += [ok_tool('"A"', 1), ok_tool('"B"', 2)]
    assert ctx.run_llm_tool_loop("go").content == "done"
    conversation = sent(host)
    assert_acceptable(conversation)
    fresh = conversation[2]["tool_calls"][0][0]
    assert FRESH_ID.fullmatch(fresh) and conversation[2]["tool_calls"][1][0] == "ok_1"
    assert answers(conversation) == [(fresh, "A"), ("ok_1", "B")]


def test_the_loop_does_not_modify_the_results_tool_calls(
    host: FakeHost, ctx: AgentContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: list[LlmResult] = []
    call_llm = ctx.call_llm

    def recorded(*args: Any, **kwargs: Any) -> LlmResult:
        results.append(call_llm(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(ctx, "call_llm", recorded)
    host.llm += [calling(call("dup", ""), call("dup", "word-tools:upper")), calling(call("dup", "x:y"))]
    host.tools.append(ok_tool('"A"', 1))
    assert ctx.run_llm_tool_loop("go", max_rounds=2) is results[1]
    assert [c["id"] for r in results for c in r.tool_calls or ()] == ["dup", "dup", "dup"]
    assert results[0].tool_calls == [
        {"id": "dup", "name": "", "arguments": "{}", "refused": False},
        {"id": "dup", "name": "word-tools:upper", "arguments": "{}", "refused": False},
    ]
    assert_acceptable(sent(host))


def test_the_loop_feeds_back_a_tool_name_the_wrapper_cannot_send(
    host: FakeHost, ctx: AgentContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    def malformed(slug: str, *_: Any) -> Any:
        raise ValueError(f"{slug!r} is not a package slug")

    monkeypatch.setattr(ctx, "_run", malformed)
    host.llm += [calling(call("c1", "Word Tools:upper")), completion("done")]
    assert ctx.run_llm_tool_loop("go").content == "done"
    assert answers(sent(host)) == [
        ("c1", {"error": "'Word Tools:upper' could not be called: 'Word Tools' is not a package slug"}),
    ]


# --- stream_llm --------------------------------------------------------------------------------------------


def test_a_stream_puts_tool_call_deltas_together(host: FakeHost, ctx: AgentContext) -> None:
    deltas = [
        llm_pb2.StreamLlmResponse(delta="Let me ", tool_call_deltas=[
            llm_pb2.ToolCallDelta(index=0, id="c1", name="word-tools:count_words", arguments_delta='{"te')]),
        llm_pb2.StreamLlmResponse(tool_call_deltas=[
            llm_pb2.ToolCallDelta(index=1, id="c2", name="word-tools:upper"),
            llm_pb2.ToolCallDelta(index=0, arguments_delta='xt": "a"}')]),
        "count.",
    ]  # fmt: skip
    host.streams.append(Stream(tuple(deltas)))
    stream = ctx.stream_llm("q", tool_context=ctx.allowed_tool_context(), response_format={"type": "text"})
    assert stream.result is None and host.llm_calls == []  # nothing is sent before the first step
    assert list(stream) == ["Let me ", "count."]
    assert stream.result is not None and stream.result.content == "Let me count."
    assert stream.result.tool_calls == [
        {"id": "c1", "name": "word-tools:count_words", "arguments": '{"text": "a"}', "refused": False},
        {"id": "c2", "name": "word-tools:upper", "arguments": "{}", "refused": False},
    ]
    (request,) = host.llm_calls
    assert len(request.tools) == 2 and request.response_format.type == llm_pb2.RESPONSE_FORMAT_TYPE_TEXT
    assert ctx.llm_calls_made == 1


def test_a_streams_final_tool_calls_win_over_its_deltas(host: FakeHost, ctx: AgentContext) -> None:
    host.streams.append(Stream(
        (llm_pb2.StreamLlmResponse(tool_call_deltas=[llm_pb2.ToolCallDelta(index=0, id="c1", name="x:y")]),),
        tool_calls=(call("c1", "x:y", '{"a": 1}', refused=True),),
    ))  # fmt: skip
    with ctx.stream_llm("q") as stream:
        assert list(stream) == []
    assert stream.result is not None
    assert (stream.result.finish_reason, stream.result.content) == ("tool_calls", "")
    assert stream.result.tool_calls == [{"id": "c1", "name": "x:y", "arguments": '{"a": 1}', "refused": True}]


def test_closing_a_stream_cancels_it(host: FakeHost, ctx: AgentContext) -> None:
    host.streams.append(Stream(("a", "b", "c")))
    stream = ctx.stream_llm("q")
    assert next(stream) == "a"
    stream.close()
    assert list(stream) == [] and stream.result is None and ctx.llm_calls_made == 0
    unstarted = ctx.stream_llm("q")
    unstarted.close()
    assert list(unstarted) == [] and len(host.llm_calls) == 1  # never sent


# --- awaitable variants ------------------------------------------------------------------------------------


def test_the_awaitable_variants_run_the_sync_calls(host: FakeHost, ctx: AgentContext) -> None:
    host.tools += [ok_tool('{"count": 2}', 1), Refusal(PD, "TOOL_NOT_ALLOWED"), ok_tool('"AB"', 2),
                   failed_tool(3), ok_tool('"again"', 4)]  # fmt: skip
    host.llm += [completion("one"), completion("two"), calling(call("c1", "word-tools:upper")),
                 completion("three")]  # fmt: skip
    host.streams.append(Stream(("s1", "s2")))

    async def agent() -> dict[str, Any]:
        counted = await ctx.arun_tool("word-tools", "count_words", text="a b")
        refused = await ctx.atry_tool("shell-tools")
        llm = await ctx.acall_llm("q", response_format={"type": "json_object"})
        text = await ctx.acall_llm_text("q")
        loop = await ctx.arun_llm_tool_loop("q")
        retried = await ctx.arun_tool_with_retry("word-tools", backoff_base=0)
        stream = ctx.astream_llm("q")
        chunks = [chunk async for chunk in stream]
        return {
            "counted": counted.result, "refused": refused, "llm": llm.content, "text": text,
            "loop": loop.content, "retried": retried.result, "chunks": chunks,
            "streamed": stream.result.content if stream.result else None,
        }

    assert asyncio.run(agent()) == {
        "counted": {"count": 2}, "refused": None, "llm": "one", "text": "two", "loop": "three",
        "retried": "again", "chunks": ["s1", "s2"], "streamed": "s1s2",
    }
    assert host.llm_calls[0].response_format.type == llm_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT
    assert ctx.llm_calls_made == 5  # one, two, the loop's two rounds, the stream


def test_awaitable_calls_run_concurrently_and_raise_as_the_sync_ones(
    host: FakeHost, ctx: AgentContext
) -> None:
    host.llm += [completion("x")] * 3 + [Refusal(RE, "LLM_CALL_LIMIT")]
    host.tools.append(Refusal(PD, "TOOL_NOT_ALLOWED", "nope"))

    async def agent() -> list[str]:
        texts = await asyncio.gather(*(ctx.acall_llm_text(f"q{i}") for i in range(3)))
        with pytest.raises(LlmAccessError):
            await ctx.acall_llm("q")
        with pytest.raises(PermissionError):
            await ctx.arun_tool_with_fallback("shell-tools")
        return list(texts)

    assert asyncio.run(agent()) == ["x", "x", "x"]


def test_an_async_entrypoint_finishing_ends_retry_waits(ctx: AgentContext) -> None:
    async def agent() -> str:
        return "done"

    assert asyncio.run(_await(agent(), ctx)) == "done"
    assert ctx._finished.is_set()


def test_an_async_agent_awaits_the_tool_loop_through_the_runner(
    host: FakeHost, ctx: AgentContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "async_loop_agent.py").write_text(
        "async def run(context, text):\n"
        "    tools = context.allowed_tool_context()\n"
        "    result = await context.arun_llm_tool_loop([{'role': 'user', 'content': text}])\n"
        "    return {'answer': result.content, 'tools': [s['name'] for s in tools.tool_specs],\n"
        "            'made': context.tool_calls_made}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    host.llm += [calling(call("c1", "word-tools:count_words", '{"text": "a b"}')), completion("2")]
    host.tools.append(ok_tool('{"count": 2}', 1))
    task = make_task(entrypoint="async_loop_agent:run", kwargs_json='{"text": "count a b"}')
    report = execute(ctx, task)
    assert json.loads(report.value_json) == {
        "answer": "2", "tools": ["word-tools:count_words", "word-tools:upper"], "made": 1,
    }
    assert ctx._finished.is_set()
