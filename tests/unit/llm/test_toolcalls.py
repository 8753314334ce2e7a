"""Tool calling and structured output in the LLM broker: the catalog and validation as data
(host/llm/toolcalls.py; the wire forms are test_translate.py's), and the real openai/anthropic SDK clients
against the local fake provider (tests/support/fake_llm.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from host.llm import admission as _admission
from host.llm.admission import LlmRefusal
from host.llm.broker import LlmBroker
from host.llm.budget import TOOL_PROMPT_TOKENS
from host.llm.providers import Completion
from host.llm.session import LlmSession
from host.llm.toolcalls import (
    JSON_MODE_CHARS,
    MAX_TOOLS,
    RESPONSE_TOOL,
    LlmCall,
    ModelToolCall,
    Rejected,
    ToolCatalog,
    build_catalog,
    check_tools,
    json_string_bytes,
    prepare,
    provider_names,
    tool_definition,
)
from host.llm.translate import (
    JSON_INSTRUCTION,
    RESPONSE_TOOL_DESCRIPTION,
    CallDelta,
    CallStream,
    anthropic_request,
    model_call,
    openai_request,
)
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime import wiring as _wiring
from host.spec.config import LlmHostConfig
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from host.tools.calls import InstalledToolpack
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer, FakeToolCall
from tests.unit.llm._tools import CATALOG, COUNT, LOOP, REVERSE, SCHEMA, USER, prepared, tools_call

CANARY = "sk-canary-tools-51c0"
PROVIDERS = ["openai", "anthropic"]


def rejected(call: LlmCall, catalog: ToolCatalog = CATALOG) -> str:
    with pytest.raises(Rejected) as info:
        prepared(call, catalog)
    return str(info.value.reason)


def exchange(
    call_id: str = "call_1", name: str = REVERSE, arguments: str = '{"text": "a b"}', refused: bool = False
) -> list[dict[str, Any]]:
    """A user message, the model's call and its result."""
    call = {"id": call_id, "name": name, "arguments": arguments, "refused": refused}
    return [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": '"b a"'},
    ]


# --- the catalog -----------------------------------------------------------------------------------------


def test_the_catalog_holds_the_declared_tools_as_the_host_read_them() -> None:
    assert [(d.name, d.description, d.parameters_json) for d in CATALOG.definitions] == [
        (REVERSE, "Reverse the words of a text", json.dumps(SCHEMA, separators=(",", ":"))),
        (COUNT, "", "{}"),
        ("text-kit:upper", "Upper-case", '{"properties":{"s":{"type":"string"}}}'),
    ]
    # What a provider gets is always an object schema.
    assert CATALOG.by_name[COUNT].parameters == {"type": "object"}
    assert CATALOG.by_name["text-kit:upper"].parameters["type"] == "object"
    assert CATALOG.dropped == 0


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string"},  # a model calls with keyword arguments: the gate would refuse every call
        {"type": "object", "properties": {"x": {"default": float("nan")}}},  # not strict JSON
        {"type": "object", "description": "x" * 17_000},  # over the size cap
        json.loads("[" * 0 + '{"a":' * 40 + "1" + "}" * 40),  # deeper than 32
    ],
)
def test_a_tool_that_cannot_be_offered_is_dropped_and_counted(schema: dict[str, Any]) -> None:
    assert tool_definition("p", ToolSpec("t", "", "", schema)) is None
    catalog = build_catalog([("p", [ToolSpec("t", "", "", schema), ToolSpec("ok", "", "", None)])])
    assert [d.name for d in catalog.definitions] == ["p:ok"] and catalog.dropped == 1


def test_the_catalog_holds_at_most_max_tools() -> None:
    specs = [ToolSpec(f"t{i}", "", "", None) for i in range(MAX_TOOLS + 5)]
    catalog = build_catalog([("p", specs)])
    assert len(catalog.definitions) == MAX_TOOLS and catalog.dropped == 5


