"""The hardened container of one run as plain data: `container_spec`'s keywords and the engine request
`create_body` makes of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from host.engine.contract import (
    HOME_IN_CONTAINER,
    INPUTS_IN_CONTAINER,
    NPROC_LIMIT,
    OUTPUTS_IN_CONTAINER,
    PACK_DIR_IN_CONTAINER,
    SANDBOX_GID,
    SANDBOX_UID,
    SOCKET_DIR_IN_CONTAINER,
    SOCKET_NAME,
    WORKSPACE_IN_CONTAINER,
    ContainerLimits,
    FilesMounts,
)
from host.engine.facts import EngineKind
from host.engine.labels import LABEL_OWNER, LABEL_RUN, LABEL_SLUG, LABEL_TOOL_FOR, LABEL_WARM
from host.engine.wrapper_env import TOOL_SERVER_ARGS, WRAPPER_ARGS, wrapper_env


def container_spec(
    *,
    image: str,
    run_id: str,
    name: str,
    owner: str,
    slug: str,
    runtime: str,
    pack_volume: str,
    import_root: str,
    socket_dir: str,
    limits: ContainerLimits = ContainerLimits(),
    warm: bool = False,
    tool_for: str = "",
    preload: str = "",
    engine: EngineKind = EngineKind.DOCKER,
    seccomp_profile: str = "",
    socket_wait: float = 0.0,
    files: FilesMounts | None = None,
) -> dict[str, Any]:
    """The `containers.create` keyword arguments of one run (the docker SDK's names, which `create_body`
    turns into the engine's request): every hardening decision, as plain data.

    `warm` marks a warm pool member (LABEL_WARM: counted by doctor, swept like any run container); it is
    the only difference between a warm and a cold spec. `tool_for` (a run id) makes it a tool sandbox of
    that run: the wrapper's tool-server mode and LABEL_TOOL_FOR are the only differences from a run's.
    `preload` is the agent's entrypoint module, imported by the wrapper before its task arrives.
    `socket_wait` > 0 lets the wrapper wait that many seconds for its socket (a container started before its
    host serves the socket: host/runtime/prelaunch.py).
    `files` names the run's host-owned files area (a snapshot or the run's copy, never the caller's own
    directory): its workspace at WORKSPACE_IN_CONTAINER (read-only unless "write"), and for an agent its
    inputs (read-only) and outputs; None mounts none of them.
    `engine` is Docker's or Podman's; on Podman three things differ, each proven from inside by the live
    hardening tests: the home tmpfs' ownership is spelled `U` (Podman refuses `uid=`/`gid=`), /run and
    /var/tmp are overmounted read-only (with a read-only root Podman mounts writable, executable tmpfs
    there), and the run names `seccomp_profile` (host.engine.seccomp: Podman's default lets a process create
    user namespaces; dockerd's does not).
    """
    podman = engine is EngineKind.PODMAN
    if podman and not seccomp_profile:
        raise ValueError("a run on Podman needs its seccomp profile (host.engine.seccomp.podman_profile)")
    tmpfs_opts = "rw,noexec,nosuid,nodev"
    home_owner = "U" if podman else f"uid={SANDBOX_UID},gid={SANDBOX_GID}"
    sealed = "ro,noexec,nosuid,nodev,size=4096"
    podman_sealed = {"/run": sealed, "/var/tmp": sealed} if podman else {}
    labels = {LABEL_RUN: run_id, LABEL_OWNER: owner, LABEL_SLUG: slug[:63]}
    if warm:
        labels[LABEL_WARM] = "1"
    if tool_for:
        labels[LABEL_TOOL_FOR] = tool_for
    return {
        "image": image,
        # The whole command as entrypoint + arguments: Podman reads an empty entrypoint as "the image's".
        "entrypoint": ["/usr/bin/python3"],
        "command": list(TOOL_SERVER_ARGS if tool_for else WRAPPER_ARGS),
        "name": name,
        "labels": labels,
        "runtime": runtime,
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", *([f"seccomp={seccomp_profile}"] if podman else [])],
        "user": f"{SANDBOX_UID}:{SANDBOX_GID}",
        "init": True,
        "pids_limit": limits.pids,
        "mem_limit": limits.memory_bytes,
        "memswap_limit": limits.memory_bytes,
        "nano_cpus": int(limits.cpus * 1_000_000_000),
        "tmpfs": {
            "/tmp": f"{tmpfs_opts},size={limits.tmp_bytes},mode=1777",
            HOME_IN_CONTAINER: (f"{tmpfs_opts},size={limits.home_bytes},{home_owner},mode=0700"),
            "/dev/shm": sealed,
            "/dev/mqueue": sealed,
            **podman_sealed,
        },
        "ulimits": [
            _ulimit("nofile", limits.nofile),
            _ulimit("fsize", limits.fsize_bytes),
            _ulimit("core", 0),
            # Named so that no engine picks its own: Podman otherwise asks for 1048576, which a host
            # without CAP_SYS_RESOURCE refuses. RLIMIT_NPROC counts the uid's processes machine-wide, so
            # it stays far above the pids ceiling, which is what bounds a run.
            _ulimit("nproc", NPROC_LIMIT),
        ],
        "environment": wrapper_env(
            home=HOME_IN_CONTAINER,
            path="/usr/bin:/bin",
            pythonpath="/opt/agentnode/site",
            socket=f"{SOCKET_DIR_IN_CONTAINER}/{SOCKET_NAME}",
            import_root=import_root,
            preload="" if tool_for else preload,
            socket_wait=socket_wait,
        ),
        "mounts": [
            {
                "Target": PACK_DIR_IN_CONTAINER,
                "Source": pack_volume,
                "Type": "volume",
                "ReadOnly": True,
                "VolumeOptions": {"NoCopy": True},
            },
            {"Target": SOCKET_DIR_IN_CONTAINER, "Source": socket_dir, "Type": "bind", "ReadOnly": True},
            *_files_mounts(files),
        ],
        "working_dir": HOME_IN_CONTAINER,
        "log_config": {
            "Type": "json-file",
            "Config": {"max-size": str(limits.log_max_bytes), "max-file": "1"},
        },
        "stdin_open": False,
        "tty": False,
        "detach": True,
        "auto_remove": False,
        "privileged": False,
        # No shared-memory or message-queue filesystem: /dev/shm and /dev/mqueue would be writable places
        # outside /tmp and HOME (gVisor provides its own /dev/shm, so both are overmounted read-only).
        "ipc_mode": "none",
    }


def _files_mounts(files: FilesMounts | None) -> list[dict[str, Any]]:
    if files is None:
        return []
    mounts: list[dict[str, Any]] = []
    if files.workspace in ("read", "write"):
        mounts.append({"Target": WORKSPACE_IN_CONTAINER, "Source": f"{files.area}/workspace", "Type": "bind",
                       "ReadOnly": files.workspace != "write"})  # fmt: skip
    if files.io:
        mounts.append({"Target": INPUTS_IN_CONTAINER, "Source": f"{files.area}/inputs", "Type": "bind",
                       "ReadOnly": True})  # fmt: skip
        mounts.append({"Target": OUTPUTS_IN_CONTAINER, "Source": f"{files.area}/outputs", "Type": "bind",
                       "ReadOnly": False})  # fmt: skip
    return mounts


def _ulimit(name: str, value: int) -> dict[str, Any]:
    return {"Name": name, "Soft": value, "Hard": value}


_HOST_CONFIG_KEYS = {
    "network_mode": "NetworkMode",
    "read_only": "ReadonlyRootfs",
    "cap_drop": "CapDrop",
    "security_opt": "SecurityOpt",
    "init": "Init",
    "pids_limit": "PidsLimit",
    "mem_limit": "Memory",
    "memswap_limit": "MemorySwap",
    "nano_cpus": "NanoCpus",
    "tmpfs": "Tmpfs",
    "ulimits": "Ulimits",
    "mounts": "Mounts",
    "log_config": "LogConfig",
    "ipc_mode": "IpcMode",
    "runtime": "Runtime",
    "privileged": "Privileged",
    "auto_remove": "AutoRemove",
}
"""`container_spec` keywords that belong to the request's HostConfig, with the engine API's names."""
_CONFIG_KEYS = {
    "image": "Image",
    "entrypoint": "Entrypoint",
    "command": "Cmd",
    "labels": "Labels",
    "user": "User",
    "working_dir": "WorkingDir",
    "tty": "Tty",
    "stdin_open": "OpenStdin",
}
"""`container_spec` keywords that are the container's own config, with the engine API's names."""


_FALSE_IS_DEFAULT = frozenset({"privileged", "auto_remove", "read_only"})


def create_body(spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The container's name and the `POST /containers/create` body of a `container_spec` (pure): the
    request the docker SDK's `containers.create` sends for the same keywords (a unit test holds the two
    equal). A keyword with no mapping here is refused, so no hardening decision is ever dropped silently."""
    unknown = set(spec) - set(_HOST_CONFIG_KEYS) - set(_CONFIG_KEYS) - {"name", "environment", "detach"}
    if unknown:
        raise ValueError(f"container_spec keywords with no engine mapping: {sorted(unknown)}")
    host_config = {
        api: spec[key]
        for key, api in _HOST_CONFIG_KEYS.items()
        # as the SDK does, false flags are left out: the engine's default is the same
        if key in spec and spec[key] is not None and not (spec[key] is False and key in _FALSE_IS_DEFAULT)
    }
    body: dict[str, Any] = {api: spec[key] for key, api in _CONFIG_KEYS.items() if key in spec}
    detached = bool(spec.get("detach"))
    body.update(
        {
            "Env": [f"{k}={v}" for k, v in (spec.get("environment") or {}).items()],
            "AttachStdin": False,
            "AttachStdout": not detached,
            "AttachStderr": not detached,
            "StdinOnce": False,
            "NetworkDisabled": False,
            "HostConfig": host_config,
        }
    )
    return str(spec["name"]), body


__all__ = [
    "container_spec",
    "create_body",
]
