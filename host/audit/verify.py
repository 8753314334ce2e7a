"""The audit log checked end to end: each line chained to the one before, the head file matching both ends,
every started run ended (or still within its runtime bound)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from host.audit.chain import (
    GENESIS,
    Head,
    chain_files,
    head_file,
    head_from_bytes,
    is_int,
    line_hash,
    locked,
    parse_record,
)
from host.audit.records import RUN_EVENT, START_EVENT

END_GRACE_SECONDS = 600
"""How long past a run's own runtime bound its end record may take (teardown, a loaded host) before
`verify_audit` calls it missing."""


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify_audit`: `problems` name the file and line of each break in the chain."""

    ok: bool
    records: int
    problems: list[str] = dataclasses.field(default_factory=list)
    open_runs: list[str] = dataclasses.field(default_factory=list)
    """Runs started within their runtime bound (plus grace) and not ended yet: in progress, not a problem."""


def verify_audit(path: Path, *, now: datetime | None = None) -> VerifyReport:
    """Check the whole chain (rotated files oldest first, then `path`) and the head file.

    Detects edited, inserted, reordered and removed lines: each line must be a JSON object whose `prev`
    is the hash of the line before it and whose `seq` follows the previous one; the first and last
    records must match `<path>.head`, which is how truncation of the tail (or start) is detected. A run
    whose `agent_run_start` has no `agent_run` after its runtime bound plus grace is a problem too (a lost
    end record); younger ones are listed in `open_runs`.
    """
    problems: list[str] = []
    records = 0
    started: dict[str, tuple[str, dict[str, Any]]] = {}
    with locked(path, exclusive=False):
        head_path = head_file(path)
        head = _read_head(head_path)
        if head is None and head_path.exists():
            problems.append(f"{head_path.name}: unreadable")
        prev_hash: str | None = None
        expect: int | None = None
        for file in chain_files(path):
            with file.open("rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    line = raw.removesuffix(b"\n")
                    records += 1
                    where = f"{file.name}:{lineno}"
                    rec = parse_record(line)
                    if rec is None:
                        problems.append(f"{where}: not a JSON object")
                        expect = None if expect is None else expect + 1
                    else:
                        problems.extend(_check(where, rec, prev_hash, expect, head))
                        _pair(rec, where, started)
                        seq = rec.get("seq")
                        expect = seq + 1 if is_int(seq) else (None if expect is None else expect + 1)
                    prev_hash = line_hash(line)
        if head is None:
            if records and not head_path.exists():
                problems.append(f"{head_path.name}: missing, removal of the last records cannot be ruled out")
        elif not records:
            problems.append(f"{path.name}: log is empty but {head_path.name} records seq {head.seq}")
        elif expect is not None and expect - 1 != head.seq:
            problems.append(
                f"{path.name}: log ends at seq {expect - 1} but {head_path.name} records seq {head.seq} "
                "(records removed from or appended to the end)"
            )
        elif prev_hash != head.hash:
            problems.append(f"{path.name}: last record does not match {head_path.name} (edited or replaced)")
    open_runs: list[str] = []
    for run_id, (where, rec) in started.items():
        if _overdue(rec, now if now is not None else datetime.now(UTC)):
            problems.append(
                f"{where}: run {run_id[:12]} ({rec.get('slug')}) started at {rec.get('ts')} and has no end "
                "record (its host died or the record was lost; a restarted host records host_lost)"
            )
        else:
            open_runs.append(run_id)
    return VerifyReport(ok=not problems, records=records, problems=problems, open_runs=open_runs)


def _pair(rec: dict[str, Any], where: str, started: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Match start records with the end record of the same run id."""
    run_id = record_run_id(rec)
    if not isinstance(run_id, str):
        return
    if rec.get("event") == START_EVENT:
        started[run_id] = (where, rec)
    elif rec.get("event") == RUN_EVENT:
        started.pop(run_id, None)


def record_run_id(rec: Mapping[str, Any]) -> Any:
    """A record's run id: `run_id`, or `request_id` in records written before the field was renamed."""
    return rec["run_id"] if "run_id" in rec else rec.get("request_id")


def _overdue(rec: dict[str, Any], now: datetime) -> bool:
    """A start is overdue once its runtime bound plus END_GRACE_SECONDS has passed (or it cannot be read)."""
    bound = rec.get("max_runtime_seconds")
    try:
        ts = datetime.fromisoformat(str(rec.get("ts")).replace("Z", "+00:00"))
    except ValueError:
        return True
    if not is_int(bound):
        return True
    return (now - ts).total_seconds() > bound + END_GRACE_SECONDS


def _check(
    where: str, rec: dict[str, Any], prev_hash: str | None, expect: int | None, head: Head | None
) -> list[str]:
    """Problems of one parsed record given the chain state before it (prev_hash None: first record)."""
    out: list[str] = []
    seq, prev = rec.get("seq"), rec.get("prev")
    if not is_int(seq):
        out.append(f"{where}: seq missing or not an integer")
    if prev_hash is None:
        start = (head.first_seq, head.first_prev) if head and head.first_seq is not None else None
        if start is not None and (seq, prev) != start:
            out.append(f"{where}: chain starts at seq {seq}, the head file says {start[0]} (records removed)")
        elif start is None and prev == GENESIS and seq != 1:
            out.append(f"{where}: first record has seq {seq}, expected 1")
        return out
    if prev != prev_hash:
        out.append(f"{where}: prev hash mismatch (record edited or removed before it)")
    if is_int(seq) and expect is not None and seq != expect:
        out.append(f"{where}: seq {seq}, expected {expect} (record inserted, removed or reordered)")
    return out


def _read_head(head_path: Path) -> Head | None:
    try:
        return head_from_bytes(head_path.read_bytes())
    except OSError:
        return None


__all__ = [
    "END_GRACE_SECONDS",
    "VerifyReport",
    "record_run_id",
    "verify_audit",
]
