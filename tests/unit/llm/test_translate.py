"""The OpenAI and Anthropic wire forms as data (host/llm/translate.py): requests for a prepared call, and the
tool calls a completion returns, whole or streamed, normalized."""

from __future__ import annotations

import json

import pytest

from host.llm.toolcalls import RESPONSE_TOOL, LlmCall, ModelToolCall
from host.llm.translate import (
    JSON_INSTRUCTION,
    RESPONSE_TOOL_DESCRIPTION,
    CallDelta,
    CallStream,
    anthropic_request,
    model_call,
    openai_request,
)
from tests.unit.llm._tools import COUNT, LOOP, REVERSE, SCHEMA, USER, prepared, tools_call

# --- provider requests --------------------------------------------------------------------------------------


def test_openai_request_mapping() -> None:
    p = prepared(LlmCall(LOOP, tools=[REVERSE, COUNT], tool_choice="required"))
    assert openai_request(p) == {
        "messages": [
            {"role": "system", "content": "be brief"},
            USER,
            {
                "role": "assistant",
                "content": "let me",
                "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "word-tools__reverse_words", "arguments": '{"text":"a b"}'}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "word-tools__count", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "2"},
            {"role": "tool", "tool_call_id": "call_1", "content": '"b a"'},
            {"role": "user", "content": "and now?"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "word-tools__reverse_words",
                                              "description": "Reverse the words of a text",
                                              "parameters": SCHEMA}},
            {"type": "function", "function": {"name": "word-tools__count", "parameters": {"type": "object"}}},
        ],
        "tool_choice": "required",
    }  # fmt: skip


def test_anthropic_request_mapping() -> None:
    p = prepared(LlmCall(LOOP, tools=[REVERSE, COUNT], tool_choice="required"))
    assert anthropic_request(p) == {
        "system": "be brief",
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "let me"},
                    {"type": "tool_use", "id": "call_1", "name": "word-tools__reverse_words",
                     "input": {"text": "a b"}},
                    {"type": "tool_use", "id": "call_2", "name": "word-tools__count", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "2"},
                    {"type": "tool_result", "tool_use_id": "call_1", "content": '"b a"'},
                ],
            },
            {"role": "user", "content": "and now?"},
        ],
        "tools": [
            {"name": "word-tools__reverse_words", "description": "Reverse the words of a text",
             "input_schema": SCHEMA},
            {"name": "word-tools__count", "input_schema": {"type": "object"}},
        ],
        "tool_choice": {"type": "any"},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "openai", "anthropic"),
    [("", None, None), ("auto", "auto", {"type": "auto"}), ("none", "none", {"type": "none"}),
     ("required", "required", {"type": "any"})],
)  # fmt: skip
def test_tool_choice_mapping(choice: str, openai: str | None, anthropic: dict[str, str] | None) -> None:
    p = prepared(tools_call(tool_choice=choice))
    assert openai_request(p).get("tool_choice") == openai
    assert anthropic_request(p).get("tool_choice") == anthropic
    if choice in ("auto", "none"):  # without tools there is nothing to choose (required: INVALID_REQUEST)
        assert "tool_choice" not in openai_request(prepared(LlmCall([USER], tool_choice=choice)))


def test_json_modes_per_provider() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    as_schema = {"type": "json_schema", "name": "count", "schema": json.dumps(schema)}
    p = prepared(LlmCall([USER], response_format=as_schema))
    assert openai_request(p)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "count", "schema": schema},
    }  # fmt: skip
    response_tool = {"name": RESPONSE_TOOL, "description": RESPONSE_TOOL_DESCRIPTION, "input_schema": schema}
    assert anthropic_request(p)["tools"] == [response_tool]
    assert anthropic_request(p)["tool_choice"] == {"type": "tool", "name": RESPONSE_TOOL}
    # json_object: OpenAI needs the word JSON in the messages; the host adds a fixed line when none says it.
    p = prepared(LlmCall([USER], response_format={"type": "json_object"}))
    assert openai_request(p)["messages"][0] == {"role": "system", "content": JSON_INSTRUCTION}
    assert anthropic_request(p)["tools"][0]["input_schema"] == {"type": "object"}
    said = prepared(
        LlmCall([{"role": "user", "content": "answer in JSON"}], response_format={"type": "json_object"})
    )
    assert openai_request(said)["messages"] == [{"role": "user", "content": "answer in JSON"}]
    # With tools, Anthropic offers the response tool beside them and the model must call one of them.
    p = prepared(tools_call(response_format={"type": "json_object"}))
    assert [t["name"] for t in anthropic_request(p)["tools"]] == ["word-tools__reverse_words", RESPONSE_TOOL]
    assert anthropic_request(p)["tool_choice"] == {"type": "any"}
    p = prepared(tools_call(tool_choice="none", response_format={"type": "json_object"}))
    assert anthropic_request(p)["tool_choice"] == {"type": "tool", "name": RESPONSE_TOOL}
    # Plain text is no format at all.
    assert "response_format" not in openai_request(
        prepared(LlmCall([USER], response_format={"type": "text"}))
    )


# --- provider responses -------------------------------------------------------------------------------------


def test_model_calls_are_normalized_whatever_the_provider_sent() -> None:
    p = prepared(tools_call())
    assert model_call(p, "call_1", "word-tools__reverse_words", '{ "text" : "a b" }') == ModelToolCall(
        "call_1", REVERSE, '{"text":"a b"}'
    )
    assert (
        model_call(p, "toolu_1", "word-tools__reverse_words", {"text": "a b"}).arguments_json
        == '{"text":"a b"}'
    )
    assert model_call(p, "c", "word-tools__reverse_words", "").arguments_json == "{}"
    # Undefined tools (the mapping is per request: the catalog name itself is not a provider name).
    for name in (REVERSE, "word-tools__count", "rm\x1b[31m"):
        call = model_call(p, "call_2", name, "{}")
        assert call.refused and call.name == name.replace("\x1b", "?")
    # Arguments that are not a JSON object: refused, with {}.
    for arguments in ("[1]", "{nope", '{"x": NaN}', {"x": float("inf")}, None):
        call = model_call(p, "call_3", "word-tools__reverse_words", arguments)
        assert (call.refused, call.name, call.arguments_json) == (True, REVERSE, "{}")
    # An id we could not send back is replaced.
    assert model_call(p, "bad id!", "word-tools__reverse_words", "{}").id.startswith("call_")
    assert model_call(p, None, "word-tools__reverse_words", "{}").id.startswith("call_")


def test_streamed_calls_are_assembled_in_order() -> None:
    stream = CallStream(prepared(tools_call()))
    assert stream.piece(0, "call_a", "word-tools__reverse_words", "") == CallDelta(0, "call_a", REVERSE, "")
    assert stream.piece(1, "call_b", "nope", '{"x"') == CallDelta(1, "call_b", "nope", '{"x"')
    assert stream.piece(0, arguments='{"text": ') == CallDelta(0, arguments='{"text": ')
    assert stream.piece(1, arguments=":1}") == CallDelta(1, arguments=":1}")
    assert stream.piece(0, arguments='"a b"}') == CallDelta(0, arguments='"a b"}')
    assert stream.calls() == (
        ModelToolCall("call_a", REVERSE, '{"text":"a b"}'),
        ModelToolCall("call_b", "nope", '{"x":1}', refused=True),
    )
