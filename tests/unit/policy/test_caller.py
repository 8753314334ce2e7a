"""Caller metadata (host/policy/caller) and live log lines (host/runtime/workload.CappedSink): bounded,
validated, and never passing on more than the logs keep."""

from __future__ import annotations

from typing import Any

import pytest

from host.policy.caller import MAX_LABELS, CallerInfo, InvalidCaller
from host.runtime.workload import MAX_LINE_BYTES, CappedSink


def test_valid_metadata_is_kept_with_labels_sorted() -> None:
    info = CallerInfo.parse("acme-eu.1", "01J9ZQ:req/7+x=", {"z": "", "team": "search@eu"})
    assert info.record() == {"tenant": "acme-eu.1", "request_id": "01J9ZQ:req/7+x=",
                             "labels": {"team": "search@eu", "z": ""}}  # fmt: skip
    assert CallerInfo.parse().empty and not info.empty


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"tenant": "a b"}, "tenant"),
        ({"tenant": "-lead"}, "tenant"),
        ({"tenant": "x" * 65}, "tenant"),
        ({"tenant": "\x1b[2K"}, "tenant"),
        ({"tenant": 7}, "tenant"),
        ({"request_id": "x" * 129}, "request_id"),
        ({"request_id": "a\nb"}, "request_id"),
        ({"request_id": "é"}, "request_id"),
        ({"labels": ["a"]}, "labels must be a mapping"),
        ({"labels": {f"k{i}": "" for i in range(MAX_LABELS + 1)}}, "at most 16"),
        ({"labels": {"Team": "x"}}, "label name"),
        ({"labels": {"team-": "x"}}, "label name"),
        ({"labels": {"k" * 64: "x"}}, "label name"),
        ({"labels": {"k": "a b"}}, "label k"),
        ({"labels": {"k": "v" * 129}}, "label k"),
        ({"labels": {"k": 1}}, "label k"),
    ],
)
def test_a_value_that_breaks_its_rule_is_refused_naming_the_field_not_the_value(
    fields: dict[str, Any], rule: str
) -> None:
    with pytest.raises(InvalidCaller) as info:
        CallerInfo.parse(**fields)
    assert rule in str(info.value) and isinstance(info.value, ValueError)
    assert "\x1b" not in str(info.value) and "a b" not in str(info.value)


def test_live_lines_are_the_kept_bytes_split_at_line_ends() -> None:
    lines: list[str] = []
    sink = CappedSink(cap=64, on_line=lines.append)
    for chunk in (b"one\ntw", b"o\r\n", "ünï\n".encode(), b"\xff\xfe\n", b"last"):
        sink.feed(chunk)
    sink.flush()
    assert lines == ["one", "two", "ünï", "\ufffd\ufffd", "last"]
    assert sink.text().startswith("one\ntwo\r\n")  # the kept logs are the bytes as written


def test_live_lines_stop_where_the_logs_stop_and_long_lines_come_in_pieces() -> None:
    lines: list[str] = []
    sink = CappedSink(cap=3 * MAX_LINE_BYTES, on_line=lines.append)
    sink.feed(b"x" * (2 * MAX_LINE_BYTES + 10) + b"\n")
    assert [len(line) for line in lines] == [MAX_LINE_BYTES, MAX_LINE_BYTES, 10]
    sink.feed(b"y" * (2 * MAX_LINE_BYTES))  # passes the cap: the kept part, then one note, then nothing
    sink.feed(b"z\n" * 1000)
    kept = 3 * MAX_LINE_BYTES - (2 * MAX_LINE_BYTES + 11)
    assert lines[3] == "y" * kept
    assert lines[4] == f"[agentnode: output beyond {3 * MAX_LINE_BYTES} bytes is dropped]" and len(lines) == 5
    sink.flush()
    assert len(lines) == 5 and sink.dropped == 2 * MAX_LINE_BYTES - kept + 2000


