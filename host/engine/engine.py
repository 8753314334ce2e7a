"""Engine access on the run path: classified failures, the hardened spec as data, teardown."""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import errno
import http.client
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host.core.errors import AuditReason, EngineError, EngineImageNotFound, EngineNotFound, EngineRejected
from host.core.owner import owner_alive
from host.core.vocab import Runtime
from host.engine.contract import (
    HOME_IN_CONTAINER,
    NPROC_LIMIT,
    PACK_DIR_IN_CONTAINER,
    SANDBOX_GID,
    SANDBOX_UID,
    SOCKET_DIR_IN_CONTAINER,
    SOCKET_NAME,
    ContainerLimits,
)
from host.engine.http import DEFAULT_HOST as DEFAULT_DOCKER_HOST
from host.engine.http import IDLE_CONNECTIONS, EngineApiError, EngineClient, LogStream, UnsupportedEngineHost
from host.engine.wrapper_env import TOOL_SERVER_ARGS, WRAPPER_ARGS, wrapper_env

logger = logging.getLogger("agentnode.sandbox.engine")

LABEL_RUN = "io.agentnode.sandbox.run-id"
LABEL_OWNER = "io.agentnode.sandbox.owner"
LABEL_SLUG = "io.agentnode.sandbox.slug"
LABEL_PROTOCOL = "io.agentnode.sandbox.protocol"
LABEL_ARTIFACT = "io.agentnode.sandbox.artifact-hash"
LABEL_WARM = "io.agentnode.sandbox.warm"
LABEL_TOOL_FOR = "io.agentnode.sandbox.tool-for"
"""On a tool sandbox: the id of the run whose tool calls it serves (its own id is LABEL_RUN)."""

ENGINE_POOL_SIZE = 128
ENGINE_SHARED_POOL_SIZE = IDLE_CONNECTIONS
"""Idle connections the docker SDK's one Unix-socket pool keeps (host/engine/sdk.py): as many as the host's
own client keeps (`IDLE_CONNECTIONS` says why)."""
ENGINE_FAILURES: tuple[type[Exception], ...] = (EngineApiError, OSError, http.client.HTTPException)
"""What an engine call of `EngineClient` raises when the engine fails or refuses: classified by
`engine_errors` (which also classifies the docker SDK's failures, where the SDK is in use)."""

_FIX_ENGINE = (
    "start the engine (as root on Debian: scripts/provision-engine), or point DOCKER_HOST at a "
    "Docker-compatible socket (Podman: unix:///run/podman/podman.sock); check with: agentnode-sandbox doctor"
)


class EngineKind(enum.StrEnum):
    """Which engine answers the Docker-compatible API: the few places they differ read this."""

    DOCKER = "docker"
    PODMAN = "podman"


ENGINE_ARCH_NAMES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
"""The engine's architecture in the kernel's (and wheels') terms: dockerd reports `uname -m` (x86_64),
Podman reports Go's names (amd64)."""


@dataclass(frozen=True)
class EngineFacts:
    """What the engine is and can do, normalized once from either engine's answers (`facts_from`): the
    image recipe, the wheel platform tags, the container spec and doctor read these, never raw answers."""

    server_version: str
    runtimes: frozenset[str]
    """The runtimes a container can actually get. Podman's compatible API runs every container under its
    default runtime whatever the request names (containers/podman#28429), so there it is that one alone."""
    memory_limit: bool
    swap_limit: bool
    kind: EngineKind = EngineKind.DOCKER
    architecture: str = ""
    """`uname -m` terms (x86_64, aarch64), whatever the engine reported; unknown names pass unchanged."""
    os: str = ""
    cgroup_version: str = ""
    """"1" or "2" ("" when the engine does not say)."""
    default_runtime: str = ""
    pids_limit: bool = True
    rootless: bool = False
    security_options: frozenset[str] = frozenset()
    """The names of the engine's security options: seccomp, apparmor, selinux, rootless, userns, cgroupns."""
    seccomp_profile_path: str = ""
    """Podman: the default seccomp profile it applies (host.engine.seccomp derives a run's from it)."""


