"""The OpenAI and Anthropic wire forms of tool calling and structured output, as data: the request fields
for a `Prepared` request (host/llm/toolcalls.py validated it), and the tool calls a completion returns,
whole or streamed, normalized back to the contract's `ModelToolCall` whichever API they came from (the
mappings themselves are described in host/llm/toolcalls.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from host.core.strictjson import JsonRejected, check_finite, loads_strict, utf8_len
from host.llm.toolcalls import (
    FORMAT_JSON_OBJECT,
    MAX_TOOL_CALLS,
    MAX_TOOL_NAME_CHARS,
    RESPONSE_TOOL,
    ModelToolCall,
    Prepared,
    ToolDef,
    canonical_json,
)
from host.tools.calls import MAX_ARGUMENTS_BYTES

RESPONSE_TOOL_DESCRIPTION = (
    "Give your final answer with this tool: its input is the whole answer, a JSON object "
    "(matching the input schema). Call it once."
)
JSON_INSTRUCTION = "Respond with a single JSON object."
"""Added as a system message for OpenAI's json_object mode when no message mentions JSON."""

_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]")


# --- provider requests ------------------------------------------------------------------------------------


def openai_request(p: Prepared) -> dict[str, Any]:
    """The chat-completions fields for `p` (besides model, bounds and stream flags)."""
    messages: list[dict[str, Any]] = []
    fmt = p.response_format
    if (
        fmt is not None
        and fmt.type == FORMAT_JSON_OBJECT
        and not any("json" in m.content.lower() for m in p.messages)
    ):
        messages.append({"role": "system", "content": JSON_INSTRUCTION})
    for m in p.messages:
        if m.role == "tool":
            messages.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": p.provider_name(c), "arguments": c.arguments_json},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            messages.append({"role": m.role, "content": m.content})
    request: dict[str, Any] = {"messages": messages}
    if p.tools:
        request["tools"] = [
            {"type": "function", "function": _function(p.names[t.name], t, "parameters")} for t in p.tools
        ]
        if p.tool_choice:
            request["tool_choice"] = p.tool_choice
    if fmt is not None:
        if fmt.type == FORMAT_JSON_OBJECT:
            request["response_format"] = {"type": "json_object"}
        else:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": fmt.name, "schema": fmt.schema},
            }
    return request


