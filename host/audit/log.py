"""Tamper-evident audit trail: one sanitized `agent_run` record per run, hash-chained, multi-process safe."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from host.core.errors import AUDIT_REASONS, AuditReason
from host.core.vocab import Source

logger = logging.getLogger("agentnode.sandbox.audit")

GENESIS = "0" * 64
"""The `prev` of the first record ever written to a log."""

_ACTIONS = frozenset({"allow", "deny"})
_SOURCES = frozenset(s.value for s in Source)
_LLM_CAP_KEYS = ("max_calls", "max_input_chars", "max_output_chars")
_LLM_BUDGET_KEYS = ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd")
_LLM_COUNTER_KEYS = (
    "requests",
    "calls",
    "ok",
    "refused_disabled",
    "refused_limit",
    "refused_input",
    "refused_output",
    "refused_model",
    "refused_tool",
    "provider_errors",
    # token and cost budgets (host/llm/budget.py) and provider retries: counts, never text
    "input_tokens",
    "output_tokens",
    "overshoot_tokens",
    "reservations",
    "refused_input_tokens",
    "refused_total_tokens",
    "refused_cost",
    "retries",
    "retries_rate_limited",
    "retries_server_error",
    "retries_connection",
)
_LLM_NUMBER_KEYS = frozenset({"max_cost_usd", "cost_usd"})
"""Dollar amounts: finite non-negative numbers, recorded as floats."""
_LLM_KEYS = (
    "enabled", *_LLM_CAP_KEYS, "allowed_models", *_LLM_BUDGET_KEYS, *_LLM_COUNTER_KEYS, "cost_usd", "model",
)  # fmt: skip
_CHAIN_KEYS = frozenset({"ts", "seq", "prev"})
RUN_EVENT = "agent_run"
"""The one record that ends a run (its outcome, counters and caps)."""
START_EVENT = "agent_run_start"
"""Written before any agent code runs, so a run without an end is visible."""
END_GRACE_SECONDS = 600
"""How long past a run's own runtime bound its end record may take (teardown, a loaded host) before
`verify_audit` calls it missing."""
APPEND_ATTEMPTS = 3
"""A failed append is retried (a transient EMFILE/ENOSPC/EINTR) before the caller is told."""
_BLOCK = 64 * 1024
_MAX_PENDING = 1000
"""End records kept in memory while the log cannot be written (each run past that is failed loudly too)."""
_HEAD_BYTES = 512
_HEAD_LAG_LINES = 64
"""How far behind the log a head may be found after a crash and still be caught up (processes appending
at once each leave at most one head unsynced)."""
"""The head file is one padded block rewritten in place (its JSON is ~200 bytes)."""


def run_record(
    *,
    slug: str,
    trust: str | None,
    run_id: str,
    action: str,
    source: str,
    reason: AuditReason | str,
    sandbox: bool,
    runtime: str | None,
    image: str | None,
    duration_ms: int,
    timed_out: bool,
    llm: Mapping[str, Any] | None,
    tool_calls: int,
    tool_refusals: int,
    tool_calls_host_worker: int = 0,
    tool_calls_tool_sandbox: int = 0,
    tool_sandboxes_started: int = 0,
    llm_tool_calls: int = 0,
    llm_tool_calls_refused: int = 0,
    caller: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the one `agent_run` record of a run; sanitized by construction.

    The tool counters say where calls ran: `tool_calls` of them, `tool_calls_host_worker` in the host's
    worker processes (trusted and curated packs) and `tool_calls_tool_sandbox` in the run's tool sandboxes
    (community packs), of which it started `tool_sandboxes_started`. `llm_tool_calls` counts the tool calls
    completions returned to the agent (the model's requests, whether or not the agent then ran them), of which
    `llm_tool_calls_refused` named no tool the request offered (host/llm/toolcalls.py).

    Only these typed fields reach the log. `llm` (effective caps + usage counters, None when no LLM policy
    applied) is filtered to the known keys with the expected types (ints, the `enabled` bool, the host-side
    `model` string, `allowed_models` as a sorted list of strings, `max_cost_usd` and `cost_usd` as finite
    non-negative floats, or None); any other key or value shape is dropped. So no prompt, completion, API
    key, provider error, tool argument/result or agent-authored text can ever be audited. `reason`,
    `action` and `source` outside their fixed sets are programming errors and raise ValueError.
    """
    if reason not in AUDIT_REASONS:
        raise ValueError(f"audit reason {reason!r} is not in AuditReason")
    if action not in _ACTIONS:
        raise ValueError(f"audit action {action!r} is not one of {sorted(_ACTIONS)}")
    if source not in _SOURCES:
        raise ValueError(f"audit source {source!r} is not one of {sorted(_SOURCES)}")
    return {
        "event": RUN_EVENT,
        "slug": slug,
        "action": action,
        "source": source,
        "reason": str(reason),
        "trust": trust,
        "run_id": run_id,
        "sandbox": bool(sandbox),
        "runtime": runtime,
        "image": image,
        "duration_ms": int(duration_ms),
        "timed_out": bool(timed_out),
        "llm": None if llm is None else _sanitize_llm(llm),
        "tool_calls": int(tool_calls),
        "tool_refusals": int(tool_refusals),
        "tool_calls_host_worker": int(tool_calls_host_worker),
        "tool_calls_tool_sandbox": int(tool_calls_tool_sandbox),
        "tool_sandboxes_started": int(tool_sandboxes_started),
        "llm_tool_calls": int(llm_tool_calls),
        "llm_tool_calls_refused": int(llm_tool_calls_refused),
        "caller": None if caller is None else _sanitize_caller(caller),
    }


