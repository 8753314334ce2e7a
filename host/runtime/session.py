"""One run's state as its gRPC services share it: the task handed over once, the result taken once, the
activity clock and the refusal budget (the services themselves: host/runtime/runserver.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from host.core.errors import CallRefusal
from host.core.vocab import WireReason
from host.egress.proxy import EgressRoute
from host.llm.session import LlmSession
from host.policy.rules import RunPolicy
from host.tools.gate import ToolGate
from sandbox_wrapper.protocol import PROTOCOL_VERSION

MAX_RESULT_BYTES = 1024 * 1024
"""Largest JSON result a run may report."""
REPORT_HOLD_SECONDS = 5.0
"""Longest a held ReportResult answer waits for the host to release it (`RunSession.hold_report`)."""

REFUSAL_BURST = 32
"""Refused tool and LLM requests a run may make back to back before it is throttled."""
REFUSAL_REFILL_PER_SECOND = 4.0
"""How fast a throttled run earns back refusals."""

HOST_ERROR_LOG_BURST = 5
"""HOST_ERROR warnings one run may log back to back; past them the host counts instead of logging."""
HOST_ERROR_LOG_REFILL_PER_SECOND = 1 / 60
"""How fast a run earns back a HOST_ERROR warning: whatever an agent provokes, its run logs at most
HOST_ERROR_LOG_BURST lines at once and one a minute after that."""


@dataclass(frozen=True)
class RunTask:
    """What FetchTask hands to the wrapper."""

    run_id: str
    entrypoint: str
    goal: str
    kwargs_json: str
    policy: RunPolicy
    system_prompt: str
    max_result_bytes: int = MAX_RESULT_BYTES


@dataclass
class RunOutcome:
    """What the wrapper (or a host-side runner: host/runtime/backends/sequential.py) reported: a JSON value or
    a failure."""

    value_json: str | None = None
    failure_code: str = ""
    failure_message: str = ""
    failure_value_json: str | None = None
    """A failure's own JSON result (a sequential pipeline's `steps_completed`); never read from the wire."""
    timed_out: bool = False
    """The run's deadline ended it, says a host-side runner that enforces it itself; never from the wire."""

    @property
    def success(self) -> bool:
        return self.value_json is not None


class RefusalBudget:
    """A per-run token bucket of refusals, so bad requests cannot buy unbounded host work.

    Every metered refusal spends its cost in tokens; tokens come back at `per_second` up to `burst`.
    While less than one is left, tool and LLM calls are refused before they are even decoded. Calls
    that were let in together may overspend: the debt (at most `burst`) is paid back before the next
    call is looked at. Thread-safe.
    """

    def __init__(
        self,
        burst: int = REFUSAL_BURST,
        per_second: float = REFUSAL_REFILL_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_second)
        self._at = now

    def allows(self) -> bool:
        """Whether a call may be looked at now."""
        with self._lock:
            self._refill()
            return self._tokens >= 1.0

    def spend(self, tokens: float = 1.0) -> None:
        """Charge one refusal of `tokens`."""
        with self._lock:
            self._refill()
            self._tokens = max(-float(self.burst), self._tokens - tokens)


