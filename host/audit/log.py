"""Tamper-evident audit trail: one sanitized `agent_run` record per run, hash-chained, multi-process safe.
Written here (`AuditLog`); the records are host/audit/records.py's, the check host/audit/verify.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
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
    lock_file,
    locked,
    parse_record,
    rotated_file,
    rotated_files,
)
from host.audit.records import RUN_EVENT

logger = logging.getLogger("agentnode.sandbox.audit")

_CHAIN_KEYS = frozenset({"ts", "seq", "prev"})
APPEND_ATTEMPTS = 3
"""A failed append is retried (a transient EMFILE/ENOSPC/EINTR) before the caller is told."""
_BLOCK = 64 * 1024
_MAX_PENDING = 1000
"""End records kept in memory while the log cannot be written (each run past that is failed loudly too)."""
_HEAD_BYTES = 512
"""The head file is one padded block rewritten in place (its JSON is ~200 bytes)."""
_HEAD_LAG_LINES = 64
"""How far behind the log a head may be found after a crash and still be caught up (processes appending
at once each leave at most one head unsynced)."""


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
        self._left: tuple[int, int, Head, bytes] | None = None
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
        with locked(self.path, exclusive=False):
            for path in reversed(chain_files(self.path)):
                for line in _lines_reversed(path):
                    rec = parse_record(line)
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
            self._lock_fd = os.open(lock_file(self.path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if self._head_fd < 0:
            self._head_fd = os.open(head_file(self.path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
        head: Head | None
        if left is not None and (st.st_ino, st.st_size, raw_head) == (left[0], left[1], left[3]):
            head = left[2]
            seq, prev = head.seq, head.hash
        else:
            head = head_from_bytes(raw_head)
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
        written = Head(seq + 1, line_hash(line), *first)
        head_bytes = _write_head(self._head_fd, written, sync=sync and not head_later)
        if sync and head_later:
            self._head_unsynced = True
        self._left = (st.st_ino, start + len(data), written, head_bytes)

    def _rotate(self) -> bool:
        """Shift `<path>.k` to `.k+1`, the live file to `.1`; True when the oldest file was dropped."""
        present = rotated_files(self.path)
        dropped = False
        for k, path in present.items():
            if k >= self.keep:
                path.unlink()
                dropped = True
        for k in range(self.keep - 1, 0, -1):
            if k in present:
                present[k].replace(rotated_file(self.path, k + 1))
        self.path.replace(rotated_file(self.path, 1))
        return dropped


def _tip(path: Path, head: Head | None, fd: int) -> tuple[int, str]:
    """(seq, hash) the next record chains to; `fd` is the live log, read without opening it again.

    The last line normally agrees with the head. If the head is behind and the lines after it chain from
    it unbroken (a crash between writing lines and the head: one record in one process, at most
    _HEAD_LAG_LINES with several appending) the line wins; on any other disagreement the head wins, so
    records removed from the end stay visible as a chain break at the next append.
    """
    last = _last_line(fd)
    if last is None and head is not None:  # an empty live file (just rotated): the head is the tip
        return head.seq, head.hash
    if last is None and rotated_file(path, 1).exists():  # no head either: go on from the newest rotated file
        last = next((line for p in reversed(chain_files(path)[:-1]) for line in _lines_reversed(p)), None)
    if last is None:
        line_tip = (0, GENESIS)
        rec = None
    else:
        rec = parse_record(last)
        seq = rec.get("seq") if rec else None
        line_tip = (seq if is_int(seq) else 0, line_hash(last))
    if head is None or line_tip == (head.seq, head.hash):
        return line_tip
    if rec is not None and rec.get("seq") == head.seq + 1 and rec.get("prev") == head.hash:
        return line_tip
    if rec is not None and _chains_from(fd, head):
        return line_tip
    return head.seq, head.hash


def _chains_from(fd: int, head: Head) -> bool:
    """Whether the live log's last lines (read from its held descriptor) run unbroken from the head's
    record: each a record whose seq is one more than the one before it and whose prev is that one's hash,
    back to the one after the head."""
    later: dict[str, Any] | None = None
    for count, line in enumerate(_lines_reversed_fd(fd)):
        rec = parse_record(line)
        seq = rec.get("seq") if rec else None
        if rec is None or not is_int(seq) or count > _HEAD_LAG_LINES:
            return False
        if later is not None and (later.get("seq") != seq + 1 or later.get("prev") != line_hash(line)):
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
    for file in chain_files(path):
        with file.open("rb") as fh:
            rec = parse_record(fh.readline().removesuffix(b"\n"))
        if rec is None:
            return None, None
        seq, prev = rec.get("seq"), rec.get("prev")
        return (seq if is_int(seq) else None), (prev if isinstance(prev, str) else None)
    return None, None


def _pread_all(fd: int) -> bytes:
    return os.pread(fd, _HEAD_BYTES, 0)


def _write_head(fd: int, head: Head, *, sync: bool) -> bytes:
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


def _open_log(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


__all__ = [
    "APPEND_ATTEMPTS",
    "AuditLog",
]
