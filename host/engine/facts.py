"""What the engine is and can do (EngineFacts), read once from either engine's answers, and the refusal of an
engine that cannot run or bound a sandbox."""

from __future__ import annotations

import concurrent.futures
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from host.core.errors import AuditReason, EngineError
from host.core.vocab import Runtime
from host.engine.errors import engine_errors
from host.engine.http import EngineClient


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


__all__ = [
    "ENGINE_ARCH_NAMES",
    "EngineFacts",
    "EngineKind",
    "engine_facts",
    "engine_kind",
    "facts_from",
    "require_capable",
]
