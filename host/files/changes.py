"""A run's change set: what its writable copy of the workspace holds that the snapshot did not (added,
modified, deleted, with sizes and SHA-256), and applying it to the caller's directory only when asked.

The copy was written by the run, so it is read as hostile (host/files/snapshot.scan: no link followed, links
leading out and special files left out, every name checked, bounded). Applying never follows a symlink: each
directory on the way is opened by descriptor with O_NOFOLLOW, so no path can leave DIR; each file is written
beside its target and renamed over it (atomic per file), its bytes verified against the change set's SHA-256
on the way; a change to a path that changed on the host since the snapshot is refused as a conflict and
leaves that path as the host has it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from host.files.snapshot import Entry, SnapshotReport, over_bound, read_through, scan, tree_digest
from host.spec.files import FileLimits

CHANGE_KINDS = ("added", "modified", "deleted")


@dataclass(frozen=True)
class Change:
    """One path the run changed; `entry` is what it is now (None when deleted), `base` what it was."""

    path: str
    kind: str
    entry: Entry | None
    base: Entry | None

    def to_json(self) -> dict[str, object]:
        now = self.entry or self.base
        assert now is not None
        return {"path": self.path, "change": self.kind, "type": now[0],
                "size": self.entry[1] if self.entry else 0,
                "sha256": self.entry[2] if self.entry and self.entry[0] == "file" else None}  # fmt: skip


@dataclass
class ChangeSet:
    """Every change, in path order, and what the scan of the copy left out (counted by reason)."""

    changes: list[Change] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    digest: str = ""

    def summary(self) -> dict[str, object]:
        """The audit record's form: counts, bytes and a digest, never a name."""
        counts = {kind: sum(1 for c in self.changes if c.kind == kind) for kind in CHANGE_KINDS}
        return {**counts, "bytes": self.bytes, "skipped": dict(sorted(self.skipped.items())),
                "digest": self.digest}  # fmt: skip


def _bounded(limits: FileLimits, base: SnapshotReport) -> int:
    return len(base.entries) + limits.max_files_out


def changes_of(base: SnapshotReport, copy: Path, limits: FileLimits, *, link_root: str) -> ChangeSet:
    """The change set of the run's copy at `copy` against the snapshot `base` it started from; FilesError
    (`files_over_bound`) when the copy holds more entries or bytes than the bounds let come back."""
    after = scan(copy, limits, max_entries=_bounded(limits, base), bound="max_files_out", link_root=link_root,
                 known=base, digest=False)  # fmt: skip
    found = ChangeSet(skipped=dict(after.skipped))
    for path in sorted(set(base.entries) | set(after.entries)):
        old, new = base.entries.get(path), after.entries.get(path)
        if old == new:
            continue
        kind = "added" if old is None else "deleted" if new is None else "modified"
        found.changes.append(Change(path, kind, new, old))
        if new is not None and new[0] == "file":
            found.bytes += new[1]
    if len(found.changes) > limits.max_files_out or found.bytes > limits.max_bytes_out:
        bound = "max_files_out" if len(found.changes) > limits.max_files_out else "max_bytes_out"
        raise over_bound(bound, getattr(limits, bound))
    found.digest = tree_digest({c.path: c.entry or ("deleted", 0, "", 0) for c in found.changes})
    return found


@dataclass
class ApplyReport:
    """What applying did: paths applied, and paths refused because the host's copy changed (conflicts) or
    the run's bytes were not what the change set says (mismatch)."""

    applied: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        return {"applied": len(self.applied), "conflicts": len(self.conflicts),
                "mismatched": len(self.mismatched)}  # fmt: skip


