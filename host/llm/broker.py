"""The LLM broker, one per host process: it resolves which provider and model serve each agent and builds
each provider's SDK client once. The llm package is the only code that reads provider API keys
(host/llm/credentials.py), so they never leave the host.

Keys come from the process environment or, where it has none, from the `.env` beside the host config
(parsed, never executed, never put into `os.environ` or a child's environment). Which provider and model
serve a run: the host config's `agent_sandbox.llm` pins win, then the agent's entry in `agent-config.json`,
then auto-detection (OPENAI_API_KEY, then ANTHROPIC_API_KEY).

A sandboxed agent sends messages (and, optionally, the names of tools from its run's catalog, a tool choice
and a response format: host/llm/toolcalls.py); its run's session (host/llm/session.py) checks them against
the run's `LlmPolicy`, calls the host-chosen provider and model (host/llm/providers.py) with the host's own
tool definitions, and answers with text, tool calls, a finish reason and token counts. Every refusal and
provider failure becomes an `LlmRefusal` with a fixed, generic message: provider error text can carry the
key, URLs or the prompt, so it is never relayed, logged or chained.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from host.llm.budget import RetryPolicy
from host.llm.credentials import PROVIDERS, Binding, Credentials, Resolution, read_env_file, resolve
from host.llm.providers import Adapter, adapter_for
from host.llm.session import LlmSession
from host.policy.rules import LlmPolicy
from host.spec.config import LlmHostConfig


class LlmBroker:
    """One per host process: reads `.env` once, resolves each agent's provider, and builds each SDK client
    once, on first use.

    `env` is the process environment (os.environ when None); `.env` (host.env_file) only fills what it
    lacks, and neither is ever copied into os.environ or into any child's environment.
    """

    def __init__(
        self, host: LlmHostConfig, env: Mapping[str, str] | None = None, *, retry: RetryPolicy | None = None
    ) -> None:
        self._host = host
        self._retry = RetryPolicy() if retry is None else retry
        file_env = read_env_file(host.env_file) if host.env_file is not None else {}
        names = {var for spec in PROVIDERS.values() for var in spec[:2]}
        names |= {a.api_key_env for a in host.agents.values() if a.api_key_env}
        self._creds = Credentials(os.environ if env is None else env, file_env, names)
        self._default = resolve(host, self._creds, None, None)
        self._adapters: dict[Binding, Adapter] = {}
        self._lock = threading.Lock()

    def _resolution(self, slug: str | None) -> Resolution:
        agent = self._host.agents.get(slug) if slug else None
        return self._default if agent is None else resolve(self._host, self._creds, agent, slug)

    def describe(self, slug: str | None = None) -> dict[str, Any]:
        """What would serve `slug`'s calls, for doctor and policy explain: provider, model, whether calls
        can be made, how they were chosen and why not; never the key or URL."""
        return self._resolution(slug).describe()

    def session(
        self, policy: LlmPolicy, slug: str | None = None, *, deadline: float | None = None
    ) -> LlmSession:
        """A fresh budget for one run of agent `slug` (its agent-config.json entry picks the provider);
        `deadline` (time.monotonic) bounds its provider retries."""
        return LlmSession(self, policy, self._resolution(slug), deadline=deadline)

    def _client(self, binding: Binding) -> Adapter:
        """The provider adapter for `binding`, built once; raises when the SDK cannot load."""
        with self._lock:
            adapter = self._adapters.get(binding)
            if adapter is None:
                adapter = self._adapters[binding] = adapter_for(binding, self._host.timeout_seconds)
            return adapter


__all__ = ["LlmBroker"]
