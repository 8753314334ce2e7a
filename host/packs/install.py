"""Pack install: hash the artifact, copy it into a labelled per-version volume, record it in the lockfile.

No pack code ever runs on the host during install: files are read as bytes, tarred and written into the
volume through a container that is created but never started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, TYPE_CHECKING

from host.core.errors import (
    AuditReason,
    EngineError,
    EngineImageNotFound,
    EngineNotFound,
    EngineRejected,
    PackError,
)
from host.core.terminal import safe_line
from host.core.vocab import HOST_TRUST, Trust
from host.engine.contract import PACK_DIR_IN_CONTAINER
from host.engine.errors import engine_errors
from host.engine.image import daemon_arch
from host.engine.labels import LABEL_ARTIFACT
from host.engine.volumes import volume_name
from host.packs.declared import read_requirements
from host.packs.files import CHUNK, Snapshot, show_name, snapshot
from host.packs.requirements import (
    Progress,
    Resolved,
    Source,
    host_target,
    identity,
    image_target,
    lock_record,
    resolve,
)
from host.packs.site import SITE_DIR, build_site, build_venv, site_archive
from host.policy.egress import ungranted
from host.spec.config import ConfigPaths
from host.spec.egress import EgressConfig
from host.spec.lockfile import (
    MAX_LOCK_ENTRY_BYTES,
    LockEntry,
    Lockfile,
    entry_too_big,
)
from host.spec.manifest.load import load_manifest, manifest_data, parse_manifest
from host.spec.manifest.model import MANIFEST_NAME, AgentManifest, ManifestWarnings, ToolpackManifest
from host.spec.wheels import VENV_DIR

if TYPE_CHECKING:
    import docker
    from docker.models.volumes import Volume

LABEL_PACK = "io.agentnode.sandbox.pack"
LABEL_PACK_VERSION = "io.agentnode.sandbox.pack-version"
ENGINE_TEXT_LIMIT = 200
"""How much of an engine's own error text an install failure quotes (escaped, on one line)."""
_VOLUME_RE = re.compile(r"agentnode-pack-[A-Za-z0-9_.-]{1,200}", re.ASCII)


def _is_pack_volume(name: str | None) -> bool:
    """Only a name this module makes may be created or removed as a pack volume."""
    return bool(name) and _VOLUME_RE.fullmatch(name or "") is not None


def _inside(parent: Path, *names: str) -> Path:
    """parent/names..., refused unless each name is one plain component and the path resolves exactly there
    (no `..`, no link on the way): checked before anything is created or removed."""
    for name in names:
        if not name or name in {".", ".."} or "/" in name or "\0" in name:
            raise PackError(
                f"refusing a host path outside {parent}: {show_name(name)!r} is not a plain name",
                hint="reinstall the pack with a valid package_id and version",
            )
    path = parent.joinpath(*names)
    if path.resolve() != parent.resolve().joinpath(*names):
        raise PackError(
            f"refusing {show_name(str(path))}: it resolves outside {parent}",
            hint=f"remove the link under {parent}, then install again",
        )
    return path


def _owned_host_copy(host_path: str | None, slug: str, packs_dir: Path) -> Path | None:
    """The recorded host copy if it is one this module made (packs_dir/slug/name, no link); else None."""
    if not host_path:
        return None
    path = Path(host_path)
    if path.parent != packs_dir / slug:
        return None
    try:
        return _inside(packs_dir, slug, path.name)
    except PackError:
        return None


def populate_volume(
    client: docker.DockerClient,
    *,
    image: str,
    name: str,
    digest: str,
    slug: str,
    version: str,
    archive: IO[bytes],
    extra: Callable[[], AbstractContextManager[IO[bytes]]] | None = None,
) -> None:
    """Create the pack's volume (if absent) and copy the tar in through a never-started container.

    `extra` makes a second tar copied in after the pack's (its unpacked requirements), only when the volume
    is actually filled; `digest` is then what both together hold (host/packs/requirements.identity).
    """
    if not _is_pack_volume(name):
        raise PackError(
            f"refusing volume name {show_name(name)!r}", hint="reinstall the pack with a valid version"
        )
    try:
        with engine_errors():
            vol = _volume(client, name)
            if vol is not None:
                if (vol.attrs.get("Labels") or {}).get(LABEL_ARTIFACT) == digest:
                    return
                vol.remove(force=True)
            created = client.volumes.create(
                name=name,
                labels={LABEL_ARTIFACT: digest, LABEL_PACK: slug, LABEL_PACK_VERSION: version},
            )
            try:
                holder = client.api.create_container(
                    image,
                    entrypoint=["/bin/true"],  # Podman reads an empty entrypoint as "the image's"
                    network_disabled=True,
                    labels={LABEL_PACK: slug},
                    host_config=client.api.create_host_config(
                        mounts=[{"Target": PACK_DIR_IN_CONTAINER, "Source": name, "Type": "volume"}],
                        network_mode="none",
                    ),
                )
                try:
                    _upload(client, holder["Id"], archive, "the pack files")
                    if extra is not None:
                        with extra() as more:
                            _upload(client, holder["Id"], more, "the pack's requirements")
                finally:
                    client.api.remove_container(holder["Id"], force=True)
            except BaseException:
                # A labelled volume claims its content: one left half-filled would be reused as complete.
                with contextlib.suppress(Exception):
                    created.remove(force=True)
                raise
    except EngineImageNotFound:
        raise PackError(
            "the pinned sandbox image is missing, so the pack volume cannot be populated",
            reason=AuditReason.IMAGE_MISSING,
            hint="build it first: agentnode-sandbox image build",
        ) from None
    except EngineRejected as exc:
        raise _fill_failed(exc) from None