def engine_kind(ping_headers: Mapping[str, str]) -> EngineKind:
    """Which engine answered `GET /_ping` with these headers: Podman adds its own API's version (pure).

    /_ping is the engine's cheapest request; /version, which also names Podman (in `Components`), has the
    engine ask its runtimes and helpers for their versions first: ~15 ms on dockerd, ~0.6 s on Podman 4.3.
    """
    return EngineKind.PODMAN if _header(ping_headers, "Libpod-Api-Version") else EngineKind.DOCKER


def _header(headers: Mapping[str, str], name: str) -> str:
    """One HTTP header's value, whatever the case of its name ("" when absent)."""
    wanted = name.lower()
    return next((str(v) for k, v in headers.items() if k.lower() == wanted), "")


def facts_from(
    info: Mapping[str, Any], kind: EngineKind, libpod: Mapping[str, Any] | None = None
) -> EngineFacts:
    """Normalize a `GET /info` answer of dockerd or Podman (`kind`: engine_kind) into EngineFacts (pure).

    Podman's compatible /info claims memory, swap and pids limits and no rootless mode even where a
    rootless service can enforce none (cgroup v1: it ignores every limit, with a warning in its own log):
    for Podman its own /libpod/info (`libpod`) decides rootless mode and which cgroup controllers the
    service may use, so such a host is refused instead of running agents without ceilings.
    """
    reported = str(info.get("Architecture", ""))
    options = frozenset(
        part.removeprefix("name=")
        for option in info.get("SecurityOptions") or []
        for part in str(option).split(",")[:1]
    )
    default_runtime = str(info.get("DefaultRuntime", ""))
    listed = frozenset((info.get("Runtimes") or {}).keys())
    runtimes = frozenset({default_runtime} & listed) if kind is EngineKind.PODMAN else listed
    memory, swap = bool(info.get("MemoryLimit", False)), bool(info.get("SwapLimit", False))
    pids, rootless, profile = bool(info.get("PidsLimit", True)), "rootless" in options, ""
    if kind is EngineKind.PODMAN:
        host = (libpod or {}).get("host") or {}
        security = host.get("security") or {}
        rootless = bool(security.get("rootless", rootless))
        profile = str(security.get("seccompProfilePath") or "")
        controllers = set(host.get("cgroupControllers") or [])
        memory, swap = memory and "memory" in controllers, swap and "memory" in controllers
        pids = pids and "pids" in controllers
        options |= {"rootless"} if rootless else set()
    return EngineFacts(
        server_version=str(info.get("ServerVersion", "")),
        runtimes=runtimes,
        memory_limit=memory,
        swap_limit=swap,
        kind=kind,
        architecture=ENGINE_ARCH_NAMES.get(reported.lower(), reported),
        os=str(info.get("OSType", "")),
        cgroup_version=str(info.get("CgroupVersion", "")),
        default_runtime=default_runtime,
        pids_limit=pids,
        rootless=rootless,
        security_options=options,
        seccomp_profile_path=profile,
    )


def open_engine(env: Mapping[str, str] | None = None, *, timeout: float = 60) -> EngineClient:
    """The host's client of the engine named by DOCKER_HOST (or the default socket), proven to answer and
    speaking the API version the engine names (as `docker` itself negotiates it)."""
    environment = dict(os.environ if env is None else env)
    docker_host = environment.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    try:
        client = EngineClient(docker_host, timeout=timeout, env=environment)
    except UnsupportedEngineHost:
        raise EngineError(
            f"DOCKER_HOST {docker_host[:64]!r} is not an engine address this host speaks",
            hint="point DOCKER_HOST at the engine's socket (unix://...) or a tcp:// address; an ssh:// "
            "engine can be reached through a forwarded socket (ssh -L /tmp/docker.sock:/var/run/docker.sock)",
            check="engine",
        ) from None
    try:
        with engine_errors():
            client.negotiate()
    except BaseException:
        client.close()
        raise
    return client


