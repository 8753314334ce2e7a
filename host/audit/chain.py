"""The audit log's files as its writer and its verifier both read them: their names and order, the head
file's record of both ends, the shared lock, and one line's parse and hash."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

GENESIS = "0" * 64
"""The `prev` of the first record ever written to a log."""


@dataclasses.dataclass(frozen=True)
class Head:
    """The chain tip (and start) recorded beside the log, so removing records at either end is visible."""

    seq: int
    hash: str
    first_seq: int | None
    first_prev: str | None


@contextlib.contextmanager
def locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold flock on `<path>.lock`; readers go unlocked when no writer ever created the lock file."""
    lock_path = lock_file(path)
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


def head_from_bytes(raw: bytes) -> Head | None:
    try:
        data = json.loads(raw)
        head = Head(data["seq"], data["hash"], data.get("first_seq"), data.get("first_prev"))
    except (ValueError, KeyError, TypeError):
        return None
    return head if is_int(head.seq) and isinstance(head.hash, str) else None


def chain_files(path: Path) -> list[Path]:
    """Rotated files oldest first, then the live file (those that exist)."""
    files = [p for _, p in sorted(rotated_files(path).items(), reverse=True)]
    return [*files, path] if path.is_file() else files


def rotated_files(path: Path) -> dict[int, Path]:
    pattern = re.compile(re.escape(path.name) + r"\.([1-9][0-9]*)")
    if not path.parent.is_dir():
        return {}
    return {
        int(m.group(1)): p
        for p in path.parent.iterdir()
        if (m := pattern.fullmatch(p.name)) is not None
    }


def lock_file(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def rotated_file(path: Path, k: int) -> Path:
    return path.with_name(f"{path.name}.{k}")


def head_file(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = [
    "GENESIS",
    "Head",
    "chain_files",
    "head_file",
    "head_from_bytes",
    "is_int",
    "line_hash",
    "lock_file",
    "locked",
    "parse_record",
    "rotated_file",
    "rotated_files",
]
