"""A cold one-shot run's container, started before the rest of the host is imported.

A new `run` process pays for importing gRPC, the session, the broker and their kin (~150-200 ms) and then
waits for the engine to start the container (~300 ms on runc, more under gVisor). Here the run is admitted
and its container verified, created and started with light modules only, while those imports go on in
another thread (host/cli/run.py): they overlap the engine's work instead of preceding it. The container's
wrapper waits for the run's socket (`PRELAUNCH_SOCKET_WAIT`), which the host serves once it has adopted the
container (`SandboxHost.run(prelaunched=...)`).

Nothing here decides anything on its own: the run is admitted again by the host, which adopts the
container only if it is the very sandbox it would have started (same pack version, runtime, image pin,
entrypoint and limits); otherwise, and on any failure here, the container is removed and the run takes
the usual path, which meets (and audits) the same failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from host.engine.contract import SANDBOX_GID, SANDBOX_UID, ContainerLimits
from host.engine.engine import open_engine, remove_and_verify, verify_runtime
from host.engine.facts import EngineKind, engine_facts
from host.engine.http import EngineClient
from host.engine.launch import (
    SandboxSpec,
    container_name,
    import_root_of,
    podman_seccomp_profile,
    sandbox_keywords,
    sandbox_spec,
    start_container,
)
from host.engine.pin import verify_pinned_image
from host.engine.spec import create_body
from host.policy.admission import Admission, admit
from host.runtime.headstart import Headstart, forget, remember
from host.runtime.rundir import RunDir, made_for, make_run_dir, run_dir_of
from host.spec.config import HostConfig, load_config
from host.spec.lockfile import Lockfile

logger = logging.getLogger("agentnode.sandbox.prelaunch")

PRELAUNCH_SOCKET_WAIT = 60.0
"""How long a prelaunched wrapper waits for its socket: the host adopts it within its imports (well under a
second); a host that dies first leaves a wrapper that gives up and exits, and a container the next startup
sweep removes (its owner is gone)."""


@dataclass
class Prelaunched:
    """A started sandbox container waiting for its host to serve its socket; adopted once, or discarded."""

    run_id: str
    name: str
    spec: SandboxSpec
    container_id: str
    rundir: RunDir
    client: EngineClient
    launched_at: float
    stages: dict[str, float] = field(default_factory=dict)
    adopted: bool = False
    admission: Admission | None = None
    """The run's admission, decided here once: the host reuses it when `admitted_for` its own request."""
    admitted_with: tuple[HostConfig, dict[str, str], str | None] | None = None
    """What that admission was decided from: the config, the environment and the runtime asked for."""

    def admitted_for(
        self, slug: str, runtime: str | None, *, config: HostConfig, env: Mapping[str, str],
        lockfile: Lockfile,
    ) -> Admission | None:
        """This run's admission, if the host's request is the one admitted here: same slug, runtime asked
        for, config and environment, and the lockfile still holds the very entry admitted (reinstalled or
        removed since: None, and the host admits the run itself)."""
        early = self.admission
        if early is None or self.admitted_with is None or early.entry is None or early.slug != slug:
            return None
        if self.admitted_with != (config, dict(env), runtime) or lockfile.get(slug) != early.entry:
            return None
        return early

    def serves(self, admission: Admission, *, pin: str | None, limits: ContainerLimits) -> bool:
        """Is this the sandbox the host would start for `admission` (same pack version and volume, runtime,
        image pin, entrypoint and limits)? The host's own admission decides; this container only fits it."""
        entry, manifest, mine = admission.entry, admission.manifest, self.spec
        if not admission.sandboxed or entry is None or manifest is None:
            return False
        return mine.preload in ("", manifest.entrypoint_module) and (
            entry.slug, entry.volume_digest, entry.sandbox_volume, import_root_of(entry), admission.runtime,
            pin or "", limits,
        ) == (
            mine.slug, mine.artifact_hash, mine.volume, mine.import_root, mine.runtime, mine.pin, mine.limits,
        )  # fmt: skip

    def discard(self) -> None:
        """Remove the container (verified) and its run dir; a failure is left to the startup sweep."""
        if self.adopted:
            return
        try:
            remove_and_verify(self.client, self.container_id, self.name)
        except Exception as exc:  # noqa: BLE001 (the sweep removes it: its owner process is gone by then)
            logger.warning("could not remove the prelaunched %s: %s", self.name, type(exc).__name__)
        finally:
            self.rundir.remove()
            self.client.close()


