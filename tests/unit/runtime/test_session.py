"""A run's state over its real socket: the task handed over once and the result taken once, a warm session's
task coming later, a held report, only accepted calls counting as activity, the run's end closing its LLM
session."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import pytest

from host.policy.rules import LlmPolicy
from host.runtime.session import RefusalBudget, RunOutcome, RunSession
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import session_pb2
from tests.unit.runtime._support import TOOL_METHOD, Env, assert_refused, raw_call, reason, refused

# --- handover once, result once ------------------------------------------------------------------------


def test_task_can_be_fetched_once(env: Env) -> None:
    run = env.start()
    run.fetch()
    err = refused(run.fetch)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert_refused(err, "TASK_ALREADY_FETCHED")


@pytest.mark.parametrize("version", [0, PROTOCOL_VERSION + 1, 999])
def test_protocol_mismatch_is_refused_and_fetches_nothing(env: Env, version: int) -> None:
    run = env.start()
    err = refused(run.fetch, version)
    assert_refused(err, "INVALID_REQUEST")
    assert str(version) in err.details()
    assert not run.session.fetched
    assert_refused(refused(run.call_llm), "TASK_NOT_FETCHED")


def test_calls_before_fetch_task_are_refused_and_run_nothing(env: Env) -> None:
    run = env.start()
    marker = env.tmp / "ran.txt"
    for err in (
        refused(run.run_tool, "word-tools", "append", {"path": str(marker)}),
        refused(run.call_llm),
        refused(run.stream_llm),
        refused(run.report, {"done": True}),
    ):
        assert_refused(err, "TASK_NOT_FETCHED")
    assert not marker.exists() and env.fake_llm.requests == []
    assert run.session.outcome is None and run.session.tools.calls_made == 0


def test_calls_after_the_result_are_refused(env: Env) -> None:
    run = env.started()
    run.report({"answer": 42})
    assert run.session.outcome is not None and run.session.outcome.value_json == '{"answer": 42}'
    assert run.session.reported.is_set()
    marker = env.tmp / "ran.txt"
    for err in (
        refused(run.run_tool, "word-tools", "append", {"path": str(marker)}),
        refused(run.call_llm),
        refused(run.stream_llm),
        refused(run.report, {"again": True}),
        refused(run.fetch),
    ):
        assert_refused(err, "RUN_FINISHED")
    assert not marker.exists() and env.fake_llm.requests == []
    assert run.session.outcome.value_json == '{"answer": 42}'


# --- warm sessions: the task comes later ---------------------------------------------------------------


def test_a_warm_fetch_waits_for_its_task(env: Env) -> None:
    run = env.start(warm=True)
    assert run.pending is not None
    marker = env.tmp / "ran.txt"
    assert_refused(refused(run.run_tool, "word-tools", "append", {"path": str(marker)}), "TASK_NOT_FETCHED")
    waiting = run.sessions.FetchTask.future(
        session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION), timeout=30
    )
    time.sleep(0.5)
    assert not waiting.done() and run.session.inflight == 1  # the wrapper is connected and waiting
    assert_refused(refused(run.fetch), "TASK_ALREADY_FETCHED")
    assert run.session.fetched_at is None
    assigned_at = time.monotonic()
    run.session.assign(*run.pending)
    task = waiting.result(timeout=10)
    assert task.run_id == "run-abc" and task.goal == "count words" and run.session.fetched
    assert run.session.fetched_at is not None and run.session.fetched_at >= assigned_at  # handed over after
    assert run.run_tool("word-tools", "append", {"path": str(marker)}).success
    with pytest.raises(RuntimeError):
        run.session.assign(*run.pending)  # a session takes one task


def test_cancelling_a_waiting_fetch_finishes_the_run(env: Env) -> None:
    run = env.start(warm=True)
    assert run.pending is not None
    waiting = run.sessions.FetchTask.future(
        session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION), timeout=30
    )
    time.sleep(0.3)
    run.session.cancel()
    with pytest.raises(grpc.RpcError) as info:
        waiting.result(timeout=10)
    assert_refused(info.value, "RUN_FINISHED")
    assert not run.session.fetched and run.session.reported.is_set()
    with pytest.raises(RuntimeError):
        run.session.assign(*run.pending)
    assert_refused(refused(run.report, 1), "RUN_FINISHED")


@pytest.mark.parametrize("end", ["release", "cancel"])
def test_a_held_report_is_answered_once_the_host_releases_it(env: Env, end: str) -> None:
    run = env.started()
    run.session.hold_report = True  # a long-lived host: the wrapper exits only once the end record is written
    answer = run.sessions.ReportResult.future(session_pb2.ReportResultRequest(value_json="1"), timeout=30)
    assert run.session.reported.wait(10) and run.session.outcome is not None  # the result is in at once
    time.sleep(0.3)
    assert not answer.done()  # ... but the wrapper's answer waits
    run.session.release() if end == "release" else run.session.cancel()
    assert answer.result(timeout=10) == session_pb2.ReportResultResponse()
    assert run.session.outcome.value_json == "1"


def test_an_unheld_report_is_answered_at_once(env: Env) -> None:
    run = env.started()
    assert not run.session.hold_report  # the default (a one-shot host tears the workload down first)
    assert run.report(1) == session_pb2.ReportResultResponse()
    assert run.session.outcome is not None and not run.session.released.is_set()


# --- only accepted calls are activity ------------------------------------------------------------------


def test_refused_calls_never_count_as_activity(env: Env) -> None:
    """Finding 9: every call, refused or not, used to reset the idle clock, so spam kept a run alive."""
    now = [100.0]
    run = env.started(clock=lambda: now[0], llm=LlmPolicy(), refusals=RefusalBudget(clock=lambda: now[0]))
    assert run.session.idle_since() == 100.0
    now[0] = 500.0
    attempts: list[Callable[[], Any]] = [
        lambda: run.run_tool("other-tools", "echo", {}),
        lambda: run.run_tool("word-tools", "echo", "{bad json"),
        lambda: run.run_tool("word-tools", "append", {"wrong": 1}),
        lambda: run.run_tool("ghost", "echo", {}),
        run.call_llm,
        lambda: list(run.stream_llm()),
        run.fetch,
        lambda: raw_call(run.channel, TOOL_METHOD, b"\x0b"),
    ]
    samples: list[float | None] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(run.session.idle_since())

    sampler = threading.Thread(target=sample)
    sampler.start()
    with futures.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: _outcome_of(attempts[i % len(attempts)]), range(200)))
    stop.set()
    sampler.join()
    assert all(isinstance(o, grpc.RpcError) for o in outcomes)
    assert "TOO_MANY_REFUSALS" in {reason(o) for o in outcomes}  # throttled calls are not activity either
    assert samples and set(samples) == {100.0}  # never "in flight", never reset
    assert run.session.last_activity == 100.0 and run.session.inflight == 0
    now[0] = 600.0  # the budget has refilled by now
    assert run.run_tool("word-tools", "echo", {}).success  # an accepted call is activity
    assert run.session.idle_since() == 600.0
    now[0] = 700.0
    empty = session_pb2.ReportResultRequest()
    assert_refused(refused(run.sessions.ReportResult, empty), "INVALID_REQUEST")  # ends the run, unaccepted
    assert run.session.outcome is not None and run.session.last_activity == 600.0


def _outcome_of(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except grpc.RpcError as err:
        return err
    return result


# --- the run's end -------------------------------------------------------------------------------------


class _ClosingLlm:
    """Records close(): the only part of an LLM session RunSession's ending touches."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("ending", ["report", "cancel"])
def test_the_runs_end_closes_its_llm_session(env: Env, ending: str) -> None:
    llm = _ClosingLlm()
    task = env.start().pending[0]  # type: ignore[index]
    session = RunSession(task=task, tools=None, llm=llm)  # type: ignore[arg-type]
    session.fetch(PROTOCOL_VERSION)
    if ending == "report":
        session.report(RunOutcome(value_json="1"))
    else:
        session.cancel()
    assert llm.closed == 1  # a provider retry waiting in its backoff gives up now
