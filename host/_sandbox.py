"""One launched sandbox: run directory, socket server, container, exit watcher and log drain; used once."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import grpc

from host._engine import (
    LABEL_WARM,
    SANDBOX_GID,
    SANDBOX_UID,
    ContainerLimits,
    MemoryProbe,
    PidsProbe,
    classify_engine_exception,
    container_spec,
    remove_and_verify,
)
from host._errors import AuditReason, EngineError
from host._rundir import RunDir, make_run_dir
from host._session import RunSession, build_run_server

logger = logging.getLogger("agentnode.sandbox.sandbox")

LOG_CAP_BYTES = 64 * 1024
"""How much of an agent's stdout/stderr the host keeps; the rest is read and dropped."""


class CappedSink:
    """Keeps the first `cap` bytes of a stream and drops the rest, so a flooding agent costs no memory."""

    def __init__(self, cap: int = LOG_CAP_BYTES) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.cap - self.size
        if room > 0:
            self.parts.append(chunk[:room])
            self.size += min(room, len(chunk))
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        out = b"".join(self.parts).decode("utf-8", "replace")
        if self.dropped:
            out += f"\n[agentnode: {self.dropped} more bytes of output dropped]"
        return out


def drain(chunks: Iterable[bytes], sink: CappedSink) -> None:
    """Read a stream to its end into a capped sink; a broken stream just ends the drain."""
    with contextlib.suppress(Exception):
        for chunk in chunks:
            sink.feed(chunk)


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a sandbox needs that does not depend on the task: pools launch from this alone."""

    slug: str
    artifact_hash: str
    runtime: str
    pin: str
    image_id: str
    volume: str
    import_root: str
    limits: ContainerLimits

    @property
    def pool_key(self) -> tuple[str, str, str, str]:
        """What a warm member is interchangeable by: the pack version, the runtime and the image pin."""
        return pool_key(self.slug, self.artifact_hash, self.runtime, self.pin)


def pool_key(slug: str, artifact_hash: str, runtime: str, pin: str) -> tuple[str, str, str, str]:
    return (slug, artifact_hash, runtime, pin)


@dataclass
class Sandbox:
    """A started container wired to its own socket; it serves exactly one run and is then destroyed."""

    run_id: str
    name: str
    spec: SandboxSpec
    session: RunSession
    rundir: RunDir
    server: grpc.Server
    client: docker.DockerClient
    container_id: str | None = None
    launched_at: float = field(default_factory=time.monotonic)
    sink: CappedSink = field(default_factory=CappedSink)
    exit_info: dict[str, Any] = field(default_factory=dict)
    probes: list[PidsProbe] = field(default_factory=list)
    memory: list[MemoryProbe] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    _destroyed: bool = False
    _drainer: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def launch(
        cls,
        client: docker.DockerClient,
        spec: SandboxSpec,
        *,
        run_id: str,
        owner: str,
        env: Any,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
    ) -> Sandbox:
        """Create the run dir and socket server, then create and start the container.

        A cold run passes a session that already holds its task, so the wrapper's first FetchTask is
        answered as soon as the host gets to it. Without one the sandbox is a warm member: its wrapper
        waits in FetchTask until `session.assign`. Either way the wrapper's wait has no deadline of its own
        (the host's deadline and idle limit bound it). Anything that fails is torn down before
        the error (START_FAILED or a classified engine error) rises.
        """
        t0 = time.monotonic()
        warm = session is None
        session = session or RunSession()
        rundir = make_run_dir(run_id, owner, env)
        if run_info is not None:  # before anything starts, so a host crash from here on is audited
            rundir.record_run(run_info)
        try:
            server = build_run_server(session, str(rundir.socket_path))
        except Exception:
            rundir.remove()
            raise
        box = cls(
            run_id=run_id,
            name=f"agentnode-run-{run_id[:20]}",
            spec=spec,
            session=session,
            rundir=rundir,
            server=server,
            client=client,
            launched_at=t0,
        )
        try:
            server.start()
            rundir.grant(SANDBOX_UID, SANDBOX_GID)
            box._mark("socket_ready", t0)
            kwargs = container_spec(
                image=spec.image_id,
                run_id=run_id,
                name=box.name,
                owner=owner,
                slug=spec.slug,
                runtime=spec.runtime,
                pack_volume=spec.volume,
                import_root=spec.import_root,
                socket_dir=str(rundir.path),
                limits=spec.limits,
            )
            if warm:
                kwargs["labels"][LABEL_WARM] = "1"  # counted by doctor; swept like any run container
            try:
                container = client.containers.create(**kwargs)
                box.container_id = container.id
                box._mark("created", t0)
                container.start()
                box._mark("started", t0)
            except docker.errors.APIError as exc:
                raise EngineError(
                    f"the sandbox container could not be started ({exc.status_code})",
                    reason=AuditReason.START_FAILED,
                    hint="check with: agentnode-sandbox doctor",
                    check="start",
                ) from None
            except docker.errors.DockerException as exc:
                raise classify_engine_exception(exc) from None
        except BaseException:
            box.destroy()
            raise
        threading.Thread(target=box._watch_exit, daemon=True, name=f"exit-{box.name}").start()
        box._drainer = threading.Thread(target=box._drain_logs, daemon=True, name=f"logs-{box.name}")
        box._drainer.start()
        return box

    def _mark(self, stage: str, t0: float) -> None:
        self.stages[stage] = round((time.monotonic() - t0) * 1000, 2)

    def _watch_exit(self) -> None:
        cid = self.container_id
        with contextlib.suppress(Exception):
            pid = int(self.client.api.inspect_container(cid)["State"]["Pid"])
            self.memory.append(MemoryProbe(pid))
            self.probes.append(PidsProbe(pid))
        with contextlib.suppress(Exception):
            self.exit_info.update(self.client.api.wait(cid))
        self.exit_info.setdefault("StatusCode", -1)
        self.session.reported.set()

    def _drain_logs(self) -> None:
        with contextlib.suppress(Exception):
            drain(
                self.client.api.logs(self.container_id, stream=True, follow=True, stdout=True, stderr=True),
                self.sink,
            )

    @property
    def ready(self) -> bool:
        """The wrapper is connected and waiting for its task."""
        return self.session.inflight > 0 and not self.exited

    @property
    def exited(self) -> bool:
        return bool(self.exit_info)

    def settle_logs(self, timeout: float) -> None:
        """Give the log drain a moment to reach the end: the wrapper exits right after it reports."""
        if self._drainer is not None:
            self._drainer.join(timeout)

    def poll(self) -> None:
        """Read the host-side cgroup counters (pids and memory): small file reads, every 50 ms of a run."""
        for memory in self.memory:
            memory.poll()
        for pids in self.probes:
            pids.poll()

    def pids_hits(self) -> int:
        """How often the pids limit refused a process or thread, as of now."""
        self.poll()
        return max((p.hits for p in self.probes), default=0)

    def oom_killed(self) -> bool:
        """The engine says so, or (where it cannot tell, as under gVisor) the memory cgroup does."""
        self.poll()
        if any(m.oom_kills for m in self.memory):
            return True
        if self.exit_info.get("StatusCode") == 137 and any(m.hit_the_limit for m in self.memory):
            return True
        with contextlib.suppress(Exception):
            return bool(self.client.api.inspect_container(self.container_id)["State"].get("OOMKilled"))
        return False

    def destroy(self) -> None:
        """Kill and remove the container (verified by id and name), stop the server, remove the run dir."""
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
        self.session.cancel()
        try:
            self.server.stop(grace=None)
            if self.container_id is not None:
                remove_and_verify(self.client, self.container_id, self.name)
            else:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    remove_and_verify(self.client, self.name, self.name)
        finally:
            self.rundir.remove()


__all__ = ["LOG_CAP_BYTES", "CappedSink", "Sandbox", "SandboxSpec", "drain", "pool_key"]