def prelaunch(
    slug: str,
    *,
    runtime: str | None,
    owner: str,
    env: Mapping[str, str],
    limits: ContainerLimits,
    starting: Callable[[], None] = lambda: None,
    headstart: Headstart | None = None,
) -> Prelaunched | None:
    """Start the sandbox of a cold run of `slug`, or None when the run is not one (refused, on the host, a
    sequential orchestration) or anything fails: the host's own path then does the run, or reports why not.

    `starting` is called as the engine is asked to start the container: work begun there overlaps the
    start. Begun earlier, it would compete with the checks and the create for the interpreter's lock, each
    engine answer waiting for it (measured: ~+50 ms before the start under runc).

    `headstart` is the container this process started from the command's record (host/runtime/headstart.py):
    it is taken if it is exactly the sandbox verified here, else removed; either way it is settled on return.
    """
    try:
        return _prelaunch(slug, runtime=runtime, owner=owner, env=env, limits=limits, starting=starting,
                          headstart=headstart)  # fmt: skip
    finally:
        if headstart is not None and not headstart.adopted:
            headstart.discard()


def _prelaunch(
    slug: str,
    *,
    runtime: str | None,
    owner: str,
    env: Mapping[str, str],
    limits: ContainerLimits,
    starting: Callable[[], None],
    headstart: Headstart | None,
) -> Prelaunched | None:
    config = load_config(env)
    admission = admit(slug, lockfile=Lockfile(config.paths.lockfile), config=config, env=env, runtime=runtime)
    if admission.refusal is not None or not admission.sandboxed:
        if headstart is not None:
            forget(env, slug, runtime or "")  # a refusal that holds would start (and remove) one every time
        return None
    entry, manifest, chosen = admission.entry, admission.manifest, admission.runtime
    if entry is None or manifest is None or chosen is None:
        return None
    t0 = time.monotonic() if headstart is None else headstart.launched_at
    try:
        client = open_engine(env)
    except Exception:  # noqa: BLE001 (the host's path meets and reports the same failure)
        return None
    run_id = uuid.uuid4().hex
    name = container_name(run_id)
    rundir: RunDir | None = None
    container: list[str] = []
    starting = _once(starting)
    try:
        if headstart is not None:
            # The engine is starting it already: the host's imports go on meanwhile, and the checks below
            # wait for its answer (GET /info, the costliest, would compete with the start inside the engine).
            # Nothing serves its socket before they pass.
            starting()
            headstart.started()
        pin = config.agent_sandbox.image
        spec = sandbox_spec(
            client, entry, chosen, facts=engine_facts(client), pin=pin, limits=limits,
            image_id=lambda: verify_pinned_image(client, pin).id,
            seccomp_profile=lambda facts: podman_seccomp_profile(facts, env),
            preload=manifest.entrypoint_module,
        )  # fmt: skip
        stages: dict[str, float] = {}

        def mark(stage: str) -> None:
            stages[stage] = round((time.monotonic() - t0) * 1000, 2)

        if headstart is not None:
            taken = _take(headstart, spec, client=client, owner=owner, env=env, mark=mark)
            if taken is not None:
                taken.stages = stages
                return taken
            headstart.discard()
            forget(env, slug, runtime or "")
        rundir = make_run_dir(run_id, owner, env)
        rundir.grant(SANDBOX_UID, SANDBOX_GID)
        keywords = sandbox_keywords(spec, run_id=run_id, name=name, owner=owner, socket_dir=str(rundir.path),
                                    socket_wait=PRELAUNCH_SOCKET_WAIT)  # fmt: skip
        start_container(client, spec, keywords, mark=mark, created=container.append, starting=starting)
        _remember(spec, client=client, env=env, files=(config.paths.config_file, config.paths.lockfile),
                  command=(slug, runtime or ""), run_id=run_id, owner=owner, rundir=rundir)  # fmt: skip
        return Prelaunched(
            run_id=run_id, name=name, spec=spec, container_id=container[0], rundir=rundir, client=client,
            launched_at=t0, stages=stages, admission=admission, admitted_with=(config, dict(env), runtime),
        )  # fmt: skip
    except BaseException as exc:  # an interrupt too: nothing started here may outlive the prelaunch
        logger.debug("no prelaunch for %s: %s", slug, type(exc).__name__)
        with contextlib.suppress(Exception):
            if container:
                remove_and_verify(client, container[0], name)
        if rundir is not None:
            rundir.remove()
        client.close()
        if not isinstance(exc, Exception):
            raise
        return None  # the host's path meets and reports the same failure