def _policy(**llm: Any) -> Any:
    from host.policy.rules import LlmPolicy, RunPolicy

    grant = LlmPolicy(enabled=True, max_calls=10, max_input_chars=100, max_output_chars=100, **llm)
    return RunPolicy(allowed_packages=("a",), max_tool_calls=20, max_runtime_seconds=300, max_iterations=12,
                     llm=grant, clamped=())  # fmt: skip


def test_overrides_only_ever_lower_a_limit() -> None:
    from host.policy.caller import RunOverrides

    policy = _policy(max_total_tokens=5000)
    tighter = RunOverrides.parse(max_runtime_seconds=5, max_tool_calls=0, max_iterations=3, max_llm_calls=2,
                                 max_total_tokens=100, max_cost_usd=0.25).tighten(policy)  # fmt: skip
    assert (tighter.max_runtime_seconds, tighter.max_tool_calls, tighter.max_iterations) == (5, 0, 3)
    assert (tighter.llm.max_calls, tighter.llm.max_total_tokens, tighter.llm.max_cost_usd) == (2, 100, 0.25)
    looser = RunOverrides.parse(max_runtime_seconds=9999, max_tool_calls=500, max_iterations=100,
                                max_llm_calls=99, max_total_tokens=10**9).tighten(policy)  # fmt: skip
    assert looser == policy  # nothing above the manifest's and host's own limits
    assert RunOverrides.parse().empty and RunOverrides.parse().tighten(policy) == policy
    assert tighter.allowed_packages == ("a",) and tighter.llm.enabled  # grants are never touched


@pytest.mark.parametrize(
    "limits",
    [{"max_runtime_seconds": 0}, {"max_iterations": -1}, {"max_tool_calls": 2**31}, {"max_llm_calls": True},
     {"max_total_tokens": 1.5}, {"max_cost_usd": 0}, {"max_cost_usd": float("nan")},
     {"max_cost_usd": float("inf")}, {"max_memory": 1}],
)  # fmt: skip
def test_a_bad_override_is_refused_naming_the_limit(limits: dict[str, Any]) -> None:
    from host.policy.caller import RunOverrides

    with pytest.raises(InvalidCaller) as info:
        RunOverrides.parse(**limits)
    assert next(iter(limits)) in str(info.value)


def test_json_log_lines_carry_the_threads_run_and_escape_everything() -> None:
    import json
    import logging
    import sys

    from host.core.logs import JsonFormatter, RunIdFilter, run_context

    formatter = JsonFormatter()
    hostile = ("\x1b]0;pwn\x07",)
    record = logging.LogRecord("agentnode.x", logging.WARNING, __file__, 1, "pack said %s", hostile, None)
    with run_context("run-42"):
        line = formatter.format(record)
        RunIdFilter().filter(record)
    assert record.run_id == "run-42"  # type: ignore[attr-defined]
    assert "\x1b" not in line and "\x07" not in line and "\n" not in line
    parsed = json.loads(line)
    assert parsed["run_id"] == "run-42" and parsed["level"] == "warning" and parsed["logger"] == "agentnode.x"
    assert parsed["message"] == "pack said \x1b]0;pwn\x07" and parsed["ts"].endswith("Z")
    try:
        raise ValueError("secret text from an agent")
    except ValueError:
        failed = logging.LogRecord("agentnode.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    outside = json.loads(formatter.format(failed))
    assert outside["run_id"] is None and outside["exception"] == "ValueError"
    assert "secret text" not in formatter.format(failed)


def test_a_long_lines_pieces_never_split_a_character() -> None:
    lines: list[str] = []
    sink = CappedSink(cap=4 * MAX_LINE_BYTES, on_line=lines.append)
    text = "é" * MAX_LINE_BYTES  # two bytes each: the 4096-byte cut falls inside one at every other offset
    sink.feed(b"x" + text.encode() + b"\n")
    assert "\ufffd" not in "".join(lines) and "".join(lines) == "x" + text
    exact: list[str] = []
    CappedSink(cap=2 * MAX_LINE_BYTES, on_line=exact.append).feed(b"y" * MAX_LINE_BYTES)  # exactly one piece
    assert exact == ["y" * MAX_LINE_BYTES]
