"""Pack install: hash the artifact, copy it into a labelled per-version volume, record it in the lockfile.

No pack code ever runs on the host during install: files are read as bytes, tarred and written into the
volume through a container that is created but never started.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import yaml

from host._config import ConfigPaths
from host._engine import LABEL_ARTIFACT, PACK_DIR_IN_CONTAINER, classify_engine_exception
from host._errors import AuditReason, PackError
from host._manifest import AgentManifest, ToolpackManifest, load_manifest, parse_manifest

LOCKFILE_VERSION = 1
TRUST_LEVELS = ("curated", "trusted", "verified", "unverified")
HOST_TRUST = frozenset({"curated", "trusted"})
LABEL_PACK = "io.agentnode.sandbox.pack"
LABEL_PACK_VERSION = "io.agentnode.sandbox.pack-version"
MAX_PACK_BYTES = 64 * 1024 * 1024
_SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"}


@dataclass(frozen=True)
class LockEntry:
    """One installed pack as the lockfile records it."""

    slug: str
    version: str
    package_type: str
    trust_level: str
    artifact_hash: str
    import_subdir: str
    sandbox_volume: str | None
    host_path: str | None
    manifest: dict[str, Any]
    installed_at: str

    def parsed_manifest(self) -> AgentManifest | ToolpackManifest:
        return parse_manifest(self.manifest, source=f"lockfile entry {self.slug}")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockEntry:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


def _pack_files(pack_dir: Path) -> Iterator[tuple[str, Path]]:
    for root, dirs, files in os.walk(pack_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(root) / name
            if path.is_symlink():
                raise PackError(
                    f"{path.relative_to(pack_dir)}: symlinks are not allowed in a pack",
                    hint="replace the link with the file it points to",
                )
            yield path.relative_to(pack_dir).as_posix(), path


def artifact_hash(pack_dir: Path) -> str:
    """sha256 over every file's path and bytes, in a stable order: the pack's identity."""
    h = hashlib.sha256()
    total = 0
    for rel, path in _pack_files(pack_dir):
        data = path.read_bytes()
        total += len(data)
        if total > MAX_PACK_BYTES:
            raise PackError(
                f"the pack is larger than {MAX_PACK_BYTES // 2**20} MiB", hint="remove build output"
            )
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def volume_name(slug: str, version: str, digest: str) -> str:
    """Per-version volume name: slug + version + artifact hash prefix (the full hash is a label)."""
    safe_version = re.sub(r"[^A-Za-z0-9_.-]", "-", version)[:40]
    return f"agentnode-pack-{slug}-{safe_version}-{digest[:16]}"


def _pack_tar(pack_dir: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, path in _pack_files(pack_dir):
            data = path.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.uid = info.gid = 0
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Lockfile:
    """The host's record of installed packs; writes are serialized by a file lock and atomic."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(f"{self.path}.lck", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"lockfile_version": LOCKFILE_VERSION, "packages": {}}
        except ValueError as exc:
            raise PackError(
                f"{self.path}: not valid JSON ({exc.__class__.__name__})",
                hint="restore it from a backup or delete it and reinstall the packs",
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("packages"), dict):
            raise PackError(f"{self.path}: unexpected layout", hint="delete it and reinstall the packs")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def entries(self) -> dict[str, LockEntry]:
        return {slug: LockEntry.from_json(e) for slug, e in self._read()["packages"].items()}

    def get(self, slug: str) -> LockEntry | None:
        raw = self._read()["packages"].get(slug)
        return LockEntry.from_json(raw) if raw else None

    def put(self, entry: LockEntry) -> LockEntry | None:
        with self._locked():
            data = self._read()
            previous = data["packages"].get(entry.slug)
            data["packages"][entry.slug] = entry.to_json()
            self._write(data)
        return LockEntry.from_json(previous) if previous else None

    def remove(self, slug: str) -> LockEntry | None:
        with self._locked():
            data = self._read()
            previous = data["packages"].pop(slug, None)
            self._write(data)
        return LockEntry.from_json(previous) if previous else None


