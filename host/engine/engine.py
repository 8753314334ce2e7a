"""Engine access on the run path: the host's client of the engine, a container's create, runtime check,
logs and proven removal, and the sweep of containers whose host is gone."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from host.core.errors import AuditReason, EngineError, EngineNotFound, EngineRejected
from host.core.owner import owner_alive
from host.engine.errors import engine_errors
from host.engine.facts import EngineKind
from host.engine.http import DEFAULT_HOST as DEFAULT_DOCKER_HOST
from host.engine.http import IDLE_CONNECTIONS, EngineClient, LogStream, UnsupportedEngineHost
from host.engine.labels import LABEL_OWNER, LABEL_RUN
from host.engine.spec import create_body

logger = logging.getLogger("agentnode.sandbox.engine")

ENGINE_POOL_SIZE = 128
ENGINE_SHARED_POOL_SIZE = IDLE_CONNECTIONS
"""Idle connections the docker SDK's one Unix-socket pool keeps (host/engine/sdk.py): as many as the host's
own client keeps (`IDLE_CONNECTIONS` says why)."""


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
    "ENGINE_POOL_SIZE",
    "ENGINE_SHARED_POOL_SIZE",
    "container_runtime",
    "create_container",
    "follow_logs",
    "open_engine",
    "read_logs",
    "remove_and_verify",
    "sweep_containers",
    "verify_runtime",
]
