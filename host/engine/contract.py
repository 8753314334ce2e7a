"""The container contract every backend keeps (Docker, Podman, Kubernetes): who the agent runs as, where
its pack, socket and home are inside, and the limits it gets. Plain data, so the Kubernetes objects read
it without importing the Docker engine module."""

from __future__ import annotations

from dataclasses import dataclass

SANDBOX_UID = 65532
SANDBOX_GID = 65532
"""The unprivileged user and group the agent and its tools run as, in every sandbox."""
SOCKET_DIR_IN_CONTAINER = "/run/agentnode"
"""Where the run's socket directory is mounted inside (read-only)."""
SOCKET_NAME = "sandbox.sock"
"""The run's gRPC socket in that directory: its identity."""
EGRESS_SOCKET_NAME = "egress.sock"
"""The sandbox's egress socket in that directory, there only when the run grants it egress (host/egress/);
sandbox_wrapper/protocol.py names it for the wrapper (a unit test holds the two equal)."""
PACK_DIR_IN_CONTAINER = "/pack"
"""Where the pack's read-only volume is mounted inside."""
HOME_IN_CONTAINER = "/home/sandbox"
"""The agent's home: a small private tmpfs."""
WORKSPACE_IN_CONTAINER = "/workspace"
"""Where a run's workspace appears inside, for every runtime: its snapshot (read-only) or the run's own copy
(writable), bind-mounted from a host-owned directory, never the caller's own (host/files/)."""
INPUTS_IN_CONTAINER = "/inputs"
"""Where the files a caller hands a run appear, read-only."""
OUTPUTS_IN_CONTAINER = "/outputs"
"""Where an agent leaves artifacts for its caller: writable by the sandbox's user only, read back by the host
once the run's sandboxes are gone."""


@dataclass(frozen=True)
class FilesMounts:
    """What of a run's files area (host/files/area.py) one sandbox mounts."""

    area: str
    """The host-owned area: `<area>/workspace`, `<area>/inputs`, `<area>/outputs`."""
    workspace: str = "none"
    """"none", "read" (read-only) or "write" (the run's own copy, writable)."""
    io: bool = False
    """The inputs (read-only) and outputs (writable): an agent's sandbox, not a tool's."""

NPROC_LIMIT = 32768
"""RLIMIT_NPROC of a sandbox (see host/engine/spec.container_spec): Podman's own service limit on hosts
where it cannot raise it, and 64 concurrent runs at the pids ceiling (256) use half of it."""


@dataclass(frozen=True)
class ContainerLimits:
    """Resource ceilings of one sandbox container; the defaults are the documented ones."""

    memory_bytes: int = 512 * 1024 * 1024
    pids: int = 256
    cpus: float = 1.0
    tmp_bytes: int = 64 * 1024 * 1024
    home_bytes: int = 16 * 1024 * 1024
    nofile: int = 256
    fsize_bytes: int = 64 * 1024 * 1024
    log_max_bytes: int = 1024 * 1024


__all__ = [
    "EGRESS_SOCKET_NAME",
    "HOME_IN_CONTAINER",
    "NPROC_LIMIT",
    "PACK_DIR_IN_CONTAINER",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "SOCKET_DIR_IN_CONTAINER",
    "SOCKET_NAME",
    "ContainerLimits",
]