def _read_manifest_data(pack_dir: Path) -> dict[str, Any]:
    path = pack_dir / "agentnode.yaml"
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}


def _import_subdir(pack_dir: Path) -> str:
    return "src" if (pack_dir / "src").is_dir() else ""


def populate_volume(
    client: docker.DockerClient,
    *,
    image: str,
    name: str,
    digest: str,
    slug: str,
    version: str,
    pack_dir: Path,
) -> None:
    """Create the pack's volume (if absent) and copy the files in through a never-started container."""
    try:
        try:
            vol = client.volumes.get(name)
            if (vol.attrs.get("Labels") or {}).get(LABEL_ARTIFACT) == digest:
                return
            vol.remove(force=True)
        except docker.errors.NotFound:
            pass
        client.volumes.create(
            name=name,
            labels={LABEL_ARTIFACT: digest, LABEL_PACK: slug, LABEL_PACK_VERSION: version},
        )
        holder = client.api.create_container(
            image,
            command=["/bin/true"],
            entrypoint=[],
            network_disabled=True,
            labels={LABEL_PACK: slug},
            host_config=client.api.create_host_config(
                mounts=[docker.types.Mount(target=PACK_DIR_IN_CONTAINER, source=name, type="volume")],
                network_mode="none",
            ),
        )
        try:
            if not client.api.put_archive(holder["Id"], PACK_DIR_IN_CONTAINER, _pack_tar(pack_dir)):
                raise PackError("the engine refused the pack files", hint="check the engine's storage")
        finally:
            client.api.remove_container(holder["Id"], force=True)
    except docker.errors.ImageNotFound:
        raise PackError(
            "the pinned sandbox image is missing, so the pack volume cannot be populated",
            reason=AuditReason.IMAGE_MISSING,
            hint="build it first: agentnode-sandbox image build",
        ) from None
    except docker.errors.APIError as exc:
        raise PackError(
            f"the engine failed while creating the pack volume ({exc.status_code})",
            reason=AuditReason.ENGINE_UNAVAILABLE,
            hint="check with: agentnode-sandbox doctor",
        ) from None
    except (OSError, docker.errors.DockerException) as exc:
        raise classify_engine_exception(exc) from None


