"""A workspace snapshot: a caller's directory copied into a directory the host owns, once, as the run starts,
so a run never sees (or races) the live tree.

The walk trusts nothing in the tree: every entry is judged from its own `lstat` before any work is done on
it, and opened relative to its parent's descriptor with O_NOFOLLOW (then checked to be the same inode), so a
file swapped for a symlink mid-walk is refused rather than followed. Regular files, directories and
symlinks whose target stays inside the tree are carried; symlinks leading out, hard-linked files, devices,
FIFOs and sockets, names that fail `name_refusal` and unreadable entries are left out and counted. Counts,
bytes and sizes are held to the limits before the bytes are read: a sparse 10 GB file or a million empty
files cost a stat each, up to the bound, and then the snapshot fails with `files_over_bound`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from host.core.errors import AuditReason, FilesError
from host.spec.files import MAX_NAME_BYTES, FileLimits, name_refusal

CHUNK = 1 << 20
PROGRESS_EVERY = 1000
"""Entries between two progress reports of a long snapshot."""

SKIPS = ("symlink_outside", "hard_link", "device", "fifo", "socket", "name_refused", "unreadable", "changed")
"""Why an entry of the tree was not carried in (counted per reason, never named)."""


Entry = tuple[str, int, str, int]
"""One entry of a tree: (kind "file" | "dir" | "link", size, SHA-256 or link target, mode 0o644 | 0o755)."""
StatKey = tuple[int, int, int, int, int]
"""(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of a file."""


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class SnapshotReport:
    """What was carried in: counts, bytes, what was left out by reason, and one digest over every entry
    (kind, path, size, SHA-256 or link target), the same for the same tree wherever it lies."""

    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    digest: str = ""
    entries: dict[str, Entry] = field(default_factory=dict)
    """path -> what it is: what a change set is later computed against."""
    written: dict[str, StatKey] = field(default_factory=dict)
    """path -> the stat of the copy's file as the host wrote it: a later scan of the copy reads again only
    the files whose stat differs (the kernel sets ctime on every write and every utime, so a run cannot
    hide a change behind an old mtime)."""

    def skip(self, reason: str) -> None:
        assert reason in SKIPS, reason
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def summary(self) -> dict[str, object]:
        """The audit record's form: numbers and the digest only, never a name."""
        return {"files": self.files, "dirs": self.dirs, "links": self.links, "bytes": self.bytes,
                "skipped": dict(sorted(self.skipped.items())), "digest": self.digest}  # fmt: skip


def over_bound(bound: str, limit: int) -> FilesError:
    """The refusal of a tree over one of `agent_sandbox.filesystem.limits`."""
    what = "the workspace" if bound.endswith("_in") else "what the run wrote"
    return FilesError(
        f"{what} is over agent_sandbox.filesystem.limits.{bound} ({limit})",
        reason=AuditReason.FILES_OVER_BOUND,
        hint=f"raise agent_sandbox.filesystem.limits.{bound} in the host config if runs may carry that much"
        + (" (or pass a smaller workspace)" if bound.endswith("_in") else ""),
    )


def _invalid(why: str) -> FilesError:
    return FilesError(f"the workspace {why}", reason=AuditReason.WORKSPACE_INVALID,
                      hint="pass a directory the host can read (run --workspace DIR)")  # fmt: skip


def _inside(parent: str, target: str, root: str) -> str | None:
    """A link target as a path relative to the link's directory that stays in the tree, or None."""
    if target.startswith("/"):
        if target != root and not target.startswith(root.rstrip("/") + "/"):
            return None
        resolved = posixpath.normpath(posixpath.relpath(target, root))
        rel = posixpath.relpath(resolved, parent or ".")
    else:
        resolved = posixpath.normpath(posixpath.join(parent, target))
        rel = target
    if resolved == ".." or resolved.startswith("../") or resolved.startswith("/"):
        return None
    return rel


class _Walk:
    """The walk of one tree; with `copy`, each carried entry is also made under the destination descriptor,
    without, it is only read and hashed (a run's writable copy, whose hard links are its own)."""

    def __init__(
        self, root: str, limits: FileLimits, progress: Callable[[str], None] | None, *, copy: bool = True,
        max_entries: int | None = None, bound: str = "max_files_in", owner: tuple[int, int] | None = None,
        known: SnapshotReport | None = None,
    ) -> None:  # fmt: skip
        self.root, self.limits, self.progress, self.copying = root, limits, progress, copy
        self.owner = owner
        self.known = known
        """A scan's base: a file whose stat is as the host wrote it is taken as its entry, unread."""
        self.max_entries = limits.max_files_in if max_entries is None else max_entries
        self.bound = bound
        self.report = SnapshotReport()
        self.seen = 0

    def count(self) -> None:
        self.seen += 1
        if self.seen > self.max_entries:
            raise over_bound(self.bound, self.max_entries)
        if self.progress is not None and self.seen % PROGRESS_EVERY == 0:
            self.progress(f"workspace: {self.seen} entries, {self.report.bytes} bytes")

    def walk(self, src_fd: int, dst_fd: int | None, rel: str, depth: int) -> None:
        names: list[str] = []
        with os.scandir(src_fd) as listing:
            for found in listing:  # a directory of a million names costs the bound, not the million
                names.append(found.name)
                if self.seen + len(names) > self.max_entries:
                    raise over_bound(self.bound, self.max_entries)
        names.sort()  # a stable order: the same tree, the same walk
        room = self.limits.max_path_bytes - (len(os.fsencode(rel)) + 1 if rel else 0)
        plain_depth = depth <= self.limits.max_depth
        for name in names:
            self.count()
            path = f"{rel}/{name}" if rel else name
            # The directory's own path passed already: a plain component within the bounds needs no more.
            plain = (plain_depth and name.isascii() and name.isprintable() and name not in (".", "..")
                     and len(name) <= min(room, MAX_NAME_BYTES))  # fmt: skip
            if not plain and name_refusal(os.fsencode(path), self.limits) is not None:
                self.report.skip("name_refused")
                continue
            try:
                st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
            except OSError:
                self.report.skip("unreadable")
                continue
            self.entry(src_fd, dst_fd, name, path, st, depth=depth)

    def entry(
        self, src_fd: int, dst_fd: int | None, name: str, path: str, st: os.stat_result, *, depth: int
    ) -> None:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if depth + 1 > self.limits.max_depth:
                raise over_bound("max_depth", self.limits.max_depth)
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
            except OSError:
                self.report.skip("unreadable")
                return
            try:
                if (os.fstat(child).st_ino, os.fstat(child).st_dev) != (st.st_ino, st.st_dev):
                    self.report.skip("changed")
                    return
                out = None
                if dst_fd is not None:
                    os.mkdir(name, 0o755, dir_fd=dst_fd)
                    out = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
                    if self.owner is not None:
                        os.fchown(out, *self.owner)
                try:
                    self.report.dirs += 1
                    self.report.entries[path] = ("dir", 0, "", 0o755)
                    self.walk(child, out, path, depth + 1)
                finally:
                    if out is not None:
                        os.close(out)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            if st.st_nlink > 1 and self.copying:  # a run's copy can only link to its own files
                self.report.skip("hard_link")
                return
            if st.st_size > self.limits.max_file_bytes:
                raise over_bound("max_file_bytes", self.limits.max_file_bytes)
            if self.copying and self.report.bytes + st.st_size > self.limits.max_bytes_in:
                raise over_bound("max_bytes_in", self.limits.max_bytes_in)
            self.copy(src_fd, dst_fd, name, path, st)
        elif stat.S_ISLNK(mode):
            try:
                target = os.readlink(name, dir_fd=src_fd)
            except OSError:
                self.report.skip("unreadable")
                return
            parent = posixpath.dirname(path)
            rel = _inside(parent, target, self.root)
            if rel is None or len(os.fsencode(rel)) > self.limits.max_path_bytes:
                self.report.skip("symlink_outside")
                return
            if dst_fd is not None:
                os.symlink(rel, name, dir_fd=dst_fd)
                if self.owner is not None:
                    os.chown(name, *self.owner, dir_fd=dst_fd, follow_symlinks=False)
            self.report.links += 1
            self.report.entries[path] = ("link", 0, rel, 0o777)
        elif stat.S_ISFIFO(mode):
            self.report.skip("fifo")
        elif stat.S_ISSOCK(mode):
            self.report.skip("socket")
        else:
            self.report.skip("device")

    def copy(self, src_fd: int, dst_fd: int | None, name: str, path: str, st: os.stat_result) -> None:
        known = self.known
        if known is not None and path in known.written and known.written[path] == stat_key(st):
            entry = known.entries[path]
            self.report.files += 1
            self.report.bytes += entry[1]
            self.report.entries[path] = entry
            return
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_fd)
        except OSError:
            self.report.skip("unreadable")
            return
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
                self.report.skip("changed")
                return
            mode = 0o755 if st.st_mode & 0o111 else 0o644  # no setuid, setgid, sticky or world-writable bit
            out = None
            if dst_fd is not None:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dst_fd)
                if self.owner is not None:
                    os.fchown(out, *self.owner)
            try:
                size, sha = read_through(fd, st.st_size, out)
                if out is not None and size == st.st_size:
                    self.report.written[path] = stat_key(os.fstat(out))
            finally:
                if out is not None:
                    os.close(out)
            if size != st.st_size:
                if dst_fd is not None:
                    os.unlink(name, dir_fd=dst_fd)
                self.report.skip("changed")
                return
        finally:
            os.close(fd)
        self.report.files += 1
        self.report.bytes += size
        self.report.entries[path] = ("file", size, sha, mode)


