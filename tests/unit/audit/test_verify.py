"""verify_audit: tampering of every kind located by file and line, removed ends seen through the head file,
and started runs paired with their ends (or found overdue)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from host.audit.log import AuditLog
from host.audit.verify import END_GRACE_SECONDS, verify_audit
from host.core.errors import AuditReason
from tests.unit.audit._support import edit_field, filled, lines, record, start, write_lines

# --- tamper detection ---------------------------------------------------------------------------------------


def _forge(raw: list[bytes]) -> list[bytes]:
    forged = json.loads(raw[1])
    forged["slug"] = "innocent"
    return [*raw[:2], json.dumps(forged, separators=(",", ":")).encode(), *raw[2:]]


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (edit_field, "audit.jsonl:4: prev hash mismatch (record edited or removed before it)"),
        (lambda raw: [*raw[:2], *raw[3:]], "audit.jsonl:3: prev hash mismatch"),
        (lambda raw: raw[:-1], "audit.jsonl: log ends at seq 4 but audit.jsonl.head records seq 5"),
        (lambda raw: [*raw[:-1], raw[-1].replace(b"agent-4", b"agent-X")], "last record does not match"),
        (lambda raw: raw[1:], "audit.jsonl:1: chain starts at seq 2"),
        (lambda raw: [raw[0], raw[2], raw[1], *raw[3:]], "audit.jsonl:2: prev hash mismatch"),
        (_forge, "audit.jsonl:3: seq 2, expected 3"),
    ],
    ids=["edit", "delete-middle", "delete-last", "edit-last", "delete-first", "reorder", "insert"],
)
def test_verify_detects_tampering(
    tmp_path: Path, tamper: Callable[[list[bytes]], list[bytes]], expected: str
) -> None:
    path = filled(tmp_path, 5)
    write_lines(path, tamper(lines(path)))
    report = verify_audit(path)
    assert not report.ok
    assert any(expected in p for p in report.problems), report.problems


def test_removed_tail_stays_visible_after_later_appends(tmp_path: Path) -> None:
    path = filled(tmp_path, 5)
    write_lines(path, lines(path)[:-2])
    assert AuditLog(path).append(record())
    report = verify_audit(path)
    assert "audit.jsonl:4: prev hash mismatch (record edited or removed before it)" in report.problems
    assert "audit.jsonl:4: seq 6, expected 4 (record inserted, removed or reordered)" in report.problems


def test_missing_head_file_is_reported(tmp_path: Path) -> None:
    path = filled(tmp_path, 2)
    (path.parent / "audit.jsonl.head").unlink()
    report = verify_audit(path)
    assert report.problems == ["audit.jsonl.head: missing, removal of the last records cannot be ruled out"]


def test_tampering_in_a_rotated_file_is_located(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=(len(json.dumps(record())) + 150) * 4, keep=5)
    for _ in range(10):
        assert log.append(record())
    rotated = tmp_path / "audit.jsonl.1"
    raw = lines(rotated)
    assert len(raw) >= 3
    write_lines(rotated, [raw[0], *raw[2:]])
    problems = verify_audit(path).problems
    assert "audit.jsonl.1:2: prev hash mismatch (record edited or removed before it)" in problems


def test_verify_of_a_missing_log_is_ok_and_empty(tmp_path: Path) -> None:
    report = verify_audit(tmp_path / "nothing" / "audit.jsonl")
    assert (report.ok, report.records, report.problems) == (True, 0, [])


# --- runs started and ended ---------------------------------------------------------------------------------


def test_a_start_without_an_end_is_open_then_a_problem_once_overdue(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    assert log.append(start("ended"), sync=False)
    assert log.append(record(run_id="ended"))
    assert log.append(start("lost", max_runtime_seconds=60), sync=False)
    fresh = verify_audit(path)
    assert fresh.ok and fresh.open_runs == ["lost"], fresh.problems
    later = datetime.now(UTC) + timedelta(seconds=60 + END_GRACE_SECONDS + 5)
    stale = verify_audit(path, now=later)
    assert not stale.ok and stale.open_runs == []
    assert len(stale.problems) == 1
    assert "run lost" in stale.problems[0] and "no end record" in stale.problems[0]
    assert log.append(record(run_id="lost", reason=AuditReason.HOST_LOST))  # what a restarted host writes
    assert verify_audit(path, now=later).ok


def old_style(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as hosts wrote it before the run id field was renamed: `request_id`, no `run_id`."""
    return {("request_id" if k == "run_id" else k): v for k, v in rec.items()}


def test_records_written_before_the_rename_still_verify_and_pair(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    assert log.append(old_style(start("old-ended")), sync=False)
    assert log.append(old_style(record(run_id="old-ended")))
    assert log.append(old_style(start("old-open")), sync=False)
    assert log.append(old_style(start("upgraded")), sync=False)  # the host was upgraded while it ran
    assert log.append(record(run_id="upgraded"))
    assert "run_id" not in lines(path)[0].decode() and '"request_id":"old-ended"' in lines(path)[0].decode()
    fresh = verify_audit(path)
    assert fresh.ok and fresh.open_runs == ["old-open"], fresh.problems
    later = datetime.now(UTC) + timedelta(seconds=60 + END_GRACE_SECONDS + 5)
    stale = verify_audit(path, now=later)
    assert not stale.ok and len(stale.problems) == 1 and "run old-open" in stale.problems[0]
    assert log.append(record(run_id="old-open", reason=AuditReason.HOST_LOST))  # a new host closes it
    assert verify_audit(path, now=later).ok


def test_a_start_with_an_unreadable_bound_is_overdue(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    AuditLog(path).append({**start("odd"), "max_runtime_seconds": "soon"})
    assert not verify_audit(path).ok
