"""What the tool-calling tests share (test_toolcalls.py, test_translate.py): a catalog, calls and a loop."""

from __future__ import annotations

from typing import Any

from host.llm.toolcalls import LlmCall, ToolCatalog, build_catalog, check_tools, prepare
from host.spec.manifest.model import ToolSpec

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
REVERSE = "word-tools:reverse_words"
COUNT = "word-tools:count"
CATALOG = build_catalog(
    [
        ("word-tools", [ToolSpec("reverse_words", "", "Reverse the words of a text", SCHEMA),
                        ToolSpec("count", "", "", None)]),
        ("text-kit", [ToolSpec("upper", "", "Upper-case", {"properties": {"s": {"type": "string"}}})]),
    ]
)  # fmt: skip
USER = {"role": "user", "content": "reverse 'a b'"}


def tools_call(tools: list[str] | None = None, **kwargs: Any) -> LlmCall:
    return LlmCall(
        messages=kwargs.pop("messages", [USER]), tools=[REVERSE] if tools is None else tools, **kwargs
    )


def prepared(call: LlmCall, catalog: ToolCatalog = CATALOG) -> Any:
    return prepare(call, check_tools(call.tools, catalog))


LOOP: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    USER,
    {
        "role": "assistant",
        "content": "let me",
        "tool_calls": [
            {"id": "call_1", "name": REVERSE, "arguments": '{"text": "a b"}'},
            {"id": "call_2", "name": COUNT, "arguments": "{}"},
        ],
    },
    {"role": "tool", "tool_call_id": "call_2", "content": "2"},
    {"role": "tool", "tool_call_id": "call_1", "content": '"b a"'},
    {"role": "user", "content": "and now?"},
]
