"""A change set taken away instead of applied: a tar of what the run added and modified (with a list of what
it deleted), or a unified patch of its text changes. Both read the run's copy by descriptor with O_NOFOLLOW
and check each file against the change set's SHA-256, so an export holds exactly what was reported; a tar is
streamed (never a whole file in memory) and removed if any file differs."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from host.core.errors import AuditReason, FilesError
from host.files.changes import Change, ChangeSet

DELETED_LIST = ".agentnode-deleted.json"
"""The tar member listing the paths the run deleted (a tar cannot say "remove this")."""
MAX_PATCH_FILE_BYTES = 1 << 20
"""A file larger than this (or not UTF-8 text) appears in a patch as "Binary files differ"."""


def _changed_after() -> FilesError:
    return FilesError(
        "the run's copy changed after its change set was taken", reason=AuditReason.FILES_INCOMPLETE,
        hint="run it again: an export holds exactly what the change set reports",
    )  # fmt: skip


def _open(root: Path, path: str) -> int:
    """`path` under `root`, every directory on the way opened with O_NOFOLLOW (OSError on a symlink)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.split("/")[:-1]:
            down = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = down
        return os.open(path.rpartition("/")[2], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


class _Checked(io.RawIOBase):
    """A file read at most to its recorded size, hashed on the way."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.left, self.digest = fd, size, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.left)
        chunk = os.read(self.fd, want) if want else b""
        buffer[: len(chunk)] = chunk
        self.left -= len(chunk)
        self.digest.update(chunk)
        return len(chunk)


def export_tar(changes: ChangeSet, copy: Path, out: Path) -> None:
    """Write the added and modified files, directories and links of `changes` (read from `copy`) to the tar
    at `out` (created; it must not exist), with DELETED_LIST naming what was deleted."""
    try:
        with tarfile.open(out, "x", format=tarfile.PAX_FORMAT) as tar:
            for change in changes.changes:
                if change.entry is not None:
                    _add(tar, change, copy)
            deleted = json.dumps([c.path for c in changes.changes if c.entry is None]).encode()
            info = tarfile.TarInfo(DELETED_LIST)
            info.size = len(deleted)
            tar.addfile(info, io.BytesIO(deleted))
    except BaseException:
        with contextlib.suppress(OSError):
            out.unlink()
        raise


def _add(tar: tarfile.TarFile, change: Change, copy: Path) -> None:
    assert change.entry is not None
    kind, size, what, mode = change.entry
    info = tarfile.TarInfo(change.path)
    info.mode = mode & 0o755
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return
    if kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, what
        tar.addfile(info)
        return
    try:
        fd = _open(copy, change.path)
    except OSError:
        raise _changed_after() from None
    try:
        info.size = size
        reader = _Checked(fd, size)
        tar.addfile(info, io.BufferedReader(reader))
        if reader.left or reader.digest.hexdigest() != what or os.read(fd, 1):
            raise _changed_after()
    finally:
        os.close(fd)


def _text(root: Path, change: Change, entry: tuple[str, int, str, int] | None) -> list[str] | None:
    """The lines of the file `entry` describes under `root` ([] for none), None when not patchable text."""
    if entry is None:
        return []
    kind, size, what, _ = entry
    if kind != "file" or size > MAX_PATCH_FILE_BYTES:
        return None
    try:
        fd = _open(root, change.path)
    except OSError:
        raise _changed_after() from None
    try:
        data = os.read(fd, size + 1)
    finally:
        os.close(fd)
    if len(data) != size or hashlib.sha256(data).hexdigest() != what:
        raise _changed_after()
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def export_patch(changes: ChangeSet, snapshot_dir: Path, copy: Path) -> str:
    """A unified diff (`a/`, `b/` prefixes) of the files the run changed: the snapshot's content against its
    copy's; a file that is not UTF-8 text within MAX_PATCH_FILE_BYTES is named as binary, one the caller
    changed since the snapshot (`snapshot_dir` may be the caller's own directory) is named as left out, and
    directories and links are left to the tar."""
    parts: list[str] = []
    for change in changes.changes:
        kinds = {entry[0] for entry in (change.base, change.entry) if entry is not None}
        if kinds != {"file"}:
            continue  # directories and links are not in a patch (a tar carries them)
        old = "/dev/null" if change.kind == "added" else f"a/{change.path}"
        new = "/dev/null" if change.kind == "deleted" else f"b/{change.path}"
        try:
            before = _text(snapshot_dir, change, change.base)
        except FilesError:  # the caller's file changed since the snapshot: the patch would not apply
            parts.append(f"Changed in the workspace since the snapshot, left out: {old}\n")
            continue
        after = _text(copy, change, change.entry)
        if before is None or after is None:
            parts.append(f"Binary files {old} and {new} differ\n")
            continue
        for line in difflib.unified_diff(before, after, old, new):
            parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(parts)


__all__ = ["DELETED_LIST", "MAX_PATCH_FILE_BYTES", "export_patch", "export_tar"]