@dataclass
class RunSession:
    """Per-run state shared by the three services: handover once, result once, activity clock.

    A session may be built before its task exists (a warm pool member): FetchTask then waits until
    `assign` hands the task over, or until the session is cancelled. Only accepted calls (past every
    check, about to do their work) count as activity: refused calls neither hold off nor reset the idle
    limit, so an agent that only gets refused is idle.
    """

    task: RunTask | None = None
    tools: ToolGate | None = None
    llm: LlmSession | None = None
    egress: EgressRoute | None = None
    """The agent sandbox's egress (its grant and the run's ledger); None: no egress path at all."""
    clock: Callable[[], float] = time.monotonic
    fetched_at: float | None = None
    """When FetchTask handed the task over (`clock`): splits a warm run's wait from the agent's own time."""
    cancelled: bool = False
    outcome: RunOutcome | None = None
    last_activity: float = field(default_factory=time.monotonic)
    inflight: int = 0
    reported: threading.Event = field(default_factory=threading.Event)
    assigned: threading.Event = field(default_factory=threading.Event)
    refusals: RefusalBudget = field(default_factory=RefusalBudget)
    throttled: int = 0
    """Calls refused unread (TOO_MANY_REFUSALS) because the refusal budget was empty."""
    host_errors: int = 0
    """Calls answered HOST_ERROR (a host fault, never the agent's text); see `note_host_error`."""
    hold_report: bool = False
    """Answer ReportResult only once the host has the run's end record written (`release`), at most
    REPORT_HOLD_SECONDS: the wrapper exits on that answer, and a container's exit (the interpreter's own
    shutdown, the engine's state writes and their fsyncs) would otherwise share the machine and the disk's
    journal with the result's audit fsync. Set where teardown follows the result (a long-lived host); a
    one-shot host tears the workload down before its result and answers at once."""
    released: threading.Event = field(default_factory=threading.Event)
    output_mark: bytes = b""
    """What the wrapper writes to each output stream once the agent returned (FetchTask hands it over);
    set by a workload that reads the output (host/runtime/workload.py), empty where nothing looks for it."""
    _fetching: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _host_error_log: RefusalBudget = field(init=False)
    _host_errors_unlogged: int = 0
    _log_listener: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self._host_error_log = RefusalBudget(
            burst=HOST_ERROR_LOG_BURST, per_second=HOST_ERROR_LOG_REFILL_PER_SECOND, clock=self.clock
        )
        if self.task is not None:
            self.assigned.set()

    def note_host_error(self) -> int | None:
        """Count a HOST_ERROR answer; None when its warning is not to be logged (the run's log budget is
        spent), else how many earlier ones went unlogged, so a flood costs the host log a few lines."""
        with self._lock:
            self.host_errors += 1
            if not self._host_error_log.allows():
                self._host_errors_unlogged += 1
                return None
            self._host_error_log.spend()
            unlogged, self._host_errors_unlogged = self._host_errors_unlogged, 0
            return unlogged

    def listen_logs(self, listener: Callable[[str], None] | None) -> None:
        """Where the agent's output lines go as they are written (host/runtime/workload.py feeds `log_line`);
        lines written before a listener is set (a warm member's boot) are kept in the logs only."""
        self._log_listener = listener

    def log_line(self, line: str) -> None:
        """One line of the agent's output, for the listener; a failing listener never stops the drain."""
        listener = self._log_listener
        if listener is not None:
            with contextlib.suppress(Exception):
                listener(line)

    def assign(self, task: RunTask, tools: ToolGate, llm: LlmSession) -> None:
        """Hand a task to a session built without one; it can happen once."""
        with self._lock:
            if self.task is not None or self.cancelled:
                raise RuntimeError("this session already has a task or was cancelled")
            self.task, self.tools, self.llm = task, tools, llm
        self.touch()
        self.assigned.set()

    def cancel(self) -> None:
        """End the session from the host side: a waiting FetchTask returns an error, the watcher wakes, and
        an LLM call waiting to retry its provider gives up."""
        with self._lock:
            self.cancelled = True
            llm = self.llm
        self.assigned.set()
        self.reported.set()
        self.released.set()
        if llm is not None:
            llm.close()

    def release(self) -> None:
        """The host is done with the report: a held ReportResult answer may go (see `hold_report`)."""
        self.released.set()

    @property
    def fetched(self) -> bool:
        return self.fetched_at is not None

    def touch(self) -> None:
        self.last_activity = self.clock()

    def begin_call(self) -> None:
        """An accepted call starts: the run is not idle while it is served."""
        with self._lock:
            self.inflight += 1
        self.touch()

    def end_call(self) -> None:
        """An accepted call ended; the idle clock restarts from now."""
        with self._lock:
            self.inflight -= 1
        self.touch()

    def idle_since(self) -> float | None:
        """When the run went idle (no accepted call in flight), or None while one is being served."""
        return None if self.inflight else self.last_activity

    def throttle(self) -> None:
        """Refuse a tool or LLM call unread while the run's refusal budget is empty."""
        if not self.refusals.allows():
            with self._lock:
                self.throttled += 1
            raise CallRefusal(
                WireReason.TOO_MANY_REFUSALS, "too many refused requests in a short time; wait and retry"
            )

    def _check_open(self) -> None:
        if self.cancelled:
            raise CallRefusal(WireReason.RUN_FINISHED, "the run was cancelled")
        if self.outcome is not None:
            raise CallRefusal(WireReason.RUN_FINISHED, "the run already reported its result")

    def require_open(self) -> tuple[ToolGate, LlmSession]:
        """Refuse calls before the task was fetched or after the result was reported."""
        with self._lock:
            self._check_open()
            if not self.fetched or self.tools is None or self.llm is None:
                raise CallRefusal(WireReason.TASK_NOT_FETCHED, "fetch the task first")
            return self.tools, self.llm

    def require_fetchable(self) -> None:
        """The state checks of FetchTask, which need nothing from the request."""
        with self._lock:
            self._check_open()
            if self._fetching:
                raise CallRefusal(WireReason.TASK_ALREADY_FETCHED, "the task can be fetched once per run")

    def require_reportable(self) -> RunTask:
        """The state checks of ReportResult; the task (its result cap) once they pass."""
        with self._lock:
            self._check_open()
            if not self.fetched or self.task is None:
                raise CallRefusal(WireReason.TASK_NOT_FETCHED, "fetch the task first")
            return self.task

    def fetch(
        self,
        protocol_version: int,
        is_active: Callable[[], bool] = lambda: True,
        on_admit: Callable[[], None] | None = None,
    ) -> RunTask:
        """Hand the task over once; a warm session waits for `assign`. `on_admit` runs once the fetch is
        accepted, before any wait (a waiting wrapper is a call in flight, never an idle run)."""
        with self._lock:
            self._check_open()
            if self._fetching:
                raise CallRefusal(WireReason.TASK_ALREADY_FETCHED, "the task can be fetched once per run")
            if protocol_version != PROTOCOL_VERSION:
                raise CallRefusal(
                    WireReason.INVALID_REQUEST,
                    f"protocol version {protocol_version} is not the host's {PROTOCOL_VERSION}",
                )
            self._fetching = True
        if on_admit is not None:
            on_admit()
        while not self.assigned.wait(0.5):
            if not is_active():
                raise CallRefusal(WireReason.RUN_FINISHED, "the caller went away before a task was assigned")
        with self._lock:
            self._check_open()
            assert self.task is not None
            self.fetched_at = self.clock()
            return self.task

    def report(self, outcome: RunOutcome) -> None:
        with self._lock:
            self._check_open()
            if not self.fetched:
                raise CallRefusal(WireReason.TASK_NOT_FETCHED, "fetch the task first")
            self.outcome = outcome
            llm = self.llm
        self.reported.set()
        if llm is not None:
            llm.close()  # the outcome is fixed: a call waiting to retry its provider gives up now


__all__ = [
    "HOST_ERROR_LOG_BURST",
    "HOST_ERROR_LOG_REFILL_PER_SECOND",
    "MAX_RESULT_BYTES",
    "REFUSAL_BURST",
    "REFUSAL_REFILL_PER_SECOND",
    "REPORT_HOLD_SECONDS",
    "RefusalBudget",
    "RunOutcome",
    "RunSession",
    "RunTask",
]
