"""A pack's files, read safely: every entry lstat'ed first and refused before any is read (links out, special
files, sizes, counts, depth), then read through descriptors verified to be the files that were checked; the
artifact hash and the install's snapshot of the tree."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from host.core.errors import PackError
from host.core.terminal import safe_line
from host.engine.tararchive import upload_tar
from host.packs.declared import MAX_PYPROJECT_BYTES, PYPROJECT, reserved_name

MAX_PACK_BYTES = 64 * 1024 * 1024
MAX_FILE_BYTES = 32 * 1024 * 1024
MAX_PACK_ENTRIES = 10_000
"""Directory entries an install looks at (files, directories, skipped debris): bounds the walk and the tar."""
MAX_PACK_DEPTH = 32
CHUNK = 1 << 20
SKIP_DIRS = frozenset(
    {"__pycache__", ".git", ".hg", ".svn", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"}
)
"""Build debris `artifact_hash` passes over (with `*.egg-info` directories and SKIP_SUFFIXES files)."""
SKIP_SUFFIXES = (".pyc", ".pyo")
REINSTALL_CLEAN = "install from a clean copy of the pack that nothing else is writing to"


def show_name(text: str, limit: int = 160) -> str:
    """A pack-authored name made safe to print: controls and bidi characters escaped, length bounded."""
    return safe_line(text, limit=limit)


# --- the pack's files: lstat first, refuse before reading, read through verified descriptors -------------


@dataclass(frozen=True)
class _PackFile:
    """A regular file as lstat saw it; the read later checks it is still this very file."""

    rel: str
    size: int
    executable: bool
    dev: int
    ino: int


@dataclass
class _Scan:
    """What the lstat walk found: the files to read, the directories (for the src/ layout), their size."""

    files: list[_PackFile] = field(default_factory=list)
    dirs: set[str] = field(default_factory=set)
    total: int = 0


_SPECIAL = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a Unix socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _open_dir(root_fd: int, parts: list[str]) -> int:
    """Open root/parts... one component at a time, never through a link (O_NOFOLLOW on each)."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _refuse(rel: str, problem: str, hint: str) -> PackError:
    return PackError(f"{show_name(rel)}: {problem}", hint=hint)


def _scan(root_fd: int) -> _Scan:
    """Every file of the pack from lstat alone, in a stable order; refusals and size limits come before
    any byte is read. Only regular files and directories are accepted."""
    scan = _Scan()
    seen = 0
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        rel_dir, depth = stack.pop()
        try:
            dir_fd = _open_dir(root_fd, rel_dir.split("/") if rel_dir else [])
        except OSError:
            raise _refuse(rel_dir, "changed while the pack was being read", REINSTALL_CLEAN) from None
        entries: list[tuple[str, os.stat_result]] = []
        try:
            with os.scandir(dir_fd) as it:
                for entry in it:
                    seen += 1
                    if seen > MAX_PACK_ENTRIES:
                        raise PackError(
                            f"the pack has more than {MAX_PACK_ENTRIES} files and directories",
                            hint="remove build output and data the pack does not need",
                        )
                    entries.append((entry.name, entry.stat(follow_symlinks=False)))
        finally:
            os.close(dir_fd)
        subdirs: list[str] = []
        for name, st in sorted(entries, key=lambda e: e[0]):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            mode = st.st_mode
            linkish = stat.S_ISLNK(mode)
            if (stat.S_ISDIR(mode) or linkish) and (name in SKIP_DIRS or name.endswith(".egg-info")):
                continue  # build debris: never followed, read or copied
            if (stat.S_ISREG(mode) or linkish) and name.endswith(SKIP_SUFFIXES):
                continue
            if not name.isprintable():
                raise _refuse(
                    rel,
                    "file names with control characters or undecodable bytes are not allowed",
                    "rename the file",
                )
            if linkish:
                raise _refuse(
                    rel, "symlinks are not allowed in a pack", "replace the link with the file it points to"
                )
            if stat.S_ISDIR(mode):
                if depth + 1 > MAX_PACK_DEPTH:
                    raise _refuse(
                        rel,
                        f"directories nest deeper than {MAX_PACK_DEPTH} levels",
                        "flatten the pack's layout",
                    )
                scan.dirs.add(rel)
                subdirs.append(rel)
            elif stat.S_ISREG(mode):
                if st.st_size > MAX_FILE_BYTES:
                    raise _refuse(
                        rel,
                        f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB",
                        "remove it from the pack (packs carry code, not data)",
                    )
                scan.total += st.st_size
                if scan.total > MAX_PACK_BYTES:
                    raise PackError(
                        f"the pack is larger than {MAX_PACK_BYTES // 2**20} MiB", hint="remove build output"
                    )
                scan.files.append(_PackFile(rel, st.st_size, bool(mode & 0o111), st.st_dev, st.st_ino))
            else:
                what = _SPECIAL.get(stat.S_IFMT(mode), "a special file")
                raise _refuse(
                    rel,
                    f"{what} is not allowed in a pack (only regular files and directories)",
                    "remove it from the pack directory",
                )
        stack.extend((d, depth + 1) for d in reversed(subdirs))
    return scan


def _changed(rel: str) -> PackError:
    return _refuse(rel, "changed while the pack was being installed", REINSTALL_CLEAN)