def _function(name: str, t: ToolDef, schema_key: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if t.description:
        out["description"] = t.description
    out[schema_key] = t.parameters
    return out


def anthropic_request(p: Prepared) -> dict[str, Any]:
    """The messages-API fields for `p` (besides model and max_tokens): system hoisted, tool calls as
    tool_use blocks, results as tool_result blocks (consecutive ones in one user message), JSON modes as a
    forced response tool."""
    # Empty system messages add nothing but separators, so they are dropped, not joined.
    system = "\n\n".join(m.content for m in p.messages if m.role == "system" and m.content)
    messages: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # the open user message of tool results
    for m in p.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if results is None:
                results = [block]
                messages.append({"role": "user", "content": results})
            else:
                results.append(block)
            continue
        results = None
        if m.tool_calls:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            for c in m.tool_calls:
                arguments = json.loads(c.arguments_json)
                blocks.append(
                    {"type": "tool_use", "id": c.id, "name": p.provider_name(c), "input": arguments}
                )
            messages.append({"role": "assistant", "content": blocks})
        else:
            messages.append({"role": m.role, "content": m.content})
    request: dict[str, Any] = {"messages": messages}
    if system:
        request["system"] = system
    tools = [_function(p.names[t.name], t, "input_schema") for t in p.tools]
    choice: dict[str, Any] | None = {"auto": {"type": "auto"}, "none": {"type": "none"},
                                     "required": {"type": "any"}}.get(p.tool_choice)  # fmt: skip
    fmt = p.response_format
    if fmt is not None and p.tool_choice != "required":
        schema = fmt.schema if fmt.schema is not None else {"type": "object"}
        response = {"name": RESPONSE_TOOL, "description": RESPONSE_TOOL_DESCRIPTION, "input_schema": schema}
        tools.append(response)
        if p.tools and p.tool_choice in ("", "auto"):
            choice = {"type": "any"}  # a tool call, or the answer through the response tool
        else:
            choice = {"type": "tool", "name": RESPONSE_TOOL}
    if tools:
        request["tools"] = tools
        if choice is not None:
            request["tool_choice"] = choice
    return request


# --- provider responses -------------------------------------------------------------------------------------


def _printable(name: str) -> str:
    return _NOT_PRINTABLE.sub("?", name[:MAX_TOOL_NAME_CHARS])


def model_call(
    p: Prepared, call_id: Any, provider_name: Any, arguments: Any, taken: set[str] | None = None
) -> ModelToolCall:
    """One tool call a completion returned, normalized: the catalog name for a function the request
    defined (else refused, under the model's own name), arguments (text or a dict) as canonical JSON text of
    an object (else refused with `{}`), the provider's id when it is one we can send back and is not in use
    (`Prepared.call_id`; `taken` holds the ids of the completion's calls so far), else a new one."""
    cid = p.call_id(call_id, set() if taken is None else taken)
    raw_name = provider_name if isinstance(provider_name, str) else ""
    name = p.reverse.get(raw_name)
    try:
        if isinstance(arguments, str):
            value = loads_strict(arguments or "{}", max_bytes=MAX_ARGUMENTS_BYTES)
        else:
            check_finite(arguments)
            value = arguments
        if not isinstance(value, dict):
            raise JsonRejected("not an object")
        text = canonical_json(value)
        if utf8_len(text) > MAX_ARGUMENTS_BYTES:
            raise JsonRejected("too large")
    except (JsonRejected, TypeError, ValueError):
        return ModelToolCall(cid, name or _printable(raw_name), "{}", refused=True)
    if name is None:
        return ModelToolCall(cid, _printable(raw_name), text, refused=True)
    return ModelToolCall(cid, name, text)


@dataclass(frozen=True)
class CallDelta:
    """A piece of a streamed tool call: `id` and `name` on its first piece, then argument text."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Partial:
    index: int
    id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)
    size: int = 0


class TooManyToolCalls(Exception):
    """A completion returned more than MAX_TOOL_CALLS calls or more argument text than a call may have."""


class CallStream:
    """Assembles streamed tool calls (OpenAI's indexed deltas, Anthropic's tool_use blocks) into
    `CallDelta`s as they come and `ModelToolCall`s at the end."""

    def __init__(self, prepared: Prepared) -> None:
        self._p = prepared
        self._calls: dict[int, _Partial] = {}
        self._ids: set[str] = set()

    def piece(self, key: int, call_id: Any = None, name: Any = None, arguments: Any = None) -> CallDelta:
        """Record a piece of the call the provider keys by `key`; the delta to forward."""
        partial = self._calls.get(key)
        first = partial is None
        if partial is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise TooManyToolCalls
            partial = self._calls[key] = _Partial(index=len(self._calls))
            partial.id = self._p.call_id(call_id, self._ids)
        if isinstance(name, str) and name:
            partial.name += name[: MAX_TOOL_NAME_CHARS + 1 - len(partial.name)]
        piece = arguments if isinstance(arguments, str) else ""
        partial.size += len(piece)
        if partial.size > MAX_ARGUMENTS_BYTES:
            raise TooManyToolCalls
        if piece:
            partial.pieces.append(piece)
        if not first:
            return CallDelta(partial.index, arguments=piece)
        shown = self._p.reverse.get(partial.name) or _printable(partial.name)
        return CallDelta(partial.index, partial.id, shown, piece)

    def calls(self) -> tuple[ModelToolCall, ...]:
        """The completed calls, in the model's order."""
        return tuple(
            model_call(self._p, c.id, c.name, "".join(c.pieces), set())  # ids were made unique in piece()
            for c in sorted(self._calls.values(), key=lambda c: c.index)
        )


__all__ = [
    "JSON_INSTRUCTION",
    "RESPONSE_TOOL_DESCRIPTION",
    "CallDelta",
    "CallStream",
    "TooManyToolCalls",
    "anthropic_request",
    "model_call",
    "openai_request",
]
