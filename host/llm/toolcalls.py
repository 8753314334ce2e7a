"""Tool calling and structured output for the LLM broker, as data: the run's tool catalog, validation of what
an agent asks for and provider-safe names; the OpenAI / Anthropic request and response mappings described
below are host/llm/translate.py.

Nothing here calls a provider or reads a key: `host/llm/session` does, with what `prepare` returns. Everything
an agent sends is checked and bounded here before any provider call (`Rejected`, which the broker refuses
with a fixed message); everything a provider returns is normalized (host/llm/translate.py) to one shape
(`ModelToolCall`), whichever API it came from.

The contract (llm.proto), normalized per provider:

- Tools: an agent names tools by their `ListTools` name (`<package slug>:<tool name>`); each must be in the
  run's catalog (LLM_TOOL_NOT_ALLOWED) and the provider gets the host's copy of its description and input
  schema, never the agent's text. Names are mapped to provider-safe function names (`^[A-Za-z0-9_-]{1,64}$`,
  both APIs) per request, reversibly; a model call of any other name comes back `refused`.
- Arguments are JSON text (an object) in both directions. OpenAI sends them as text, Anthropic as a dict:
  both are checked as strict JSON (finite numbers, bounded size and depth) and returned in one canonical
  compact form. A call whose arguments are not a JSON object is refused too (its arguments become `{}`).
- Parallel tool calls (OpenAI's default, and Anthropic's several tool_use blocks) are allowed and returned
  in the model's order.
- Messages: an assistant message carries the tool calls a completion returned (OpenAI `tool_calls`,
  Anthropic `tool_use` blocks); a `tool` message answers one by id (OpenAI role `tool`, Anthropic a
  `tool_result` block in a user message: consecutive results are merged into one). Every call of an
  assistant message must be answered by the tool messages right after it, once each.
- Structured output: OpenAI gets `response_format` (`json_object`, or `json_schema` with name and schema);
  for `json_object` a fixed system line asking for JSON is added when no message says "json" (OpenAI
  refuses the mode otherwise). Anthropic has no JSON mode on every model, so the documented way is used:
  a forced tool (`RESPONSE_TOOL`) whose input schema is the schema (`{"type": "object"}` for a JSON
  object); its input, as canonical JSON text, is the completion's content (streamed as text deltas), and
  text blocks beside it are dropped. With tools the model may call, the response tool is offered beside
  them and the model must call one of them (`any`).
- Tool choice: OpenAI `auto` / `none` / `required`; Anthropic `auto` / `none` / `any`.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from host.core.strictjson import JsonRejected, check_finite, dumps_strict, loads_strict, utf8_len
from host.core.vocab import WireReason
from host.spec.manifest.model import ToolSpec
from host.tools.calls import MAX_ARGUMENTS_BYTES

MAX_TOOLS = 128
"""Tool definitions a run's catalog holds, and so at most what one request may name; more are dropped."""
MAX_TOOL_DEFINITION_BYTES = 16 * 1024
"""Name, description and input schema of one definition, in UTF-8 bytes; a larger one is dropped."""
MAX_TOOL_NAME_CHARS = 256
"""A catalog name (`slug:tool`) longer than this is dropped; a refused call's name is cut to it."""
MAX_SCHEMA_DEPTH = 32
"""Nesting a tool's input schema or a response schema may have."""
MAX_SCHEMA_BYTES = 64 * 1024
"""A response format's schema, as JSON text."""
MAX_TOOL_CALLS = 128
"""Tool calls one request's assistant messages may carry together, and one completion may return."""
TOOL_CALL_OVERHEAD_CHARS = 4
"""What each tool call or tool definition adds to the input size besides its counted texts."""
JSON_MODE_CHARS = 256
"""What a JSON response format adds to the input size besides its name and schema: the fixed instruction
or response-tool description the host adds (host/llm/translate.py; each shorter than this)."""
MAX_TOOL_CALL_ID_CHARS = 128

RESPONSE_TOOL = "json_response"
"""The forced tool that carries an Anthropic JSON response (its input is the answer)."""

ROLES = frozenset({"system", "user", "assistant", "tool"})
TOOL_CHOICES = frozenset({"", "auto", "none", "required"})
FORMAT_TEXT = "text"
FORMAT_JSON_OBJECT = "json_object"
FORMAT_JSON_SCHEMA = "json_schema"

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