def _pack(slug: str, trust: str, *names: str) -> InstalledToolpack:
    tools = tuple(ToolSpec(n, f"m:{n}", f"{n} tool", None) for n in names)
    manifest = ToolpackManifest(
        slug=slug, version="1.0.0", name=slug, entrypoint="m", tools=tools, dependencies=()
    )
    return InstalledToolpack(
        slug=slug, version="1.0.0", trust=trust, root=Path("/nonexistent"), manifest=manifest
    )


def _policy(allowed: tuple[str, ...] | None) -> RunPolicy:
    return RunPolicy(allowed_packages=allowed, max_tool_calls=5, max_runtime_seconds=60, max_iterations=5,
                     llm=LlmPolicy(), clamped=())  # fmt: skip


def test_the_runs_catalog_follows_its_allowlist_and_the_gates_view_of_trust(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed = {
        "b-tools": _pack("b-tools", "trusted", "one", "two"),
        "a-tools": _pack("a-tools", "curated", "three"),
        "community": _pack("community", "unverified", "four"),
    }
    entries = {s: SimpleNamespace(slug=s, package_type="toolpack") for s in installed}
    entries["an-agent"] = SimpleNamespace(slug="an-agent", package_type="agent")
    lockfile = SimpleNamespace(entries=lambda: entries)
    monkeypatch.setattr(_wiring, "_toolpack", lambda entry: installed[entry.slug])

    def catalog(allowed: tuple[str, ...] | None, community: bool) -> list[str]:
        packs: dict[str, InstalledToolpack | None] = {}

        def lookup(slug: str) -> InstalledToolpack | None:
            return packs.setdefault(slug, installed.get(slug))

        built = _wiring.tool_catalog(_policy(allowed), lockfile, packs, lookup, community=community)  # type: ignore[arg-type]
        return [d.name for d in built.definitions]

    # An allowlist: its order; a slug that is not installed or not a tool pack has no tools.
    assert catalog(("b-tools", "ghost", "a-tools", "community"), community=True) == [
        "b-tools:one", "b-tools:two", "a-tools:three", "community:four",
    ]  # fmt: skip
    # Without tool sandboxes the gate refuses community packs: their tools are not offered.
    assert catalog(("b-tools", "community"), community=False) == ["b-tools:one", "b-tools:two"]
    # No allowlist: every installed tool pack, by slug.
    assert catalog(None, community=True) == ["a-tools:three", "b-tools:one", "b-tools:two", "community:four"]
    assert catalog((), community=True) == []

    def broken(slug: str) -> InstalledToolpack | None:
        if slug == "b-tools":
            raise OSError("its manifest cannot be read")
        return installed.get(slug)

    # A broken pack on an explicit allowlist leaves only its own tools out (its calls fail as they would).
    built = _wiring.tool_catalog(_policy(("b-tools", "a-tools")), lockfile, {}, broken, community=True)  # type: ignore[arg-type]
    assert [d.name for d in built.definitions] == ["a-tools:three"]


def test_a_catalog_that_failed_to_build_fails_the_same_way_without_building_again(
    srv: FakeLlmServer,
) -> None:
    builds: list[int] = []

    def unreadable() -> ToolCatalog:
        builds.append(1)
        raise OSError("the lockfile cannot be read")

    sess = LlmBroker(LlmHostConfig(), env={}).session(LlmPolicy())
    sess.use_tools(unreadable)
    for _ in range(3):
        with pytest.raises(LlmRefusal) as info:
            sess.tool_catalog()
        assert info.value.reason == "LLM_UNAVAILABLE" and info.value.__traceback__ is not None
        assert "lockfile" not in str(info.value) and info.value.__cause__ is None
    assert builds == [1]


def test_an_unreadable_lockfile_fails_an_allowlisted_catalog_instead_of_emptying_it() -> None:
    def unreadable() -> dict[str, Any]:
        raise OSError("the lockfile cannot be read")

    lockfile = SimpleNamespace(entries=unreadable)
    with pytest.raises(OSError):
        _wiring.tool_catalog(_policy(("a-tools",)), lockfile, {}, lambda _slug: None, community=True)  # type: ignore[arg-type]


def _sent_text_bytes(value: Any, *, text_keys: bool = False) -> int:
    """UTF-8 bytes of every string a provider request body sends as text: every string value, and the keys
    inside a schema or a tool call's input (they are text the model reads)."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        total = 0
        for key, item in value.items():
            if text_keys:
                total += len(str(key).encode("utf-8"))
            inner = text_keys or key in ("parameters", "input_schema", "input", "schema")
            total += _sent_text_bytes(item, text_keys=inner)
        return total
    if isinstance(value, list):
        return sum(_sent_text_bytes(item, text_keys=text_keys) for item in value)
    return 0


@pytest.mark.parametrize("json_mode", ["", "json_object", "json_schema"])
def test_the_input_bound_covers_every_text_either_adapter_sends(json_mode: str) -> None:
    # A tool with no declared type (the provider gets "type": "object" added), a long name, history calls.
    catalog = build_catalog([("word.tools", [
        ToolSpec("reverse_words", "", "Reverse the words.", {"properties": {"text": {"type": "string"}}}),
        ToolSpec("x" * 60, "", "", None),
    ])])  # fmt: skip
    names = [d.name for d in catalog.definitions]
    history = [
        {"role": "system", "content": "be brief"},
        USER,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "name": names[0], "arguments": '{"text": "a b"}'},
            {"id": "call_2", "name": "not:offered", "arguments": "{}", "refused": True},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '"b a"'},
        {"role": "tool", "tool_call_id": "call_2", "content": "refused"},
    ]  # fmt: skip
    fmt = {"type": json_mode, "name": "answer", "schema": '{"type": "object", "properties": {}}'}
    call = LlmCall(history, tools=names, response_format=fmt if json_mode == "json_schema" else
                   {"type": json_mode} if json_mode else None)  # fmt: skip
    p = prepare(call, check_tools(call.tools, catalog))
    # The hidden tool-use prompt's allowance is for what the provider adds, not for the text we send.
    bound = _admission._estimate(p) - TOOL_PROMPT_TOKENS
    for body in (openai_request(p), anthropic_request(p)):
        assert bound >= _sent_text_bytes(body) + 3, body


# --- names --------------------------------------------------------------------------------------------------


def test_provider_names_are_safe_distinct_and_reversible() -> None:
    names = [
        REVERSE,
        "word.tools:reverse_words",
        "word_tools:reverse.words",
        "a:" + "x" * 80,
        "a:" + "x" * 81,
    ]
    mapped = provider_names(names, reserved=[RESPONSE_TOOL])
    assert mapped[REVERSE] == "word-tools__reverse_words"
    assert len(set(mapped.values())) == len(names)
    assert all(len(v) <= 64 and all(c.isalnum() or c in "_-" for c in v) for v in mapped.values())
    assert provider_names(["json:response", "json_response"], reserved=[RESPONSE_TOOL]) == {
        "json:response": "json__response",
        "json_response": "json_response_2",  # the response tool's name stays the host's
    }


# --- validation ---------------------------------------------------------------------------------------------


def test_tools_outside_the_catalog_are_refused_by_their_own_reason() -> None:
    with pytest.raises(Rejected) as info:
        check_tools([REVERSE, "evil:rm"], CATALOG)
    assert info.value.reason == "LLM_TOOL_NOT_ALLOWED"
    with pytest.raises(Rejected) as info:
        check_tools(["x"] * (MAX_TOOLS + 1), CATALOG)
    assert info.value.reason == "LLM_TOOL_NOT_ALLOWED"
    for bad in ([REVERSE, REVERSE], [""], REVERSE):
        with pytest.raises(Rejected) as info:
            check_tools(bad, CATALOG)
        assert info.value.reason == "INVALID_REQUEST"


def _call(call_id: str = "call_1", **fields: Any) -> dict[str, Any]:
    return {"id": call_id, "name": REVERSE, "arguments": "{}", **fields}


BAD_MESSAGES: dict[str, list[dict[str, Any]]] = {
    "unknown role": [{"role": "developer", "content": "x"}],
    "tool message without tool_call_id": [*exchange()[:2], {"role": "tool", "content": "x"}],
    "tool_call_id no call issued": [USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}],
    "tool_call_id of another message": [
        *exchange(),
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
    ],
    "call answered twice": [*exchange(), exchange()[2]],
    "call never answered": [*exchange()[:2], USER],
    "conversation ends with a call": exchange()[:2],
    "tool calls on a user message": [{"role": "user", "content": "", "tool_calls": [_call()]}],
    "tool_call_id on a user message": [{"role": "user", "content": "", "tool_call_id": "call_1"}],
    "a call id with bad characters": exchange(call_id="call 1"),
    "a call id too long": exchange(call_id="c" * 129),
    "duplicate call ids": [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [_call(), _call()]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
    ],
    "a call of a tool the request does not define": exchange(name=COUNT),
    "arguments not JSON": exchange(arguments="{text: 1}"),
    "arguments not an object": exchange(arguments="[1]"),
    "arguments not finite": exchange(arguments='{"x": 1e999}'),
    "arguments too deep": exchange(arguments='{"a":' * 70 + "1" + "}" * 70),
    "refused not a bool": [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [_call(refused="yes")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
    ],
    "tool_calls not a list": [USER, {"role": "assistant", "content": "", "tool_calls": "call_1"}],
    "content not text": [{"role": "user", "content": None}],
}


@pytest.mark.parametrize("messages", list(BAD_MESSAGES.values()), ids=list(BAD_MESSAGES))
def test_malformed_conversations_are_invalid_requests(messages: list[dict[str, Any]]) -> None:
    assert rejected(tools_call(messages=messages)) == "INVALID_REQUEST"


@pytest.mark.parametrize(
    ("tools", "choice", "fmt"),
    [
        ([], "required", None),
        ([REVERSE], "sometimes", None),
        ([REVERSE], "unknown", None),
        ([], "", {"type": "json_object", "name": "x", "schema": ""}),
        ([], "", {"type": "json_schema", "name": "bad name", "schema": "{}"}),
        ([], "", {"type": "json_schema", "name": "ok", "schema": '{"type": "array"}'}),
        ([], "", {"type": "json_schema", "name": "ok", "schema": "{nope"}),
        ([], "", {"type": "json_schema", "name": "ok", "schema": "[]"}),
        ([], "", {"type": "json_schema", "name": "ok", "schema": '{"a":' * 40 + "1" + "}" * 40}),
        ([], "", {"type": "unknown", "name": "", "schema": ""}),
    ],
)
def test_bad_tool_choice_and_response_formats_are_invalid(
    tools: list[str], choice: str, fmt: dict[str, str] | None
) -> None:
    assert rejected(tools_call(tools, tool_choice=choice, response_format=fmt)) == "INVALID_REQUEST"


def test_a_refused_call_may_stay_in_the_history_under_its_own_name() -> None:
    messages = exchange(name="evil:rm -rf", refused=True)
    p = prepared(tools_call(messages=messages))
    assert p.messages[1].tool_calls == (
        ModelToolCall("call_1", "evil:rm -rf", '{"text":"a b"}', refused=True),
    )
    assert openai_request(p)["messages"][1]["tool_calls"][0]["function"]["name"] == "evil__rm_-rf"


def test_the_input_size_counts_definitions_calls_results_and_the_schema() -> None:
    base = prepared(LlmCall([USER])).chars
    assert base == len("user") + json_string_bytes(USER["content"]) + 4
    definition = CATALOG.by_name[REVERSE]
    with_tool = prepared(tools_call()).chars
    assert with_tool - base == definition.chars + 4 >= len(definition.parameters_json) + len(REVERSE)
    arguments = '{"text":  "a b"}'  # counted as sent, escaped, as it is longer than the canonical form
    loop = prepared(tools_call(messages=exchange(arguments=arguments))).chars
    provider_name = "word-tools__reverse_words"  # the longer of the two names counts
    assistant = len("assistant") + 4 + len("call_1") + len(provider_name) + json_string_bytes(arguments) + 4
    result = len("tool") + json_string_bytes('"b a"') + 4 + len("call_1")
    assert loop - with_tool == assistant + result
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}}'
    fmt = prepared(LlmCall([USER], response_format={"type": "json_schema", "name": "out", "schema": schema}))
    assert fmt.chars - base == len("out") + json_string_bytes(schema) + JSON_MODE_CHARS
    assert len(JSON_INSTRUCTION) + len("system") + 4 < JSON_MODE_CHARS
    assert len(RESPONSE_TOOL_DESCRIPTION) + len(RESPONSE_TOOL) + len('{"type":"object"}') < JSON_MODE_CHARS


# --- through the broker, with the real SDKs -----------------------------------------------------------------


@pytest.fixture
def srv() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as server:
        yield server


def session(provider: str, srv: FakeLlmServer, **caps: Any) -> LlmSession:
    env = (
        {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": srv.base_url_openai}
        if provider == "openai"
        else {"ANTHROPIC_API_KEY": CANARY, "ANTHROPIC_BASE_URL": srv.base_url_anthropic}
    )
    policy = LlmPolicy(
        enabled=True, **({"max_calls": 10, "max_input_chars": 5000, "max_output_chars": 5000} | caps)
    )
    sess = LlmBroker(LlmHostConfig(), env=env).session(policy)
    sess.use_tools(lambda: CATALOG)
    return sess


def complete(sess: LlmSession, call: LlmCall, streaming: bool) -> tuple[Completion, list[Any]]:
    if not streaming:
        return sess.call(call), []
    items = list(sess.stream(call))
    final = items.pop()
    assert isinstance(final, Completion) and final.content == ""
    text = "".join(i for i in items if isinstance(i, str))
    return Completion(
        text, final.finish_reason, final.input_tokens, final.output_tokens, final.tool_calls
    ), items


def as_history(completion: Completion) -> dict[str, Any]:
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments_json, "refused": c.refused}
             for c in completion.tool_calls]  # fmt: skip
    return {"role": "assistant", "content": completion.content, "tool_calls": calls}


def sent_tools(provider: str, body: dict[str, Any]) -> list[tuple[str, str, Any]]:
    if provider == "openai":
        return [(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"])
                for t in body.get("tools", [])]  # fmt: skip
    return [(t["name"], t.get("description", ""), t["input_schema"]) for t in body.get("tools", [])]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_model_driven_tool_loop(provider: str, streaming: bool, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(
        text="reversed",
        tool_calls=(FakeToolCall(REVERSE, {"text": "a b"}), FakeToolCall("word-tools:count", {"x": 1})),
        echo_results=True,
    )
    sess = session(provider, srv)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, USER]
    first, items = complete(sess, LlmCall(messages, tools=[REVERSE]), streaming)
    assert first.finish_reason == "tool_calls" and first.content == ""
    assert [(c.name, c.arguments_json, c.refused) for c in first.tool_calls] == [
        (REVERSE, '{"text":"a b"}', False),
        ("word-tools:count", '{"x":1}', True),  # defined in the catalog, but not offered in this request
    ]
    if streaming:
        deltas = [i for i in items if isinstance(i, CallDelta)]
        assert [(d.index, d.id, d.name) for d in deltas if d.id] == [
            (0, first.tool_calls[0].id, REVERSE), (1, first.tool_calls[1].id, "word-tools:count"),
        ]  # fmt: skip
        for index, call in enumerate(first.tool_calls):
            text = "".join(d.arguments for d in deltas if d.index == index)
            assert json.loads(text) == json.loads(call.arguments_json)
    messages.append(as_history(first))
    messages += [
        {"role": "tool", "tool_call_id": c.id, "content": "refused" if c.refused else '"b a"'}
        for c in first.tool_calls
    ]
    final, _ = complete(sess, LlmCall(messages, tools=[REVERSE]), streaming)
    assert (final.content, final.finish_reason, final.tool_calls) == ('reversed: "b a" | refused', "stop", ())
    assert srv.problems == []
    # The provider got the host's definition, under a provider-safe name, and the results by call id.
    definition = CATALOG.by_name[REVERSE]
    for request in srv.requests:
        assert sent_tools(provider, request.body) == [
            ("word-tools__reverse_words", definition.description, definition.parameters)
        ]
    usage = sess.usage()
    assert (usage["ok"], usage["tool_calls"], usage["tool_calls_refused"]) == (2, 2, 1)
    seen = repr(first) + repr(final) + repr(items) + repr(usage)
    assert CANARY not in seen and srv.base_url not in seen


def test_call_ids_are_unique_in_a_completion_and_new_to_the_conversation() -> None:
    history = LlmCall(
        [USER, {"role": "assistant", "content": "",
                "tool_calls": [{"id": "call_0", "name": REVERSE, "arguments": "{}"}]},
         {"role": "tool", "tool_call_id": "call_0", "content": "x"}, USER],
        tools=[REVERSE],
    )  # fmt: skip
    p = prepared(history)
    assert p.call_ids == frozenset({"call_0"})
    taken: set[str] = set()
    ids = [model_call(p, cid, "word-tools__reverse_words", "{}", taken).id for cid in ("call_0", "a", "a")]
    assert ids[1] == "a" and len(set(ids)) == 3 and "call_0" not in ids
    stream = CallStream(p)
    proposed = ("call_0", "b", "b")
    streamed = [stream.piece(i, cid, "word-tools__reverse_words").id for i, cid in enumerate(proposed)]
    assert streamed[1] == "b" and len(set(streamed)) == 3 and "call_0" not in streamed
    assert [c.id for c in stream.calls()] == streamed


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_provider_that_reuses_call_ids_still_gets_a_valid_next_turn(
    provider: str, streaming: bool, srv: FakeLlmServer
) -> None:
    # Some compatible servers number calls call_0, call_1... every turn, or repeat one id in a turn.
    same = FakeToolCall(REVERSE, {"text": "a b"}, id="call_0")
    srv.default = Behaviour(text="done", tool_calls=(same, same), echo_results=True)
    sess = session(provider, srv)
    messages: list[dict[str, Any]] = [USER]
    seen: list[str] = []
    for _turn in range(2):
        first, _ = complete(sess, LlmCall(messages, tools=[REVERSE]), streaming)
        seen += [c.id for c in first.tool_calls]
        messages.append(as_history(first))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in first.tool_calls]
        final, _ = complete(sess, LlmCall(messages, tools=[REVERSE]), streaming)
        assert final.finish_reason == "stop"
        messages += [{"role": "assistant", "content": final.content}, USER]
    assert len(seen) == 4 and len(set(seen)) == 4  # every call id new to the conversation
    assert srv.problems == []


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_tool_outside_the_catalog_never_reaches_the_provider(
    provider: str, streaming: bool, srv: FakeLlmServer
) -> None:
    sess = session(provider, srv)
    with pytest.raises(LlmRefusal) as info:
        complete(sess, tools_call([REVERSE, "evil:rm"]), streaming)
    assert info.value.reason == "LLM_TOOL_NOT_ALLOWED"
    with pytest.raises(LlmRefusal) as info:
        complete(sess, tools_call(messages=exchange(name=COUNT)), streaming)
    assert info.value.reason == "INVALID_REQUEST"
    assert srv.requests == []
    usage = sess.usage()
    assert (usage["refused_tool"], usage["requests"], usage["calls"]) == (1, 2, 0)
    assert sess.calls_remaining == 10


def test_a_run_without_a_catalog_has_no_tools(srv: FakeLlmServer) -> None:
    sess = LlmBroker(
        LlmHostConfig(), env={"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": srv.base_url_openai}
    ).session(LlmPolicy(enabled=True, max_calls=2, max_input_chars=100, max_output_chars=100))
    assert sess.tool_catalog().definitions == ()
    with pytest.raises(LlmRefusal) as info:
        sess.call(tools_call())
    assert info.value.reason == "LLM_TOOL_NOT_ALLOWED"


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
def test_json_output(provider: str, streaming: bool, kind: str, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(json_value={"n": 2, "words": ["b", "a"]})
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}}'
    fmt = {
        "type": kind,
        "name": "count" if kind == "json_schema" else "",
        "schema": schema if kind == "json_schema" else "",
    }
    completion, _ = complete(session(provider, srv), LlmCall([USER], response_format=fmt), streaming)
    assert json.loads(completion.content) == {"n": 2, "words": ["b", "a"]}
    assert (completion.finish_reason, completion.tool_calls) == ("stop", ())
    assert srv.problems == []
    [request] = srv.requests
    if provider == "openai":
        assert request.body["response_format"]["type"] == kind
    else:
        assert request.body["tool_choice"] == {"type": "tool", "name": RESPONSE_TOOL}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_json_output_beside_tools_goes_through_the_loop(provider: str, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(tool_calls=(FakeToolCall(REVERSE, {"text": "a b"}),), json_value={"done": True})
    sess = session(provider, srv)
    fmt = {"type": "json_object"}
    first = sess.call(tools_call(response_format=fmt))
    assert [c.name for c in first.tool_calls] == [REVERSE]
    messages = [
        USER,
        as_history(first),
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "x"},
    ]
    final = sess.call(tools_call(messages=messages, response_format=fmt))
    assert json.loads(final.content) == {"done": True} and final.tool_calls == ()
    assert srv.problems == []


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_output_cap_counts_tool_call_arguments(
    provider: str, streaming: bool, srv: FakeLlmServer
) -> None:
    srv.default = Behaviour(tool_calls=(FakeToolCall(REVERSE, {"text": "x" * 40}),), chunks=4)
    sess = session(provider, srv, max_output_chars=30)
    with pytest.raises(LlmRefusal) as info:
        complete(sess, tools_call(), streaming)
    assert info.value.reason == "LLM_OUTPUT_TOO_LARGE"
    assert sess.usage()["refused_output"] == 1 and sess.usage()["tool_calls"] == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_input_cap_counts_the_tool_definitions(provider: str, srv: FakeLlmServer) -> None:
    need = prepared(tools_call()).chars
    assert session(provider, srv, max_input_chars=need).call(tools_call()).content == "fake reply"
    sess = session(provider, srv, max_input_chars=need - 1)
    with pytest.raises(LlmRefusal) as info:
        sess.call(tools_call())
    assert info.value.reason == "LLM_INPUT_TOO_LARGE"
    assert len(srv.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_provider_errors_about_tools_never_cross(provider: str, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(status=400)
    with pytest.raises(LlmRefusal) as info:
        session(provider, srv).call(tools_call(messages=exchange()))
    assert info.value.reason == "LLM_UNAVAILABLE"
    assert SECRET_IN_ERROR_BODY not in str(info.value) and info.value.__context__ is None


def test_a_call_without_tools_is_unchanged_on_the_wire(srv: FakeLlmServer) -> None:
    session("openai", srv).call([USER])
    session("anthropic", srv).call([USER])
    openai_body, anthropic_body = (r.body for r in srv.requests)
    assert set(openai_body) == {"model", "messages", "max_completion_tokens"}
    assert set(anthropic_body) == {"model", "messages", "max_tokens"}


SDK_SHAPES = [
    LlmCall([USER]),
    LlmCall(LOOP, tools=[REVERSE, COUNT], tool_choice="required"),
    LlmCall(LOOP, tools=[COUNT, REVERSE], tool_choice="auto", response_format={"type": "json_object"}),
    LlmCall([USER], response_format={"type": "json_object"}),
    LlmCall(
        [USER],
        tools=[COUNT],
        response_format={
            "type": "json_schema",
            "name": "answer",
            "schema": json.dumps(
                {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 0}},
                    "required": ["n"],
                    "additionalProperties": False,
                }
            ),
        },
    ),
]


@pytest.mark.parametrize("call", SDK_SHAPES)
@pytest.mark.parametrize("streaming", [False, True])
def test_the_openai_body_is_what_the_sdks_create_would_send(call: LlmCall, streaming: bool) -> None:
    """The adapter hands its body to `create` as extra_body, skipping the SDK's walk over typed arguments:
    that is sound only while the walk would leave every field as it is, checked here against the SDK
    installed (a change there fails this test, not the wire)."""
    from openai._utils import maybe_transform
    from openai.types.chat import completion_create_params as params

    body = {"model": "m", **openai_request(prepared(call)), "max_completion_tokens": 64}
    shape = params.CompletionCreateParamsStreaming if streaming else params.CompletionCreateParamsNonStreaming
    assert maybe_transform(body, shape) == body


@pytest.mark.parametrize("streaming", [False, True])
def test_the_openai_wire_body_is_the_request_as_built(streaming: bool, srv: FakeLlmServer) -> None:
    """`messages=[]` goes to create only because it is required: the body's own messages replace it."""
    srv.default = Behaviour(json_value={"n": 1})
    call = SDK_SHAPES[-1]
    complete(session("openai", srv), call, streaming)
    [request] = srv.requests
    sent = dict(request.body)
    assert sent.pop("model") and sent.pop("max_completion_tokens") > 0
    if streaming:
        assert (sent.pop("stream"), sent.pop("stream_options")) == (True, {"include_usage": True})
    assert sent == openai_request(prepared(call))
    assert sent["messages"] and srv.problems == []


def test_screen_refuses_too_many_tools_before_decoding(srv: FakeLlmServer) -> None:
    sess = session("openai", srv)
    sess.screen(tool_count=MAX_TOOLS)  # passes, counts nothing
    with pytest.raises(LlmRefusal) as info:
        sess.screen(tool_count=MAX_TOOLS + 1)
    assert info.value.reason == "LLM_TOOL_NOT_ALLOWED"
    assert (sess.usage()["requests"], sess.usage()["refused_tool"]) == (1, 1)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_admitted_call_is_settled_exactly_once(
    provider: str, srv: FakeLlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget hook's contract (host/llm/budget.py settles or releases there): once per admitted call, with
    the provider's usage when there is one, whatever way the call ends."""
    settled: list[tuple[int, int] | None] = []
    monkeypatch.setattr(
        LlmSession,
        "_settled",
        lambda self, admitted, c, **_: settled.append(c and (c.input_tokens, c.output_tokens)),
    )
    sess = session(provider, srv, max_output_chars=20)
    srv.script(
        Behaviour(text="ok"),  # call: completed
        *[Behaviour(status=500)] * 3,  # call: provider failure (3 attempts: the broker retries a 5xx)
        Behaviour(text="y" * 30),  # call: over the output cap (usage known)
        Behaviour(text="ok", chunks=1),  # stream: completed
        Behaviour(text="y" * 30, chunks=3),  # stream: cut at the cap
        Behaviour(text="abcdef", chunks=3),  # stream: closed by the consumer
    )
    sess.call([USER])
    for _ in range(2):
        with pytest.raises(LlmRefusal):
            sess.call([USER])
    list(sess.stream([USER]))
    with pytest.raises(LlmRefusal):
        list(sess.stream([USER]))
    stream = sess.stream([USER])
    next(stream)
    stream.close()
    with pytest.raises(LlmRefusal):
        sess.call(tools_call(["evil:rm"]))  # refused before admission: nothing to settle
    assert [s is not None for s in settled] == [True, False, True, True, False, False]
    assert settled[0] is not None and settled[0][1] == 2


def test_a_streams_final_chunk_is_held_to_the_output_cap_too(srv: FakeLlmServer) -> None:
    # Canonical JSON can be longer than what streamed (1E15 is 1000000000000000.0 once parsed and written):
    # the final chunk re-sends every call's canonical arguments, so the cap is checked there as well.
    raw = '{"n":1E15,"m":2E15}'
    srv.default = Behaviour(tool_calls=(FakeToolCall(REVERSE, raw, raw=True),))
    sess = session("openai", srv, max_output_chars=len(raw) + 2)
    with pytest.raises(LlmRefusal) as info:
        list(sess.stream(LlmCall([USER], tools=[REVERSE])))
    assert info.value.reason == "LLM_OUTPUT_TOO_LARGE"
    assert sess.usage()["refused_output"] == 1
