"""A run's result as callers see it, built in one place: an outcome, a refusal, a host fault, a lost audit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from host.core.errors import AuditReason, SandboxError

if TYPE_CHECKING:  # (the admin client imports this module, and needs none of the run server's)
    from host.runtime.outcome import Outcome


@dataclass
class RunResult:
    """The outcome of one run, as `run --json` prints it; `reason` is what its audit record says.

    `error_code` is the result's own code: an agent's failure code (e.g. `agent_exception`) or the audit
    reason. `reason` is None only on a result rebuilt from the admin socket's wire form.
    """

    success: bool
    result: Any = None
    error: str = ""
    error_code: str = ""
    mode_used: str = ""
    run_id: str = ""
    timed_out: bool = False
    duration_ms: int = 0
    hint: str = ""
    logs: str = ""
    warm: bool = False
    stages: dict[str, float] = field(default_factory=dict)
    reason: AuditReason | None = None
    files: dict[str, Any] | None = None
    """What crossed the boundary when the caller handed the run files (host/files/run.py FilesOutcome)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "result": self.result,
            "error": self.error or None,
            "error_code": self.error_code or None,
            "mode_used": self.mode_used,
            "run_id": self.run_id,
            "timed_out": self.timed_out,
            "duration_ms": self.duration_ms,
            "hint": self.hint or None,
            "logs": self.logs,
            **({"files": self.files} if self.files is not None else {}),
        }


def from_outcome(outcome: Outcome, logs: str) -> RunResult:
    """The result of a run that ran: what its outcome names, with the logs it left."""
    return RunResult(
        outcome.success,
        result=outcome.result,
        error=outcome.error,
        error_code=outcome.error_code,
        hint=outcome.hint,
        timed_out=outcome.timed_out,
        logs=logs,
        reason=outcome.reason,
    )


def from_error(exc: SandboxError) -> RunResult:
    """A run that failed closed: the error's message, reason and the operator's next step."""
    return RunResult(False, error=exc.message, error_code=exc.reason.value, hint=exc.hint, reason=exc.reason)


def host_fault(exc: BaseException) -> RunResult:
    """A run the host loop itself failed: only the exception's type is shown (never its text)."""
    return RunResult(
        False,
        error=f"the host failed while running the agent ({type(exc).__name__})",
        error_code=AuditReason.HOST_LOOP_ERROR.value,
        hint="see the host log; check with: agentnode-sandbox doctor",
        reason=AuditReason.HOST_LOOP_ERROR,
    )


def withheld(result: RunResult, hint: str) -> RunResult:
    """A run whose end record could not be written fails loudly: its result is not handed out."""
    ended = result.reason.value if result.reason else "unknown"
    return dataclasses.replace(
        result,
        success=False,
        result=None,
        error=f"the audit record of this run could not be written (it ended as {ended}), so its result is "
        "withheld",
        error_code=AuditReason.AUDIT_FAILED.value,
        hint=hint,
        reason=AuditReason.AUDIT_FAILED,
    )


__all__ = ["RunResult", "from_error", "from_outcome", "host_fault", "withheld"]