_TWO_BYTE_ESCAPES = b'"\\\b\f\n\r\t'
"""Characters JSON writes as a backslash and one letter."""
_SIX_BYTE_ESCAPES = bytes(c for c in range(0x20) if c not in _TWO_BYTE_ESCAPES)
"""The other control characters, which JSON writes as \\u00XX."""


def json_string_bytes(text: str) -> int:
    """The bytes `text` takes inside a JSON string as both SDKs send it: `json.dumps(text,
    ensure_ascii=False)[1:-1]` encoded as UTF-8 (openai and anthropic serialize request bodies with
    `ensure_ascii=False` and send UTF-8, as httpx does), so a control character counts 6 (or 2 for
    \\b \\f \\n \\r \\t), `"` and `\\` 2, any other character its UTF-8 length (1 to 4).

    Computed without building the escaped text: one UTF-8 encode and two byte deletions, all in C and O(n).
    Control characters, `"` and `\\` are single bytes in UTF-8 and never occur inside a multi-byte one.
    """
    raw = text.encode("utf-8", "surrogatepass")
    two = len(raw) - len(raw.translate(None, _TWO_BYTE_ESCAPES))
    six = len(raw) - len(raw.translate(None, _SIX_BYTE_ESCAPES))
    return len(raw) + two + 5 * six


def canonical_json(value: Any) -> str:
    """Compact JSON as the SDKs send a dict (`ensure_ascii=False`, no spaces): what reaches the provider."""
    return dumps_strict(value, ensure_ascii=False, separators=(",", ":"))


class Rejected(Exception):
    """A request this module refuses; the broker turns it into its LlmRefusal (fixed message, counted)."""

    def __init__(self, reason: WireReason) -> None:
        super().__init__(reason)
        self.reason = reason


def _invalid() -> Rejected:
    return Rejected(WireReason.INVALID_REQUEST)


# --- the run's catalog -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolDef:
    """One tool a model may be offered, as the host read it from the lockfile (never from the agent)."""

    name: str
    """`<package slug>:<tool name>`."""
    description: str
    parameters_json: str
    """The declared input schema as canonical JSON text; `{}` when none is declared (ListTools shows it)."""
    parameters: Mapping[str, Any] = field(compare=False, repr=False)
    """What the provider gets: the declared schema with `"type": "object"` when it names no type."""
    chars: int = field(compare=False, repr=False)
    """Its input size: name and description as JSON-escaped bytes, the schema as its canonical bytes."""
    sent_json: str = field(default="", compare=False, repr=False)
    """`parameters` as canonical JSON text: what the provider is sent (and the input bound counts)."""


@dataclass(frozen=True)
class ToolCatalog:
    """The tools one run may hand to a model, in allowlist order, then declaration order."""

    definitions: tuple[ToolDef, ...] = ()
    dropped: int = 0
    """Declared tools left out: over MAX_TOOLS, over MAX_TOOL_DEFINITION_BYTES, a schema that is not an
    object schema or not strict JSON, a name longer than MAX_TOOL_NAME_CHARS."""
    by_name: Mapping[str, ToolDef] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.by_name:
            object.__setattr__(self, "by_name", {d.name: d for d in self.definitions})


EMPTY_CATALOG = ToolCatalog()


def tool_definition(slug: str, spec: ToolSpec) -> ToolDef | None:
    """The definition of one declared tool, or None when it cannot be offered to a model."""
    name = f"{slug}:{spec.name}"
    if len(name) > MAX_TOOL_NAME_CHARS:
        return None
    schema: Mapping[str, Any] = spec.input_schema if spec.input_schema is not None else {}
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if kind is not None and kind != "object":
        return None  # a model calls tools with keyword arguments: an object, or the gate refuses the call
    try:
        check_finite(schema, max_depth=MAX_SCHEMA_DEPTH)
        parameters_json = canonical_json(schema)
    except (JsonRejected, TypeError, ValueError):
        return None
    parameters: dict[str, Any] = json.loads(parameters_json)  # a copy of our own, never the manifest's
    if kind is None:
        parameters = {"type": "object", **parameters}
    size = utf8_len(name) + utf8_len(spec.description) + utf8_len(parameters_json)
    if size > MAX_TOOL_DEFINITION_BYTES:
        return None
    sent_json = canonical_json(parameters)
    chars = json_string_bytes(name) + json_string_bytes(spec.description) + utf8_len(sent_json)
    return ToolDef(name, spec.description, parameters_json, parameters, chars, sent_json)