def read_through(fd: int, size: int, out: int | None = None) -> tuple[int, str]:
    """Read at most `size` + 1 bytes of `fd` (one past the stat'ed size shows a file still growing), hashing
    them and writing them to `out` when given; (bytes read, SHA-256)."""
    digest, done = hashlib.sha256(), 0
    while done <= size:
        chunk = os.read(fd, min(CHUNK, size + 1 - done))
        if not chunk:
            break
        done += len(chunk)
        digest.update(chunk)
        if out is not None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
    return done, digest.hexdigest()


def tree_digest(entries: dict[str, Entry]) -> str:
    """One SHA-256 over every entry, in path order."""
    h = hashlib.sha256()
    for path in sorted(entries):
        kind, size, what, mode = entries[path]
        h.update(f"{kind}\0{path}\0{size}\0{what}\0{mode:o}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def scan(
    root: Path, limits: FileLimits, *, max_entries: int, bound: str, link_root: str,
    known: SnapshotReport | None = None, digest: bool = True,
) -> SnapshotReport:  # fmt: skip
    """Read and hash the tree at `root` (a run's writable copy: hostile) without copying it, within
    `max_entries` entries (`bound` names that limit in the error) and the per-file bound; an absolute link
    is inside when it points under `link_root` (where the run saw the tree). With `known` (the snapshot the
    copy was written from), a file whose stat is still as the host wrote it is not read again. Without
    `digest` the tree's digest is left "" (a change set digests its changes, not the tree)."""
    try:
        src = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise _invalid("copy of the run is gone") from None
    walk = _Walk(link_root, limits, None, copy=False, max_entries=max_entries, bound=bound, known=known)
    try:
        walk.walk(src, None, "", 0)
    finally:
        os.close(src)
    if digest:
        walk.report.digest = tree_digest(walk.report.entries)
    return walk.report


