"""Per-run socket directories: fresh, private to the run's uid, owned by a live host, swept when orphaned."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from host.core.owner import owner_alive
from host.engine.contract import EGRESS_SOCKET_NAME, SOCKET_NAME
from host.files.area import AREA_SUFFIX, sweep_areas

logger = logging.getLogger("agentnode.sandbox.rundir")

_OWNER_SUFFIX = ".owner"
_RUN_SUFFIX = ".run"
_PREFIX = "run-"


def run_root(env: Mapping[str, str] | None = None) -> Path:
    """Where run directories live: AGENTNODE_RUN_DIR, else /run/agentnode-sandbox as root, else per user.

    Kept short on purpose: a Unix socket path must fit in 108 bytes.
    """
    env = os.environ if env is None else env
    if env.get("AGENTNODE_RUN_DIR"):
        root = Path(env["AGENTNODE_RUN_DIR"])
    elif os.geteuid() == 0:
        root = Path("/run/agentnode-sandbox")
    else:
        base = env.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
        root = Path(base) / f"agentnode-sandbox-{os.geteuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    return root


@dataclass(frozen=True)
class RunDir:
    """One run's directory and the socket path inside it."""

    path: Path

    @property
    def socket_path(self) -> Path:
        return self.path / SOCKET_NAME

    @property
    def egress_path(self) -> Path:
        """The sandbox's egress socket (host/egress/proxy.py), made only when the run grants it egress."""
        return self.path / EGRESS_SOCKET_NAME

    def grant(self, uid: int, gid: int) -> None:
        """Let the container's uid (and only it, besides root) reach the sockets there are."""
        sockets = [p for p in (self.socket_path, self.egress_path) if p.exists()]
        if os.geteuid() == 0:
            os.chown(self.path, uid, gid)
            os.chmod(self.path, 0o700)
            for path in sockets:
                os.chown(path, uid, gid)
                os.chmod(path, 0o600)
        else:
            # Without root we cannot hand the directory over; the unguessable name and a non-listable
            # directory are what keep other users out.
            os.chmod(self.path, 0o711)  # noqa: S103 (traverse only; not listable)
            for path in sockets:
                os.chmod(path, 0o666)  # noqa: S103 (see above)

    @property
    def owner_file(self) -> Path:
        """Beside the directory, not in it: the container sees the directory and must not learn host pids."""
        return self.path.with_name(self.path.name + _OWNER_SUFFIX)

    @property
    def run_file(self) -> Path:
        """Beside the directory: what run this is, so a host that restarts after a crash can audit it."""
        return self.path.with_name(self.path.name + _RUN_SUFFIX)

    def record_run(self, info: Mapping[str, object]) -> None:
        self.run_file.write_text(json.dumps(dict(info)))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.owner_file.unlink(missing_ok=True)
        self.run_file.unlink(missing_ok=True)


def run_dir_of(run_id: str, env: Mapping[str, str] | None = None) -> RunDir:
    """Where the directory of run `run_id` is (made or not)."""
    return RunDir(run_root(env) / f"{_PREFIX}{run_id}")


def make_run_dir(run_id: str, owner: str, env: Mapping[str, str] | None = None) -> RunDir:
    """Create a fresh directory for one run, recording the owning host process for the sweep."""
    rundir = run_dir_of(run_id, env)
    rundir.path.mkdir(mode=0o700)
    rundir.owner_file.write_text(owner)
    return rundir


def made_for(rundir: RunDir, owner: str) -> bool:
    """Is `rundir` a run directory as `make_run_dir` makes it for `owner`: a real directory (no link) of this
    user's, private, holding nothing yet, and its owner file (likewise this user's) naming `owner`? A
    directory another process made (host/runtime/headstart.py) is served only if it is."""
    try:
        found, marker = os.lstat(rundir.path), os.lstat(rundir.owner_file)
        if not (stat.S_ISDIR(found.st_mode) and stat.S_ISREG(marker.st_mode)):
            return False
        uid = os.geteuid()
        if found.st_uid != uid or marker.st_uid != uid or stat.S_IMODE(found.st_mode) != 0o700:
            return False
        return not any(rundir.path.iterdir()) and rundir.owner_file.read_text() == owner
    except OSError:
        return False


def _young(path: Path, seconds: float = 60.0) -> bool:
    """A directory without an owner file yet may be one another host is creating right now."""
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def orphaned_runs(env: Mapping[str, str] | None = None) -> list[dict[str, object]]:
    """Runs that were in progress when their host died: read before the sweep removes their records."""
    runs: list[dict[str, object]] = []
    for record in run_root(env).glob(f"{_PREFIX}*{_RUN_SUFFIX}"):
        rundir = RunDir(record.with_name(record.name.removesuffix(_RUN_SUFFIX)))
        try:
            owner = rundir.owner_file.read_text().strip()
            info = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if not owner_alive(owner) and isinstance(info, dict):
            runs.append(info)
    return runs


def sweep_run_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    """Remove run directories whose owning host process is gone; nothing else under the root is touched."""
    removed: list[str] = []
    root = run_root(env)
    removed += sweep_areas(root, owner_alive)
    for entry in root.iterdir():
        if not entry.name.startswith(_PREFIX):
            continue
        if AREA_SUFFIX in entry.name:  # a run's files (and their owner): host/files/area.py sweeps them
            continue
        if entry.name.endswith(_RUN_SUFFIX) and entry.is_file():
            if not RunDir(entry.with_name(entry.name.removesuffix(_RUN_SUFFIX))).path.exists():
                entry.unlink(missing_ok=True)
            continue
        if entry.name.endswith(_OWNER_SUFFIX) and entry.is_file():
            rundir = RunDir(entry.with_name(entry.name.removesuffix(_OWNER_SUFFIX)))
            if not rundir.path.exists() and not owner_alive(entry.read_text().strip()):
                entry.unlink(missing_ok=True)  # the directory went, its owner record stayed
            continue
        if not entry.is_dir():
            continue
        rundir = RunDir(entry)
        try:
            owner = rundir.owner_file.read_text().strip()
        except OSError:
            owner = ""
        if owner_alive(owner) if owner else _young(entry):
            continue
        with contextlib.suppress(OSError):
            rundir.remove()
            removed.append(entry.name)
    return removed


__all__ = ["RunDir", "made_for", "make_run_dir", "orphaned_runs", "run_dir_of", "run_root", "sweep_run_dirs"]