def build_catalog(packs: Iterable[tuple[str, Sequence[ToolSpec]]]) -> ToolCatalog:
    """The catalog of `(slug, declared tools)` pairs, bounded by MAX_TOOLS and the per-definition caps."""
    definitions: list[ToolDef] = []
    dropped = 0
    for slug, specs in packs:
        for spec in specs:
            definition = tool_definition(slug, spec)
            if definition is None or len(definitions) >= MAX_TOOLS:
                dropped += 1
            else:
                definitions.append(definition)
    return ToolCatalog(tuple(definitions), dropped)


# --- what an agent asks for ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlmCall:
    """One LLM request as plain data (the RPC layer builds it from CallLlmRequest / StreamLlmRequest).

    `messages`: mappings with `role`, `content` and, optionally, `tool_calls` (mappings with `id`, `name`,
    `arguments` as JSON text and `refused`) and `tool_call_id`. `tools`: catalog names. `tool_choice`: ""
    (unset), `auto`, `none` or `required`. `response_format`: None, or a mapping with `type` (`text`,
    `json_object`, `json_schema`), `name` and `schema` (JSON text).
    """

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[str] = ()
    tool_choice: str = ""
    response_format: Mapping[str, str] | None = None


@dataclass(frozen=True)
class ModelToolCall:
    """A tool call as the contract has it: the provider's id, the catalog name, arguments as canonical JSON
    text of an object; `refused` when the model named no tool of the request (or sent arguments that are
    not a JSON object): `name` is then the model's own, cut to printable ASCII."""

    id: str
    name: str
    arguments_json: str
    refused: bool = False


@dataclass(frozen=True)
class Message:
    """A validated message."""

    role: str
    content: str
    tool_calls: tuple[ModelToolCall, ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True)
class ResponseFormat:
    """A JSON response format: `json_object` or `json_schema` with its name and parsed schema."""

    type: str
    name: str = ""
    schema: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Prepared:
    """A request that passed every check, ready for an adapter: the host's tool definitions, the per-request
    name map in both directions, and its input size (`chars`, what max_input_chars is checked against)."""

    messages: tuple[Message, ...]
    tools: tuple[ToolDef, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)
    """Catalog name -> provider-safe function name."""
    reverse: Mapping[str, str] = field(default_factory=dict)
    """Provider-safe function name -> catalog name."""
    tool_choice: str = ""
    response_format: ResponseFormat | None = None
    chars: int = 0
    call_ids: frozenset[str] = frozenset()
    """The tool-call ids the conversation already uses: a completion's calls never reuse one."""

    def call_id(self, proposed: Any, taken: set[str]) -> str:
        """The id a call of the completion goes back under: the provider's own when it is one we can send
        back and neither the conversation nor another call of this completion uses it (providers and
        compatible servers that number calls `call_0`, `call_1`... each turn would break the next turn's
        uniqueness), else a new one; recorded in `taken`."""
        fresh = isinstance(proposed, str) and _ID.fullmatch(proposed) is not None
        cid = proposed if fresh and proposed not in self.call_ids and proposed not in taken else new_call_id()
        taken.add(cid)
        return cid

    @property
    def json_mode(self) -> bool:
        return self.response_format is not None

    def provider_name(self, call: ModelToolCall) -> str:
        """The function name a history call is sent under: its mapped name, or (a refused call) its own name
        made provider-safe."""
        mapped = self.names.get(call.name)
        if mapped is not None and not call.refused:
            return mapped
        return _safe_name(call.name)

    def texts(self) -> Iterator[str]:
        """Every text the provider is sent for this request (for an input-token estimate)."""
        for m in self.messages:
            yield m.content
            for c in m.tool_calls:
                yield c.arguments_json
        for t in self.tools:
            yield t.description
            yield t.sent_json or canonical_json(t.parameters)  # what is sent, with its "type": "object"
        if self.response_format is not None and self.response_format.schema is not None:
            yield canonical_json(self.response_format.schema)


def _safe_name(name: str) -> str:
    return _UNSAFE.sub("_", name.replace(":", "__"))[:64] or "tool"