def snapshot(
    source: Path,
    dest: Path,
    limits: FileLimits,
    *,
    progress: Callable[[str], None] | None = None,
    owner: tuple[int, int] | None = None,
) -> SnapshotReport:
    """Copy the tree at `source` into `dest` (created here, or an empty directory already mounted into a warm
    sandbox) within `limits`. FilesError (`workspace_invalid`, `files_over_bound`) otherwise, with what was
    copied removed: nothing half-made is left."""
    try:
        root = os.path.realpath(source)
        src = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        raise _invalid("is not a directory the host can read") from None
    existed = dest.is_dir() and not dest.is_symlink()
    try:
        if existed:
            if any(os.scandir(dest)):
                raise FileExistsError(f"{dest} is not empty")
        else:
            os.mkdir(dest, 0o755)
    except OSError:
        os.close(src)
        raise
    walk = _Walk(root, limits, progress, owner=owner)  # `owner`: the run's user, when it writes its copy
    try:
        dst = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            walk.walk(src, dst, "", 0)
        finally:
            os.close(dst)
    except BaseException:
        _remove(dest, keep=existed)
        raise
    finally:
        os.close(src)
    walk.report.digest = tree_digest(walk.report.entries)
    return walk.report


def _remove(path: Path, *, keep: bool = False) -> None:
    """Remove `path`'s tree (only its contents with `keep`: a directory mounted into a sandbox stays)."""
    import shutil  # noqa: PLC0415 (only a failed snapshot needs it)

    if not keep:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
        return
    with contextlib.suppress(OSError), os.scandir(path) as found:
        for entry in found:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)


__all__ = [
    "SKIPS", "Entry", "SnapshotReport", "StatKey", "over_bound", "read_through", "scan", "snapshot",
    "stat_key", "tree_digest",
]  # fmt: skip
