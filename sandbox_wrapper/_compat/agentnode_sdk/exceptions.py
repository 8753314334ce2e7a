"""The SDK's exception classes, with its names and constructor signatures (agentnode-format §3.4, §4.6).

Tools raise `AgentNodeToolError` to fail a call; the host reports it like any other exception a tool
raises ("tool raised AgentNodeToolError", never the message). `AgentNodeError` and its subclasses are the
registry client's errors: defined so that `except` clauses naming them import and work.
"""

from __future__ import annotations

from typing import Any


class AgentNodeError(Exception):
    """Base error of the agentnode registry client: `code` and `message`, shown as "[code] message"."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"[{code}] {message}")


class NotFoundError(AgentNodeError):
    """A package or resource was not found (the registry's 404)."""


class AuthError(AgentNodeError):
    """Authentication or authorization failed (the registry's 401/403)."""


class ValidationError(AgentNodeError):
    """A manifest or an input was invalid (the registry's 422)."""


class RateLimitError(AgentNodeError):
    """The registry's rate limit was exceeded (429)."""


class AgentNodeToolError(Exception):
    """A tool failed: what pack authors raise instead of returning an `{"error": ...}` dict.

    A subclass of Exception, not of AgentNodeError, as in the SDK. `details` defaults to an empty dict.
    """

    def __init__(
        self, message: str, tool_name: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        self.tool_name = tool_name
        self.details = details or {}
        super().__init__(message)


__all__ = [
    "AgentNodeError",
    "AgentNodeToolError",
    "AuthError",
    "NotFoundError",
    "RateLimitError",
    "ValidationError",
]