def _reach_unix_socket(docker_host: str, timeout: float) -> None:
    """Raise the OSError a connect to a `unix://` engine socket meets (other schemes: nothing to do)."""
    if docker_host.startswith("unix://"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(timeout)
            probe.connect(docker_host.removeprefix("unix://"))


def _diagnosis(exc: BaseException) -> tuple[str, AuditReason, str]:
    """Message, reason and hint of an engine failure, from its exception chain (never from its text)."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for item in chain:
        if isinstance(item, PermissionError) or (
            isinstance(item, OSError) and item.errno in (errno.EACCES, errno.EPERM)
        ):
            return (
                "not permitted to use the container engine socket",
                AuditReason.ENGINE_PERMISSION_DENIED,
                "run as a user allowed to use the engine (root, or the docker group), "
                "or set DOCKER_HOST to a socket you may use; check with: agentnode-sandbox doctor",
            )
    # The SDK wraps a refused version probe (`from_env`) in a plain DockerException: look down the chain.
    if any((_answer(item) or (0, "", False))[0] in (401, 403) for item in chain):
        return (
            "the container engine refused the request",
            AuditReason.ENGINE_PERMISSION_DENIED,
            "check the engine's authorization plugins; check with: agentnode-sandbox doctor",
        )
    return "no container engine answers", AuditReason.ENGINE_UNAVAILABLE, _FIX_ENGINE


def _sdk_errors() -> Any:
    """The docker SDK's error module where the SDK is in use (a run never imports it), else None."""
    return sys.modules.get("docker.errors")


def _answer(exc: BaseException) -> tuple[int, str, bool] | None:
    """(status, the engine's explanation, whether the 404 names an image) of an answer with an error
    status, from our client (EngineApiError) or the SDK (APIError); None for any other failure."""
    if isinstance(exc, EngineApiError):
        return exc.status, exc.explanation, exc.image_missing
    sdk = _sdk_errors()
    if sdk is not None and isinstance(exc, sdk.APIError):
        status = int(exc.status_code) if exc.status_code is not None else 0
        return status, str(exc.explanation or "").strip(), isinstance(exc, sdk.ImageNotFound)
    return None


def container_vanished(exc: BaseException) -> bool:
    """The engine's answer says the container does not exist: Docker's and Podman's 404, or the 500 Podman
    gives once for a container removed while it is asked ("... does not exist in database: no such
    container"), which is the same fact and must not read as a failing engine."""
    answer = _answer(exc)
    if answer is None:
        return False
    status, explanation, _ = answer
    return status == 404 or (status == 500 and explanation.rstrip().endswith("no such container"))


def classify_engine_exception(exc: BaseException) -> EngineError:
    """The one classification of engine failures: a client, SDK or connection exception in, its
    EngineError out.

    The reason (permission denied or unavailable) and the way out are fixed; the exception's text is never
    copied. An answer with an error status comes back as EngineRejected carrying the status, as
    EngineNotFound for a 404 and as EngineImageNotFound when the 404 names an image, so a caller can tell
    "absent" from "failing"; uncaught, each reads like any other engine failure.
    """
    message, reason, hint = _diagnosis(exc)
    answer = _answer(exc)
    if answer is None:
        return EngineError(message, reason=reason, hint=hint, check="engine")
    status, explanation, image_missing = answer
    kind = (
        EngineImageNotFound
        if image_missing
        else EngineNotFound
        if container_vanished(exc)
        else EngineRejected
    )
    return kind(message, status=status or None, explanation=explanation, reason=reason, hint=hint)


def _engine_failure(exc: BaseException) -> bool:
    if isinstance(exc, ENGINE_FAILURES):
        return True
    sdk = _sdk_errors()
    urllib3_errors = sys.modules.get("urllib3.exceptions")
    return (sdk is not None and isinstance(exc, sdk.DockerException)) or (
        # a streamed SDK answer (pull, build) cut off mid-read
        urllib3_errors is not None and isinstance(exc, urllib3_errors.HTTPError)
    )


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """The engine boundary: an engine client, SDK or connection failure raised in the block leaves it as
    its classified EngineError, without the chain. The host's own errors pass unchanged, and so does any
    other exception: that is a bug, not an engine failure."""
    try:
        yield
    except Exception as exc:
        if not _engine_failure(exc):
            raise
        raise classify_engine_exception(exc) from None


def engine_facts(client: EngineClient) -> EngineFacts:
    """Read what the engine is and supports; an unreachable engine is classified, never raised raw."""
    with engine_errors():
        kind = engine_kind(client.ping())
        if kind is EngineKind.DOCKER:
            return facts_from(client.info(), kind)
        # Podman takes ~0.4 s over each of its two answers (4.3, rootful): ask for both at once.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="libpod-info") as other:
            libpod = other.submit(client.libpod, "/info")
            info: dict[str, Any] = client.info()
            return facts_from(info, kind, libpod.result())


def _runtime_hint(facts: EngineFacts, runtime: str) -> str:
    """How to make `runtime` available on this engine (the refusal's way out)."""
    if facts.kind is EngineKind.PODMAN:
        default = facts.default_runtime or "its default"
        if runtime == Runtime.RUNSC:
            return (
                "gVisor (runsc) needs Docker here: its run socket needs the runtime argument "
                "--host-uds=open, which Podman cannot pass; use Docker for runsc, or set "
                f"agent_sandbox.runtime to {default}"
            )
        return (
            f"Podman runs every container under its default runtime ({default}): set "
            f'agent_sandbox.runtime to {default}, or set [engine] runtime = "{runtime}" in '
            "containers.conf and restart the Podman service"
        )
    if runtime == Runtime.RUNSC:
        return (
            "install gVisor (apt-get install runsc) and register it in /etc/docker/daemon.json with "
            'runtimeArgs ["--network=none", "--host-uds=open"] (scripts/provision-engine does both), '
            "or set agent_sandbox.runtime to runc; check with: docker info --format '{{.Runtimes}}'"
        )
    return f"use a Docker-compatible engine with the {runtime} runtime registered; check with: docker info"


def require_capable(facts: EngineFacts, runtime: str) -> None:
    """Fail closed unless the engine can run `runtime` and enforce the memory+swap and pids ceilings."""
    if runtime not in tuple(Runtime):
        raise EngineError(
            f"unknown runtime {runtime!r}",
            reason=AuditReason.CONFIG_INVALID,
            hint=f"set agent_sandbox.runtime to {' or '.join(Runtime)}",
            check="runtime",
        )
    if runtime not in facts.runtimes:
        where = "" if facts.kind is EngineKind.DOCKER else f" ({facts.kind} {facts.server_version})"
        raise EngineError(
            f"the engine{where} has no {runtime!r} runtime registered",
            reason=AuditReason.RUNTIME_NOT_REGISTERED,
            hint=_runtime_hint(facts, runtime),
            check="runtime",
        )
    if not (facts.memory_limit and facts.swap_limit and facts.pids_limit):
        rootless = (
            "rootless Podman needs cgroup v2 with the memory and pids controllers delegated to the user "
            "(with systemd: Delegate=memory pids cpu in user@.service; on cgroup v1 it enforces no limit); "
            if facts.rootless
            else ""
        )
        check = (
            "podman info --format '{{.Host.CgroupsVersion}} {{.Host.CgroupControllers}}'"
            if facts.kind is EngineKind.PODMAN
            else "docker info --format '{{.MemoryLimit}} {{.SwapLimit}} {{.PidsLimit}}'"
        )
        raise EngineError(
            "the engine cannot enforce the memory or process ceiling "
            "(memory, swap or pids accounting is off)",
            reason=AuditReason.MEMORY_LIMIT_UNSUPPORTED,
            hint=(
                f"{rootless}enable the memory and pids cgroup controllers and swap accounting (cgroup v2, or "
                f"the kernel arguments cgroup_enable=memory swapaccount=1) and restart the engine; check "
                f"with: {check}"
            ),
            check="memory_limit",
        )


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
) -> dict[str, Any]:
    """The `containers.create` keyword arguments of one run (the docker SDK's names, which `create_body`
    turns into the engine's request): every hardening decision, as plain data.

    `warm` marks a warm pool member (LABEL_WARM: counted by doctor, swept like any run container); it is
    the only difference between a warm and a cold spec. `tool_for` (a run id) makes it a tool sandbox of
    that run: the wrapper's tool-server mode and LABEL_TOOL_FOR are the only differences from a run's.
    `preload` is the agent's entrypoint module, imported by the wrapper before its task arrives.
    `socket_wait` > 0 lets the wrapper wait that many seconds for its socket (a container started before its
    host serves the socket: host/runtime/prelaunch.py).
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


def create_container(client: EngineClient, spec: Mapping[str, Any]) -> str:
    """Create a container from its spec (`container_spec`) and return its id: one engine round trip."""
    name, body = create_body(spec)
    return client.create_container(body, name)


def container_runtime(client: EngineClient, container_id: str, kind: EngineKind) -> str:
    """The runtime a created container will run under, as its engine records it. Podman's compatible
    inspect says only "oci" there, so Podman is asked through its own (libpod) inspect."""
    with engine_errors():
        if kind is EngineKind.PODMAN:
            return str(client.libpod(f"/containers/{container_id}/json").get("OCIRuntime", ""))[:64]
        inspected = client.inspect_container(container_id)
        return str((inspected.get("HostConfig") or {}).get("Runtime", ""))[:64]


def verify_runtime(client: EngineClient, container_id: str, runtime: str, kind: EngineKind) -> None:
    """Refuse a created container whose runtime is not the one asked for, before it starts.

    dockerd runs what the request names, or refuses it, so nothing is asked there. Podman's compatible API
    ignores the name and uses its default runtime (containers/podman#28429); `EngineFacts.runtimes` admits
    only that one there, and this check (one inspect) closes the window where the default changes while
    the host lives.
    """
    if kind is not EngineKind.PODMAN:
        return
    used = container_runtime(client, container_id, kind)
    if used != runtime:
        raise EngineError(
            f"the engine created the sandbox under the {used!r} runtime, not the {runtime!r} asked for",
            reason=AuditReason.RUNTIME_NOT_REGISTERED,
            hint=f'Podman\'s default runtime changed: set [engine] runtime = "{runtime}" in '
            "containers.conf and restart the Podman service, or set agent_sandbox.runtime; "
            "check with: agentnode-sandbox doctor",
            check="runtime",
        )


def follow_logs(client: EngineClient, container_id: str) -> LogStream:
    """The container's stdout and stderr from the start, followed until it exits (ours have no TTY:
    `container_spec` sets none, so the engine frames the two streams)."""
    return client.logs(container_id)


def read_logs(client: EngineClient, container_id: str) -> LogStream:
    """What the engine holds of the container's stdout and stderr now, not followed."""
    return client.logs(container_id, follow=False)