def _sanitize_caller(caller: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's metadata (host/policy/caller.py validated it): its three fields as strings only."""
    labels = caller.get("labels")
    return {
        "tenant": str(caller.get("tenant") or ""),
        "request_id": str(caller.get("request_id") or ""),
        "labels": {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
    }


def start_record(
    *,
    slug: str,
    trust: str | None,
    run_id: str,
    source: str,
    sandbox: bool,
    runtime: str | None,
    max_runtime_seconds: int,
) -> dict[str, Any]:
    """The `agent_run_start` record written before any agent code runs.

    With it a run whose end record never arrives (host killed, append lost) is visible to `verify_audit`:
    a start older than its own runtime bound plus `END_GRACE_SECONDS` with no matching `agent_run` is a
    problem. A restarted host closes such runs with `host_lost`.
    """
    if source not in _SOURCES:
        raise ValueError(f"audit source {source!r} is not one of {sorted(_SOURCES)}")
    return {
        "event": START_EVENT,
        "slug": slug,
        "source": source,
        "trust": trust,
        "run_id": run_id,
        "sandbox": bool(sandbox),
        "runtime": runtime,
        "max_runtime_seconds": int(max_runtime_seconds),
    }


def _sanitize_llm(llm: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only known keys whose values have the expected scalar shape."""
    out: dict[str, Any] = {}
    for key in _LLM_KEYS:
        if key not in llm:
            continue
        value = llm[key]
        if value is None:
            out[key] = None
        elif key == "enabled":
            if isinstance(value, bool):
                out[key] = value
        elif key == "model":
            if isinstance(value, str):
                out[key] = value
        elif key == "allowed_models":
            if isinstance(value, list | tuple | set | frozenset) and all(isinstance(m, str) for m in value):
                out[key] = sorted(value)
        elif key in _LLM_NUMBER_KEYS:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value) and value >= 0:
                out[key] = float(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify_audit`: `problems` name the file and line of each break in the chain."""

    ok: bool
    records: int
    problems: list[str] = dataclasses.field(default_factory=list)
    open_runs: list[str] = dataclasses.field(default_factory=list)
    """Runs started within their runtime bound (plus grace) and not ended yet: in progress, not a problem."""


@dataclasses.dataclass(frozen=True)
class _Head:
    """The chain tip (and start) recorded beside the log, so removing records at either end is visible."""

    seq: int
    hash: str
    first_seq: int | None
    first_prev: str | None


class AuditLog:
    """Append-only JSON-lines audit log with a sha256 chain, rotation and a head pointer.

    Each line carries `ts`, `seq` (monotonic over the whole chain, rotations included) and `prev`, the
    sha256 hex of the previous line's bytes (without its newline; GENESIS for the first record ever).
    `<path>.head` holds the last `seq`/hash and the first retained record's `seq`/`prev`; it is how
    `verify_audit` detects records removed from the end (or start) of the log, which the chain alone
    cannot show. Before an append would take the live file past `max_bytes` it becomes `<path>.1` (older
    files shift up, those beyond `keep` are dropped) and the chain continues in a new file. Writers
    serialize on an flock of `<path>.lock`, so threads and processes may append concurrently.

    The lock, log and head descriptors are opened once and held: a host whose descriptor table is
    exhausted by a hostile run can still write its audit (only a rotation needs a new one). A failed
    append is retried `APPEND_ATTEMPTS` times before `append` reports it.
    The chain is unkeyed: it makes edits evident, it does not stop someone who rewrites the log,
    recomputes every hash and rewrites the head file.
    """

    def __init__(self, path: Path, *, max_bytes: int = 10 * 2**20, keep: int = 5) -> None:
        if max_bytes <= 0 or keep < 1:
            raise ValueError("AuditLog needs max_bytes > 0 and keep >= 1")
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._mutex = threading.Lock()
        self._lock_fd = -1
        self._log_fd = -1
        self._head_fd = -1
        self._pending: list[dict[str, Any]] = []
        """End records whose append failed: written first by the next append that succeeds (or close)."""
        self._head_unsynced = False
        """The head was rewritten after the last synced append without its own fsync (`append(...,
        head_later=True)`): `sync_head`, the next synced append or `close` makes it durable."""
        self._left: tuple[int, int, _Head, bytes] | None = None
        """(inode, size, head, head file bytes) as this log's last append left them. While the live file
        still has that inode and size (every append grows it) and the head file those bytes, no one wrote
        since: the tip is that head, without parsing the head and reading back the last line (a run's two
        appends each did, ~0.1 ms). Anything else takes the full path (`_tip`)."""

    def open(self) -> None:
        """Open (and from then on hold) the descriptors appends need; appends call it themselves."""
        with self._mutex:
            self._ensure_open()

    @property
    def pending(self) -> int:
        """End records not written yet (their runs were failed loudly; they go in with the next append)."""
        return len(self._pending)

    def flush(self) -> bool:
        """Try once more to write end records that failed earlier; True when none is left."""
        if self._pending:
            self._write_with_retries(None, sync=True)
        return not self._pending

    def close(self) -> None:
        """Write what is pending if the log allows it, then release the held descriptors."""
        with contextlib.suppress(Exception):
            self.flush()
        with contextlib.suppress(OSError):
            self.sync_head()
        with self._mutex:
            for name in ("_lock_fd", "_log_fd", "_head_fd"):
                fd = getattr(self, name)
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                setattr(self, name, -1)

    def append(self, record: Mapping[str, Any], *, sync: bool = True, head_later: bool = False) -> bool:
        """Append one record; never raises. False (and one content-free warning) when it was not written.

        `sync=False` skips the fsyncs: the record still survives the host process dying, not the machine.
        `head_later=True` makes the record durable but leaves the head file's fsync for `sync_head` (a run's
        result waits for its record, not for the head): until then a machine crash can leave the head one
        record behind the log, which the next append repairs (see `_tip`). The next synced append makes the
        head durable before it writes its own line, so it is never further behind.
        A run's end record (`agent_run`) that still fails is kept and written ahead of the next append that
        succeeds, so a transient failure delays it rather than losing it (the caller still gets False).
        """
        return self._write_with_retries(dict(record), sync=sync, head_later=head_later)

    def sync_head(self) -> None:
        """Make a head that `append(..., head_later=True)` left unsynced durable; cheap when there is none."""
        with self._mutex:
            self._sync_head_locked()

    def _sync_head_locked(self) -> None:
        """The fsync `head_later` left for later, if any; the caller holds the mutex."""
        if self._head_unsynced and self._head_fd >= 0:
            os.fsync(self._head_fd)
        self._head_unsynced = False

    def _write_with_retries(
        self, entry: dict[str, Any] | None, *, sync: bool, head_later: bool = False
    ) -> bool:
        cause = ""
        for attempt in range(APPEND_ATTEMPTS):
            if attempt:
                time.sleep(0.05 * 4**attempt)
            try:
                with self._mutex:
                    self._ensure_open()
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                    try:
                        while self._pending:  # oldest first, each with its own chain link
                            self._append_locked(self._pending[0], True)
                            self._pending.pop(0)
                        if entry is not None:
                            self._append_locked(entry, sync, head_later=head_later)
                    finally:
                        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                return True
            except (TypeError, ValueError) as exc:  # a record that cannot be serialized: retrying won't help
                logger.warning("audit record not written to %s: %s", self.path, type(exc).__name__)
                return False
            except OSError as exc:
                cause = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        if entry is not None and entry.get("event") == RUN_EVENT and len(self._pending) < _MAX_PENDING:
            with self._mutex:
                self._pending.append(entry)
        logger.warning("audit record not written to %s: %s", self.path, cause)
        return False

    def tail(
        self, n: int, *, slug: str | None = None, events: frozenset[str] | None = None
    ) -> list[dict[str, Any]]:
        """The last `n` records (only `slug`'s / those `events` when given), oldest first, across rotations.

        Lines that are not JSON objects are skipped; use `verify_audit` to find them.
        """
        found: list[dict[str, Any]] = []
        if n <= 0:
            return found
        with _locked(self.path, exclusive=False):
            for path in reversed(_chain_files(self.path)):
                for line in _lines_reversed(path):
                    rec = _parse(line)
                    if rec is None or (slug is not None and rec.get("slug") != slug):
                        continue
                    if events is not None and rec.get("event") not in events:
                        continue
                    found.append(rec)
                    if len(found) == n:
                        return found[::-1]
        return found[::-1]

    # -- held descriptors ----------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._lock_fd < 0:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_fd = os.open(_lock_path(self.path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if self._head_fd < 0:
            self._head_fd = os.open(_head_path(self.path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if self._log_fd < 0:
            self._log_fd = _open_log(self.path)

    def _current_log_fd(self) -> tuple[int, os.stat_result]:
        """The held log descriptor (and its stat), reopened when another writer rotated the file away."""
        try:
            held = os.fstat(self._log_fd)
            same = os.stat(self.path).st_ino == held.st_ino
        except FileNotFoundError:
            same = False
        if not same:
            self._left = None
            os.close(self._log_fd)
            self._log_fd = -1
            self._log_fd = _open_log(self.path)
            held = os.fstat(self._log_fd)
        return self._log_fd, held

    # -- under the lock ------------------------------------------------------------------------------

    def _append_locked(self, record: Mapping[str, Any], sync: bool, *, head_later: bool = False) -> None:
        if sync:
            self._sync_head_locked()  # the head of the last record first: never two behind
        fd, st = self._current_log_fd()
        left, self._left = self._left, None  # (forgotten unless this append completes)
        raw_head = _pread_all(self._head_fd)
        head: _Head | None
        if left is not None and (st.st_ino, st.st_size, raw_head) == (left[0], left[1], left[3]):
            head = left[2]
            seq, prev = head.seq, head.hash
        else:
            head = _head_from_bytes(raw_head)
            seq, prev = _tip(self.path, head, fd)
        entry = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "seq": seq + 1,
            **{k: v for k, v in record.items() if k not in _CHAIN_KEYS},
            "prev": prev,
        }
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
        dropped = False
        start = st.st_size
        if start and start + len(line) + 1 > self.max_bytes:
            dropped = self._rotate()
            fd, st = self._current_log_fd()
            start = st.st_size
        # A torn last line (crash mid-write elsewhere, or its newline overwritten in place) must not swallow
        # this record: checked on every append, the remembered tip included.
        torn = start and os.pread(fd, 1, start - 1) != b"\n"
        data = (b"\n" if torn else b"") + line + b"\n"
        if os.write(fd, data) != len(data):
            os.ftruncate(fd, start)
            raise OSError(errno.EIO, "short write")
        if sync:
            os.fsync(fd)
        first: tuple[int | None, str | None]
        if head is not None and head.first_seq is not None and not dropped:
            first = (head.first_seq, head.first_prev)
        elif seq == 0 and prev == GENESIS:  # the first record ever is the first retained one
            first = (1, GENESIS)
        else:
            first = _first_record(self.path)
        written = _Head(seq + 1, _sha(line), *first)
        head_bytes = _write_head(self._head_fd, written, sync=sync and not head_later)
        if sync and head_later:
            self._head_unsynced = True
        self._left = (st.st_ino, start + len(data), written, head_bytes)

    def _rotate(self) -> bool:
        """Shift `<path>.k` to `.k+1`, the live file to `.1`; True when the oldest file was dropped."""
        present = _rotated(self.path)
        dropped = False
        for k, path in present.items():
            if k >= self.keep:
                path.unlink()
                dropped = True
        for k in range(self.keep - 1, 0, -1):
            if k in present:
                present[k].replace(_numbered(self.path, k + 1))
        self.path.replace(_numbered(self.path, 1))
        return dropped


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
    with _locked(path, exclusive=False):
        head_path = _head_path(path)
        head = _read_head(head_path)
        if head is None and head_path.exists():
            problems.append(f"{head_path.name}: unreadable")
        prev_hash: str | None = None
        expect: int | None = None
        for file in _chain_files(path):
            with file.open("rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    line = raw.removesuffix(b"\n")
                    records += 1
                    where = f"{file.name}:{lineno}"
                    rec = _parse(line)
                    if rec is None:
                        problems.append(f"{where}: not a JSON object")
                        expect = None if expect is None else expect + 1
                    else:
                        problems.extend(_check(where, rec, prev_hash, expect, head))
                        _pair(rec, where, started)
                        seq = rec.get("seq")
                        expect = seq + 1 if _is_int(seq) else (None if expect is None else expect + 1)
                    prev_hash = _sha(line)
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
    if not _is_int(bound):
        return True
    return (now - ts).total_seconds() > bound + END_GRACE_SECONDS


def _check(
    where: str, rec: dict[str, Any], prev_hash: str | None, expect: int | None, head: _Head | None
) -> list[str]:
    """Problems of one parsed record given the chain state before it (prev_hash None: first record)."""
    out: list[str] = []
    seq, prev = rec.get("seq"), rec.get("prev")
    if not _is_int(seq):
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
    if _is_int(seq) and expect is not None and seq != expect:
        out.append(f"{where}: seq {seq}, expected {expect} (record inserted, removed or reordered)")
    return out


@contextlib.contextmanager
def _locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold flock on `<path>.lock`; readers go unlocked when no writer ever created the lock file."""
    lock_path = _lock_path(path)
    if exclusive:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    else:
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            yield
            return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _tip(path: Path, head: _Head | None, fd: int) -> tuple[int, str]:
    """(seq, hash) the next record chains to; `fd` is the live log, read without opening it again.

    The last line normally agrees with the head. If the head is behind and the lines after it chain from
    it unbroken (a crash between writing lines and the head: one record in one process, at most
    _HEAD_LAG_LINES with several appending) the line wins; on any other disagreement the head wins, so
    records removed from the end stay visible as a chain break at the next append.
    """
    last = _last_line(fd)
    if last is None and head is not None:  # an empty live file (just rotated): the head is the tip
        return head.seq, head.hash
    if last is None and _numbered(path, 1).exists():  # no head either: go on from the newest rotated file
        last = next((line for p in reversed(_chain_files(path)[:-1]) for line in _lines_reversed(p)), None)
    if last is None:
        line_tip = (0, GENESIS)
        rec = None
    else:
        rec = _parse(last)
        seq = rec.get("seq") if rec else None
        line_tip = (seq if _is_int(seq) else 0, _sha(last))
    if head is None or line_tip == (head.seq, head.hash):
        return line_tip
    if rec is not None and rec.get("seq") == head.seq + 1 and rec.get("prev") == head.hash:
        return line_tip
    if rec is not None and _chains_from(fd, head):
        return line_tip
    return head.seq, head.hash


def _chains_from(fd: int, head: _Head) -> bool:
    """Whether the live log's last lines (read from its held descriptor) run unbroken from the head's
    record: each a record whose seq is one more than the one before it and whose prev is that one's hash,
    back to the one after the head."""
    later: dict[str, Any] | None = None
    for count, line in enumerate(_lines_reversed_fd(fd)):
        rec = _parse(line)
        seq = rec.get("seq") if rec else None
        if rec is None or not _is_int(seq) or count > _HEAD_LAG_LINES:
            return False
        if later is not None and (later.get("seq") != seq + 1 or later.get("prev") != _sha(line)):
            return False
        if seq == head.seq + 1:
            return rec.get("prev") == head.hash
        if seq <= head.seq:
            return False
        later = rec
    return False


def _last_line(fd: int) -> bytes | None:
    """The last non-empty line of an open file (without its newline), reading blocks from the end."""
    pos = os.fstat(fd).st_size
    rest = b""
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        chunk = os.pread(fd, step, pos) + rest
        stripped = chunk.rstrip(b"\n") if not rest else chunk
        if not rest and not stripped:
            rest = b""
            continue
        cut = stripped.rfind(b"\n")
        if cut >= 0:
            return stripped[cut + 1 :]
        rest = stripped
    return rest or None


def _first_record(path: Path) -> tuple[int | None, str | None]:
    """(seq, prev) of the oldest retained record, or (None, None) when it cannot be read."""
    for file in _chain_files(path):
        with file.open("rb") as fh:
            rec = _parse(fh.readline().removesuffix(b"\n"))
        if rec is None:
            return None, None
        seq, prev = rec.get("seq"), rec.get("prev")
        return (seq if _is_int(seq) else None), (prev if isinstance(prev, str) else None)
    return None, None


def _read_head(head_path: Path) -> _Head | None:
    try:
        return _head_from_bytes(head_path.read_bytes())
    except OSError:
        return None


def _head_from_bytes(raw: bytes) -> _Head | None:
    try:
        data = json.loads(raw)
        head = _Head(data["seq"], data["hash"], data.get("first_seq"), data.get("first_prev"))
    except (ValueError, KeyError, TypeError):
        return None
    return head if _is_int(head.seq) and isinstance(head.hash, str) else None


def _pread_all(fd: int) -> bytes:
    return os.pread(fd, _HEAD_BYTES, 0)


def _write_head(fd: int, head: _Head, *, sync: bool) -> bytes:
    """Rewrite the held head file in place: one fixed-size block, padded, so no write leaves a tail behind.
    Returns the bytes written."""
    data = json.dumps(dataclasses.asdict(head), separators=(",", ":")).encode().ljust(_HEAD_BYTES)
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(errno.EIO, "short write")
    if os.fstat(fd).st_size != _HEAD_BYTES:
        os.ftruncate(fd, _HEAD_BYTES)
    if sync:
        os.fsync(fd)
    return data


def _lines_reversed(path: Path) -> Iterator[bytes]:
    """Lines of `path` (without newlines) from the last to the first, reading blocks from the end."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        yield from _lines_reversed_fd(fh.fileno())


def _lines_reversed_fd(fd: int) -> Iterator[bytes]:
    """Lines of an open file (without newlines) from the last to the first, read by position (the
    descriptor's offset is left alone), in blocks from the end."""
    pos = os.fstat(fd).st_size
    if pos == 0:
        return
    if os.pread(fd, 1, pos - 1) == b"\n":
        pos -= 1
    rest = b""
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        first, *lines = (os.pread(fd, step, pos) + rest).split(b"\n")
        rest = first
        yield from reversed(lines)
    yield rest


def _chain_files(path: Path) -> list[Path]:
    """Rotated files oldest first, then the live file (those that exist)."""
    files = [p for _, p in sorted(_rotated(path).items(), reverse=True)]
    return [*files, path] if path.is_file() else files


def _rotated(path: Path) -> dict[int, Path]:
    pattern = re.compile(re.escape(path.name) + r"\.([1-9][0-9]*)")
    if not path.parent.is_dir():
        return {}
    return {
        int(m.group(1)): p
        for p in path.parent.iterdir()
        if (m := pattern.fullmatch(p.name)) is not None
    }


def _open_log(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _numbered(path: Path, k: int) -> Path:
    return path.with_name(f"{path.name}.{k}")


def _head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def _sha(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = [
    "END_GRACE_SECONDS",
    "GENESIS",
    "RUN_EVENT",
    "START_EVENT",
    "AuditLog",
    "VerifyReport",
    "record_run_id",
    "run_record",
    "start_record",
    "verify_audit",
]
