"""The LLM broker (host/llm/broker.py) with the real openai/anthropic SDKs against a local fake provider:
the environment it reads, one adapter per binding, and nothing secret leaving in refusals, usage or logs."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from host.llm.admission import LlmRefusal
from host.llm.broker import LlmBroker
from host.llm.budget import RetryPolicy
from host.policy.rules import LlmPolicy
from host.spec.config import LlmHostConfig
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer
from tests.unit.llm._support import CANARY, MESSAGES, agents_host, drain, env_for, grant


def test_keys_come_only_from_the_given_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    assert LlmBroker(LlmHostConfig(), env={}).describe()["configured"] is False
    assert LlmBroker(LlmHostConfig()).describe()["configured"] is True  # default: os.environ


def test_adapters_are_built_once_per_binding(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    for slug in ("writer", "coder", "writer", None, "plain", "coder"):
        broker.session(grant(), slug=slug).call(MESSAGES)
    assert len(broker._adapters) == 3  # anthropic; openai with CODER_KEY; openai with OPENAI_API_KEY


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
