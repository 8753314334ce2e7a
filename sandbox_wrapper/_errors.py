"""Exceptions an agent catches from AgentContext, so refusals map to stable, documented Python types.

They keep both contracts agents are written against: the agentnode runtime's (builtin PermissionError for
the allowlist, AgentLimitExceeded and AgentTerminated as RuntimeErrors, RuntimeError for LLM problems) and
the seed sandbox's, where every refusal was a RuntimeError. So `except PermissionError`,
`except AgentLimitExceeded` and `except RuntimeError` each catch what they caught there.
"""

from __future__ import annotations

import builtins


class AgentLimitExceeded(RuntimeError):
    """A run limit (iterations or tool calls) is used up; uncaught, the run fails with AGENT_LIMIT."""


class AgentTerminated(RuntimeError):
    """A termination condition stopped the agent: `stop_on_consecutive_errors` tool calls failed in a row.

    Raised inside the call that reached the limit, so its result is never returned; uncaught, the run fails
    with AGENT_LIMIT. try_tool does not swallow it.
    """


class PermissionError(builtins.PermissionError, RuntimeError):
    """The host refused the tool package (not on the allowlist, or an untrusted pack); public as
    `sandbox_wrapper.ToolAccessError`.

    Both the builtin PermissionError the agentnode runtime raises and the RuntimeError the seed sandbox
    raised. It keeps the builtin's name, so agents that report `type(exc).__name__` see what they saw
    there. `reason` is the wire reason (TOOL_NOT_ALLOWED or TOOL_PACK_UNTRUSTED).
    """

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class LlmAccessError(RuntimeError):
    """The host refused or could not serve an LLM call; `reason` is the wire reason, e.g. LLM_CALL_LIMIT."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class HostUnavailableError(RuntimeError):
    """The host's socket stopped answering mid-run (the host is gone or shutting the run down)."""


ToolAccessError = PermissionError
"""The public name of the tool-refusal exception (its class name stays PermissionError)."""