def provider_names(names: Iterable[str], reserved: Iterable[str] = ()) -> dict[str, str]:
    """Catalog name -> a distinct provider-safe function name (`:` becomes `__`, any other character outside
    `[A-Za-z0-9_-]` `_`, at most 64 characters, `_2`, `_3`... on a clash), in the order given; never one of
    `reserved`. Reversible within one request, which is all a name map lives for."""
    taken = set(reserved)
    out: dict[str, str] = {}
    for name in names:
        base = _safe_name(name)
        candidate, n = base, 2
        while candidate in taken:
            suffix = f"_{n}"
            candidate, n = base[: 64 - len(suffix)] + suffix, n + 1
        taken.add(candidate)
        out[name] = candidate
    return out


def new_call_id() -> str:
    """An id for a call the provider gave none (or one outside `[A-Za-z0-9_-]{1,128}`)."""
    return "call_" + secrets.token_hex(12)


def _text(value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise _invalid()
    return value


def _arguments(raw: Any) -> tuple[str, int]:
    """A history call's arguments: strict JSON text of an object -> (canonical text, counted chars)."""
    text = _text(raw)
    try:
        value = loads_strict(text, max_bytes=MAX_ARGUMENTS_BYTES)
    except JsonRejected:
        raise _invalid() from None
    if not isinstance(value, dict):
        raise _invalid()
    canonical = canonical_json(value)
    return canonical, max(json_string_bytes(text), json_string_bytes(canonical))


def _response_format(raw: Mapping[str, str] | None) -> tuple[ResponseFormat | None, int]:
    """The validated format and its counted chars; plain text is None."""
    if raw is None:
        return None, 0
    if not isinstance(raw, Mapping):
        raise _invalid()
    kind, name, schema_text = raw.get("type", ""), raw.get("name", ""), raw.get("schema", "")
    if not isinstance(kind, str) or not isinstance(name, str) or not isinstance(schema_text, str):
        raise _invalid()
    if kind in ("", FORMAT_TEXT, FORMAT_JSON_OBJECT):
        if name or schema_text:
            raise _invalid()  # a name or schema belongs to json_schema only
        if kind != FORMAT_JSON_OBJECT:
            return None, 0
        return ResponseFormat(FORMAT_JSON_OBJECT), JSON_MODE_CHARS
    if kind != FORMAT_JSON_SCHEMA:
        raise _invalid()
    name = name or "response"
    if not _PROVIDER_NAME.fullmatch(name):
        raise _invalid()
    try:
        schema = loads_strict(schema_text, max_bytes=MAX_SCHEMA_BYTES, max_depth=MAX_SCHEMA_DEPTH)
    except JsonRejected:
        raise _invalid() from None
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise _invalid()  # both APIs take an object at the root (Anthropic: a tool's input)
    if "type" not in schema:
        schema = {"type": "object", **schema}
    chars = json_string_bytes(name) + max(json_string_bytes(schema_text), utf8_len(canonical_json(schema)))
    return ResponseFormat(FORMAT_JSON_SCHEMA, name, schema), chars + JSON_MODE_CHARS


def check_tools(requested: Sequence[str], catalog: ToolCatalog) -> tuple[ToolDef, ...]:
    """The host's definitions of the requested names; LLM_TOOL_NOT_ALLOWED for a name outside the catalog,
    INVALID_REQUEST for a repeated or malformed one."""
    if isinstance(requested, str | bytes) or not isinstance(requested, Sequence):
        raise _invalid()
    if len(requested) > MAX_TOOLS:
        raise Rejected(WireReason.LLM_TOOL_NOT_ALLOWED)  # more than the catalog can hold
    out: list[ToolDef] = []
    seen: set[str] = set()
    for name in requested:
        if not isinstance(name, str) or not name or name in seen:
            raise _invalid()
        seen.add(name)
        definition = catalog.by_name.get(name)
        if definition is None:
            raise Rejected(WireReason.LLM_TOOL_NOT_ALLOWED)
        out.append(definition)
    return tuple(out)


def prepare(call: LlmCall, tools: tuple[ToolDef, ...]) -> Prepared:
    """Validate `call` (whose tool names `check_tools` resolved to `tools`) and size it; INVALID_REQUEST on
    any malformed field or role/field combination:

    - roles are system, user, assistant or tool; content is text;
    - only an assistant message carries `tool_calls` (at most MAX_TOOL_CALLS in the request): each with a
      unique id (`[A-Za-z0-9_-]{1,128}`), the name of a tool this request defines (or `refused` true, as
      a completion returned it), arguments that are strict JSON text of an object;
    - only a tool message carries `tool_call_id`, and it must: the id of a call of the assistant message
      the tool messages directly follow, not answered before; every call is answered before any other
      message, and the conversation does not end with unanswered calls;
    - `tool_choice` `required` needs tools; a response format is text, a JSON object, or a JSON schema with
      a provider-safe name and an object schema (strict JSON, bounded).
    """
    messages = call.messages
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise _invalid()
    choice = call.tool_choice
    if not isinstance(choice, str) or choice not in TOOL_CHOICES or (choice == "required" and not tools):
        raise _invalid()
    tool_choice = call.tool_choice if tools else ""
    response_format, chars = _response_format(call.response_format)
    defined = {t.name for t in tools}
    names = provider_names([t.name for t in tools], reserved=(RESPONSE_TOOL,) if response_format else ())
    chars += sum(t.chars + TOOL_CALL_OVERHEAD_CHARS for t in tools)
    out: list[Message] = []
    ids: set[str] = set()
    pending: set[str] = set()  # calls of the last assistant message not answered yet
    total_calls = 0
    for message in messages:
        if not isinstance(message, Mapping):
            raise _invalid()
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in ROLES or not isinstance(content, str):
            raise _invalid()
        raw_calls = message.get("tool_calls") or ()
        call_id = message.get("tool_call_id") or ""
        if isinstance(raw_calls, str | bytes | Mapping) or not isinstance(raw_calls, Sequence):
            raise _invalid()
        if not isinstance(call_id, str) or (raw_calls and role != "assistant"):
            raise _invalid()
        if call_id and role != "tool":
            raise _invalid()
        chars += json_string_bytes(role) + json_string_bytes(content) + 4
        if role == "tool":
            if not _ID.fullmatch(call_id) or call_id not in pending:
                raise _invalid()
            pending.discard(call_id)
            chars += json_string_bytes(call_id)
            out.append(Message(role, content, tool_call_id=call_id))
            continue
        if pending:
            raise _invalid()  # a call of the previous assistant message was never answered
        calls: list[ModelToolCall] = []
        total_calls += len(raw_calls)
        if total_calls > MAX_TOOL_CALLS:
            raise _invalid()
        for raw in raw_calls:
            if not isinstance(raw, Mapping):
                raise _invalid()
            cid, name, refused = raw.get("id"), _text(raw.get("name"), empty=False), raw.get("refused", False)
            if not isinstance(cid, str) or not _ID.fullmatch(cid) or cid in ids:
                raise _invalid()
            if not isinstance(refused, bool):
                raise _invalid()
            if (not refused and name not in defined) or len(name) > MAX_TOOL_NAME_CHARS:
                raise _invalid()
            arguments, counted = _arguments(raw.get("arguments", "{}"))
            ids.add(cid)
            pending.add(cid)
            calls.append(ModelToolCall(cid, name, arguments, refused))
            sent_name = names.get(name, "") if not refused else _safe_name(name)
            chars += json_string_bytes(cid) + max(json_string_bytes(name), len(sent_name)) + counted
            chars += TOOL_CALL_OVERHEAD_CHARS
        out.append(Message(role, content, tuple(calls)))
    if pending:
        raise _invalid()
    return Prepared(
        messages=tuple(out),
        tools=tools,
        names=names,
        reverse={v: k for k, v in names.items()},
        tool_choice=tool_choice,
        response_format=response_format,
        chars=chars,
        call_ids=frozenset(ids),
    )


__all__ = [
    "EMPTY_CATALOG",
    "FORMAT_JSON_OBJECT",
    "FORMAT_JSON_SCHEMA",
    "FORMAT_TEXT",
    "JSON_MODE_CHARS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_TOOLS",
    "MAX_TOOL_CALLS",
    "MAX_TOOL_DEFINITION_BYTES",
    "MAX_TOOL_NAME_CHARS",
    "RESPONSE_TOOL",
    "LlmCall",
    "Message",
    "ModelToolCall",
    "Prepared",
    "Rejected",
    "ResponseFormat",
    "ToolCatalog",
    "ToolDef",
    "build_catalog",
    "canonical_json",
    "check_tools",
    "json_string_bytes",
    "new_call_id",
    "prepare",
    "provider_names",
    "tool_definition",
]
