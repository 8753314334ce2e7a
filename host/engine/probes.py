"""Host-side cgroup readers of a running container, so a fork bomb or an OOM kill is named, not guessed."""

from __future__ import annotations

import re
from pathlib import Path


def _cgroup_dir(pid: int, controller: str, marker: str) -> Path | None:
    """The host-side cgroup directory of `controller` for a process, found via /proc/<pid>/cgroup.

    Works for cgroup v1 and v2 and for both cgroup drivers; None where it cannot be found (rootless or
    remote engines), and callers then simply learn nothing.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        for candidate in (
            Path("/sys/fs/cgroup") / controller / rel.lstrip("/")
            if controller in controllers.split(",")
            else None,
            Path("/sys/fs/cgroup") / rel.lstrip("/") if controllers == "" else None,
        ):
            if candidate is not None and (candidate / marker).exists():
                return candidate
    return None


_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def container_cgroup_dir(
    container_id: str, controller: str, marker: str, *, root: Path = Path("/sys/fs/cgroup")
) -> Path | None:
    """The host-side cgroup directory of `controller` for a container, found by its id where the engine's
    drivers put it (cgroupfs: docker/<id>; systemd: system.slice/docker-<id>.scope; cgroup v1 and v2),
    under every runtime; None elsewhere (then the caller asks the engine for the process and uses
    `_cgroup_dir`). It saves an engine round trip per run."""
    if not _CONTAINER_ID.fullmatch(container_id):
        return None
    for base in (root / controller, root):
        for rel in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
            if (base / rel / marker).exists():
                return base / rel
    return None


def _read_counter(path: Path | None, key: str) -> int:
    """A `key value` counter from a cgroup file such as pids.events or memory.events (0 when unknown)."""
    if path is None:
        return 0
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


class PidsProbe:
    """Reads the host-side pids cgroup of a running container, so a fork bomb is named, not guessed."""

    def __init__(self, pid: int | None = None, *, container_id: str = "") -> None:
        """By the container's id (`container_cgroup_dir`), else by a process in it."""
        found = container_cgroup_dir(container_id, "pids", "pids.events") if container_id else None
        if found is None and pid is not None:
            found = _cgroup_dir(pid, "pids", "pids.events")
        self.path: Path | None = found / "pids.events" if found else None
        self.hits = 0

    def poll(self) -> int:
        """How often the pids limit refused a new process or thread so far (0 when unknown)."""
        self.hits = max(self.hits, _read_counter(self.path, "max"))
        return self.hits


class MemoryProbe:
    """Reads the host-side memory cgroup, so an OOM kill is told from any other SIGKILL under every runtime.

    gVisor does not set the engine's OOMKilled flag; the cgroup's own counters do not depend on it.
    """

    def __init__(self, pid: int | None = None, *, container_id: str = "") -> None:
        """By the container's id (`container_cgroup_dir`), else by a process in it."""

        def find(marker: str) -> Path | None:
            found = container_cgroup_dir(container_id, "memory", marker) if container_id else None
            return found if found is not None or pid is None else _cgroup_dir(pid, "memory", marker)

        v2 = find("memory.events")
        v1 = None if v2 else find("memory.oom_control")
        self.events = v2 / "memory.events" if v2 else (v1 / "memory.oom_control" if v1 else None)
        self.failcnt = v1 / "memory.failcnt" if v1 else None
        self.oom_kills = 0
        self.limit_hits = 0

    def poll(self) -> int:
        """OOM kills so far; also tracks how often usage hit the limit (0 when unknown)."""
        self.oom_kills = max(self.oom_kills, _read_counter(self.events, "oom_kill"))
        if self.failcnt is not None:
            try:
                self.limit_hits = max(self.limit_hits, int(self.failcnt.read_text().strip() or 0))
            except (OSError, ValueError):
                pass
        else:
            self.limit_hits = max(self.limit_hits, _read_counter(self.events, "max"))
        return self.oom_kills

    @property
    def found(self) -> bool:
        return self.events is not None

    @property
    def hit_the_limit(self) -> bool:
        return self.oom_kills > 0 or self.limit_hits > 0


__all__ = [
    "MemoryProbe",
    "PidsProbe",
    "container_cgroup_dir",
]
