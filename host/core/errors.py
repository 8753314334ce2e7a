"""The host's error tree and the fixed audit reason set, so every failure maps to a stable reason.

Every failure the host reports to its callers (the CLI, `serve`, SandboxHost) is a SandboxError: its class
names the area, `reason` is one AuditReason and `hint` the operator's way out. Outside the tree, on purpose:
CallRefusal, which fails one call from the sandbox and never leaves its run; ValueError and TypeError for an
argument no validated input produces (a caller's bug); and KeyboardInterrupt. Anything else that escapes is
a bug, which the CLI reports as `host_loop_error`.
"""

from __future__ import annotations

import enum

from host.core.vocab import WireReason


class AuditReason(enum.StrEnum):
    """The closed set of `reason` values an audit record may carry (documented in README)."""

    AGENT_COMPLETED = "agent_completed"
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    REFUSED_FLAG_OFF = "refused_flag_off"
    REFUSED_TRUST = "refused_trust"
    NOT_INSTALLED = "not_installed"
    NOT_AN_AGENT = "not_an_agent"
    MANIFEST_INVALID = "manifest_invalid"
    CONFIG_INVALID = "config_invalid"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    ENGINE_PERMISSION_DENIED = "engine_permission_denied"
    MEMORY_LIMIT_UNSUPPORTED = "memory_limit_unsupported"
    RUNTIME_NOT_REGISTERED = "runtime_not_registered"
    IMAGE_NOT_PINNED = "image_not_pinned"
    IMAGE_MISSING = "image_missing"
    IMAGE_MISMATCH = "image_mismatch"
    PROTOCOL_MISMATCH = "protocol_mismatch"
    VOLUME_MISSING = "volume_missing"
    VOLUME_STALE = "volume_stale"
    START_FAILED = "start_failed"
    EXITED_BEFORE_RESULT = "exited_before_result"
    OOM_KILLED = "oom_killed"
    PIDS_EXHAUSTED = "pids_exhausted"
    SANDBOX_CRASHED = "sandbox_crashed"
    HOST_LOOP_ERROR = "host_loop_error"
    SOCKET_LOST = "socket_lost"
    HOST_LOST = "host_lost"
    HOST_AT_CAPACITY = "host_at_capacity"
    AUDIT_FAILED = "audit_failed"
    POD_REFUSED = "pod_refused"
    """A run pod differs from what the controller builds for its AgentRun (docs/kubernetes.md)."""
    FILESYSTEM_REFUSED = "filesystem_refused"
    """The pack declares a filesystem level the operator's `agent_sandbox.filesystem.allow` does not grant."""
    WORKSPACE_INVALID = "workspace_invalid"
    """The workspace (or an input) the caller names is not a directory (a file) the host can read."""
    FILES_OVER_BOUND = "files_over_bound"
    """Files in or out of a run went over one of `agent_sandbox.filesystem.limits` (the message names it)."""
    FILES_INCOMPLETE = "files_incomplete"
    """A file coming back was not what the host read from the run (truncated, changed or missing): never a
    success."""


AUDIT_REASONS: frozenset[str] = frozenset(r.value for r in AuditReason)


class CallRefusal(Exception):
    """One refused call from the sandbox: `reason` is the wire ErrorReason (errors.proto) without its prefix.

    It fails that call only, never the run; `message` is host-written and safe to send into the sandbox.
    """

    def __init__(self, reason: WireReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class SandboxError(Exception):
    """Root of every error the host raises to its callers.

    `reason` is the fixed audit reason; `hint` tells the operator what to do next.
    """

    default_reason: AuditReason = AuditReason.HOST_LOOP_ERROR

    def __init__(self, message: str, *, reason: AuditReason | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reason: AuditReason = reason or self.default_reason
        self.hint = hint


class ConfigError(SandboxError):
    """The host configuration is invalid; the message names the key path."""

    default_reason = AuditReason.CONFIG_INVALID


class ManifestError(SandboxError):
    """An agentnode.yaml is invalid; the message names the key path."""

    default_reason = AuditReason.MANIFEST_INVALID


class PackError(SandboxError):
    """A pack cannot be installed, found or uninstalled."""

    default_reason = AuditReason.NOT_INSTALLED


class EngineError(SandboxError):
    """The container engine, runtime or image is not usable; `check` names the doctor check."""

    default_reason = AuditReason.ENGINE_UNAVAILABLE

    def __init__(
        self, message: str, *, reason: AuditReason | None = None, hint: str = "", check: str = "engine"
    ) -> None:
        super().__init__(message, reason=reason, hint=hint)
        self.check = check


class InvalidRequest(SandboxError, ValueError):
    """A long-running host refused a malformed request (INVALID_REQUEST): no run was made and nothing was
    audited; the message says which field broke which rule. It is a ValueError too."""

    default_reason = AuditReason.CONFIG_INVALID


class EngineRejected(EngineError):
    """The engine answered a request with an error status (the SDK's APIError), classified like any failure.

    `status` is the HTTP status (None when the SDK had no response); `explanation` is the engine's own text,
    engine-written and unbounded: a caller that shows it bounds it. The message and hint never quote it.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        explanation: str = "",
        reason: AuditReason | None = None,
        hint: str = "",
        check: str = "engine",
    ) -> None:
        super().__init__(message, reason=reason, hint=hint, check=check)
        self.status = status
        self.explanation = explanation


class EngineNotFound(EngineRejected):
    """The engine has no such object (404): the caller decides what a missing container or volume means."""


class EngineImageNotFound(EngineNotFound):
    """The engine has no such image (a 404 that names the image)."""


class FilesError(SandboxError):
    """Files could not cross the boundary: over a bound, or not readable as given; nothing the caller had is
    changed."""

    default_reason = AuditReason.FILES_OVER_BOUND


class RefusedError(SandboxError):
    """Routing refused the run (feature flag off, unknown trust level)."""

    default_reason = AuditReason.REFUSED_TRUST


__all__ = [
    "AUDIT_REASONS",
    "AuditReason",
    "CallRefusal",
    "ConfigError",
    "EngineError",
    "EngineImageNotFound",
    "EngineNotFound",
    "EngineRejected",
    "FilesError",
    "InvalidRequest",
    "ManifestError",
    "PackError",
    "RefusedError",
    "SandboxError",
]
