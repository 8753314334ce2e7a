"""Result and exit attacks: huge or unserializable results, and every way of dying before reporting."""

from __future__ import annotations

import pytest

from tests.hostile.conftest import STUBS, Lab, Ledger, brief

pytestmark = pytest.mark.docker

AGENT = (
    STUBS
    + r"""
import ctypes, signal, sys, threading, time, _thread

def report_raw(value_json):
    session = session_pb2_grpc.SessionServiceStub(channel())
    request = session_pb2.ReportResultRequest(value_json=value_json)
    return status(lambda: session.ReportResult(request, timeout=30))

def run(context, mode, **kwargs):
    if mode == "huge":
        return "x" * (2 << 20)
    if mode == "huge_raw":
        report_raw(json.dumps("x" * (2 << 20)))
        return "small"
    if mode == "over_message_cap_raw":
        seen = report_raw(json.dumps("x" * (6 << 20)))
        return {"raw_report": seen}
    if mode == "unserializable":
        return {"handle": object()}
    if mode == "nan":
        return [float("nan")]
    if mode == "deep":
        nested = []
        for _ in range(100000):
            nested = [nested]
        return nested
    if mode == "invalid_json_raw":
        report_raw("{not json")
        return "small"
    if mode == "thread_raise":
        worker = threading.Thread(target=lambda: 1 / 0)
        worker.start()
        worker.join()
        return "main survived"
    if mode == "interrupt_main":
        threading.Timer(0.2, _thread.interrupt_main).start()
        time.sleep(10)
        return "not interrupted"
    if mode == "system_exit":
        sys.exit(3)
    if mode == "os_exit":
        os._exit(7)
    if mode == "exit_from_thread":
        threading.Thread(target=lambda: os._exit(0)).start()
        time.sleep(10)
    if mode == "sigsegv":
        ctypes.string_at(0)
    if mode == "sigkill_self":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "close_std_fds":
        os.close(1)
        os.close(2)
        raise RuntimeError("no one hears this")
    if mode == "ok":
        return "healthy"
    raise ValueError(mode)
"""
)

# (mode, attack id, expected error_code or a result, what it shows)
RESULTS = [
    ("huge", "result.huge", "result_too_large", "a 2 MiB result is refused with result_too_large"),
    (
        "huge_raw",
        "result.huge_raw_report",
        "result_too_large",
        "a 2 MiB ReportResult sent on the agent's own channel is refused: result_too_large",
    ),
    (
        "unserializable",
        "result.unserializable",
        "result_not_serializable",
        "a result holding object() fails with result_not_serializable",
    ),
    ("nan", "result.nan", "result_not_serializable", "NaN is not JSON: result_not_serializable"),
    (
        "deep",
        "result.deep_nesting",
        "result_not_serializable",
        "a 100000-deep nested list fails with result_not_serializable",
    ),
    (
        "invalid_json_raw",
        "result.invalid_json_raw_report",
        "result_not_serializable",
        "a raw ReportResult of invalid JSON is refused: result_not_serializable",
    ),
]
EXITS = [
    (
        "interrupt_main",
        "escape.interrupt_main",
        "base_exception",
        "KeyboardInterrupt raised into main is reported",
    ),
    ("system_exit", "escape.system_exit", "system_exit", "sys.exit(3) is reported as system_exit"),
    ("os_exit", "escape.os_exit", "exited_before_result", "os._exit(7) ends as exited_before_result"),
    (
        "exit_from_thread",
        "escape.exit_from_thread",
        "exited_before_result",
        "os._exit(0) from a thread ends as exited_before_result",
    ),
    (
        "sigsegv",
        "escape.sigsegv",
        "exited_before_result",
        "a SIGSEGV (ctypes NULL read) ends as exited_before_result",
    ),
    (
        "sigkill_self",
        "escape.sigkill_self",
        "exited_before_result",
        "SIGKILL to itself ends as exited_before_result",
    ),
    (
        "close_std_fds",
        "escape.close_std_fds",
        "agent_exception|exited_before_result",
        "closing stdout/stderr, then raising: agent_exception, or exited_before_result if the wrapper "
        "cannot write the traceback",
    ),
]


def test_huge_and_unserializable_results(lab: Lab, ledger: Ledger) -> None:
    lab.agent("outcomes", AGENT)
    host = lab.host()
    for mode, attack, code, expected in RESULTS:
        result = lab.run("outcomes", host=host, kwargs={"mode": mode})
        ledger.attack(
            attack,
            expected=expected,
            observed=brief({"code": result.error_code or "completed", "error": result.error}),
            ok=not result.success and result.error_code == code,
        )
    result = lab.run("outcomes", host=host, kwargs={"mode": "over_message_cap_raw"})
    raw = (result.result or {}).get("raw_report", {}) if result.success else {}
    ledger.attack(
        "result.over_message_cap_raw_report",
        expected="a 6 MiB raw ReportResult is refused by the transport (RESOURCE_EXHAUSTED); "
        "only the legitimate report counts",
        observed=brief({"raw_report": raw, "code": result.error_code or "completed"}),
        ok=result.success and raw.get("code") == "RESOURCE_EXHAUSTED",
    )
    audit = lab.audit()
    assert len(audit) == len(RESULTS) + 1 and all(r["action"] == "deny" for r in audit[:-1])


def test_exceptions_and_exits_are_named(lab: Lab, ledger: Ledger) -> None:
    lab.agent("outcomes", AGENT)
    host = lab.host()
    result = lab.run("outcomes", host=host, kwargs={"mode": "thread_raise"})
    ledger.attack(
        "escape.thread_raise",
        expected="an exception in a thread does not change the run's outcome",
        observed=brief(
            {
                "result": result.result,
                "code": result.error_code or "completed",
                "traceback_in_logs": "ZeroDivisionError" in result.logs,
            }
        ),
        ok=result.success and result.result == "main survived",
    )
    for mode, attack, code, expected in EXITS:
        result = lab.run("outcomes", host=host, kwargs={"mode": mode})
        ledger.attack(
            attack,
            expected=expected + "; the host keeps serving",
            observed=brief({"code": result.error_code or "completed", "error": result.error}),
            ok=not result.success and result.error_code in code.split("|"),
        )
    healthy = lab.run("outcomes", host=host, kwargs={"mode": "ok"})
    audit = lab.audit()
    assert healthy.success and healthy.result == "healthy"
    assert len(audit) == len(EXITS) + 2 and len({r["run_id"] for r in audit}) == len(audit)
