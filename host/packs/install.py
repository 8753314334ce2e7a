"""Pack install: hash the artifact, copy it into a labelled per-version volume, record it in the lockfile.

No pack code ever runs on the host during install: files are read as bytes, tarred and written into the
volume through a container that is created but never started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
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
from host.engine.tararchive import upload_tar
from host.engine.volumes import verify_volume, volume_name
from host.packs.requirements import (
    MAX_PYPROJECT_BYTES,
    PYPROJECT,
    SITE_DIR,
    Progress,
    Resolved,
    Source,
    build_site,
    build_venv,
    host_target,
    identity,
    image_target,
    lock_record,
    read_requirements,
    reserved_name,
    resolve,
    site_archive,
)
from host.spec.config import ConfigPaths
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
MAX_PACK_BYTES = 64 * 1024 * 1024
MAX_FILE_BYTES = 32 * 1024 * 1024
MAX_PACK_ENTRIES = 10_000
"""Directory entries an install looks at (files, directories, skipped debris): bounds the walk and the tar."""
ENGINE_TEXT_LIMIT = 200
"""How much of an engine's own error text an install failure quotes (escaped, on one line)."""
MAX_PACK_DEPTH = 32
_CHUNK = 1 << 20
SKIP_DIRS = frozenset(
    {"__pycache__", ".git", ".hg", ".svn", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"}
)
"""Build debris `artifact_hash` passes over (with `*.egg-info` directories and SKIP_SUFFIXES files)."""
SKIP_SUFFIXES = (".pyc", ".pyo")
_VOLUME_RE = re.compile(r"agentnode-pack-[A-Za-z0-9_.-]{1,200}", re.ASCII)
_REINSTALL_CLEAN = "install from a clean copy of the pack that nothing else is writing to"


def _show(text: str, limit: int = 160) -> str:
    """A pack-authored name made safe to print: controls and bidi characters escaped, length bounded."""
    return safe_line(text, limit=limit)


# --- the pack's files: lstat first, refuse before reading, read through verified descriptors -------------


@dataclass(frozen=True)
class _PackFile:
    """A regular file as lstat saw it; the read later checks it is still this very file."""

    rel: str
    size: int
    executable: bool
    dev: int
    ino: int


@dataclass
class _Scan:
    """What the lstat walk found: the files to read, the directories (for the src/ layout), their size."""

    files: list[_PackFile] = field(default_factory=list)
    dirs: set[str] = field(default_factory=set)
    total: int = 0


_SPECIAL = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a Unix socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _open_dir(root_fd: int, parts: list[str]) -> int:
    """Open root/parts... one component at a time, never through a link (O_NOFOLLOW on each)."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _refuse(rel: str, problem: str, hint: str) -> PackError:
    return PackError(f"{_show(rel)}: {problem}", hint=hint)


def _scan(root_fd: int) -> _Scan:
    """Every file of the pack from lstat alone, in a stable order; refusals and size limits come before
    any byte is read. Only regular files and directories are accepted."""
    scan = _Scan()
    seen = 0
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        rel_dir, depth = stack.pop()
        try:
            dir_fd = _open_dir(root_fd, rel_dir.split("/") if rel_dir else [])
        except OSError:
            raise _refuse(rel_dir, "changed while the pack was being read", _REINSTALL_CLEAN) from None
        entries: list[tuple[str, os.stat_result]] = []
        try:
            with os.scandir(dir_fd) as it:
                for entry in it:
                    seen += 1
                    if seen > MAX_PACK_ENTRIES:
                        raise PackError(
                            f"the pack has more than {MAX_PACK_ENTRIES} files and directories",
                            hint="remove build output and data the pack does not need",
                        )
                    entries.append((entry.name, entry.stat(follow_symlinks=False)))
        finally:
            os.close(dir_fd)
        subdirs: list[str] = []
        for name, st in sorted(entries, key=lambda e: e[0]):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            mode = st.st_mode
            linkish = stat.S_ISLNK(mode)
            if (stat.S_ISDIR(mode) or linkish) and (name in SKIP_DIRS or name.endswith(".egg-info")):
                continue  # build debris: never followed, read or copied
            if (stat.S_ISREG(mode) or linkish) and name.endswith(SKIP_SUFFIXES):
                continue
            if not name.isprintable():
                raise _refuse(
                    rel,
                    "file names with control characters or undecodable bytes are not allowed",
                    "rename the file",
                )
            if linkish:
                raise _refuse(
                    rel, "symlinks are not allowed in a pack", "replace the link with the file it points to"
                )
            if stat.S_ISDIR(mode):
                if depth + 1 > MAX_PACK_DEPTH:
                    raise _refuse(
                        rel,
                        f"directories nest deeper than {MAX_PACK_DEPTH} levels",
                        "flatten the pack's layout",
                    )
                scan.dirs.add(rel)
                subdirs.append(rel)
            elif stat.S_ISREG(mode):
                if st.st_size > MAX_FILE_BYTES:
                    raise _refuse(
                        rel,
                        f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB",
                        "remove it from the pack (packs carry code, not data)",
                    )
                scan.total += st.st_size
                if scan.total > MAX_PACK_BYTES:
                    raise PackError(
                        f"the pack is larger than {MAX_PACK_BYTES // 2**20} MiB", hint="remove build output"
                    )
                scan.files.append(_PackFile(rel, st.st_size, bool(mode & 0o111), st.st_dev, st.st_ino))
            else:
                what = _SPECIAL.get(stat.S_IFMT(mode), "a special file")
                raise _refuse(
                    rel,
                    f"{what} is not allowed in a pack (only regular files and directories)",
                    "remove it from the pack directory",
                )
        stack.extend((d, depth + 1) for d in reversed(subdirs))
    return scan


def _changed(rel: str) -> PackError:
    return _refuse(rel, "changed while the pack was being installed", _REINSTALL_CLEAN)


def _open_file(root_fd: int, f: _PackFile) -> int:
    """Open the scanned file itself: no link followed, no FIFO blocking, and fstat must agree with lstat."""
    *parents, name = f.rel.split("/")
    try:
        dir_fd = _open_dir(root_fd, parents)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        raise _changed(f.rel) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_size) != (f.dev, f.ino, f.size):
        os.close(fd)
        raise _changed(f.rel)
    return fd


class _Reader:
    """Exactly `f.size` bytes of an opened pack file, in chunks, hashed as they pass."""

    def __init__(self, fd: int, f: _PackFile) -> None:
        self.fd, self.file, self.left = fd, f, f.size
        self.sha = hashlib.sha256()

    def read(self, n: int = _CHUNK) -> bytes:
        want = min(n if n >= 0 else _CHUNK, self.left, _CHUNK)
        if want <= 0:
            return b""
        data = os.read(self.fd, want)
        if not data:  # the file shrank after fstat
            raise _changed(self.file.rel)
        self.left -= len(data)
        self.sha.update(data)
        return data

    def finish(self) -> bytes:
        """The file's sha256, after checking it did not grow past the size that was checked."""
        while self.left:
            self.read()
        if os.read(self.fd, 1):
            raise _changed(self.file.rel)
        return self.sha.digest()


def _root_fd(pack_dir: Path) -> int:
    try:
        return os.open(pack_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PackError(
            f"{pack_dir}: cannot open the pack directory ({type(exc).__name__})",
            hint="point at a pack directory (see: agentnode-sandbox init)",
        ) from None


def artifact_hash(pack_dir: Path) -> str:
    """sha256 over every file's path and bytes, in a stable order: the pack's identity."""
    root_fd = _root_fd(pack_dir.resolve())
    try:
        h = hashlib.sha256()
        for f in _scan(root_fd).files:
            fd = _open_file(root_fd, f)
            try:
                h.update(f.rel.encode() + b"\0" + _Reader(fd, f).finish())
            finally:
                os.close(fd)
        return h.hexdigest()
    finally:
        os.close(root_fd)


@dataclass
class _Snapshot:
    """One read of the pack: its identity and a tar of exactly the bytes that were hashed (on disk)."""

    digest: str
    archive: IO[bytes]
    dirs: set[str]
    pyproject: bytes | None = None
    """The pack's pyproject.toml as hashed (None when it has none), for its requirements."""


def _check_scan(scan: _Scan) -> None:
    """Refusals that need the whole file list: names the host reserves, an oversized pyproject.toml."""
    reserved = reserved_name([*sorted(scan.dirs), *(f.rel for f in scan.files)])
    if reserved is not None:
        raise _refuse(
            reserved,
            "names starting with .agentnode- are reserved for the host (at the pack's root and under src/)",
            "rename or remove it",
        )
    for f in scan.files:
        if f.rel == PYPROJECT and f.size > MAX_PYPROJECT_BYTES:
            raise _refuse(
                f.rel,
                f"is larger than {MAX_PYPROJECT_BYTES // 1024} KiB",
                "shorten it (the host reads only [project].dependencies)",
            )


def _read_member(archive: IO[bytes], name: str) -> bytes | None:
    """One file of the snapshot's tar (None when absent); the archive is rewound afterwards."""
    archive.seek(0)
    try:
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            for member in tar:
                if member.name == name:
                    source = tar.extractfile(member)
                    return source.read() if source is not None else None
            return None
    finally:
        archive.seek(0)


@contextlib.contextmanager
def _snapshot(pack_dir: Path) -> Iterator[_Snapshot]:
    """Scan, then read each file once, streaming it into both the hash and a temporary tar.

    The volume and the host copy are both made from this tar, so they hold exactly what was hashed, and no
    file is ever held in memory whole.
    """
    with tempfile.TemporaryFile(prefix="agentnode-pack-") as archive:
        root_fd = _root_fd(pack_dir)
        try:
            scan = _scan(root_fd)
            _check_scan(scan)
            digest = _archive(root_fd, scan, archive)
        except OSError as exc:
            raise PackError(
                f"cannot stage the pack for install ({type(exc).__name__})",
                hint="check free space in the temporary directory (TMPDIR), then install again",
            ) from None
        finally:
            os.close(root_fd)
        has_pyproject = any(f.rel == PYPROJECT for f in scan.files)
        pyproject = _read_member(archive, PYPROJECT) if has_pyproject else None
        yield _Snapshot(digest, archive, scan.dirs, pyproject)


def _archive(root_fd: int, scan: _Scan, archive: IO[bytes]) -> str:
    """Write the scanned files into `archive` as a tar with neutral metadata; returns the artifact hash."""
    h = hashlib.sha256()
    with upload_tar(archive) as tar:
        for f in scan.files:
            fd = _open_file(root_fd, f)
            try:
                reader = _Reader(fd, f)
                info = tarfile.TarInfo(f.rel)
                info.size = f.size
                info.mode = 0o755 if f.executable else 0o644
                info.uid = info.gid = 0
                info.mtime = 0
                tar.addfile(info, reader)  # reads exactly info.size bytes, chunk by chunk
                h.update(f.rel.encode() + b"\0" + reader.finish())
            finally:
                os.close(fd)
    return h.hexdigest()


def _is_pack_volume(name: str | None) -> bool:
    """Only a name this module makes may be created or removed as a pack volume."""
    return bool(name) and _VOLUME_RE.fullmatch(name or "") is not None


def _inside(parent: Path, *names: str) -> Path:
    """parent/names..., refused unless each name is one plain component and the path resolves exactly there
    (no `..`, no link on the way): checked before anything is created or removed."""
    for name in names:
        if not name or name in {".", ".."} or "/" in name or "\0" in name:
            raise PackError(
                f"refusing a host path outside {parent}: {_show(name)!r} is not a plain name",
                hint="reinstall the pack with a valid package_id and version",
            )
    path = parent.joinpath(*names)
    if path.resolve() != parent.resolve().joinpath(*names):
        raise PackError(
            f"refusing {_show(str(path))}: it resolves outside {parent}",
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
            f"refusing volume name {_show(name)!r}", hint="reinstall the pack with a valid version"
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
    snap: _Snapshot,
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
                    shutil.copyfileobj(source, out, _CHUNK)
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
) -> LockEntry:
    """Install a pack: validate, hash, copy (volume for agents, host copy for host-trusted code), record.

    The pack's Python requirements (pyproject.toml) are resolved to wheels from `source` and installed
    with each copy (host/packs/requirements.py); `progress` gets a line per stage of that.
    What installs but is probably wrong (unknown or misspelled manifest keys, dependencies that are not
    installed) is appended to `warnings` when given: terminal-safe lines, at most MAX_WARNINGS and a count.
    """
    pack_dir = pack_dir.resolve()
    if not os.path.lexists(pack_dir / MANIFEST_NAME):
        raise PackError(
            f"{pack_dir}: no agentnode.yaml", hint="point at a pack directory (see: agentnode-sandbox init)"
        )
    level = Trust.parse(trust)
    if level is None:
        raise PackError(
            f"unknown trust level {_show(trust.strip().lower())!r}", hint=f"use one of: {', '.join(Trust)}"
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
    with _snapshot(pack_dir) as snap, tempfile.TemporaryDirectory(prefix="agentnode-wheels-") as wheels_tmp:
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
    "SKIP_DIRS",
    "SKIP_SUFFIXES",
    "LockEntry",
    "Lockfile",
    "artifact_hash",
    "install_pack",
    "populate_volume",
    "uninstall_pack",
    "verify_volume",
    "volume_name",
]