def install_pack(
    pack_dir: Path,
    *,
    trust: str,
    paths: ConfigPaths,
    client: docker.DockerClient | None,
    image: str | None,
) -> LockEntry:
    """Install a pack: validate, hash, copy (volume for agents, host copy for host-trusted code), record."""
    pack_dir = pack_dir.resolve()
    if not (pack_dir / "agentnode.yaml").is_file():
        raise PackError(
            f"{pack_dir}: no agentnode.yaml", hint="point at a pack directory (see: agentnode-sandbox init)"
        )
    trust = trust.strip().lower()
    if trust not in TRUST_LEVELS:
        raise PackError(f"unknown trust level {trust!r}", hint=f"use one of: {', '.join(TRUST_LEVELS)}")
    manifest = load_manifest(pack_dir)
    if manifest.dependencies:
        raise PackError(
            f"{manifest.slug} declares dependencies ({', '.join(manifest.dependencies[:5])}); "
            "sandboxed packs cannot install dependencies",
            hint="vendor pure-Python dependencies into the pack, or remove them from agentnode.yaml",
        )
    digest = artifact_hash(pack_dir)
    is_agent = isinstance(manifest, AgentManifest)
    volume: str | None = None
    if is_agent:
        if client is None and trust not in HOST_TRUST:
            raise PackError(
                "community agents are installed into a sandbox volume, which needs the container engine",
                reason=AuditReason.ENGINE_UNAVAILABLE,
                hint="start the engine (scripts/provision-engine), then install again; "
                "check with: agentnode-sandbox doctor",
            )
        if client is not None and not image and trust not in HOST_TRUST:
            raise PackError(
                "community agents are installed into a sandbox volume, which needs the pinned image",
                reason=AuditReason.IMAGE_NOT_PINNED,
                hint="build and pin it: agentnode-sandbox image build, then install again",
            )
        # A host-trusted agent installed without engine or image gets no volume: it runs on the host path,
        # and a policy that sandboxes it fails closed (volume_missing) until it is reinstalled.
        if client is not None and image:
            volume = volume_name(manifest.slug, manifest.version, digest)
            populate_volume(
                client,
                image=image,
                name=volume,
                digest=digest,
                slug=manifest.slug,
                version=manifest.version,
                pack_dir=pack_dir,
            )
    host_path: str | None = None
    if trust in HOST_TRUST:
        dest = paths.packs_dir / manifest.slug / f"{manifest.version}-{digest[:16]}"
        if not dest.exists():
            staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
            staging.mkdir(parents=True)
            for rel, path in _pack_files(pack_dir):
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, staging / rel)
            os.replace(staging, dest)
        host_path = str(dest)
    entry = LockEntry(
        slug=manifest.slug,
        version=manifest.version,
        package_type="agent" if is_agent else "toolpack",
        trust_level=trust,
        artifact_hash=digest,
        import_subdir=_import_subdir(pack_dir),
        sandbox_volume=volume,
        host_path=host_path,
        manifest=_read_manifest_data(pack_dir),
        installed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    previous = Lockfile(paths.lockfile).put(entry)
    if previous is not None:
        _forget_copies(previous, keep=entry, client=client)
    return entry


def _forget_copies(old: LockEntry, *, keep: LockEntry, client: docker.DockerClient | None) -> None:
    """Best effort: drop the replaced version's volume and host copy (a volume in use by a run stays)."""
    if old.sandbox_volume and old.sandbox_volume != keep.sandbox_volume and client is not None:
        with contextlib.suppress(docker.errors.DockerException):
            client.volumes.get(old.sandbox_volume).remove(force=True)
    if old.host_path and old.host_path != keep.host_path:
        shutil.rmtree(old.host_path, ignore_errors=True)


def uninstall_pack(slug: str, *, paths: ConfigPaths, client: docker.DockerClient | None) -> LockEntry:
    """Forget a pack and remove its volume and host copy."""
    entry = Lockfile(paths.lockfile).remove(slug)
    if entry is None:
        raise PackError(f"{slug} is not installed", hint="see: agentnode-sandbox list")
    if entry.sandbox_volume and client is not None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # in use by a run: stays
            client.volumes.get(entry.sandbox_volume).remove(force=True)
    if entry.host_path:
        shutil.rmtree(entry.host_path, ignore_errors=True)
    return entry


def verify_volume(client: docker.DockerClient, entry: LockEntry) -> str:
    """Return the run's pack volume only if it exists and its label matches the lockfile; never create one."""
    expected = volume_name(entry.slug, entry.version, entry.artifact_hash)
    if not entry.sandbox_volume or entry.sandbox_volume != expected:
        raise PackError(
            f"the sandbox volume of {entry.slug} is missing or stale in the lockfile",
            reason=AuditReason.VOLUME_STALE if entry.sandbox_volume else AuditReason.VOLUME_MISSING,
            hint=f"reinstall it: agentnode-sandbox install <path-to-{entry.slug}>",
        )
    try:
        vol = client.volumes.get(expected)
    except docker.errors.NotFound:
        raise PackError(
            f"the sandbox volume of {entry.slug} is missing",
            reason=AuditReason.VOLUME_MISSING,
            hint=f"reinstall it: agentnode-sandbox install <path-to-{entry.slug}>",
        ) from None
    except (OSError, docker.errors.DockerException) as exc:
        raise classify_engine_exception(exc) from None
    if (vol.attrs.get("Labels") or {}).get(LABEL_ARTIFACT) != entry.artifact_hash:
        raise PackError(
            f"the sandbox volume of {entry.slug} does not match the installed artifact",
            reason=AuditReason.VOLUME_STALE,
            hint=f"reinstall it: agentnode-sandbox install <path-to-{entry.slug}>",
        )
    return expected


__all__ = [
    "HOST_TRUST",
    "TRUST_LEVELS",
    "LockEntry",
    "Lockfile",
    "artifact_hash",
    "install_pack",
    "populate_volume",
    "uninstall_pack",
    "verify_volume",
    "volume_name",
]