def _fill_failed(exc: EngineRejected) -> PackError:
    """The install's error for an engine failure while the volume was made: the engine's own words, escaped
    and cut short, since they are the operator's only clue (a full disk, a storage driver's bug)."""
    return PackError(
        f"the engine failed while creating the pack volume ({exc.status}: "
        f"{safe_line(exc.explanation, limit=ENGINE_TEXT_LIMIT)})",
        reason=AuditReason.ENGINE_UNAVAILABLE,
        hint="install again; if it fails the same way, check with: agentnode-sandbox doctor",
    )


def _upload(client: docker.DockerClient, holder: str, archive: IO[bytes], what: str) -> None:
    """Copy one tar into the holder's volume, streamed from disk (never read into memory whole).

    An engine failure (5xx) is tried once more: Podman's upload fails now and then on a sound archive
    (containers/buildah#6573), and a second copy of the same tar writes the same files. A refusal (4xx),
    a holder that vanished (EngineNotFound, which the engine may answer with a 500), or a second failure
    ends the install.
    """
    for attempt in (1, 2):
        archive.seek(0)
        try:
            with engine_errors():
                if client.api.put_archive(holder, PACK_DIR_IN_CONTAINER, archive):
                    return
        except EngineRejected as exc:
            if attempt == 2 or exc.status is None or exc.status < 500 or isinstance(exc, EngineNotFound):
                raise
            continue
        raise PackError(f"the engine refused {what}", hint="check the engine's storage")


def _volume(client: docker.DockerClient, name: str) -> Volume | None:
    """The volume `name`, or None when the engine has none by that name."""
    try:
        with engine_errors():
            return client.volumes.get(name)
    except EngineNotFound:
        return None