def _once(work: Callable[[], None]) -> Callable[[], None]:
    """`work` run at its first call only (the host's imports are begun once, whichever path asks first)."""
    done: list[bool] = []

    def once() -> None:
        if not done:
            done.append(True)
            work()

    return once


def _replayable(spec: SandboxSpec, *, client: EngineClient, run_id: str, owner: str, rundir: RunDir,
                name: str) -> tuple[dict[str, Any], str, str]:  # fmt: skip
    """What a head start of `spec` sends for run `run_id` (host/runtime/headstart.py): its create body, create
    target and start target. No preload: nothing of the pack is imported before the host has verified it."""
    keywords = sandbox_keywords(
        dataclasses.replace(spec, preload=""), run_id=run_id, name=name, owner=owner,
        socket_dir=str(rundir.path), socket_wait=PRELAUNCH_SOCKET_WAIT,
    )  # fmt: skip
    _, body = create_body(keywords)
    create, start = client.url("/containers/create", {"name": name}), client.url(f"/containers/{name}/start")
    return body, create, start


def _volume_target(client: EngineClient, spec: SandboxSpec) -> str:
    """The request a head start checks its pack volume with (it must exist before the create)."""
    return client.url(f"/volumes/{quote(spec.volume, safe='')}")


def _remember(spec: SandboxSpec, *, client: EngineClient, env: Mapping[str, str], files: tuple[Path, ...],
              command: tuple[str, str], run_id: str, owner: str, rundir: RunDir) -> None:  # fmt: skip
    """Keep the request a head start of this command replays next time (Docker's Unix socket only: Podman
    must have each container's runtime checked before it starts)."""
    if spec.engine is not EngineKind.DOCKER or client.socket_path is None:
        return
    name = container_name(run_id)
    body, create, start = _replayable(spec, client=client, run_id=run_id, owner=owner, rundir=rundir,
                                      name=name)  # fmt: skip
    with contextlib.suppress(Exception):  # a record not kept costs the next run its head start, nothing else
        remember(env, *command, files=[str(f) for f in files], engine_socket=client.socket_path,
                 volume_target=_volume_target(client, spec), create_target=create, start_target=start,
                 body=body, run_id=run_id, name=name, owner=owner, rundir=str(rundir.path),
                 owner_file=str(rundir.owner_file))  # fmt: skip


def _take(early: Headstart, spec: SandboxSpec, *, client: EngineClient, owner: str, env: Mapping[str, str],
          mark: Callable[[str], None]) -> Prelaunched | None:  # fmt: skip
    """The head start as this run's sandbox, if it is exactly the one verified here (`spec`, without its
    preload): same engine, run directory, name, create request and runtime, created and started; else None
    (the caller removes it)."""
    rundir = run_dir_of(early.run_id, env)
    name = container_name(early.run_id)
    same_engine = spec.engine is EngineKind.DOCKER and early.engine_socket == client.socket_path
    if not same_engine or early.owner != owner:
        return None
    body, create, start = _replayable(spec, client=client, run_id=early.run_id, owner=owner, rundir=rundir,
                                      name=name)  # fmt: skip
    sent = (early.name, early.rundir, early.owner_file, early.volume_target, early.create_target,
            early.start_target, early.body())  # fmt: skip
    want = (name, str(rundir.path), str(rundir.owner_file), _volume_target(client, spec), create, start, body)
    if sent != want:
        return None
    container_id = early.created()
    if not container_id or not made_for(rundir, owner):
        return None
    mark("created")
    verify_runtime(client, container_id, spec.runtime, spec.engine)
    if not early.started():
        return None
    mark("started")
    early.adopted = True
    return Prelaunched(
        run_id=early.run_id, name=name, spec=dataclasses.replace(spec, preload=""), container_id=container_id,
        rundir=rundir, client=client, launched_at=early.launched_at,
    )  # fmt: skip


__all__ = ["PRELAUNCH_SOCKET_WAIT", "Prelaunched", "prelaunch"]
