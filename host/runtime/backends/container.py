"""The Docker backend: a run's workload is a hardened container; engine client, spec checks, volumes."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

from host.core.errors import AuditReason, EngineError, EngineNotFound, EngineRejected, SandboxError
from host.egress.proxy import EgressRoute
from host.engine.contract import SANDBOX_GID, SANDBOX_UID, ContainerLimits, FilesMounts
from host.engine.engine import follow_logs, read_logs, remove_and_verify
from host.engine.errors import engine_errors
from host.engine.facts import EngineFacts, EngineKind, engine_facts
from host.engine.http import EngineClient
from host.engine.launch import (
    SandboxSpec,
    container_name,
    podman_seccomp_profile,
    pool_key,
    sandbox_keywords,
    sandbox_spec,
    start_container,
)
from host.engine.pin import verify_pinned_image
from host.engine.probes import MemoryProbe, PidsProbe
from host.files.area import FilesArea, area_of
from host.policy.admission import Admission
from host.policy.filesystem import FilesystemRefused, filesystem_grant
from host.runtime.pool import PoolSettings, WarmPools
from host.runtime.rundir import run_dir_of
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession
from host.runtime.workload import SocketServer, Workload
from host.spec.files import FilesConfig
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.model import AgentManifest
from host.tools.link import ToolLink

if TYPE_CHECKING:
    from host.runtime.prelaunch import Prelaunched

logger = logging.getLogger("agentnode.sandbox.sandbox")

_ENGINE_FACTS_TTL = 30.0
_IMAGE_TTL = 30.0
"""How long a verified image pin is trusted without asking the engine again. The image is content-addressed
by its id, so only its presence can change: a create that finds it gone refuses with IMAGE_MISSING too."""


@dataclass(kw_only=True)
class Sandbox(Workload):
    """A started container wired to its own socket; it serves exactly one run and is then destroyed."""

    spec: SandboxSpec
    client: EngineClient
    container_id: str | None = None
    probes: list[PidsProbe] = field(default_factory=list)
    memory: list[MemoryProbe] = field(default_factory=list)
    reads_output: ClassVar[bool] = True

    @property
    def logs_lag(self) -> bool:
        """Podman's log follow passes a container's output on hundreds of milliseconds late (conmon writes a
        log file that the API server tails); Docker's streams it from the container's own pipes."""
        return self.spec.engine is EngineKind.PODMAN

    @classmethod
    def launch(
        cls,
        client: EngineClient,
        spec: SandboxSpec,
        *,
        run_id: str,
        owner: str,
        env: Any,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
        serve: Callable[[str], SocketServer] | None = None,
        tool_for: str = "",
        egress: EgressRoute | None = None,
        files: FilesMounts | None = None,
    ) -> Self:
        """Create the run dir and socket server, then create and start the container.

        A cold run passes a session that already holds its task, so the wrapper's first FetchTask is
        answered as soon as the host gets to it. Without one the sandbox is a warm member: its wrapper
        waits in FetchTask until `session.assign`. Either way the wrapper's wait has no deadline of its own
        (the host's deadline and idle limit bound it). Anything that fails is torn down before
        the error (START_FAILED or a classified engine error) rises. A tool sandbox (`tool_for`: the run
        it serves) has `serve` build its socket's server and runs the wrapper's tool-server mode; its
        `egress` is its own pack's (an agent's is its session's). The egress socket is served before the
        container starts, so the wrapper finds it when it looks. `files` mounts parts of the run's files
        area (made and filled by the caller: host/files/run.py) into it.
        """
        t0 = time.monotonic()
        warm = session is None and not tool_for
        session = session or RunSession()
        rundir, server = cls.open_socket(run_id, owner, env, session, run_info, serve=serve)
        box = cls(
            run_id=run_id,
            name=container_name(run_id, tool_for=tool_for),
            spec=spec,
            session=session,
            rundir=rundir,
            server=server,
            client=client,
            launched_at=t0,
        )
        try:
            box.open_egress(egress or session.egress, SANDBOX_UID, SANDBOX_GID)
            server.start()
            rundir.grant(SANDBOX_UID, SANDBOX_GID)
            box.mark("socket_ready")
            keywords = sandbox_keywords(
                spec, run_id=run_id, name=box.name, owner=owner, socket_dir=str(rundir.path), warm=warm,
                tool_for=tool_for, files=files,
            )  # fmt: skip
            box.container_id = start_container(
                client, spec, keywords, mark=box.mark, created=lambda cid: setattr(box, "container_id", cid)
            )
        except BaseException:
            box.destroy()
            raise
        return box._watched()

    @classmethod
    def adopt(
        cls,
        early: Prelaunched,
        *,
        client: EngineClient,
        session: RunSession,
        run_info: Mapping[str, object] | None = None,
    ) -> Self:
        """Serve the socket of a container already started (host/runtime/prelaunch.py), whose wrapper is
        waiting for it: the crash record first, then the server, then the socket handed to the container's
        user. A failure tears the container down before the error rises. `client` (the host's) serves it from
        here: the prelaunch's own is closed."""
        early.adopted = True
        early.client.close()
        rundir = early.rundir
        if run_info is not None:
            rundir.record_run(run_info)
        box = cls(
            run_id=early.run_id,
            name=early.name,
            spec=early.spec,
            session=session,
            rundir=rundir,
            server=None,
            client=client,
            launched_at=early.launched_at,
            container_id=early.container_id,
            stages=dict(early.stages),
        )
        try:
            box.open_egress(session.egress, SANDBOX_UID, SANDBOX_GID)  # before the wrapper can get its task
            box.server = build_run_server(session, str(rundir.socket_path))
            box.server.start()
            rundir.grant(SANDBOX_UID, SANDBOX_GID)
            box.mark("socket_ready")
        except BaseException:
            box.destroy()
            raise
        return box._watched()

    def _watched(self) -> Self:
        """Its exit watched and its output drained, each on a thread of its own: a started sandbox."""
        threading.Thread(target=self._watch_exit, daemon=True, name=f"exit-{self.name}").start()
        # Podman's followed stream can end short of a container's last lines (podman#21914, #10596); a
        # plain read of the log then has them. Docker's has not been seen to, but the check is the same.
        self.start_drain(self._log_stream, reread=self._read_logs)
        return self

    def _watch_exit(self) -> None:
        cid = self.container_id
        with contextlib.suppress(Exception):
            memory, pids = MemoryProbe(container_id=cid or ""), PidsProbe(container_id=cid or "")
            if not (memory.found and pids.path is not None):  # not where the engine's drivers put them
                pid = int(self.client.inspect_container(cid or "")["State"]["Pid"])
                memory, pids = MemoryProbe(pid), PidsProbe(pid)
            self.memory.append(memory)
            self.probes.append(pids)
        with contextlib.suppress(Exception):
            self.exit_info.update(self.client.wait(cid or ""))
        self.exited_with(-1)

    def _log_stream(self) -> Any:
        return follow_logs(self.client, self.container_id or self.name)

    def _read_logs(self) -> Any:
        return read_logs(self.client, self.container_id or self.name)

    def poll(self) -> None:
        """Read the host-side cgroup counters (pids and memory): small file reads, every 50 ms of a run."""
        for memory in self.memory:
            memory.poll()
        for pids in self.probes:
            pids.poll()

    def pids_hits(self) -> int:
        self.poll()
        return max((p.hits for p in self.probes), default=0)

    def oom_killed(self) -> bool:
        """The engine says so, or (where it cannot tell, as under gVisor) the memory cgroup does."""
        self.poll()
        if any(m.oom_kills for m in self.memory):
            return True
        if self.exit_info.get("StatusCode") == 137 and any(m.hit_the_limit for m in self.memory):
            return True
        with contextlib.suppress(Exception):  # no verdict from the engine: the exit is named without it
            return bool(self.client.inspect_container(self.container_id or "")["State"].get("OOMKilled"))
        return False

    def _kill(self) -> None:
        """Kill and remove the container, verified by id and name."""
        if self.container_id is not None:
            remove_and_verify(self.client, self.container_id, self.name)
        else:
            with contextlib.suppress(EngineRejected):
                remove_and_verify(self.client, self.name, self.name)


@dataclass(kw_only=True)
class ToolSandbox(Sandbox):
    """A community tool pack's container: a Sandbox whose socket is served by a ToolLink, not a run."""

    @property
    def link(self) -> ToolLink:
        assert isinstance(self.server, ToolLink)
        return self.server


class DockerBackend:
    """Sandboxed runs on a Docker engine: one lazily connected client, cached engine facts, fail-closed
    spec checks, and the pack volumes a teardown may retire."""

    def __init__(
        self,
        client_factory: Callable[[], EngineClient],
        *,
        owner: str,
        env: Mapping[str, str],
        lockfile: Lockfile,
        image_pin: str | None,
        limits: ContainerLimits,
        pool: PoolSettings | None = None,
        before_member: Callable[[], None] = lambda: None,
        files: FilesConfig | None = None,
    ) -> None:
        self._client_factory = client_factory
        self.files = files or FilesConfig()
        self._client: EngineClient | None = None
        self._facts: tuple[float, EngineFacts] | None = None
        self._profile: str | None = None
        self._image: tuple[str | None, float, str] | None = None  # (pin, verified at, image id)
        self._lock = threading.Lock()
        self.owner = owner
        self.env = env
        self.lockfile = lockfile
        self.image_pin = image_pin
        self.limits = limits
        self._retired_volumes: set[str] = set()
        self._volumes_lock = threading.Lock()
        self._before_member = before_member
        self.pools = (
            WarmPools(self._launch_member, pool, is_current=self.is_current, retired=self.retire_pool)
            if pool is not None and pool.size > 0
            else None
        )

    def client(self) -> EngineClient:
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def facts(self) -> EngineFacts:
        now = time.monotonic()
        cached = self._facts
        if cached is not None and now - cached[0] < _ENGINE_FACTS_TTL:
            return cached[1]
        facts = engine_facts(self.client())
        self._facts = (now, facts)
        return facts

    def spec_for(self, entry: LockEntry, runtime: str, *, preload: str = "") -> SandboxSpec:
        """Verify everything a sandbox stands on (engine, runtime, image pin, pack volume); fail closed.
        `preload` (an agent's entrypoint module) is what its wrapper imports ahead of the task."""
        client = self.client()
        return sandbox_spec(
            client, entry, runtime, facts=self.facts(), image_id=lambda: self._verified_image(client),
            pin=self.image_pin, limits=self.limits, seccomp_profile=self._seccomp_profile, preload=preload,
        )  # fmt: skip

    def _seccomp_profile(self, facts: EngineFacts) -> str:
        """The Podman runs' seccomp profile, derived and written once per backend."""
        if self._profile is None:
            self._profile = podman_seccomp_profile(facts, self.env)
        return self._profile

    def _verified_image(self, client: EngineClient) -> str:
        """The pinned image's id, verified (present, ours, our protocol) at most _IMAGE_TTL ago."""
        now, pin = time.monotonic(), self.image_pin
        cached = self._image
        if cached is not None and cached[0] == pin and now - cached[1] < _IMAGE_TTL:
            return cached[2]
        image_id = str(verify_pinned_image(client, pin).id)
        self._image = (pin, now, image_id)
        return image_id

    def claim(self, admission: Admission) -> Sandbox | None:
        """A warm member of this run's pool (same pack version, runtime and image pin), if there is one."""
        a = admission
        if self.pools is None or not (a.entry and a.runtime and a.image):
            return None
        return self.pools.claim(pool_key(a.entry.slug, a.entry.volume_digest, a.runtime, a.image))

    def prepare(self, admission: Admission) -> SandboxSpec:
        """The verified spec of a cold run; its pool (if pools are on) starts filling for the next run."""
        assert admission.entry is not None and admission.runtime is not None
        preload = admission.manifest.entrypoint_module if admission.manifest is not None else ""
        spec = self.spec_for(admission.entry, admission.runtime, preload=preload)
        if self.pools is not None:
            self.pools.want(spec)
        return spec

    def prewarm(self, entry: LockEntry, runtime: str) -> None:
        """Start a warm pool for an installed community agent (no-op without pools, and for a sequential
        orchestration, which runs no container)."""
        if self.pools is None or entry.package_type != "agent":
            return
        manifest = entry.parsed_manifest()
        if isinstance(manifest, AgentManifest) and manifest.orchestration is None:
            self.pools.want(self.spec_for(entry, runtime, preload=manifest.entrypoint_module))

    def _launch_member(self, spec: SandboxSpec) -> Sandbox:
        self._before_member()  # e.g. the host's descriptor budget: a refill must not eat into its reserve
        run_id = uuid.uuid4().hex
        mode = self.member_workspace(spec.slug)
        if mode is None:
            return self.launch(spec, run_id=run_id)
        # A pack with a workspace level: the member mounts an empty area, filled when a run claims it.
        area = area_of(run_dir_of(run_id, self.env).path)
        FilesArea.make(area, self.files.limits, uid=SANDBOX_UID, gid=SANDBOX_GID, writable=mode == "write",
                       owner=self.owner, hand_over=False)  # fmt: skip
        try:
            box = self.launch(spec, run_id=run_id, files=FilesMounts(str(area), workspace=mode, io=True))
        except BaseException:
            FilesArea(area, True).remove()
            raise
        box.files_area = area
        return box

    def member_workspace(self, slug: str) -> str | None:
        """What a warm member of `slug` mounts at /workspace ("read" or "write"), None for a member with no
        files area (a pack without a workspace level, or one its config refuses): a run handed files claims
        a member only when it has one."""
        entry = self.lockfile.get(slug)
        try:
            level = entry.parsed_manifest().permissions.get("filesystem", "none") if entry else "none"
            mode = filesystem_grant(str(level), self.files).workspace
        except (FilesystemRefused, SandboxError):
            return None
        return mode if mode != "none" else None

    def launch(
        self,
        spec: SandboxSpec,
        *,
        run_id: str,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
        files: FilesMounts | None = None,
    ) -> Sandbox:
        with self._image_gone_forgotten():
            return Sandbox.launch(
                self.client(),
                spec,
                run_id=run_id,
                owner=self.owner,
                env=self.env,
                session=session,
                run_info=run_info,
                files=files,
            )

    def adopt(
        self, early: Prelaunched, *, session: RunSession, run_info: Mapping[str, object] | None = None
    ) -> Sandbox:
        """A prelaunched container as this run's sandbox (`Prelaunched.serves` said it is the one)."""
        return Sandbox.adopt(early, client=self.client(), session=session, run_info=run_info)

    @contextlib.contextmanager
    def _image_gone_forgotten(self) -> Iterator[None]:
        """A launch that found the pinned image gone drops the cached verification: the next is afresh."""
        try:
            yield
        except EngineError as exc:
            if exc.reason is AuditReason.IMAGE_MISSING:
                self._image = None
            raise

    def launch_tool_sandbox(
        self,
        entry: LockEntry,
        runtime: str,
        *,
        tool_for: str,
        egress: EgressRoute | None = None,
        files: FilesMounts | None = None,
    ) -> ToolSandbox:
        """Start a tool sandbox for run `tool_for`: the tool pack's own volume, verified as an agent's is,
        the run's runtime and image pin, its own socket served by a ToolLink (connect it next), and its own
        pack's egress, if the run grants that pack any."""
        with self._image_gone_forgotten():
            return ToolSandbox.launch(
                self.client(),
                self.spec_for(entry, runtime),
                run_id=uuid.uuid4().hex,
                owner=self.owner,
                env=self.env,
                serve=ToolLink,
                tool_for=tool_for,
                egress=egress,
                files=files,
            )

    def teardown(self, workload: Workload) -> None:
        """Destroy a used sandbox, then offer its pack volume for removal (see `retire_volume`)."""
        workload.destroy()
        if isinstance(workload, Sandbox):
            self.retire_volume(workload.spec.volume)

    def is_current(self, spec: SandboxSpec) -> bool:
        """Is this pool's pack version still the installed one (same artifact, same volume)?"""
        e = self.lockfile.get(spec.slug)
        return bool(e and e.package_type == "agent" and e.volume_digest == spec.artifact_hash
                    and e.sandbox_volume == spec.volume)  # fmt: skip

    def retire_pool(self, spec: SandboxSpec) -> None:
        """An uninstalled or replaced pack's pool is gone: drop its volume too, unless a run still uses it."""
        self.retire_volume(spec.volume)

    def retire_volume(self, volume: str) -> None:
        """Offer a pack volume for removal: it goes only if no lockfile entry names it (after a run, that
        is when its pack was uninstalled or replaced meanwhile: nothing else would drop it)."""
        if volume:
            with self._volumes_lock:
                self._retired_volumes.add(volume)
        self.drop_retired_volumes()

    def drop_retired_volumes(self) -> None:
        """Remove retired pack volumes no lockfile entry names; one still in use is retried after a run."""
        if not self._retired_volumes:
            return
        with self._volumes_lock:
            used = {e.sandbox_volume for e in self.lockfile.entries().values()}
            client = self.client()  # a failure to connect propagates: the caller counts it
            for name in list(self._retired_volumes):
                if name in used:
                    self._retired_volumes.discard(name)
                    continue
                try:
                    with engine_errors():
                        client.remove_volume(name)
                except EngineNotFound:
                    pass
                except EngineError:
                    continue  # in use by a run still going: its teardown retries
                self._retired_volumes.discard(name)

    def close(self) -> None:
        """Destroy the warm pools, drop retired volumes, close the engine client."""
        if self.pools is not None:
            self.pools.close()
        with contextlib.suppress(Exception):
            self.drop_retired_volumes()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()


__all__ = ["DockerBackend", "Sandbox", "SandboxSpec", "ToolSandbox", "pool_key"]