def _host_copy(
    packs_dir: Path,
    manifest: AgentManifest | ToolpackManifest,
    snap: Snapshot,
    *,
    digest: str | None = None,
    prepare: Callable[[Path, Path], None] | None = None,
) -> Path:
    """The pack's files for the host path, unpacked from the snapshot under packs_dir/slug/version-hash.

    `digest` names what the copy holds (the artifact hash, or with requirements their identity, see
    host/packs/requirements.identity); `prepare(staging, dest)` adds the requirements before the copy appears.
    """
    digest = digest or snap.digest
    dest = _inside(packs_dir, manifest.slug, f"{manifest.version}-{digest[:16]}")
    if dest.exists():
        if not dest.is_dir():
            raise PackError(f"{dest} exists and is not a directory", hint="remove it, then install again")
        return dest  # content-addressed: the same version, artifact (and wheels) are already there
    staging = _inside(packs_dir, manifest.slug, f".{dest.name}.{uuid.uuid4().hex}")
    try:
        staging.mkdir(parents=True)
        snap.archive.seek(0)
        with tarfile.open(fileobj=snap.archive, mode="r:") as tar:
            for member in tar:  # the tar is ours: regular files with checked, plain relative names
                target = staging.joinpath(*member.name.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                with open(target, "xb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                os.chmod(target, member.mode)
        if prepare is not None:
            prepare(staging, dest)
        os.replace(staging, dest)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if dest.is_dir() and not dest.is_symlink():  # a concurrent install of the same content won the race
            return dest
        raise PackError(
            f"cannot write the host copy under {packs_dir} ({type(exc).__name__})",
            hint="check free space and permissions there, then install again",
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.parent.rmdir()  # the pack's directory, if this failed install was its first copy
        raise
    return dest


def install_pack(
    pack_dir: Path,
    *,
    trust: str,
    paths: ConfigPaths,
    client: docker.DockerClient | None,
    image: str | None,
    warnings: list[str] | None = None,
    source: Source | None = None,
    progress: Progress | None = None,
    egress: EgressConfig | None = None,
) -> LockEntry:
    """Install a pack: validate, hash, copy (volume for agents, host copy for host-trusted code), record.

    The pack's Python requirements (pyproject.toml) are resolved to wheels from `source` and installed
    with each copy (host/packs/requirements.py); `progress` gets a line per stage of that.
    What installs but is probably wrong (unknown or misspelled manifest keys, dependencies that are not
    installed, network the operator's `egress` config does not grant a sandboxed pack) is appended to
    `warnings` when given: terminal-safe lines, at most MAX_WARNINGS and a count.
    """
    pack_dir = pack_dir.resolve()
    if not os.path.lexists(pack_dir / MANIFEST_NAME):
        raise PackError(
            f"{pack_dir}: no agentnode.yaml", hint="point at a pack directory (see: agentnode-sandbox init)"
        )
    level = Trust.parse(trust)
    if level is None:
        raise PackError(
            f"unknown trust level {show_name(trust.strip().lower())!r}",
            hint=f"use one of: {', '.join(Trust)}",
        )
    found = ManifestWarnings()
    manifest = load_manifest(pack_dir, warnings=found)
    installed = Lockfile(paths.lockfile).entries()
    pack_refs = {*installed, *(dep.slug for dep in manifest.pack_dependencies)} - {manifest.slug}
    if manifest.pack_dependencies:  # packs it references; like the agentnode SDK, nothing installs them
        for dep in manifest.pack_dependencies:
            if dep.slug not in installed:
                found.add(
                    f"dependency {dep.slug} ({'required' if dep.required else 'optional'}) is not installed; "
                    "install it too (dependencies are never installed automatically)"
                )
    if egress is not None and level not in HOST_TRUST:  # a host (trusted) pack is outside the egress path
        network = manifest.permissions.get("network", "none")
        for line in ungranted(network, manifest.network_domains, egress, slug=manifest.slug, trust=level):
            found.add(line)
    stored = manifest_data(manifest)
    if parse_manifest(stored, source="") != manifest:  # what runs read back must be what was validated
        raise PackError(f"{manifest.slug}: the manifest does not survive storage", hint="report this bug")
    stored_size = len(json.dumps(stored))
    if stored_size > MAX_LOCK_ENTRY_BYTES:
        raise entry_too_big(manifest.slug, stored_size)
    is_agent = isinstance(manifest, AgentManifest)
    if is_agent:
        if client is None and level not in HOST_TRUST:
            raise PackError(
                "community agents are installed into a sandbox volume, which needs the container engine",
                reason=AuditReason.ENGINE_UNAVAILABLE,
                hint="start the engine (scripts/provision-engine), then install again; "
                "check with: agentnode-sandbox doctor",
            )
        if client is not None and not image and level not in HOST_TRUST:
            raise PackError(
                "community agents are installed into a sandbox volume, which needs the pinned image",
                reason=AuditReason.IMAGE_NOT_PINNED,
                hint="build and pin it: agentnode-sandbox image build, then install again",
            )
    volume: str | None = None
    host_path: str | None = None
    source = source or Source()
    with snapshot(pack_dir) as snap, tempfile.TemporaryDirectory(prefix="agentnode-wheels-") as wheels_tmp:
        declared = read_requirements(snap.pyproject, pack_refs)
        for line in declared.warnings:
            found.add(line)
        import_subdir = "src" if "src" in snap.dirs else ""
        site_prefix = f"{import_subdir}/{SITE_DIR}" if import_subdir else SITE_DIR
        # A host-trusted agent installed without engine or image gets no volume: it runs on the host path,
        # and a policy that sandboxes it fails closed (volume_missing) until it is reinstalled. A community
        # toolpack gets one too: its calls run in tool sandboxes (host/runtime/toolsandbox.py).
        in_volume = (is_agent or level not in HOST_TRUST) and client is not None and bool(image)
        sandbox_wheels = host_wheels = None
        if declared.requirements and in_volume:
            assert client is not None
            sandbox_wheels = resolve(
                declared, image_target(daemon_arch(client)), source, _empty(wheels_tmp, "sandbox"), progress
            )
        if declared.requirements and level in HOST_TRUST:
            host_wheels = resolve(declared, host_target(), source, _empty(wheels_tmp, "host"), progress)
        if in_volume:
            assert client is not None and image
            digest = identity(snap.digest, sandbox_wheels.wheels if sandbox_wheels else ())
            volume = volume_name(manifest.slug, manifest.version, digest)
            populate_volume(
                client,
                image=image,
                name=volume,
                digest=digest,
                slug=manifest.slug,
                version=manifest.version,
                archive=snap.archive,
                extra=None if not sandbox_wheels or not sandbox_wheels.wheels else _site_tar(
                    sandbox_wheels, site_prefix, progress
                ),
            )
        if level in HOST_TRUST:
            prepare = None
            if host_wheels is not None and host_wheels.wheels:  # markers may leave nothing to install
                prepare = _host_requirements(host_wheels, is_agent, site_prefix, progress)
            digest = identity(snap.digest, host_wheels.wheels if host_wheels else ())
            host_path = str(_host_copy(paths.packs_dir, manifest, snap, digest=digest, prepare=prepare))
    entry = LockEntry(
        slug=manifest.slug,
        version=manifest.version,
        package_type="agent" if is_agent else "toolpack",
        trust_level=level.value,
        artifact_hash=snap.digest,
        import_subdir=import_subdir,
        sandbox_volume=volume,
        host_path=host_path,
        manifest=stored,
        installed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        requirements=lock_record(declared, sandbox_wheels, host_wheels),
    )
    previous = Lockfile(paths.lockfile).put(entry)
    if previous is not None:
        _forget_copies(previous, keep=entry, client=client, packs_dir=paths.packs_dir)
    if warnings is not None:
        warnings.extend(found.lines())
    return entry


def _empty(parent: str, name: str) -> Path:
    path = Path(parent) / name
    path.mkdir()
    return path


def _site_tar(
    resolved: Resolved, prefix: str, progress: Progress | None
) -> Callable[[], AbstractContextManager[IO[bytes]]]:
    """The sandbox wheels unpacked under `prefix` (the import root's SITE_DIR), as a tar for the volume."""

    @contextlib.contextmanager
    def make() -> Iterator[IO[bytes]]:
        with tempfile.TemporaryDirectory(prefix="agentnode-site-") as tmp:
            site = Path(tmp) / "site"
            build_site(site, resolved, shown_as=f"{PACK_DIR_IN_CONTAINER}/{prefix}", progress=progress)
            with site_archive(site, prefix) as archive:
                yield archive

    return make


def _host_requirements(
    resolved: Resolved, is_agent: bool, site_prefix: str, progress: Progress | None
) -> Callable[[Path, Path], None]:
    """How a host copy gets its requirements: a trusted toolpack its own venv (the tool worker's
    interpreter), a trusted agent an unpacked site beside its code (the wrapper needs the host's grpc)."""

    def prepare(staging: Path, final: Path) -> None:
        if is_agent:
            build_site(staging / site_prefix, resolved, shown_as=str(final / site_prefix), progress=progress)
        else:
            build_venv(staging / VENV_DIR, resolved, progress)

    return prepare


def _forget_copies(
    old: LockEntry, *, keep: LockEntry, client: docker.DockerClient | None, packs_dir: Path
) -> None:
    """Best effort: drop the replaced version's volume and host copy (a volume in use by a run stays).

    Only what this module makes is removed: a volume named like ours and a copy directly under
    packs_dir/slug; anything else an entry names (an older host, an edited lockfile) is left alone.
    """
    if (
        old.sandbox_volume != keep.sandbox_volume
        and client is not None
        and _is_pack_volume(old.sandbox_volume)
    ):
        with contextlib.suppress(EngineError), engine_errors():
            client.volumes.get(old.sandbox_volume).remove(force=True)
    if old.host_path != keep.host_path:
        copy = _owned_host_copy(old.host_path, old.slug, packs_dir)
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)


def uninstall_pack(slug: str, *, paths: ConfigPaths, client: docker.DockerClient | None) -> LockEntry:
    """Forget a pack and remove its volume and host copy (only ones this module made; see _forget_copies)."""
    entry = Lockfile(paths.lockfile).remove(slug)
    if entry is None:
        raise PackError(f"{slug} is not installed", hint="see: agentnode-sandbox list")
    if client is not None and _is_pack_volume(entry.sandbox_volume):
        with contextlib.suppress(EngineRejected), engine_errors():  # in use by a run: stays
            client.volumes.get(entry.sandbox_volume).remove(force=True)
    copy = _owned_host_copy(entry.host_path, entry.slug, paths.packs_dir)
    if copy is not None:
        shutil.rmtree(copy, ignore_errors=True)
    return entry


__all__ = [
    "install_pack",
    "populate_volume",
    "uninstall_pack",
]
