"""A sandbox's container from verified inputs to started, with no gRPC: what a cold `run` does first, so that
the rest of the host's imports overlap the engine's start instead of preceding it
(host/runtime/prelaunch.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host.core.errors import AuditReason, EngineError, EngineImageNotFound, EngineRejected
from host.engine.contract import ContainerLimits, FilesMounts
from host.engine.engine import create_container, verify_runtime
from host.engine.errors import engine_errors
from host.engine.facts import EngineFacts, EngineKind, require_capable
from host.engine.http import EngineClient
from host.engine.pin import pinned_image_missing
from host.engine.seccomp import PODMAN_DEFAULT_PROFILE, podman_profile
from host.engine.spec import container_spec
from host.engine.volumes import verify_volume
from host.spec.config import config_paths
from host.spec.lockfile import LockEntry


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
    preload: str = ""
    """The agent's entrypoint module, which the wrapper imports before its task ("" for none)."""
    engine: EngineKind = EngineKind.DOCKER
    """Which engine runs it (`EngineFacts.kind`): see `container_spec` for what differs on Podman."""
    seccomp_profile: str = ""
    """On Podman, the path of the run's seccomp profile (host.engine.seccomp); "" on Docker (its default)."""

    @property
    def pool_key(self) -> tuple[str, str, str, str]:
        """What a warm member is interchangeable by: the pack version, the runtime and the image pin."""
        return pool_key(self.slug, self.artifact_hash, self.runtime, self.pin)


def pool_key(slug: str, artifact_hash: str, runtime: str, pin: str) -> tuple[str, str, str, str]:
    return (slug, artifact_hash, runtime, pin)


def sandbox_spec(
    client: EngineClient,
    entry: LockEntry,
    runtime: str,
    *,
    facts: EngineFacts,
    image_id: Callable[[], str],
    pin: str | None,
    limits: ContainerLimits,
    seccomp_profile: Callable[[EngineFacts], str],
    preload: str = "",
) -> SandboxSpec:
    """Verify everything a sandbox stands on (engine, runtime, image pin, pack volume) and assemble its spec;
    fail closed. `image_id` verifies the pin and `seccomp_profile` writes Podman's (a caller may cache
    either: `podman_seccomp_profile`); `preload` is the entrypoint module."""
    require_capable(facts, runtime)
    verified_image = image_id()
    volume = verify_volume(client, entry)
    profile = seccomp_profile(facts) if facts.kind is EngineKind.PODMAN else ""
    return SandboxSpec(
        slug=entry.slug,
        artifact_hash=entry.volume_digest,  # the artifact plus its wheels: what the volume holds
        runtime=runtime,
        pin=pin or "",
        image_id=verified_image,
        volume=volume,
        import_root=import_root_of(entry),
        limits=limits,
        preload=preload,
        engine=facts.kind,
        seccomp_profile=profile,
    )


def container_name(run_id: str, *, tool_for: str = "") -> str:
    """A sandbox container's name: what it is (a run's, or a tool sandbox) and its run id's start."""
    return f"agentnode-{'tool' if tool_for else 'run'}-{run_id[:20]}"


def import_root_of(entry: LockEntry) -> str:
    """Where the pack's importable code is inside the sandbox: the volume's root, or its import subdir."""
    return "/pack/" + entry.import_subdir if entry.import_subdir else "/pack"


def podman_seccomp_profile(facts: EngineFacts, env: Mapping[str, str] | None) -> str:
    """The Podman runs' seccomp profile (host.engine.seccomp), written into the host's own directory (beside
    its config: not a run's, so no run sweep ever takes it)."""
    directory = config_paths(env).dir / "seccomp"
    base = Path(facts.seccomp_profile_path) if facts.seccomp_profile_path else PODMAN_DEFAULT_PROFILE
    return str(podman_profile(directory, base))


def sandbox_keywords(
    spec: SandboxSpec,
    *,
    run_id: str,
    name: str,
    owner: str,
    socket_dir: str,
    warm: bool = False,
    tool_for: str = "",
    socket_wait: float = 0.0,
    files: FilesMounts | None = None,
) -> dict[str, Any]:
    """The `container_spec` of one sandbox of `spec`: what `start_container` creates (and what a replayed
    create request must equal: host/runtime/prelaunch.py). `socket_wait` > 0 lets the wrapper wait that long
    for the run's socket to appear (a container started before its host serves the socket)."""
    return container_spec(
        image=spec.image_id,
        run_id=run_id,
        name=name,
        owner=owner,
        slug=spec.slug,
        runtime=spec.runtime,
        pack_volume=spec.volume,
        import_root=spec.import_root,
        socket_dir=socket_dir,
        limits=spec.limits,
        warm=warm,
        tool_for=tool_for,
        preload=spec.preload,
        engine=spec.engine,
        seccomp_profile=spec.seccomp_profile,
        socket_wait=socket_wait,
        files=files,
    )


def start_container(
    client: EngineClient,
    spec: SandboxSpec,
    keywords: Mapping[str, Any],
    *,
    mark: Callable[[str], None] = lambda _stage: None,
    created: Callable[[str], None] = lambda _id: None,
    starting: Callable[[], None] = lambda: None,
) -> str:
    """Create and start a sandbox of `spec` from its `keywords` (`sandbox_keywords`); its id. `created` learns
    the id as soon as there is one, so a caller can tear down a container whose start failed; `starting` is
    called as the start is asked for (what the caller does meanwhile overlaps the engine's work).

    A pinned image removed since it was verified is the same refusal as at verification (IMAGE_MISSING);
    any other engine refusal is START_FAILED."""
    try:
        with engine_errors():
            container_id = create_container(client, keywords)
            created(container_id)
            mark("created")
            verify_runtime(client, container_id, spec.runtime, spec.engine)
            starting()
            client.start(container_id)
            mark("started")
    except EngineImageNotFound:
        raise pinned_image_missing(spec.pin or spec.image_id) from None
    except EngineRejected as exc:
        raise EngineError(
            f"the sandbox container could not be started ({exc.status})",
            reason=AuditReason.START_FAILED,
            hint="check with: agentnode-sandbox doctor",
            check="start",
        ) from None
    return container_id


__all__ = [
    "SandboxSpec",
    "container_name",
    "import_root_of",
    "podman_seccomp_profile",
    "pool_key",
    "sandbox_keywords",
    "sandbox_spec",
    "start_container",
]
