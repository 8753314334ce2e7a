"""The LLM broker with the real openai/anthropic SDKs against a local fake provider: caps, refusals, leaks."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import ConfigError
from host.llm.admission import MAX_MESSAGES, MESSAGE_OVERHEAD_CHARS, LlmRefusal, input_chars
from host.llm.broker import LlmBroker
from host.llm.budget import RetryPolicy
from host.llm.credentials import MAX_ENV_FILE_BYTES, parse_env_text, read_env_file
from host.llm.providers import Completion
from host.llm.session import LlmSession
from host.llm.toolcalls import MAX_TOOL_CALLS, MAX_TOOLS, json_string_bytes
from host.policy.rules import LlmPolicy
from host.runtime.backends.hostproc import HostSpec, host_wrapper_env
from host.runtime.rundir import RunDir
from host.spec.config import AgentLlmConfig, LlmHostConfig
from host.tools.gate import _worker_env
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer

CANARY = "sk-canary-XYZ"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
MESSAGES_INPUT = 13 + len("system") + len("user") + 2 * MESSAGE_OVERHEAD_CHARS  # contents, roles, overhead
PROVIDERS = ["openai", "anthropic"]


@pytest.fixture
def srv() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as server:
        yield server


def env_for(provider: str, srv: FakeLlmServer) -> dict[str, str]:
    if provider == "openai":
        return {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": srv.base_url_openai}
    return {"ANTHROPIC_API_KEY": CANARY, "ANTHROPIC_BASE_URL": srv.base_url_anthropic}


def grant(**overrides: Any) -> LlmPolicy:
    caps: dict[str, Any] = {"max_calls": 5, "max_input_chars": 1000, "max_output_chars": 1000}
    return LlmPolicy(enabled=True, **(caps | overrides))


def session(provider: str, srv: FakeLlmServer, policy: LlmPolicy | None = None, **host: Any) -> LlmSession:
    return LlmBroker(LlmHostConfig(**host), env=env_for(provider, srv)).session(policy or grant())


def refusal(fn: Any, *args: Any) -> LlmRefusal:
    with pytest.raises(LlmRefusal) as info:
        fn(*args)
    return info.value


def drain(sess: LlmSession, messages: Any = MESSAGES) -> list[str | Completion]:
    return list(sess.stream(messages))


def wait_for(predicate: Any, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_openai_call_sends_the_host_model_key_and_bound(srv: FakeLlmServer) -> None:
    sess = session("openai", srv)
    completion = sess.call(MESSAGES)
    assert completion == Completion("fake reply", "stop", input_tokens=13, output_tokens=10)
    [req] = srv.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {CANARY}"
    assert req.body["model"] == "gpt-4o-mini"
    assert req.body["messages"] == MESSAGES
    assert req.body["max_completion_tokens"] == 334  # ceil(1000 / 3)
    assert "max_tokens" not in req.body
    assert sess.usage() == {
        "requests": 1, "calls": 1, "ok": 1, "refused_disabled": 0, "refused_limit": 0, "refused_input": 0,
        "refused_output": 0, "refused_model": 0, "refused_tool": 0, "provider_errors": 0, "tool_calls": 0,
        "tool_calls_refused": 0, "model": "gpt-4o-mini",
    }  # fmt: skip
    assert sess.calls_remaining == 4


def test_anthropic_call_moves_system_messages_to_the_system_parameter(srv: FakeLlmServer) -> None:
    sess = session("anthropic", srv)
    messages = [*MESSAGES, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "no lists"}]
    completion = sess.call(messages)
    assert completion == Completion("fake reply", "stop", input_tokens=18 + 7, output_tokens=10)
    [req] = srv.requests
    assert req.path == "/v1/messages"
    assert CANARY in req.headers.get("authorization", "") + req.headers.get("x-api-key", "")
    assert req.body["model"] == "claude-3-5-haiku-latest"
    assert req.body["system"] == "be brief\n\nno lists"
    assert req.body["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "ok"},
    ]
    assert req.body["max_tokens"] == 334
    assert sess.usage()["model"] == "claude-3-5-haiku-latest"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_yields_chunks_then_one_final_completion(provider: str, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(text="abcdefghij", chunks=5)
    sess = session(provider, srv)
    items = drain(sess)
    assert items[:-1] == ["ab", "cd", "ef", "gh", "ij"]
    assert items[-1] == Completion("", "stop", input_tokens=13, output_tokens=10)
    assert sess.usage()["ok"] == 1
    assert sess.usage()["calls"] == 1
    [req] = srv.requests
    assert req.body["stream"] is True
    if provider == "openai":
        assert req.body["stream_options"] == {"include_usage": True}


def test_openai_compatible_uses_the_configured_url_and_a_dummy_key(srv: FakeLlmServer) -> None:
    broker = LlmBroker(
        LlmHostConfig(provider="openai_compatible", base_url=srv.base_url_openai, model="llama3"), env={}
    )
    assert broker.describe() == {
        "provider": "openai_compatible", "model": "llama3", "configured": True,
        "provider_source": "host config", "key_variable": "OPENAI_API_KEY", "key_source": None,
        "unavailable": None,
    }  # fmt: skip
    assert broker.session(grant(max_output_chars=30)).call(MESSAGES).content == "fake reply"
    [req] = srv.requests
    assert req.headers["authorization"] == "Bearer not-needed"
    assert req.body["model"] == "llama3"
    assert req.body["max_tokens"] == 10
    assert "max_completion_tokens" not in req.body


def test_openai_compatible_takes_key_and_url_from_env(srv: FakeLlmServer) -> None:
    env = {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": srv.base_url_openai}
    LlmBroker(LlmHostConfig(provider="openai_compatible"), env=env).session(grant()).call(MESSAGES)
    assert srv.requests[0].headers["authorization"] == f"Bearer {CANARY}"


def test_openai_compatible_without_a_url_is_unconfigured() -> None:
    broker = LlmBroker(LlmHostConfig(provider="openai_compatible"), env={})
    assert broker.describe()["configured"] is False
    assert refusal(broker.session(grant()).call, MESSAGES).reason == "LLM_UNAVAILABLE"


@pytest.mark.parametrize(
    ("keys", "configured_provider", "expected"),
    [
        ({"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}, None, "openai"),
        ({"ANTHROPIC_API_KEY"}, None, "anthropic"),
        ({"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}, "anthropic", "anthropic"),
    ],
)
def test_provider_selection(
    keys: set[str], configured_provider: str | None, expected: str, srv: FakeLlmServer
) -> None:
    env = {k: CANARY for k in keys} | {
        "OPENAI_BASE_URL": srv.base_url_openai,
        "ANTHROPIC_BASE_URL": srv.base_url_anthropic,
    }
    broker = LlmBroker(LlmHostConfig(provider=configured_provider), env=env)
    assert broker.describe()["provider"] == expected
    broker.session(grant()).call(MESSAGES)
    assert srv.requests[0].path == ("/v1/chat/completions" if expected == "openai" else "/v1/messages")


def test_no_provider_refuses_without_charging_a_call() -> None:
    broker = LlmBroker(LlmHostConfig(), env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    described = broker.describe()
    assert {k: described[k] for k in ("provider", "model", "configured", "key_source")} == {
        "provider": None, "model": None, "configured": False, "key_source": None,
    }  # fmt: skip
    assert "no LLM provider" in described["unavailable"]
    sess = broker.session(grant())
    assert refusal(sess.call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert sess.usage()["provider_errors"] == 1
    assert sess.calls_remaining == 5


def test_keys_come_only_from_the_given_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    assert LlmBroker(LlmHostConfig(), env={}).describe()["configured"] is False
    assert LlmBroker(LlmHostConfig()).describe()["configured"] is True  # default: os.environ


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


ERRORS = [
    (Behaviour(status=429), "LLM_RATE_LIMITED"),
    (Behaviour(status=500), "LLM_UNAVAILABLE"),
    (Behaviour(status=400), "LLM_UNAVAILABLE"),
    (Behaviour(garbage=True), "LLM_UNAVAILABLE"),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(("behaviour", "reason"), ERRORS)
def test_provider_errors_map_to_generic_refusals(
    provider: str, streaming: bool, behaviour: Behaviour, reason: str, srv: FakeLlmServer
) -> None:
    srv.default = behaviour
    broker = LlmBroker(LlmHostConfig(), env=env_for(provider, srv), retry=RetryPolicy(base_delay=0.0))
    sess = broker.session(grant())
    exc = refusal(drain if streaming else sess.call, *((sess,) if streaming else (MESSAGES,)))
    assert exc.reason == reason
    assert SECRET_IN_ERROR_BODY not in str(exc)
    assert exc.__cause__ is None
    assert exc.__context__ is None  # the provider exception (and its body) is not chained
    # The SDKs never retry (max_retries=0); the broker retries 429 and 5xx only, 3 attempts in all, within
    # the call's one call slot.
    transient = behaviour.status in (429, 500)
    assert len(srv.requests) == (3 if transient else 1)
    assert (sess.usage()["provider_errors"], sess.usage()["calls"]) == (1, 1)
    assert sess.budget_usage()["retries"] == (2 if transient else 0)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    "behaviour", [Behaviour(hang=True), Behaviour(text="abcdef", chunks=3, chunk_delay=1.0)]
)
def test_silent_provider_times_out(provider: str, behaviour: Behaviour, srv: FakeLlmServer) -> None:
    srv.default = behaviour
    sess = session(provider, srv, timeout_seconds=0.3)
    received: list[str | Completion] = []
    with pytest.raises(LlmRefusal) as info:
        for item in sess.stream(MESSAGES):
            received.append(item)
    assert info.value.reason == "LLM_TIMEOUT"
    assert received == ([] if behaviour.hang else ["ab"])
    if behaviour.hang:
        assert refusal(sess.call, MESSAGES).reason == "LLM_TIMEOUT"


def test_unreachable_provider_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"}
    sess = LlmBroker(LlmHostConfig(), env=env).session(grant())
    assert refusal(sess.call, MESSAGES).reason == "LLM_UNAVAILABLE"


def test_missing_sdk_is_unavailable_and_not_charged(
    monkeypatch: pytest.MonkeyPatch, srv: FakeLlmServer
) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # `import anthropic` now fails
    sess = session("anthropic", srv)
    assert refusal(sess.call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert srv.requests == []
    assert (sess.usage()["provider_errors"], sess.calls_remaining) == (1, 5)


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


@pytest.mark.parametrize(
    ("provider", "raw", "expected"),
    [
        ("openai", "length", "length"),
        ("openai", "content_filter", "content_filter"),
        ("openai", "tool_calls", "tool_calls"),
        ("openai", "function_call", "other"),
        ("anthropic", "tool_use", "tool_calls"),
        ("anthropic", "max_tokens", "length"),
        ("anthropic", "stop_sequence", "stop"),
        ("anthropic", "refusal", "content_filter"),
        ("anthropic", "pause_turn", "other"),
    ],
)
def test_finish_reasons_are_normalized(provider: str, raw: str, expected: str, srv: FakeLlmServer) -> None:
    srv.default = Behaviour(finish=raw)
    sess = session(provider, srv)
    assert sess.call(MESSAGES).finish_reason == expected
    final = drain(sess)[-1]
    assert isinstance(final, Completion)
    assert final.finish_reason == expected


def test_key_url_model_and_provider_text_never_leak(
    srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    model = "host-secret-model-Q"
    prompt = "PROMPT-MARKER-91"
    messages = [{"role": "user", "content": prompt}]
    env: Mapping[str, str] = env_for("openai", srv)
    # One attempt per call: each scripted failure answers exactly one call.
    host = LlmHostConfig(model=model, timeout_seconds=0.3)
    broker = LlmBroker(host, env=env, retry=RetryPolicy(max_attempts=1))
    refusals: list[LlmRefusal] = []

    def attempt(policy: LlmPolicy, streaming: bool = False) -> None:
        sess = broker.session(policy)
        try:
            drain(sess, messages) if streaming else sess.call(messages)
        except LlmRefusal as exc:
            refusals.append(exc)
        usage = repr(sess.usage())
        assert CANARY not in usage
        assert srv.base_url not in usage

    for behaviour in [
        Behaviour(status=429),
        Behaviour(status=500),
        Behaviour(garbage=True),
        Behaviour(hang=True),
    ]:
        srv.script(behaviour, behaviour)
        attempt(grant())
        attempt(grant(), streaming=True)
    srv.default = Behaviour(text="y" * 50)
    attempt(grant(max_output_chars=10))
    attempt(grant(max_output_chars=10), streaming=True)
    attempt(grant(allowed_models=frozenset({"other"})))
    attempt(grant(max_input_chars=3))
    attempt(LlmPolicy())

    assert len(refusals) == 13
    for exc in refusals:
        for text in (str(exc), repr(exc), exc.message):
            for secret in (CANARY, SECRET_IN_ERROR_BODY, srv.base_url, model, prompt):
                assert secret not in text
    described = repr(broker.describe())
    assert CANARY not in described
    assert srv.base_url not in described
    assert CANARY not in caplog.text
    assert SECRET_IN_ERROR_BODY not in caplog.text
    ours = [r.getMessage() for r in caplog.records if r.name == "agentnode.sandbox.broker"]
    assert ours  # the failures were logged, by type only
    for line in ours:
        for secret in (prompt, model, srv.base_url):
            assert secret not in line
    # ...while the key did go to the provider, host-side.
    assert all(r.headers["authorization"] == f"Bearer {CANARY}" for r in srv.requests)
    assert len(srv.requests) == 10


@pytest.mark.parametrize("provider", PROVIDERS)
def test_sdk_debug_logging_never_carries_the_prompt(
    provider: str, srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    prompt = "PROMPT-MARKER-42"
    sess = session(provider, srv)
    sess.call([{"role": "user", "content": prompt}])
    drain(sess, [{"role": "user", "content": prompt}])
    assert prompt not in caplog.text
    assert CANARY not in caplog.text


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



# --- .env and agent-config.json ---------------------------------------------------------------------

FILE_KEY = "sk-from-dotenv-FILE-41"
AGENT_KEY = "sk-agent-config-AGENT-77"


def test_env_text_is_parsed_like_dotenv(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "# a comment\n"
        "\n"
        "PLAIN=abc\n"
        "export EXPORTED=yes\n"
        "  SPACED  =  padded value  \n"
        "SINGLE='literal \\n #not a comment $HOME' # a comment\n"
        'DOUBLE="line\\nnext \\"q\\" \\\\ \\x # kept"\n'
        "INLINE=value # comment\n"
        "HASH=a#b\n"
        "EMPTY=\n"
        "QUOTED_EMPTY=''\n"
        "EXPAND=$PLAIN${PLAIN}\n"
        "DUP=first\r\n"
        "DUP=second\r"
        "export=word\n"
        "  # indented comment\n"
    )
    assert parse_env_text(text, ".env") == {
        "PLAIN": "abc",
        "EXPORTED": "yes",
        "SPACED": "padded value",
        "SINGLE": "literal \\n #not a comment $HOME",
        "DOUBLE": 'line\nnext "q" \\ \\x # kept',
        "INLINE": "value",
        "HASH": "a#b",
        "EMPTY": "",
        "QUOTED_EMPTY": "",
        "EXPAND": "$PLAIN${PLAIN}",  # nothing is expanded
        "DUP": "second",
        "export": "word",
    }
    assert caplog.records == []


def test_malformed_env_lines_are_ignored_with_a_warning_that_never_shows_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    text = (
        "GOOD=1\n"
        f"{CANARY}\n"  # no '='
        f"1BAD={CANARY}\n"  # not a name
        f"OPEN='{CANARY}\n"  # unclosed quote: a value never spans lines
        f'AFTER="{CANARY}"junk\n'  # text after the closing quote
        f"export {CANARY}\n"
        f"$(echo {CANARY})=x\n"  # never executed
        "ALSO_GOOD = 2\n"
    )
    assert parse_env_text(text, "/cfg/.env") == {"GOOD": "1", "ALSO_GOOD": "2"}
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "/cfg/.env: ignored 6 line(s) that are not KEY=VALUE (line 2, 3, 4, 5, 6, 7)"
    )
    assert CANARY not in caplog.text


def write_env_file(directory: Path, text: str, mode: int = 0o600) -> Path:
    path = directory / ".env"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_env_file_is_read_bounded_and_refused_when_too_large(tmp_path: Path) -> None:
    assert read_env_file(tmp_path / "missing") == {}
    path = write_env_file(tmp_path, "\ufeffA=1\n" + "# pad\n" * ((MAX_ENV_FILE_BYTES - 10) // 6))
    assert path.stat().st_size <= MAX_ENV_FILE_BYTES
    assert read_env_file(path) == {"A": "1"}  # a UTF-8 BOM is fine
    path.write_text("A=" + "x" * MAX_ENV_FILE_BYTES, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_env_file(path)
    assert str(info.value) == f"{path}: the .env file is larger than {MAX_ENV_FILE_BYTES} bytes"
    assert "xxxx" not in info.value.hint


def test_env_file_that_is_not_text_or_not_a_file_is_refused_without_showing_it(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_bytes(b"OPENAI_API_KEY=" + CANARY.encode() + b"\xff\xfe\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=r"\.env: the \.env file is not UTF-8 text$") as info:
        read_env_file(path)
    assert CANARY not in str(info.value) + info.value.hint
    assert info.value.__cause__ is None and info.value.__context__ is None
    path.unlink()
    os.mkfifo(path)  # a FIFO would block a plain open(); it is refused without waiting for a writer
    with pytest.raises(ConfigError, match="not a regular file"):
        read_env_file(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        read_env_file(path)


@pytest.mark.parametrize(("mode", "warned"), [(0o600, False), (0o400, False), (0o640, True), (0o604, True),
                                              (0o620, True)])  # fmt: skip
def test_env_file_open_to_others_is_used_with_a_warning(
    mode: int, warned: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_env_file(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\n", mode)
    assert read_env_file(path) == {"OPENAI_API_KEY": FILE_KEY}
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == ([f"{path} is readable or writable by group or others (mode {mode:o}): run chmod 600 "
                         f"{path}"] if warned else [])  # fmt: skip
    assert FILE_KEY not in caplog.text


def dotenv_host(tmp_path: Path, text: str, **host: Any) -> LlmHostConfig:
    env_file = write_env_file(tmp_path, text)
    return LlmHostConfig(env_file=env_file, agent_config_file=tmp_path / "ac.json", **host)


def test_dotenv_supplies_keys_and_urls_the_environment_lacks(tmp_path: Path, srv: FakeLlmServer) -> None:
    text = f"export OPENAI_API_KEY='{FILE_KEY}'\nOPENAI_BASE_URL={srv.base_url_openai}\n"
    host = dotenv_host(tmp_path, text)
    broker = LlmBroker(host, env={})
    described = broker.describe()
    assert described["configured"] is True
    assert (described["key_variable"], described["key_source"]) == ("OPENAI_API_KEY", ".env")
    assert FILE_KEY not in repr(described)
    broker.session(grant()).call(MESSAGES)
    assert srv.requests[0].headers["authorization"] == f"Bearer {FILE_KEY}"


def test_the_environment_wins_over_dotenv(tmp_path: Path, srv: FakeLlmServer) -> None:
    host = dotenv_host(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\nOPENAI_BASE_URL=http://127.0.0.1:9/v1\n")
    broker = LlmBroker(host, env=env_for("openai", srv))
    assert broker.describe()["key_source"] == "env"
    broker.session(grant()).call(MESSAGES)
    assert srv.requests[0].headers["authorization"] == f"Bearer {CANARY}"  # and the env's URL was used


def test_an_empty_environment_variable_counts_as_unset(tmp_path: Path, srv: FakeLlmServer) -> None:
    host = dotenv_host(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\n")
    broker = LlmBroker(host, env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": srv.base_url_openai})
    assert broker.describe()["key_source"] == ".env"


def test_dotenv_drives_auto_detection_in_the_sdk_order(tmp_path: Path, srv: FakeLlmServer) -> None:
    host = dotenv_host(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\n")
    described = LlmBroker(host, env={"ANTHROPIC_API_KEY": CANARY}).describe()
    assert (described["provider"], described["provider_source"], described["key_source"]) == (
        "openai", "auto-detect", ".env"
    )


def test_dotenv_never_reaches_os_environ_or_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, srv: FakeLlmServer
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "MY_AGENT_KEY"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    text = f"OPENAI_API_KEY={FILE_KEY}\nMY_AGENT_KEY={AGENT_KEY}\nOPENAI_BASE_URL={srv.base_url_openai}\n"
    host = dotenv_host(tmp_path, text, agents={"a": AgentLlmConfig("openai", api_key_env="MY_AGENT_KEY")})
    broker = LlmBroker(host)  # the real process environment
    broker.session(grant(), slug="a").call(MESSAGES)
    broker.session(grant()).call(MESSAGES)
    assert [r.headers["authorization"] for r in srv.requests] == [f"Bearer {AGENT_KEY}", f"Bearer {FILE_KEY}"]
    assert dict(os.environ) == before
    # What the host hands its children: a plain child, the host-path wrapper and a tool worker.
    child = subprocess.run(
        [sys.executable, "-c", "import os, sys; sys.stdout.write(repr(sorted(os.environ.items())))"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    wrapper = host_wrapper_env(RunDir(tmp_path), HostSpec(slug="a", import_root=str(tmp_path)), os.environ)
    for seen in (child.stdout, repr(wrapper), repr(_worker_env())):
        for secret in (FILE_KEY, AGENT_KEY, "MY_AGENT_KEY", srv.base_url):
            assert secret not in seen
    for secret in (FILE_KEY, AGENT_KEY):
        assert secret not in repr(vars(broker))


def agents_host(srv: FakeLlmServer, **host: Any) -> tuple[LlmHostConfig, dict[str, str]]:
    agents = {
        "writer": AgentLlmConfig("anthropic", "claude-writer"),
        "coder": AgentLlmConfig("openai", "gpt-coder", api_key_env="CODER_KEY"),
        "router": AgentLlmConfig("openrouter", "meta/llama-x"),
        "gem": AgentLlmConfig("gemini", "gemini-pro"),
        "plain": AgentLlmConfig("openai"),
    }
    env = {
        "OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": srv.base_url_openai,
        "ANTHROPIC_API_KEY": "sk-anthropic-K", "ANTHROPIC_BASE_URL": srv.base_url_anthropic,
        "CODER_KEY": AGENT_KEY,
        "OPENROUTER_API_KEY": "sk-or-K", "OPENROUTER_BASE_URL": srv.base_url_openai,
    }  # fmt: skip
    return LlmHostConfig(agents=agents, agent_config_file=Path("/cfg/agent-config.json"), **host), env


@pytest.mark.parametrize(
    ("slug", "path", "model", "key", "bound"),
    [
        (None, "/v1/chat/completions", "gpt-4o-mini", CANARY, "max_completion_tokens"),  # auto-detect
        ("unlisted", "/v1/chat/completions", "gpt-4o-mini", CANARY, "max_completion_tokens"),
        ("writer", "/v1/messages", "claude-writer", "sk-anthropic-K", "max_tokens"),
        ("coder", "/v1/chat/completions", "gpt-coder", AGENT_KEY, "max_completion_tokens"),
        ("router", "/v1/chat/completions", "meta/llama-x", "sk-or-K", "max_tokens"),
        ("plain", "/v1/chat/completions", "gpt-4o-mini", CANARY, "max_completion_tokens"),
    ],
)
def test_agent_config_picks_each_agents_provider_model_and_key(
    slug: str | None, path: str, model: str, key: str, *, bound: str, srv: FakeLlmServer
) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    sess = broker.session(grant(), slug=slug)
    assert sess.call(MESSAGES).content == "fake reply"
    assert drain(broker.session(grant(), slug=slug))[-1] == Completion("", "stop", 13, 10)
    for req in srv.requests:
        assert req.path == path
        assert req.body["model"] == model
        assert key in req.headers.get("authorization", "") + req.headers.get("x-api-key", "")
        assert bound in req.body
    assert sess.usage()["model"] == model
    described = broker.describe(slug)
    assert (described["provider_source"], described["model"]) == (
        "agent-config" if slug in ("writer", "coder", "router", "plain") else "auto-detect", model
    )
    assert described["key_variable"] == ("CODER_KEY" if slug == "coder" else described["key_variable"])


def test_openrouter_defaults_to_its_own_url() -> None:
    host = LlmHostConfig(agents={"r": AgentLlmConfig("openrouter")})
    broker = LlmBroker(host, env={"OPENROUTER_API_KEY": CANARY})
    assert broker._resolution("r").binding is not None
    assert broker._resolution("r").binding.base_url == "https://openrouter.ai/api/v1"  # type: ignore[union-attr]
    assert broker.describe("r")["model"] == "openai/gpt-4o-mini"


def test_host_pinned_provider_ignores_an_agent_config_for_another_provider(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv, provider="anthropic")
    broker = LlmBroker(host, env=env)
    broker.session(grant(), slug="coder").call(MESSAGES)  # coder asks for openai, gpt-coder, CODER_KEY
    [req] = srv.requests
    assert req.path == "/v1/messages" and req.body["model"] == "claude-3-5-haiku-latest"
    assert "sk-anthropic-K" in req.headers.get("authorization", "") + req.headers.get("x-api-key", "")
    assert broker.describe("coder")["provider_source"] == "host config"
    assert broker.describe("gem")["configured"] is True  # gemini is never reached when the host pins


def test_host_pinned_provider_keeps_the_agents_model_and_key_for_that_provider(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv, provider="openai")
    LlmBroker(host, env=env).session(grant(), slug="coder").call(MESSAGES)
    [req] = srv.requests
    assert (req.body["model"], req.headers["authorization"]) == ("gpt-coder", f"Bearer {AGENT_KEY}")


def test_host_pinned_model_and_url_win_over_agent_config(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv, model="host-model", base_url=srv.base_url_anthropic)
    env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # the host's base_url wins over the variable
    broker = LlmBroker(host, env=env)
    broker.session(grant(), slug="writer").call(MESSAGES)
    [req] = srv.requests
    assert (req.path, req.body["model"]) == ("/v1/messages", "host-model")


def test_allowed_models_apply_to_the_agent_config_model(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    sess = broker.session(grant(allowed_models=frozenset({"gpt-4o-mini"})), slug="writer")
    assert refusal(sess.call, MESSAGES).reason == "LLM_MODEL_NOT_ALLOWED"
    assert broker.session(grant(allowed_models=frozenset({"claude-writer"})), slug="writer").call(MESSAGES)
    assert len(srv.requests) == 1


def test_gemini_is_unavailable_with_a_clear_reason(
    srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    described = broker.describe("gem")
    assert (described["provider"], described["configured"]) == ("gemini", False)
    assert described["unavailable"] == (
        "provider gemini (agents.gem.llm in /cfg/agent-config.json) is not supported by the broker "
        "(no gemini SDK): choose openai, anthropic or openrouter there, or pin agent_sandbox.llm.provider"
    )
    sess = broker.session(grant(), slug="gem")
    assert refusal(sess.call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert (sess.usage()["provider_errors"], sess.calls_remaining) == (1, 5)
    assert described["unavailable"] in caplog.text
    assert srv.requests == []


def test_an_agent_configs_missing_key_never_falls_back_to_another_provider(
    tmp_path: Path, srv: FakeLlmServer
) -> None:
    agents = {"a": AgentLlmConfig("anthropic", api_key_env="NOPE")}
    host = LlmHostConfig(env_file=tmp_path / ".env", agents=agents)
    broker = LlmBroker(host, env=env_for("openai", srv))
    described = broker.describe("a")
    assert (described["provider"], described["configured"], described["key_variable"]) == (
        "anthropic", False, "NOPE"
    )
    assert described["unavailable"] == (
        f"no API key for anthropic: NOPE is set neither in the environment nor in {tmp_path / '.env'}"
    )
    assert refusal(broker.session(grant(), slug="a").call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert srv.requests == []
    assert broker.describe()["configured"] is True  # other agents still auto-detect openai


def test_adapters_are_built_once_per_binding(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    for slug in ("writer", "coder", "writer", None, "plain", "coder"):
        broker.session(grant(), slug=slug).call(MESSAGES)
    assert len(broker._adapters) == 3  # anthropic; openai with CODER_KEY; openai with OPENAI_API_KEY


def test_no_key_from_any_source_leaks_into_describe_refusals_or_logs(
    tmp_path: Path, srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host, env = agents_host(srv)
    env.pop("OPENAI_API_KEY")
    host = LlmHostConfig(
        env_file=write_env_file(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\nbroken {FILE_KEY}\n", 0o644),
        agents=host.agents, agent_config_file=host.agent_config_file,
    )  # fmt: skip
    broker = LlmBroker(host, env=env)
    srv.default = Behaviour(status=500)
    seen: list[str] = []
    for slug in (None, "writer", "coder", "router", "gem", "plain"):
        seen.append(repr(broker.describe(slug)))
        sess = broker.session(grant(), slug=slug)
        exc = refusal(sess.call, MESSAGES)
        seen += [str(exc), repr(exc), exc.message, repr(sess.usage())]
    seen.append(caplog.text)
    for secret in (FILE_KEY, AGENT_KEY, CANARY, "sk-anthropic-K", "sk-or-K", SECRET_IN_ERROR_BODY):
        assert all(secret not in text for text in seen), secret


def test_a_provider_whose_sdk_is_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "anthropic" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    broker = LlmBroker(LlmHostConfig(), env={"ANTHROPIC_API_KEY": "sk-ant-test"})
    described = broker.describe()
    assert described["configured"] is False and described["provider"] == "anthropic"
    assert "pip install 'agentnode-sandbox[anthropic]'" in described["unavailable"]
    assert "sk-ant-test" not in repr(described)
    assert LlmBroker(LlmHostConfig(), env={"OPENAI_API_KEY": "sk-test"}).describe()["configured"] is True
