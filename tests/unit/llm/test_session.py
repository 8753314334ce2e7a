"""One run's LLM session (host/llm/session.py, admission.py) with the real SDKs against a local fake
provider: the caps and their order, nothing spent on a refusal, streams cut at the cap, and the input cap
counting what is sent."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import pytest

from host.llm.admission import MAX_MESSAGES, MESSAGE_OVERHEAD_CHARS, LlmRefusal, input_chars
from host.llm.providers import Completion
from host.llm.toolcalls import MAX_TOOL_CALLS, MAX_TOOLS, json_string_bytes
from host.policy.rules import LlmPolicy
from tests.support.fake_llm import Behaviour, FakeLlmServer
from tests.unit.llm._support import MESSAGES, PROVIDERS, drain, grant, refusal, session, wait_for

MESSAGES_INPUT = 13 + len("system") + len("user") + 2 * MESSAGE_OVERHEAD_CHARS  # contents, roles, overhead


def test_default_deny_never_reaches_the_provider(srv: FakeLlmServer) -> None:
    sess = session("openai", srv, LlmPolicy())
    assert refusal(sess.call, MESSAGES).reason == "LLM_NOT_GRANTED"
    assert refusal(drain, sess).reason == "LLM_NOT_GRANTED"
    assert srv.requests == []
    assert sess.usage()["refused_disabled"] == 2
    assert sess.usage()["requests"] == 2
    assert sess.calls_remaining == 0


def test_call_cap_is_literal(srv: FakeLlmServer) -> None:
    sess = session("openai", srv, grant(max_calls=2))
    sess.call(MESSAGES)
    drain(sess)
    assert sess.calls_remaining == 0
    assert refusal(sess.call, MESSAGES).reason == "LLM_CALL_LIMIT"
    assert refusal(drain, sess).reason == "LLM_CALL_LIMIT"
    assert len(srv.requests) == 2
    assert sess.usage()["refused_limit"] == 2


def test_concurrent_calls_never_exceed_the_cap(srv: FakeLlmServer) -> None:
    srv.default = Behaviour(delay=0.05)  # keep the admitted calls in flight while the rest arrive
    sess = session("openai", srv, grant(max_calls=5))
    barrier = threading.Barrier(50)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            sess.call(MESSAGES)
            outcome = "ok"
        except LlmRefusal as exc:
            outcome = exc.reason
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(outcomes) == ["LLM_CALL_LIMIT"] * 45 + ["ok"] * 5
    assert len(srv.requests) == 5
    usage = sess.usage()
    assert (usage["requests"], usage["calls"], usage["ok"], usage["refused_limit"]) == (50, 5, 5, 45)


def test_input_cap_counts_roles_contents_and_overhead_and_is_not_charged(srv: FakeLlmServer) -> None:
    assert MESSAGES_INPUT == 31
    assert session("openai", srv, grant(max_input_chars=31)).call(MESSAGES).content == "fake reply"
    sess = session("openai", srv, grant(max_input_chars=30))
    assert refusal(sess.call, MESSAGES).reason == "LLM_INPUT_TOO_LARGE"
    assert refusal(drain, sess).reason == "LLM_INPUT_TOO_LARGE"
    assert len(srv.requests) == 1
    assert sess.usage()["refused_input"] == 2
    assert sess.calls_remaining == 5


@pytest.mark.parametrize("allowed", [frozenset({"gpt-4o"}), frozenset()])
def test_model_outside_allowed_models_never_reaches_the_provider(
    allowed: frozenset[str], srv: FakeLlmServer
) -> None:
    sess = session("openai", srv, grant(allowed_models=allowed))
    assert refusal(sess.call, MESSAGES).reason == "LLM_MODEL_NOT_ALLOWED"
    assert refusal(drain, sess).reason == "LLM_MODEL_NOT_ALLOWED"
    assert srv.requests == []
    assert sess.usage()["refused_model"] == 2
    assert sess.usage()["model"] == "gpt-4o-mini"


def test_allowed_model_is_served(srv: FakeLlmServer) -> None:
    sess = session("anthropic", srv, grant(allowed_models=frozenset({"claude-x"})), model="claude-x")
    assert sess.call(MESSAGES).content == "fake reply"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_output_cap_on_call(provider: str, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(text="x" * 10)
    assert session(provider, srv, grant(max_output_chars=10)).call(MESSAGES).content == "x" * 10
    sess = session(provider, srv, grant(max_output_chars=9))
    assert refusal(sess.call, MESSAGES).reason == "LLM_OUTPUT_TOO_LARGE"
    assert (sess.usage()["refused_output"], sess.usage()["calls"], sess.usage()["ok"]) == (1, 1, 0)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_is_cut_at_exactly_the_cap_and_the_provider_stream_closed(
    provider: str, srv: FakeLlmServer
) -> None:
    srv.default = Behaviour(text="abcdefghij" * 4, chunks=8, chunk_delay=0.02)
    sess = session(provider, srv, grant(max_output_chars=12))
    stream = sess.stream(MESSAGES)
    assert [next(stream), next(stream), next(stream)] == ["abcde", "fghij", "ab"]
    # Closed at the cap, before the consumer even asks for more.
    assert wait_for(lambda: srv.disconnects == 1)
    assert sess.usage()["refused_output"] == 1
    assert refusal(next, stream).reason == "LLM_OUTPUT_TOO_LARGE"


def test_stream_exactly_at_the_cap_completes(srv: FakeLlmServer) -> None:
    srv.default = Behaviour(text="abcdefghij", chunks=2)
    items = drain(session("anthropic", srv, grant(max_output_chars=10)))
    assert items[:-1] == ["abcde", "fghij"]
    assert isinstance(items[-1], Completion)


def test_closing_a_stream_early_closes_the_provider_stream(srv: FakeLlmServer) -> None:
    srv.default = Behaviour(text="abcdefghij" * 4, chunks=8, chunk_delay=0.02)
    stream = session("openai", srv).stream(MESSAGES)
    assert isinstance(stream, Generator)
    assert next(stream) == "abcde"
    stream.close()
    assert wait_for(lambda: srv.disconnects == 1)


@pytest.mark.parametrize(
    ("provider", "output_chars", "expected"),
    [("openai", 10, 4), ("anthropic", 10, 4), ("anthropic", 1, 1), ("openai", 10**9, 16384)],
)
def test_max_tokens_bound_is_derived_from_the_output_cap(
    provider: str, output_chars: int, expected: int, srv: FakeLlmServer
) -> None:
    srv.default = Behaviour(text="ok"[: min(2, output_chars)])
    session(provider, srv, grant(max_output_chars=output_chars)).call(MESSAGES)
    field = "max_completion_tokens" if provider == "openai" else "max_tokens"
    assert srv.requests[0].body[field] == expected


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [{"role": "tool", "content": "x"}],
        [{"role": "user", "content": 5}],
        [{"role": "user"}],
        ["user: hello"],
        None,
    ],
)
def test_malformed_messages_are_invalid_requests(messages: Any, srv: FakeLlmServer) -> None:
    sess = session("openai", srv)
    assert refusal(sess.call, messages).reason == "INVALID_REQUEST"
    assert refusal(drain, sess, messages).reason == "INVALID_REQUEST"
    assert srv.requests == []
    assert sess.calls_remaining == 5


# --- the input cap counts what is sent; cheap checks come before any message (red-team issue 12) ---------


def sent_chars(body: dict[str, Any]) -> int:
    """Roles, contents and the system text as they reached the provider."""
    system = body.get("system", "")
    return sum(len(m["role"]) + len(m["content"]) for m in body["messages"]) + len(system)


STRUCTURE_BYTES = 25
"""JSON a message costs in a request body besides its role and content: {"role":"","content":""},"""
BODY_FIELDS_BYTES = 256
"""The rest of a body: model, max_tokens, stream flags, the "system" key."""


def sent_bytes(request: Any) -> int:
    """The request body's size as it reached the provider (its Content-Length), checked against the body."""
    size = int(request.headers["content-length"])
    assert size == len(json.dumps(request.body, ensure_ascii=False, separators=(",", ":")).encode())
    return size