def _open_file(root_fd: int, f: _PackFile) -> int:
    """Open the scanned file itself: no link followed, no FIFO blocking, and fstat must agree with lstat."""
    *parents, name = f.rel.split("/")
    try:
        dir_fd = _open_dir(root_fd, parents)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        raise _changed(f.rel) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_size) != (f.dev, f.ino, f.size):
        os.close(fd)
        raise _changed(f.rel)
    return fd


class _Reader:
    """Exactly `f.size` bytes of an opened pack file, in chunks, hashed as they pass."""

    def __init__(self, fd: int, f: _PackFile) -> None:
        self.fd, self.file, self.left = fd, f, f.size
        self.sha = hashlib.sha256()

    def read(self, n: int = CHUNK) -> bytes:
        want = min(n if n >= 0 else CHUNK, self.left, CHUNK)
        if want <= 0:
            return b""
        data = os.read(self.fd, want)
        if not data:  # the file shrank after fstat
            raise _changed(self.file.rel)
        self.left -= len(data)
        self.sha.update(data)
        return data

    def finish(self) -> bytes:
        """The file's sha256, after checking it did not grow past the size that was checked."""
        while self.left:
            self.read()
        if os.read(self.fd, 1):
            raise _changed(self.file.rel)
        return self.sha.digest()


def _root_fd(pack_dir: Path) -> int:
    try:
        return os.open(pack_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PackError(
            f"{pack_dir}: cannot open the pack directory ({type(exc).__name__})",
            hint="point at a pack directory (see: agentnode-sandbox init)",
        ) from None


def artifact_hash(pack_dir: Path) -> str:
    """sha256 over every file's path and bytes, in a stable order: the pack's identity."""
    root_fd = _root_fd(pack_dir.resolve())
    try:
        h = hashlib.sha256()
        for f in _scan(root_fd).files:
            fd = _open_file(root_fd, f)
            try:
                h.update(f.rel.encode() + b"\0" + _Reader(fd, f).finish())
            finally:
                os.close(fd)
        return h.hexdigest()
    finally:
        os.close(root_fd)


@dataclass
class Snapshot:
    """One read of the pack: its identity and a tar of exactly the bytes that were hashed (on disk)."""

    digest: str
    archive: IO[bytes]
    dirs: set[str]
    pyproject: bytes | None = None
    """The pack's pyproject.toml as hashed (None when it has none), for its requirements."""


def _check_scan(scan: _Scan) -> None:
    """Refusals that need the whole file list: names the host reserves, an oversized pyproject.toml."""
    reserved = reserved_name([*sorted(scan.dirs), *(f.rel for f in scan.files)])
    if reserved is not None:
        raise _refuse(
            reserved,
            "names starting with .agentnode- are reserved for the host (at the pack's root and under src/)",
            "rename or remove it",
        )
    for f in scan.files:
        if f.rel == PYPROJECT and f.size > MAX_PYPROJECT_BYTES:
            raise _refuse(
                f.rel,
                f"is larger than {MAX_PYPROJECT_BYTES // 1024} KiB",
                "shorten it (the host reads only [project].dependencies)",
            )


def _read_member(archive: IO[bytes], name: str) -> bytes | None:
    """One file of the snapshot's tar (None when absent); the archive is rewound afterwards."""
    archive.seek(0)
    try:
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            for member in tar:
                if member.name == name:
                    source = tar.extractfile(member)
                    return source.read() if source is not None else None
            return None
    finally:
        archive.seek(0)


@contextlib.contextmanager
def snapshot(pack_dir: Path) -> Iterator[Snapshot]:
    """Scan, then read each file once, streaming it into both the hash and a temporary tar.

    The volume and the host copy are both made from this tar, so they hold exactly what was hashed, and no
    file is ever held in memory whole.
    """
    with tempfile.TemporaryFile(prefix="agentnode-pack-") as archive:
        root_fd = _root_fd(pack_dir)
        try:
            scan = _scan(root_fd)
            _check_scan(scan)
            digest = _archive(root_fd, scan, archive)
        except OSError as exc:
            raise PackError(
                f"cannot stage the pack for install ({type(exc).__name__})",
                hint="check free space in the temporary directory (TMPDIR), then install again",
            ) from None
        finally:
            os.close(root_fd)
        has_pyproject = any(f.rel == PYPROJECT for f in scan.files)
        pyproject = _read_member(archive, PYPROJECT) if has_pyproject else None
        yield Snapshot(digest, archive, scan.dirs, pyproject)


def _archive(root_fd: int, scan: _Scan, archive: IO[bytes]) -> str:
    """Write the scanned files into `archive` as a tar with neutral metadata; returns the artifact hash."""
    h = hashlib.sha256()
    with upload_tar(archive) as tar:
        for f in scan.files:
            fd = _open_file(root_fd, f)
            try:
                reader = _Reader(fd, f)
                info = tarfile.TarInfo(f.rel)
                info.size = f.size
                info.mode = 0o755 if f.executable else 0o644
                info.uid = info.gid = 0
                info.mtime = 0
                tar.addfile(info, reader)  # reads exactly info.size bytes, chunk by chunk
                h.update(f.rel.encode() + b"\0" + reader.finish())
            finally:
                os.close(fd)
    return h.hexdigest()
