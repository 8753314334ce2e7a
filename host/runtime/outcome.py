"""How a run ends, as pure functions: the watch loop over a workload and a clock, and the outcome's name.

Both are backend-free: `watch` sees only what the session and the workload say, and `name_outcome` turns
the facts gathered at the end into the result and its one audit reason. Unit tests drive every ending with
fakes and a fake clock.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from host.core.errors import AuditReason
from host.core.strictjson import loads_strict
from host.core.vocab import Runtime
from host.runtime.session import RunOutcome

WATCH_TICK_SECONDS = 0.05
"""How often the workload is polled (cgroup counters, socket directory) while a run lasts."""
GVISOR_CRASH_STATUS = 2
"""What runsc exits with when the sandbox kernel itself stops; an agent's own exit status passes through."""


class Ending(enum.Enum):
    """What stopped the watch loop."""

    REPORTED = "reported"
    CANCELLED = "cancelled"
    EXITED = "exited"
    LOST = "lost"
    DEADLINE = "deadline"
    IDLE = "idle"


class _Wakeup(Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...

    def clear(self) -> None: ...


class WatchedSession(Protocol):
    """The session side of a run, as the watch loop reads it."""

    @property
    def outcome(self) -> RunOutcome | None: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def reported(self) -> _Wakeup: ...

    @property
    def fetched(self) -> bool: ...

    def idle_since(self) -> float | None: ...


class WatchedWorkload(Protocol):
    """The workload side of a run, as the watch loop reads it."""

    @property
    def exited(self) -> bool: ...

    def poll(self) -> None: ...

    def lost(self) -> bool: ...


def watch(
    session: WatchedSession,
    workload: WatchedWorkload,
    *,
    deadline: float,
    idle_limit: float,
    clock: Callable[[], float] = time.monotonic,
) -> Ending:
    """Wait for the result, the workload's exit, cancellation, the wall-clock deadline or the idle limit.

    The workload is polled every tick until the run reports (its counters, whether its socket directory is
    still there); the session's `reported` event cuts a wait short whenever something happens.
    """
    first = True
    while True:
        # State first, then the event: a wake-up between the two is caught by the next wait. A reported run
        # ends before the poll: the outcome reads the counters once more anyway (`conclude`), and a warm
        # run's result waited ~0.2 ms for a poll nothing used.
        if session.outcome is not None:
            return Ending.REPORTED
        if session.cancelled:
            return Ending.CANCELLED
        # Before its task is fetched the run's own code has not started: a warm run's first pass skips the
        # reads (they competed with the task's handover); the counters are cumulative, so the next tick
        # still sees anything earlier (a warm member's import of the pack's module included).
        if session.fetched or not first:
            workload.poll()
        first = False
        if workload.exited:
            return Ending.EXITED
        if workload.lost():
            return Ending.LOST
        now = clock()
        if now >= deadline:
            return Ending.DEADLINE
        idle = session.idle_since()
        if idle is not None and now >= idle + idle_limit:
            return Ending.IDLE
        idle_deadline = idle + idle_limit if idle is not None else now + idle_limit
        wake_at = min(deadline, idle_deadline, now + WATCH_TICK_SECONDS)
        session.reported.wait(timeout=max(0.0, wake_at - now))
        session.reported.clear()


@dataclass(frozen=True)
class EndFacts:
    """Everything that names a run's outcome, gathered once the watch loop returned."""

    ending: Ending
    report: RunOutcome | None
    exit_status: int | None = None
    oom: bool = False
    pids_hits: int = 0
    runtime: str | None = None
    max_runtime_seconds: int = 0
    idle_limit: float = 0
    pids_limit: int = 0


@dataclass(frozen=True)
class Outcome:
    """A run's named outcome: the result or the error the caller sees, and its one audit reason.

    `error_code` is what the result says (an agent's own failure code, e.g. `agent_exception`, or the
    audit reason); `reason` is what the audit record says.
    """

    success: bool
    reason: AuditReason
    result: Any = None
    error: str = ""
    error_code: str = ""
    hint: str = ""
    timed_out: bool = False


_TIMEOUT_HINT = "raise limits.max_runtime_seconds (within the host ceiling) if the agent needs longer"


def _fail(reason: AuditReason, error: str, hint: str, *, timed_out: bool = False) -> Outcome:
    return Outcome(False, reason, error=error, error_code=reason.value, hint=hint, timed_out=timed_out)


def name_outcome(f: EndFacts) -> Outcome:
    """Name what ended the run: its result, a deadline, cancellation, or the workload's death and cause."""
    if f.report is not None:
        if f.report.success:
            assert f.report.value_json is not None
            return Outcome(True, AuditReason.AGENT_COMPLETED, result=loads_strict(f.report.value_json))
        code, partial = f.report.failure_code, f.report.failure_value_json
        result = None if partial is None else loads_strict(partial)
        if f.report.timed_out:  # a host-side runner that enforces the deadline itself reported it
            reason = AuditReason.TIMEOUT
            return Outcome(False, reason, result, f.report.failure_message, reason.value, _TIMEOUT_HINT, True)
        return Outcome(
            False, AuditReason.AGENT_ERROR, result, error=f.report.failure_message or code, error_code=code
        )
    pids_error = (
        f"the agent hit the sandbox's process/thread limit ({f.pids_limit}) "
        f"{f.pids_hits} time(s), e.g. by forking in a loop"
    )
    pids_hint = "use fewer processes and threads; under gVisor each process also costs a host process"
    if f.ending is Ending.LOST:
        return _fail(
            AuditReason.SOCKET_LOST,
            "the run's socket directory disappeared from the host; the run was stopped",
            "something removed entries under the host's run directory (a tmp cleaner?); "
            "keep it away from /run/agentnode-sandbox",
        )
    if f.ending is Ending.CANCELLED:
        return _fail(AuditReason.CANCELLED, "the run was cancelled; its sandbox was killed", "")
    if f.ending in (Ending.DEADLINE, Ending.IDLE):
        if f.pids_hits:
            return _fail(
                AuditReason.PIDS_EXHAUSTED, f"{pids_error}; the run then timed out", pids_hint, timed_out=True
            )
        what = (
            f"the run exceeded max_runtime_seconds ({f.max_runtime_seconds} s)"
            if f.ending is Ending.DEADLINE
            else f"the agent made no accepted call for {f.idle_limit:g} s"
        )
        return _fail(AuditReason.TIMEOUT, f"{what}; the sandbox was killed", _TIMEOUT_HINT, timed_out=True)
    status = -1 if f.exit_status is None else f.exit_status
    if f.oom:
        return _fail(
            AuditReason.OOM_KILLED,
            "the agent exceeded its memory limit and was killed",
            "the sandbox memory ceiling is fixed; reduce the agent's memory use",
        )
    if f.pids_hits:
        return _fail(
            AuditReason.PIDS_EXHAUSTED, f"{pids_error}; the sandbox stopped (exit {status})", pids_hint
        )
    if f.runtime == Runtime.RUNSC and status == GVISOR_CRASH_STATUS:
        return _fail(
            AuditReason.SANDBOX_CRASHED,
            f"the gVisor sandbox stopped (exit {status}) before the agent reported; under gVisor the "
            "usual cause is forking past the pids limit (or the agent itself exited with that status)",
            "use fewer processes; see the logs of the run (run --json shows them)",
        )
    return _fail(
        AuditReason.EXITED_BEFORE_RESULT,
        f"the agent exited (status {status}) before reporting a result",
        "see the logs of the run (run --json shows them)",
    )


class EndedWorkload(WatchedWorkload, Protocol):
    """What naming the outcome asks of a workload once the watch loop returned."""

    @property
    def exit_status(self) -> int | None: ...

    @property
    def session(self) -> Any: ...

    def oom_killed(self) -> bool: ...

    def pids_hits(self) -> int: ...


def conclude(
    ending: Ending,
    workload: EndedWorkload,
    *,
    runtime: str | None,
    max_runtime_seconds: int,
    idle_limit: float,
    pids_limit: int,
) -> Outcome:
    """Gather the end facts from the workload (its memory and pids verdicts only if it ended unreported: a
    report names the outcome by itself, and reading the counters cost a reported run ~0.2 ms); name them."""
    report = workload.session.outcome
    return name_outcome(
        EndFacts(
            ending,
            report,
            exit_status=workload.exit_status,
            oom=ending is Ending.EXITED and report is None and workload.oom_killed(),
            pids_hits=workload.pids_hits() if report is None else 0,
            runtime=runtime,
            max_runtime_seconds=max_runtime_seconds,
            idle_limit=idle_limit,
            pids_limit=pids_limit,
        )
    )


__all__ = [
    "GVISOR_CRASH_STATUS",
    "EndFacts",
    "Ending",
    "Outcome",
    "WatchedSession",
    "conclude",
    "name_outcome",
    "watch",
]