def shapes(cap: int) -> list[list[dict[str, str]]]:
    """Message lists that probe the accounting at `cap`: empty floods, separator floods, mixed roles."""
    return [
        [{"role": "user", "content": ""}] * (cap // 8),  # empty user messages: 8 each
        [{"role": "user", "content": ""}] * (cap // 8 + 1),
        [{"role": "system", "content": ""}] * 150 + [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "a"}] * (cap // 11) + [{"role": "user", "content": "q"}],
        [{"role": "system", "content": "a"}] * (cap // 11 + 1),
        [{"role": r, "content": "x" * 37} for r in ("system", "user", "assistant") * (cap // 150)],
        [{"role": "user", "content": "y" * (cap - len("user") - MESSAGE_OVERHEAD_CHARS)}],
        [{"role": "user", "content": "y" * (cap - len("user") - MESSAGE_OVERHEAD_CHARS + 1)}],
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_what_reaches_the_provider_stays_under_the_input_cap(provider: str, srv: FakeLlmServer) -> None:
    """Finding 3: empty messages used to cost nothing against the cap (14.5 MB under 2,000 characters),
    and Anthropic's joined system prompt of empty messages counted as one character."""
    cap = 2000
    admitted = refused_input = 0
    for messages in shapes(cap):
        sess = session(provider, srv, grant(max_input_chars=cap))
        if input_chars(messages) > cap or len(messages) > MAX_MESSAGES:
            assert refusal(sess.call, messages).reason == "LLM_INPUT_TOO_LARGE"
            refused_input += 1
            continue
        sess.call(messages)
        admitted += 1
        body = srv.requests[-1].body
        assert sent_chars(body) <= cap, sent_chars(body)
        assert len(body["messages"]) <= MAX_MESSAGES
        assert sent_bytes(srv.requests[-1]) <= cap + STRUCTURE_BYTES * len(messages) + BODY_FIELDS_BYTES
    assert admitted == len(srv.requests) == 5 and refused_input == 3
    if provider == "anthropic":
        flooded = srv.requests[1].body  # 150 empty system messages are dropped, not joined into "\n\n"s
        assert "system" not in flooded and flooded["messages"] == [{"role": "user", "content": "hi"}]
        joined = srv.requests[2].body["system"]
        assert joined == "\n\n".join(["a"] * (cap // 11)) and len(joined) <= cap


class _Untouchable(Sequence[Mapping[str, str]]):
    """A huge message list whose elements must never be looked at."""

    def __len__(self) -> int:
        return 2_000_000

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError("a message was looked at")


def test_too_many_messages_are_refused_before_any_is_looked_at(srv: FakeLlmServer) -> None:
    sess = session("openai", srv, grant(max_input_chars=10**7))
    assert refusal(sess.call, _Untouchable()).reason == "LLM_INPUT_TOO_LARGE"
    assert refusal(drain, sess, _Untouchable()).reason == "LLM_INPUT_TOO_LARGE"
    ungranted = session("openai", srv, LlmPolicy())
    assert refusal(ungranted.call, _Untouchable()).reason == "LLM_NOT_GRANTED"
    started = time.thread_time()
    flood = [{"role": "user", "content": ""}] * 2_000_000
    assert refusal(sess.call, flood).reason == "LLM_INPUT_TOO_LARGE"
    assert time.thread_time() - started < 0.05
    assert srv.requests == [] and sess.usage()["refused_input"] == 3


def test_screen_refuses_what_needs_no_message_and_counts_like_call(srv: FakeLlmServer) -> None:
    ungranted = session("openai", srv, LlmPolicy())
    assert ungranted.max_request_bytes == 0
    assert refusal(lambda: ungranted.screen(request_bytes=1)).reason == "LLM_NOT_GRANTED"
    sess = session("openai", srv, grant(max_calls=1, max_input_chars=100))
    # The input counts at least its UTF-8 bytes; framing of each message, tool definition and tool call.
    assert sess.max_request_bytes == 100 + 16 * (MAX_MESSAGES + MAX_TOOLS + MAX_TOOL_CALLS) + 256
    sess.screen(request_bytes=sess.max_request_bytes, message_count=MAX_MESSAGES)  # passes, counts nothing
    assert sess.usage()["requests"] == 0
    too_big = refusal(lambda: sess.screen(request_bytes=sess.max_request_bytes + 1))
    too_many = refusal(lambda: sess.screen(message_count=MAX_MESSAGES + 1))
    assert too_big.reason == too_many.reason == "LLM_INPUT_TOO_LARGE"
    sess.call(MESSAGES)
    assert refusal(lambda: sess.screen(request_bytes=10)).reason == "LLM_CALL_LIMIT"
    usage = sess.usage()
    assert (usage["requests"], usage["refused_input"], usage["refused_limit"]) == (4, 2, 1)
    assert ungranted.usage()["refused_disabled"] == 1


def test_on_admit_runs_once_an_admitted_call_is_reserved(srv: FakeLlmServer) -> None:
    admitted: list[str] = []
    sess = session("openai", srv, grant(max_calls=2, max_input_chars=40))
    sess.call(MESSAGES, on_admit=lambda: admitted.append("call"))
    drain_items = list(sess.stream(MESSAGES, on_admit=lambda: admitted.append("stream")))
    assert admitted == ["call", "stream"] and isinstance(drain_items[-1], Completion)
    refusal(lambda: sess.call([{"role": "user", "content": "z" * 50}], on_admit=lambda: admitted.append("x")))
    refusal(lambda: sess.call(MESSAGES, on_admit=lambda: admitted.append("y")))  # LLM_CALL_LIMIT
    assert admitted == ["call", "stream"]


# --- the input cap counts the bytes that are sent, escaping and UTF-8 included ---------------------------


# One character of each shape and what it takes in the body: "\x01" is written \u0001, '"' and "\\" take
# a backslash each, an emoji is 4 bytes of UTF-8, "\n" is written \n.
WIRE_SHAPES = {"control": ("\x01", 6), "quote": ('"', 2), "backslash": ("\\", 2), "newline": ("\n", 2),
               "emoji": ("\U0001f600", 4), "accented": ("é", 2), "plain": ("x", 1)}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(WIRE_SHAPES))
@pytest.mark.parametrize("role", ["user", "system"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_input_cap_counts_escaped_utf8_bytes(
    provider: str, role: str, shape: str, srv: FakeLlmServer
) -> None:
    """A 20,000-character cap counted in characters let "\x01" * N send 6 N bytes (12 N with ensure_ascii
    emoji): the cap now holds for the bytes of the body whatever the content is made of."""
    char, width = WIRE_SHAPES[shape]
    cap = 2000
    question = {"role": "user", "content": "q"}
    fits = (cap - len(role) - MESSAGE_OVERHEAD_CHARS - input_chars([question])) // width

    def request(n: int) -> list[dict[str, str]]:
        return [{"role": role, "content": char * n}, question]

    sess = session(provider, srv, grant(max_input_chars=cap))
    assert refusal(sess.call, request(fits + 1)).reason == "LLM_INPUT_TOO_LARGE"
    assert refusal(drain, sess, request(fits + 1)).reason == "LLM_INPUT_TOO_LARGE"
    sess.call(request(fits))
    drain(sess, request(fits))
    assert len(srv.requests) == 2 and sess.usage()["refused_input"] == 2
    for sent in srv.requests:
        assert sent_bytes(sent) <= cap + 2 * STRUCTURE_BYTES + BODY_FIELDS_BYTES, sent_bytes(sent)
        assert sent_bytes(sent) > cap - width - 2 * STRUCTURE_BYTES  # the cap is what bounds it, not less


@pytest.mark.parametrize("provider", PROVIDERS)
def test_many_escaped_messages_stay_under_the_cap_plus_their_structure(
    provider: str, srv: FakeLlmServer
) -> None:
    cap = 20000
    mixed = '\x01\x1f"\\\n\U0001f600é x' * 40
    messages = [
        {"role": ("system", "user", "assistant")[i % 3], "content": mixed} for i in range(MAX_MESSAGES)
    ]
    fitting = messages[: max(1, cap // input_chars(messages[:1]))]
    fitting = fitting[: next(n for n in range(len(fitting), 0, -1) if input_chars(fitting[:n]) <= cap)]
    sess = session(provider, srv, grant(max_input_chars=cap))
    assert refusal(sess.call, fitting + messages[:1]).reason == "LLM_INPUT_TOO_LARGE"
    sess.call(fitting)
    [request] = srv.requests
    assert sent_bytes(request) <= cap + STRUCTURE_BYTES * len(fitting) + BODY_FIELDS_BYTES


def test_json_string_bytes_is_what_the_sdks_send() -> None:
    """The count is what both SDKs' own body serializer (ensure_ascii=False, UTF-8) sends, to the byte."""
    from anthropic._utils._json import openapi_dumps as anthropic_dumps
    from openai._utils._json import openapi_dumps as openai_dumps

    rng = random.Random(12)
    alphabet = [chr(c) for c in range(0x80)] + ["é", "\u07ff", "\u0800", "\u2028", "\uffff", "\U0001f600"]
    texts = ["", "x" * 1000, "\x01" * 1000, '"' * 1000, "\U0001f600" * 1000]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(80))) for _ in range(500)]
    for text in texts:
        assert json_string_bytes(text) == len(openai_dumps(text)) - 2 == len(anthropic_dumps(text)) - 2, text


def test_json_string_bytes_is_linear_and_cheap() -> None:
    """No per-character Python: megabytes of the worst shapes are counted in milliseconds."""
    for char, width in WIRE_SHAPES.values():
        text = char * 2_000_000
        started = time.thread_time()
        assert json_string_bytes(text) == width * 2_000_000
        assert time.thread_time() - started < 0.25
