"""The watch loop and the naming of outcomes, driven with fakes and a fake clock: every ending, no daemon."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from host.core.errors import AuditReason
from host.runtime.outcome import EndFacts, Ending, name_outcome, watch
from host.runtime.session import RunOutcome


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeEvent:
    """`wait` advances the fake clock by its timeout (nothing else happens meanwhile) and runs a hook."""

    clock: Clock
    hook: Callable[[], None] = lambda: None
    waits: list[float] = field(default_factory=list)

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None and timeout >= 0
        self.waits.append(timeout)
        self.clock.now += timeout
        self.hook()
        return False

    def clear(self) -> None:
        pass


@dataclass
class FakeSession:
    reported: FakeEvent
    outcome: RunOutcome | None = None
    cancelled: bool = False
    idle: float | None = None
    fetched: bool = True

    def idle_since(self) -> float | None:
        return self.idle


@dataclass
class FakeWorkload:
    exited: bool = False
    gone: bool = False
    polls: int = 0

    def poll(self) -> None:
        self.polls += 1

    def lost(self) -> bool:
        return self.gone


def _setup(idle: float | None = None) -> tuple[Clock, FakeSession, FakeWorkload]:
    clock = Clock()
    return clock, FakeSession(FakeEvent(clock), idle=idle), FakeWorkload()


def test_deadline() -> None:
    clock, session, work = _setup()
    assert watch(session, work, deadline=clock.now + 2, idle_limit=60, clock=clock) is Ending.DEADLINE
    assert clock.now == pytest.approx(1002.0)
    assert work.polls >= 40  # polled every tick while it lasted
    assert max(session.reported.waits) <= 0.05 + 1e-9


def test_a_task_not_yet_fetched_is_not_polled_at_once() -> None:
    clock, session, work = _setup()
    session.fetched = False  # a warm member's task is on its way: no agent code has run for this run

    def later() -> None:
        if clock.now >= 1000.12:
            session.outcome = RunOutcome(value_json="1")

    session.reported.hook = later
    assert watch(session, work, deadline=clock.now + 10, idle_limit=60, clock=clock) is Ending.REPORTED
    assert work.polls == 2  # not on the first pass; on each tick after it (the task may be running)
    session2 = FakeSession(FakeEvent(clock))
    session2.outcome = None
    session2.reported.hook = lambda: setattr(session2, "outcome", RunOutcome(value_json="1"))
    work2 = FakeWorkload()
    assert watch(session2, work2, deadline=clock.now + 10, idle_limit=60, clock=clock) is Ending.REPORTED
    assert work2.polls == 1  # fetched: polled on the first pass


def test_idle_counts_from_the_last_accepted_call() -> None:
    clock, session, work = _setup(idle=1000.0)
    assert watch(session, work, deadline=clock.now + 100, idle_limit=3, clock=clock) is Ending.IDLE
    assert clock.now == pytest.approx(1003.0)


def test_a_call_in_flight_is_not_idle() -> None:
    clock, session, work = _setup(idle=None)  # a call is being served: no idle clock
    assert watch(session, work, deadline=clock.now + 5, idle_limit=1, clock=clock) is Ending.DEADLINE


@pytest.mark.parametrize(
    ("event", "ending"),
    [
        ("report", Ending.REPORTED),
        ("cancel", Ending.CANCELLED),
        ("exit", Ending.EXITED),
        ("lose", Ending.LOST),
    ],
)
def test_events_end_the_wait(event: str, ending: Ending) -> None:
    clock, session, work = _setup()

    def later() -> None:
        if clock.now >= 1001.0:
            if event == "report":
                session.outcome = RunOutcome(value_json="1")
            elif event == "cancel":
                session.cancelled = True
            elif event == "exit":
                work.exited = True
            else:
                work.gone = True

    session.reported.hook = later
    assert watch(session, work, deadline=clock.now + 10, idle_limit=60, clock=clock) is ending
    assert clock.now < 1002.0


def test_a_result_wins_over_everything_that_happened_with_it() -> None:
    clock, session, work = _setup()
    session.outcome = RunOutcome(value_json='{"a": 1}')
    session.cancelled, work.exited, work.gone = True, True, True
    assert watch(session, work, deadline=clock.now - 1, idle_limit=0, clock=clock) is Ending.REPORTED


def _named(ending: Ending, **kw: object) -> tuple[AuditReason, bool]:
    facts = EndFacts(ending, None, max_runtime_seconds=30, idle_limit=60, pids_limit=256, **kw)  # type: ignore[arg-type]
    o = name_outcome(facts)
    assert not o.success and o.error_code == o.reason.value and o.error
    return o.reason, o.timed_out


def test_a_reported_result_is_the_outcome() -> None:
    o = name_outcome(EndFacts(Ending.REPORTED, RunOutcome(value_json='{"a": [1, 2]}')))
    assert (o.success, o.reason, o.result) == (True, AuditReason.AGENT_COMPLETED, {"a": [1, 2]})


def test_an_agent_failure_keeps_its_code_and_is_audited_as_agent_error() -> None:
    report = RunOutcome(failure_code="agent_exception", failure_message="it broke")
    o = name_outcome(EndFacts(Ending.REPORTED, report))
    assert (o.success, o.reason, o.error_code, o.error) == (
        False,
        AuditReason.AGENT_ERROR,
        "agent_exception",
        "it broke",
    )


EXITED = AuditReason.EXITED_BEFORE_RESULT
PIDS = AuditReason.PIDS_EXHAUSTED


@pytest.mark.parametrize(
    ("ending", "facts", "expected"),
    [
        (Ending.LOST, {}, (AuditReason.SOCKET_LOST, False)),
        (Ending.CANCELLED, {}, (AuditReason.CANCELLED, False)),
        (Ending.DEADLINE, {}, (AuditReason.TIMEOUT, True)),
        (Ending.IDLE, {}, (AuditReason.TIMEOUT, True)),
        (Ending.DEADLINE, {"pids_hits": 3}, (PIDS, True)),
        (Ending.EXITED, {"exit_status": 137, "oom": True}, (AuditReason.OOM_KILLED, False)),
        (Ending.EXITED, {"exit_status": 1, "pids_hits": 1}, (PIDS, False)),
        (Ending.EXITED, {"exit_status": 2, "runtime": "runsc"}, (AuditReason.SANDBOX_CRASHED, False)),
        (Ending.EXITED, {"exit_status": 2, "runtime": "runc"}, (EXITED, False)),
        (Ending.EXITED, {"exit_status": 0}, (EXITED, False)),
        (Ending.EXITED, {}, (EXITED, False)),
    ],
)
def test_every_ending_is_named(
    ending: Ending, facts: dict[str, object], expected: tuple[AuditReason, bool]
) -> None:
    assert _named(ending, **facts) == expected


def test_messages_say_which_limit_and_the_hint_says_what_to_do() -> None:
    deadline = name_outcome(EndFacts(Ending.DEADLINE, None, max_runtime_seconds=30, idle_limit=60))
    idle = name_outcome(EndFacts(Ending.IDLE, None, max_runtime_seconds=30, idle_limit=60))
    pids = name_outcome(EndFacts(Ending.EXITED, None, exit_status=1, pids_hits=4, pids_limit=256))
    assert "max_runtime_seconds (30 s)" in deadline.error and "max_runtime_seconds" in deadline.hint
    assert "no accepted call for 60 s" in idle.error
    assert "(256) 4 time(s)" in pids.error and "exit 1" in pids.error and pids.hint
    exited = name_outcome(EndFacts(Ending.EXITED, None, exit_status=None))
    assert "status -1" in exited.error
