"""What the LLM broker tests share: a key and messages, a granted policy, a session on the fake provider
(tests/support/fake_llm.py) and a host config with one agent per provider."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from host.llm.admission import LlmRefusal
from host.llm.broker import LlmBroker
from host.llm.providers import Completion
from host.llm.session import LlmSession
from host.policy.rules import LlmPolicy
from host.spec.config import AgentLlmConfig, LlmHostConfig
from tests.support.fake_llm import FakeLlmServer

CANARY = "sk-canary-XYZ"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
PROVIDERS = ["openai", "anthropic"]


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


AGENT_KEY = "sk-agent-config-AGENT-77"


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
