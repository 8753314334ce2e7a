"""Exceptions an agent catches from AgentContext, so refusals map to stable, documented Python types."""

from __future__ import annotations


class AgentLimitExceeded(RuntimeError):
    """A run limit (iterations or tool calls) is used up; uncaught, the run fails with AGENT_LIMIT."""


class LlmAccessError(RuntimeError):
    """The host refused or could not serve an LLM call; `reason` is the wire reason, e.g. LLM_CALL_LIMIT."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class HostUnavailableError(RuntimeError):
    """The host's socket stopped answering mid-run (the host is gone or shutting the run down)."""