def remove_and_verify(
    client: EngineClient, container_id: str, name: str, *, timeout: float = 30.0
) -> None:
    """Kill and remove a container, then prove it is gone; raise if it is not. Only `container_id` is
    checked: known by its id, a container made later under its name is not ours; known only by name (its
    create never answered), the name is both. `name` is what the operator is told to remove by hand."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with engine_errors():
                client.remove_container(container_id, force=True)
        except EngineNotFound:
            pass
        except EngineRejected as exc:
            # "removal already in progress" (409) is fine; anything else is retried until the deadline.
            logger.debug("remove %s: engine answered %s", container_id[:12], exc.status)
        if not _exists(client, container_id):
            return
        if time.monotonic() > deadline:
            raise EngineError(
                f"container {name} could not be removed",
                reason=AuditReason.HOST_LOOP_ERROR,
                hint=f"remove it by hand: docker rm -f {name}",
                check="engine",
            )
        time.sleep(0.05)


def _exists(client: EngineClient, ref: str) -> bool:
    try:
        with engine_errors():
            client.inspect_container(ref)
    except EngineNotFound:
        return False
    return True


def sweep_containers(client: EngineClient) -> list[str]:
    """Remove run containers whose owning host process is gone; nothing without our labels is touched."""
    removed: list[str] = []
    with engine_errors():
        found = client.containers(labels=[LABEL_RUN, LABEL_OWNER])
    for c in found:
        labels = c.get("Labels") or {}
        owner = labels.get(LABEL_OWNER, "")
        if not owner or owner_alive(owner):
            continue
        name = (c.get("Names") or [""])[0].lstrip("/")
        try:
            remove_and_verify(client, c["Id"], name or c["Id"])
            removed.append(name or c["Id"][:12])
        except EngineError:
            logger.warning("sweep could not remove %s", name or c["Id"][:12])
    return removed


__all__ = [
    "DEFAULT_DOCKER_HOST",
    "ENGINE_FAILURES",
    "EngineFacts",
    "EngineKind",
    "MemoryProbe",
    "PidsProbe",
    "classify_engine_exception",
    "container_cgroup_dir",
    "container_runtime",
    "container_spec",
    "container_vanished",
    "create_body",
    "create_container",
    "engine_errors",
    "engine_facts",
    "engine_kind",
    "facts_from",
    "follow_logs",
    "open_engine",
    "read_logs",
    "remove_and_verify",
    "require_capable",
    "sweep_containers",
    "verify_runtime",
]