class _Dirs:
    """Directory descriptors opened component by component with O_NOFOLLOW (a symlink on the way fails)."""

    def __init__(self, root: Path) -> None:
        self.root = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.open: dict[str, int] = {"": self.root}

    def get(self, rel: str, *, create: bool) -> int | None:
        if rel in self.open:
            return self.open[rel]
        parent, _, name = rel.rpartition("/")
        up = self.get(parent, create=create)
        if up is None:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=up)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(name, 0o755, dir_fd=up)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=up)
        except OSError:  # a symlink (ELOOP), a file (ENOTDIR): never followed, never replaced
            return None
        self.open[rel] = fd
        return fd

    def close(self) -> None:
        for fd in self.open.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _current(dir_fd: int, name: str) -> Entry | None:
    """What the host's tree holds at name now (as snapshot entries describe it), None when nothing is there,
    ("other", ...) for anything a snapshot would not carry."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return ("dir", 0, "", 0o755)
    if stat.S_ISLNK(st.st_mode):
        return ("link", 0, os.readlink(name, dir_fd=dir_fd), 0o777)
    if not stat.S_ISREG(st.st_mode):
        return ("other", 0, "", 0)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        size, sha = read_through(fd, st.st_size)
    finally:
        os.close(fd)
    return ("file", size, sha, 0o755 if st.st_mode & 0o111 else 0o644)


def _same(now: Entry | None, base: Entry | None) -> bool:
    if now is None or base is None:
        return now is base
    if now[0] == "link" and base[0] == "link":
        return True  # a snapshot stores a link's target relative; the host's may be absolute
    return now[:3] == base[:3]


def apply_changes(changes: ChangeSet, copy: Path, target: Path, *, durable: bool = True) -> ApplyReport:
    """Apply `changes` (read from the run's `copy`) to the caller's `target` directory, per file. `durable`:
    each file is on disk before it replaces anything (fsync, then rename), so a host crash never leaves a
    caller's file empty; artifacts written into a new directory replace nothing and skip it."""
    report = ApplyReport()
    dirs, source = _Dirs(target), _Dirs(copy)
    try:
        ordered = [c for c in changes.changes if c.kind != "deleted"]
        deleted = (c for c in changes.changes if c.kind == "deleted")
        ordered += sorted(deleted, key=lambda c: -c.path.count("/"))  # a directory's files before it
        for change in ordered:
            parent, _, name = change.path.rpartition("/")
            up = dirs.get(parent, create=change.kind != "deleted")
            if up is None or not _same(_current(up, name), change.base):
                report.conflicts.append(change.path)
                continue
            if _apply_one(change, up, name, source, parent, durable=durable):
                report.applied.append(change.path)
            else:
                report.mismatched.append(change.path)
    finally:
        dirs.close()
        source.close()
    return report


def _apply_one(change: Change, up: int, name: str, source: _Dirs, parent: str, *, durable: bool) -> bool:
    entry = change.entry
    if entry is None:  # deleted: a directory only when the host's is empty now
        try:
            if change.base is not None and change.base[0] == "dir":
                os.rmdir(name, dir_fd=up)
            else:
                os.unlink(name, dir_fd=up)
        except OSError:
            return False
        return True
    kind, size, what, mode = entry
    if change.base is not None and change.base[0] != kind:  # a file became a directory, or the reverse
        try:
            if change.base[0] == "dir":
                os.rmdir(name, dir_fd=up)
            else:
                os.unlink(name, dir_fd=up)
        except OSError:
            return False
    if kind == "dir":
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=up)
        return True
    temp = f".agentnode-{secrets.token_hex(6)}"
    if kind == "link":
        os.symlink(what, temp, dir_fd=up)
        os.rename(temp, name, src_dir_fd=up, dst_dir_fd=up)
        return True
    src_dir = source.get(parent, create=False)
    if src_dir is None:
        return False
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=src_dir)
    except OSError:
        return False
    try:
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=up)
        try:
            done, sha = read_through(fd, size, out)
            if durable:
                os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    if (done, sha) != (size, what):  # the run's file is not what the change set says: never half-applied
        os.unlink(temp, dir_fd=up)
        return False
    os.rename(temp, name, src_dir_fd=up, dst_dir_fd=up)
    return True


__all__ = ["CHANGE_KINDS", "ApplyReport", "Change", "ChangeSet", "apply_changes", "changes_of"]
