"""The shared vocabularies, defined once: trust levels, runtimes, routes, audit sources, wire reasons."""

from __future__ import annotations

import enum


class Trust(enum.StrEnum):
    """A pack's trust level as the lockfile records it (compared trimmed and lower-cased)."""

    CURATED = "curated"
    TRUSTED = "trusted"
    VERIFIED = "verified"
    UNVERIFIED = "unverified"

    @classmethod
    def parse(cls, raw: object) -> Trust | None:
        """The level a recorded value names, or None (missing or unknown: routed like community code)."""
        if not isinstance(raw, str):
            return None
        return cls._value2member_map_.get(raw.strip().lower())  # type: ignore[return-value]


HOST_TRUST: frozenset[Trust] = frozenset({Trust.CURATED, Trust.TRUSTED})
"""Levels whose packs may run as host processes (when the host's trust policy allows)."""
COMMUNITY_TRUST: frozenset[Trust] = frozenset({Trust.VERIFIED, Trust.UNVERIFIED})
"""Community levels: their agents only ever run sandboxed."""


class Runtime(enum.StrEnum):
    """The OCI runtimes a sandbox may use."""

    RUNC = "runc"
    RUNSC = "runsc"
    CRUN = "crun"
    """Podman's default runtime on most hosts (a kernel-sharing runtime like runc, not a second kernel)."""


class Route(enum.Enum):
    """Where a run goes."""

    SANDBOX = "sandbox"
    HOST = "host"
    REFUSED = "refused"


class Source(enum.StrEnum):
    """The audit record's `source`: which kind of run it was (or would have been, when refused)."""

    AGENT_SANDBOX = "agent_sandbox"
    AGENT_HOST = "agent_host"
    AGENT_SEQUENTIAL = "agent_sequential"
    """A sequential orchestration (format §5.5): no agent code, every step a tool call the host makes."""


class WireReason(enum.StrEnum):
    """Why one call from the sandbox was refused: errors.proto's ErrorReason without its prefix.

    A unit test holds this set equal to the generated enum, so the host cannot send a reason the wrapper
    does not know.
    """

    TASK_ALREADY_FETCHED = "TASK_ALREADY_FETCHED"
    TASK_NOT_FETCHED = "TASK_NOT_FETCHED"
    RUN_FINISHED = "RUN_FINISHED"
    INVALID_REQUEST = "INVALID_REQUEST"
    TOO_LARGE = "TOO_LARGE"
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
    TOOL_CALL_LIMIT = "TOOL_CALL_LIMIT"
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    TOOL_PACK_UNTRUSTED = "TOOL_PACK_UNTRUSTED"
    TOOL_ARGUMENTS_INVALID = "TOOL_ARGUMENTS_INVALID"
    LLM_NOT_GRANTED = "LLM_NOT_GRANTED"
    LLM_CALL_LIMIT = "LLM_CALL_LIMIT"
    LLM_INPUT_TOO_LARGE = "LLM_INPUT_TOO_LARGE"
    LLM_OUTPUT_TOO_LARGE = "LLM_OUTPUT_TOO_LARGE"
    LLM_MODEL_NOT_ALLOWED = "LLM_MODEL_NOT_ALLOWED"
    LLM_RATE_LIMITED = "LLM_RATE_LIMITED"
    LLM_TIMEOUT = "LLM_TIMEOUT"
    LLM_UNAVAILABLE = "LLM_UNAVAILABLE"
    RUN_DEADLINE = "RUN_DEADLINE"
    HOST_ERROR = "HOST_ERROR"
    TOO_MANY_REFUSALS = "TOO_MANY_REFUSALS"
    LLM_TOKEN_BUDGET = "LLM_TOKEN_BUDGET"  # noqa: S105  a reason's name, not a secret
    LLM_COST_BUDGET = "LLM_COST_BUDGET"
    LLM_TOOL_NOT_ALLOWED = "LLM_TOOL_NOT_ALLOWED"


__all__ = ["COMMUNITY_TRUST", "HOST_TRUST", "Route", "Runtime", "Source", "Trust", "WireReason"]
