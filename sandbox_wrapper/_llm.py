"""The LLM wire mapping: AgentContext's arguments (the agentnode runtime's and OpenAI's shapes) to the
sandbox protocol's messages, tool definitions, tool choice and response format, and back.

Only shapes are checked here (a wrong type is a TypeError, an unknown choice a ValueError, both before
anything is sent); every limit is the host's to enforce.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2
from sandbox_wrapper._strictjson import loads_finite

Messages = str | Sequence[Mapping[str, Any]]
"""What call_llm accepts: one user message as text, or messages as dicts (an LlmResult is one)."""

FINISH_REASONS = {
    llm_pb2.FINISH_REASON_STOP: "stop",
    llm_pb2.FINISH_REASON_LENGTH: "length",
    llm_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    llm_pb2.FINISH_REASON_OTHER: "other",
    llm_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
_TOOL_CHOICES = {
    "auto": llm_pb2.TOOL_CHOICE_AUTO,
    "none": llm_pb2.TOOL_CHOICE_NONE,
    "required": llm_pb2.TOOL_CHOICE_REQUIRED,
    "any": llm_pb2.TOOL_CHOICE_REQUIRED,  # Anthropic's spelling of "required"
}
_RESPONSE_FORMATS = {
    "text": llm_pb2.RESPONSE_FORMAT_TYPE_TEXT,
    "json_object": llm_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT,
}
_MESSAGE_SHAPE = "each LLM message must be a mapping with str 'role' and 'content'"


def dumps(value: Any, what: str) -> str:
    """Strict JSON text (no NaN/Infinity), non-ASCII kept as is unless it cannot be encoded (a lone
    surrogate), so the model reads text and the host counts fewer bytes. TypeError when it is not JSON."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"{what} is not JSON: {exc}") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, allow_nan=False)
    return text


# --- requests ----------------------------------------------------------------------------------------------


def chat_messages(messages: Messages) -> list[llm_pb2.ChatMessage]:
    """The wire conversation. A `tool` message's non-text content is sent as its JSON text; an assistant
    message may have no content (None) when it carries `tool_calls`."""
    items: Any = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
    if not isinstance(items, Sequence) or isinstance(items, bytes | bytearray):
        raise TypeError("messages must be a str or a list of message mappings")
    return [_chat_message(m, i) for i, m in enumerate(items)]


