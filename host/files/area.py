"""A run's files on the host: one directory beside its run directory (workspace, inputs, outputs), on a
tmpfs the kernel bounds when the host is root, so a run that writes without end fills its own bound and
never the host's disk; removed with the run.

The area is the host's: made before the sandbox exists, never handed to one whole. A sandbox sees its parts
through bind mounts (host/engine/spec.py): the workspace read-only unless the run writes its own copy, the
inputs read-only, the outputs writable by the run's user only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from host.spec.files import FileLimits

OWNER_SUFFIX = ".owner"
AREA_SUFFIX = ".files"
"""`<run dir><AREA_SUFFIX>`: beside the run's socket directory, never inside it (that one is mounted)."""
WORKSPACE, INPUTS, OUTPUTS = "workspace", "inputs", "outputs"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MNT_DETACH = 2
_INODE_SLACK = 64
_BYTE_SLACK = 1 << 20


def area_of(run_dir: Path | str) -> Path:
    """Where the files of the run whose socket directory is `run_dir` live."""
    return Path(f"{run_dir}{AREA_SUFFIX}")


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc, looked up once (find_library runs ldconfig: milliseconds a call)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_tmpfs(path: Path, *, size: int, inodes: int) -> bool:
    """A tmpfs of `size` bytes and `inodes` entries on `path` (root only); False where it cannot be had."""
    if os.geteuid() != 0:
        return False
    opts = f"size={size},nr_inodes={inodes},mode=0755".encode()
    rc = _libc().mount(b"agentnode-files", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts)
    return bool(rc == 0)


def unmount(path: Path) -> None:
    """Detach a tmpfs from `path` (lazily: a container still holding a bind of it keeps its view until it
    goes, and the memory is freed then); nothing when none is there."""
    with contextlib.suppress(OSError):
        if os.path.ismount(path):
            _libc().umount2(os.fsencode(path), _MNT_DETACH)


@dataclass
class FilesArea:
    """The host-side directories of one run's files."""

    path: Path
    bounded: bool
    """On a tmpfs of the run's own size (root); otherwise bounded only when what it wrote is read back."""

    @property
    def workspace(self) -> Path:
        return self.path / WORKSPACE

    @property
    def inputs(self) -> Path:
        return self.path / INPUTS

    @property
    def outputs(self) -> Path:
        return self.path / OUTPUTS

    @property
    def owner_file(self) -> Path:
        """Beside the area: the host process it is for (a sweep leaves a live host's area alone, even once
        its run directory is gone: the host reads the area back after its sandbox was removed)."""
        return self.path.with_name(self.path.name + OWNER_SUFFIX)

    @classmethod
    def make(
        cls, path: Path, limits: FileLimits, *, uid: int, gid: int, writable: bool, owner: str = "",
        hand_over: bool = True,
    ) -> FilesArea:  # fmt: skip
        """The area at `path` (which must not exist), its workspace owned by the run's user when the run
        writes its copy (`writable`), its outputs always. Sized by the limits: what may come in and go out.
        `owner` is the host's owner token (host/core/owner.py), recorded beside it for the sweep. Without
        `hand_over` (a warm member's, made before its run) everything stays root's until `hand_over`: the
        member's preloaded code can plant nothing in it before the caller's files arrive."""
        area = cls(path, False)
        if owner:
            area.owner_file.write_text(owner)
        os.mkdir(path, 0o755)
        try:
            area.bounded = _mount_tmpfs(
                path,
                size=limits.max_bytes_in + limits.max_bytes_out + _BYTE_SLACK,
                inodes=limits.max_files_in + limits.max_files_out + _INODE_SLACK,
            )
            os.chmod(path, 0o755)  # noqa: S103 (the sandbox's user traverses it to its mounts)
            for part in (WORKSPACE, INPUTS, OUTPUTS):
                os.mkdir(path / part, 0o755)
            if hand_over:
                area.hand_over(uid, gid, writable=writable)
        except BaseException:
            area.remove()
            raise
        return area

    def hand_over(self, uid: int, gid: int, *, writable: bool) -> None:
        """Give the run's user its outputs (0700) and, when it writes its copy, the workspace's top."""
        if writable:
            os.chown(self.workspace, uid, gid)
        os.chown(self.outputs, uid, gid)
        os.chmod(self.outputs, 0o700)

    def seal(self) -> bool:
        """Make the area read-only for every mount of it at once, the sandboxes' binds included (its tmpfs
        remounted read-only): from then on nothing of the run can change what the host reads back. False
        when that cannot be had (no tmpfs, or a file of it still open for writing: EBUSY); the caller then
        waits for the run's sandboxes to end instead."""
        if not self.bounded or not os.path.ismount(self.path):
            return False
        flags = _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        return bool(_libc().mount(None, os.fsencode(self.path), None, flags, None) == 0)

    def remove(self) -> None:
        """Gone: the tmpfs detached (its memory with it), the directory removed; never raises."""
        unmount(self.path)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.path)
        with contextlib.suppress(OSError):
            self.owner_file.unlink()


def sweep_areas(root: Path, live: Callable[[str], bool]) -> list[str]:
    """Remove the files areas under `root` whose run directory (`<name>` without the suffix) is gone and
    whose owner (the token beside it) is not `live`: what a host that died mid-run left. The names removed."""
    removed: list[str] = []
    with contextlib.suppress(OSError), os.scandir(root) as found:
        for entry in found:
            if not entry.name.endswith(AREA_SUFFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            area = FilesArea(Path(entry.path), True)
            if os.path.lexists(entry.path[: -len(AREA_SUFFIX)]):
                continue
            try:
                owner = area.owner_file.read_text().strip()
            except OSError:
                owner = ""
            if owner and live(owner):
                continue
            area.remove()
            removed.append(entry.name)
    return removed


__all__ = [
    "AREA_SUFFIX", "INPUTS", "OUTPUTS", "OWNER_SUFFIX", "WORKSPACE", "FilesArea", "area_of", "sweep_areas",
    "unmount",
]  # fmt: skip
