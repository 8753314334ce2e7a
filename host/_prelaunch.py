"""A cold one-shot run's container, started before the rest of the host is imported.

A new `run` process pays for importing gRPC, the session, the broker and their kin (~150-200 ms) and then
waits for the engine to start the container (~300 ms on runc, more under gVisor). Here the run is admitted
and its container verified, created and started with light modules only, while those imports go on in
another thread (host/_cli.py): they overlap the engine's work instead of preceding it. The container's
wrapper waits for the run's socket (`PRELAUNCH_SOCKET_WAIT`), which the host serves once it has adopted the
container (`SandboxHost.run(prelaunched=...)`).

Nothing here decides anything on its own: the run is admitted again by the host, which adopts the
container only if it is the very sandbox it would have started (same pack version, runtime, image pin,
entrypoint and limits); otherwise, and on any failure here, the container is removed and the run takes
the usual path, which meets (and audits) the same failure.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from host._admission import Admission, admit
from host._config import load_config
from host._engine import (
    SANDBOX_GID,
    SANDBOX_UID,
    ContainerLimits,
    engine_facts,
    open_engine,
    remove_and_verify,
)
from host._engine_http import EngineClient
from host._launch import (
    SandboxSpec,
    container_name,
    import_root_of,
    podman_seccomp_profile,
    sandbox_spec,
    start_container,
)
from host._lockfile import Lockfile
from host._pin import verify_pinned_image
from host._rundir import RunDir, make_run_dir

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

    def serves(self, admission: Admission, *, pin: str | None, limits: ContainerLimits) -> bool:
        """Is this the sandbox the host would start for `admission` (same pack version and volume, runtime,
        image pin, entrypoint and limits)? The host's own admission decides; this container only fits it."""
        entry, manifest, mine = admission.entry, admission.manifest, self.spec
        if not admission.sandboxed or entry is None or manifest is None:
            return False
        return (
            entry.slug, entry.volume_digest, entry.sandbox_volume, import_root_of(entry), admission.runtime,
            pin or "", limits, manifest.entrypoint_module,
        ) == (
            mine.slug, mine.artifact_hash, mine.volume, mine.import_root, mine.runtime, mine.pin, mine.limits,
            mine.preload,
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
) -> Prelaunched | None:
    """Start the sandbox of a cold run of `slug`, or None when the run is not one (refused, on the host, a
    sequential orchestration) or anything fails: the host's own path then does the run, or reports why not.

    `starting` is called as the engine is asked to start the container: work begun there overlaps the
    start. Begun earlier, it would compete with the checks and the create for the interpreter's lock, each
    engine answer waiting for it (measured: ~+50 ms before the start under runc).
    """
    config = load_config(env)
    admission = admit(slug, lockfile=Lockfile(config.paths.lockfile), config=config, env=env, runtime=runtime)
    if admission.refusal is not None or not admission.sandboxed:
        return None
    entry, manifest, chosen = admission.entry, admission.manifest, admission.runtime
    if entry is None or manifest is None or chosen is None:
        return None
    t0 = time.monotonic()
    try:
        client = open_engine(env)
    except Exception:  # noqa: BLE001 (the host's path meets and reports the same failure)
        return None
    run_id = uuid.uuid4().hex
    name = container_name(run_id)
    rundir: RunDir | None = None
    container: list[str] = []
    try:
        pin = config.agent_sandbox.image
        spec = sandbox_spec(
            client, entry, chosen, facts=engine_facts(client), pin=pin, limits=limits,
            image_id=lambda: verify_pinned_image(client, pin).id,
            seccomp_profile=lambda facts: podman_seccomp_profile(facts, env),
            preload=manifest.entrypoint_module,
        )  # fmt: skip
        rundir = make_run_dir(run_id, owner, env)
        rundir.grant(SANDBOX_UID, SANDBOX_GID)
        stages: dict[str, float] = {}

        def mark(stage: str) -> None:
            stages[stage] = round((time.monotonic() - t0) * 1000, 2)

        start_container(
            client, spec, run_id=run_id, name=name, owner=owner, socket_dir=str(rundir.path),
            socket_wait=PRELAUNCH_SOCKET_WAIT, mark=mark, created=container.append, starting=starting,
        )  # fmt: skip
        return Prelaunched(
            run_id=run_id, name=name, spec=spec, container_id=container[0], rundir=rundir, client=client,
            launched_at=t0, stages=stages,
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


__all__ = ["PRELAUNCH_SOCKET_WAIT", "Prelaunched", "prelaunch"]