def _chat_message(message: Any, index: int) -> llm_pb2.ChatMessage:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise TypeError(f"{_MESSAGE_SHAPE} (message {index})")
    role: str = message["role"]
    content = message.get("content")
    if role == "tool" and not isinstance(content, str):
        content = dumps(content, f"the content of tool message {index}")
    elif role == "assistant" and content is None:
        content = ""
    elif not isinstance(content, str):
        raise TypeError(f"{_MESSAGE_SHAPE} (message {index})")
    chat = llm_pb2.ChatMessage(role=role, content=content)
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, Sequence) or isinstance(calls, str | bytes | bytearray):
            raise TypeError(f"'tool_calls' of message {index} must be a list of tool calls")
        chat.tool_calls.extend(_tool_call(c, index) for c in calls)
    call_id = message.get("tool_call_id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise TypeError(f"'tool_call_id' of message {index} must be a str")
        chat.tool_call_id = call_id
    return chat


def _tool_call(call: Any, index: int) -> llm_pb2.ToolCall:
    """A tool call as LlmResult.tool_calls has it ({id, name, arguments, refused}) or in OpenAI's wire shape
    ({id, type, function: {name, arguments}}); arguments as JSON text or a mapping (Anthropic's)."""
    if not isinstance(call, Mapping):
        raise TypeError(f"each tool call of message {index} must be a mapping")
    function = call.get("function")
    source: Mapping[str, Any] = function if isinstance(function, Mapping) else call
    name, call_id, arguments = source.get("name"), call.get("id") or "", source.get("arguments")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise TypeError(f"each tool call of message {index} needs a str 'name' (and a str 'id')")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = dumps(arguments, f"tool call arguments in message {index}")
    refused = bool(call.get("refused"))
    return llm_pb2.ToolCall(id=call_id, name=name, arguments_json=arguments, refused=refused)


def tool_definitions(tool_context: Any) -> list[llm_pb2.ToolDefinition]:
    """The tools offered to the model, by name: a ToolContext's `tool_specs` (`{name, ...}`, also OpenAI's
    `{type: function, function: {name, ...}}`), each name once. Only names are sent: the host offers the
    model its own declaration of each tool (and refuses a name not on its list), never the agent's text,
    so a spec's description and schema are not sent (and not checked). None offers none."""
    if tool_context is None:
        return []
    specs = getattr(tool_context, "tool_specs", None)
    if not isinstance(specs, Sequence) or isinstance(specs, str | bytes | bytearray):
        raise TypeError("tool_context must be a ToolContext (see allowed_tool_context()) or None")
    names = dict.fromkeys(_tool_name(spec, i) for i, spec in enumerate(specs))
    return [llm_pb2.ToolDefinition(name=name) for name in names]


def _tool_name(spec: Any, index: int) -> str:
    function = spec.get("function") if isinstance(spec, Mapping) else None
    source = function if isinstance(function, Mapping) else spec
    name = source.get("name") if isinstance(source, Mapping) else None
    if not isinstance(name, str):
        raise TypeError(f"tool spec {index} must be a mapping with a str 'name'")
    return name


def tool_choice(
    choice: Any, tools: list[llm_pb2.ToolDefinition]
) -> tuple[llm_pb2.ToolChoice, list[llm_pb2.ToolDefinition]]:
    """(wire choice, tools to send). "auto", "none", "required" (or "any"), also as `{"type": ...}`; a
    forced tool (`{"type": "function", "function": {"name": n}}` or Anthropic's `{"type": "tool", "name":
    n}`) is "required" with only that tool offered, which the model can then only call."""
    if choice is None:
        return llm_pb2.TOOL_CHOICE_UNSPECIFIED, tools
    kind = choice.get("type") if isinstance(choice, Mapping) else choice
    if not isinstance(kind, str):
        raise TypeError("tool_choice must be a str ('auto', 'none', 'required') or a mapping with a 'type'")
    if isinstance(choice, Mapping) and kind in ("function", "tool"):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
        if not isinstance(name, str):
            raise TypeError("a tool_choice naming a tool needs its str 'name'")
        chosen = [t for t in tools if t.name == name]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which tool_context does not offer")
        return llm_pb2.TOOL_CHOICE_REQUIRED, chosen
    if kind not in _TOOL_CHOICES:
        raise ValueError(f"tool_choice {kind!r} is not 'auto', 'none', 'required' or a tool")
    return _TOOL_CHOICES[kind], tools


def response_format(fmt: Any) -> llm_pb2.ResponseFormat | None:
    """OpenAI's response_format: `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}}}` (other keys, such as `strict`, are not sent)."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or not isinstance(fmt.get("type"), str):
        raise TypeError("response_format must be a mapping with a str 'type'")
    kind: str = fmt["type"]
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        name = spec.get("name", "") if isinstance(spec, Mapping) else None
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(name, str) or not isinstance(schema, Mapping):
            raise TypeError(
                "a json_schema response_format needs 'json_schema': {'name': str, 'schema': {...}}"
            )
        return llm_pb2.ResponseFormat(
            type=llm_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
            schema_name=name,
            schema_json=dumps(dict(schema), "the response_format schema"),
        )
    if kind not in _RESPONSE_FORMATS:
        raise ValueError(f"response_format type {kind!r} is not 'text', 'json_object' or 'json_schema'")
    return llm_pb2.ResponseFormat(type=_RESPONSE_FORMATS[kind])


# --- responses ---------------------------------------------------------------------------------------------


def tool_call_dict(call: llm_pb2.ToolCall) -> dict[str, Any]:
    """`{"id", "name", "arguments", "refused"}`, arguments as JSON text (as OpenAI-style clients give it)."""
    arguments = call.arguments_json or "{}"
    return {"id": call.id, "name": call.name, "arguments": arguments, "refused": call.refused}


def tool_spec(definition: llm_pb2.ToolDefinition) -> dict[str, Any]:
    """`{"name", "description", "input_schema"}`, the runtime's tool spec; a schema that is not a JSON
    object reads as `{}`."""
    try:
        schema = loads_finite(definition.parameters_json or "{}")
    except (ValueError, RecursionError):
        schema = {}
    return {
        "name": definition.name,
        "description": definition.description,
        "input_schema": schema if isinstance(schema, dict) else {},
    }


class ToolCallDeltas:
    """Tool calls put together from a stream's deltas, by index (used when the final chunk lists none)."""

    def __init__(self) -> None:
        self._calls: dict[int, tuple[list[str], list[str]]] = {}  # index -> ([id, name], argument pieces)

    def add(self, delta: llm_pb2.ToolCallDelta) -> None:
        head, pieces = self._calls.setdefault(delta.index, (["", ""], []))
        head[0] = delta.id or head[0]
        head[1] = delta.name or head[1]
        if delta.arguments_delta:
            pieces.append(delta.arguments_delta)

    def calls(self) -> list[dict[str, Any]]:
        return [
            {"id": head[0], "name": head[1], "arguments": "".join(pieces) or "{}", "refused": False}
            for _, (head, pieces) in sorted(self._calls.items())
        ]
