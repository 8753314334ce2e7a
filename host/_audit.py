"""Tamper-evident audit trail: one sanitized `agent_run` record per run, hash-chained, multi-process safe."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from host._errors import AUDIT_REASONS, AuditReason

logger = logging.getLogger("agentnode.sandbox.audit")

GENESIS = "0" * 64
"""The `prev` of the first record ever written to a log."""

_ACTIONS = frozenset({"allow", "deny"})
_SOURCES = frozenset({"agent_sandbox", "agent_host"})
_LLM_INT_KEYS = (
    "max_calls",
    "max_input_chars",
    "max_output_chars",
    "requests",
    "calls",
    "ok",
    "refused_disabled",
    "refused_limit",
    "refused_input",
    "refused_output",
    "refused_model",
    "provider_errors",
)
_LLM_KEYS = ("enabled", *_LLM_INT_KEYS[:3], "allowed_models", *_LLM_INT_KEYS[3:], "model")
_CHAIN_KEYS = frozenset({"ts", "seq", "prev"})
_BLOCK = 64 * 1024


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
) -> dict[str, Any]:
    """Build the one `agent_run` record of a run; sanitized by construction.

    Only these typed fields reach the log. `llm` (effective caps + usage counters, None when no LLM policy
    applied) is filtered to the known keys with the expected types (ints, the `enabled` bool, the host-side
    `model` string, `allowed_models` as a sorted list of strings, or None); any other key or value shape is
    dropped. So no prompt, completion, API key, provider error, tool argument/result or agent-authored
    text can ever be audited. `reason`, `action` and `source` outside their fixed sets are programming
    errors and raise ValueError.
    """
    if reason not in AUDIT_REASONS:
        raise ValueError(f"audit reason {reason!r} is not in AuditReason")
    if action not in _ACTIONS:
        raise ValueError(f"audit action {action!r} is not one of {sorted(_ACTIONS)}")
    if source not in _SOURCES:
        raise ValueError(f"audit source {source!r} is not one of {sorted(_SOURCES)}")
    return {
        "event": "agent_run",
        "slug": slug,
        "action": action,
        "source": source,
        "reason": str(reason),
        "trust": trust,
        "request_id": run_id,
        "sandbox": bool(sandbox),
        "runtime": runtime,
        "image": image,
        "duration_ms": int(duration_ms),
        "timed_out": bool(timed_out),
        "llm": None if llm is None else _sanitize_llm(llm),
        "tool_calls": int(tool_calls),
        "tool_refusals": int(tool_refusals),
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
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify_audit`: `problems` name the file and line of each break in the chain."""

    ok: bool
    records: int
    problems: list[str] = dataclasses.field(default_factory=list)


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
    The chain is unkeyed: it makes edits evident, it does not stop someone who rewrites the log,
    recomputes every hash and rewrites the head file.
    """

    def __init__(self, path: Path, *, max_bytes: int = 10 * 2**20, keep: int = 5) -> None:
        if max_bytes <= 0 or keep < 1:
            raise ValueError("AuditLog needs max_bytes > 0 and keep >= 1")
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep

    def append(self, record: Mapping[str, Any]) -> bool:
        """Append one record; never raises. False (and one content-free warning) when it was not written."""
        try:
            with _locked(self.path, exclusive=True):
                self._append_locked(record)
        except (OSError, TypeError, ValueError) as exc:
            cause = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else type(exc).__name__
            logger.warning("audit record not written to %s: %s", self.path, cause)
            return False
        return True

    def tail(self, n: int, *, slug: str | None = None) -> list[dict[str, Any]]:
        """The last `n` records (only `slug`'s when given), oldest first, reading rotated files as needed.

        Lines that are not JSON objects are skipped; use `verify_audit` to find them.
        """
        found: list[dict[str, Any]] = []
        if n <= 0:
            return found
        with _locked(self.path, exclusive=False):
            for path in reversed(_chain_files(self.path)):
                for line in _lines_reversed(path):
                    rec = _parse(line)
                    if rec is not None and (slug is None or rec.get("slug") == slug):
                        found.append(rec)
                        if len(found) == n:
                            return found[::-1]
        return found[::-1]

    def _append_locked(self, record: Mapping[str, Any]) -> None:
        head_path = _head_path(self.path)
        head = _read_head(head_path)
        seq, prev = _tip(self.path, head)
        entry = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "seq": seq + 1,
            **{k: v for k, v in record.items() if k not in _CHAIN_KEYS},
            "prev": prev,
        }
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
        dropped = False
        fd = _open_log(self.path)
        try:
            size = os.fstat(fd).st_size
            if size and size + len(line) + 1 > self.max_bytes:
                os.close(fd)
                fd = -1
                dropped = self._rotate()
                fd = _open_log(self.path)
            start = os.fstat(fd).st_size
            # A torn last line (crash mid-write elsewhere) must not swallow this record.
            data = (b"\n" if start and os.pread(fd, 1, start - 1) != b"\n" else b"") + line + b"\n"
            if os.write(fd, data) != len(data):
                os.ftruncate(fd, start)
                raise OSError(errno.EIO, "short write")
            os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        first: tuple[int | None, str | None]
        if head is not None and head.first_seq is not None and not dropped:
            first = (head.first_seq, head.first_prev)
        else:
            first = _first_record(self.path)
        _write_head(head_path, _Head(seq + 1, _sha(line), *first))

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


def verify_audit(path: Path) -> VerifyReport:
    """Check the whole chain (rotated files oldest first, then `path`) and the head file.

    Detects edited, inserted, reordered and removed lines: each line must be a JSON object whose `prev`
    is the hash of the line before it and whose `seq` follows the previous one; the first and last
    records must match `<path>.head`, which is how truncation of the tail (or start) is detected.
    """
    problems: list[str] = []
    records = 0
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
    return VerifyReport(ok=not problems, records=records, problems=problems)


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
    lock_path = path.with_name(path.name + ".lock")
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


def _tip(path: Path, head: _Head | None) -> tuple[int, str]:
    """(seq, hash) the next record chains to.

    The last line normally agrees with the head. If the head is exactly one record behind (a crash
    between writing the line and the head) the line wins; on any other disagreement the head wins, so
    records removed from the end stay visible as a chain break at the next append.
    """
    last = next((line for p in reversed(_chain_files(path)) for line in _lines_reversed(p)), None)
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
    return head.seq, head.hash


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
        data = json.loads(head_path.read_bytes())
        head = _Head(data["seq"], data["hash"], data.get("first_seq"), data.get("first_prev"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return head if _is_int(head.seq) and isinstance(head.hash, str) else None


def _write_head(head_path: Path, head: _Head) -> None:
    """Atomically replace the head file (write a temp file, fsync, rename)."""
    tmp = head_path.with_name(head_path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(dataclasses.asdict(head), separators=(",", ":")).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(head_path)


def _lines_reversed(path: Path) -> Iterator[bytes]:
    """Lines of `path` (without newlines) from the last to the first, reading blocks from the end."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        pos = fh.seek(0, os.SEEK_END)
        if pos == 0:
            return
        fh.seek(pos - 1)
        if fh.read(1) == b"\n":
            pos -= 1
        rest = b""
        while pos > 0:
            step = min(_BLOCK, pos)
            pos -= step
            fh.seek(pos)
            first, *lines = (fh.read(step) + rest).split(b"\n")
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
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)


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


__all__ = ["GENESIS", "AuditLog", "VerifyReport", "run_record", "verify_audit"]
