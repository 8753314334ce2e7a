"""The openai and anthropic adapters (host/llm/providers.py) with the real SDKs against a local fake provider:
what each sends and streams, finish reasons, and provider failures as generic refusals."""

from __future__ import annotations

import logging
import socket
import sys

import pytest

from host.llm.admission import LlmRefusal
from host.llm.broker import LlmBroker
from host.llm.budget import RetryPolicy
from host.llm.providers import Completion
from host.spec.config import LlmHostConfig
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer
from tests.unit.llm._support import CANARY, MESSAGES, PROVIDERS, drain, env_for, grant, refusal, session


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
