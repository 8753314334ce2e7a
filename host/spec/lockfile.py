"""The lockfile: the host's record of installed packs, read on every run, so reading it imports no engine SDK.

`list`, `audit` and the run path's routing read it; installing (host/packs/install) writes it. A manifest is
validated again only when an entry is used (LockEntry.parsed_manifest), and the requirement records only
when their wheels are asked for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from host.core.errors import ManifestError, PackError

if TYPE_CHECKING:
    from host.spec.manifest.model import AgentManifest, ToolpackManifest

LOCKFILE_VERSION = 1
MAX_LOCK_ENTRY_BYTES = 256 * 1024
"""One lockfile entry as JSON: every run of every agent reads the whole lockfile, so entries stay small."""
MAX_LOCKFILE_BYTES = 16 * 1024 * 1024
"""A lockfile over this is refused unparsed (an older host stored raw manifests, alias bombs included)."""


@dataclass(frozen=True)
class LockEntry:
    """One installed pack as the lockfile records it; `manifest` is the validated form (manifest_data)."""

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
    requirements: dict[str, Any] | None = None
    """The pack's Python requirements and the wheels installed for them (host/packs/requirements.lock_record);
    None when it has none (and in entries an older host wrote)."""

    @property
    def volume_digest(self) -> str:
        """What the sandbox volume holds: the artifact plus the recorded sandbox wheels (the artifact hash
        when there are none). Its name and label carry it, so a volume with other wheels is stale; a
        malformed record yields "" (no volume ever matches: the run fails closed)."""
        from host.spec.wheels import identity, recorded_wheels  # noqa: PLC0415  (installed packs only)

        try:
            return identity(self.artifact_hash, recorded_wheels(self.requirements, "sandbox"))
        except ValueError:
            return ""

    def host_interpreter(self) -> Path | None:
        """The interpreter of a trusted toolpack's own environment (None: it has no requirements and runs
        under the host's interpreter). A malformed record names a path that does not exist: fail closed."""
        from host.spec.wheels import VENV_DIR, recorded_wheels  # noqa: PLC0415

        try:
            wheels = recorded_wheels(self.requirements, "host")
        except ValueError:
            return Path("/nonexistent/agentnode-malformed-requirements/bin/python")
        if not wheels or self.package_type != "toolpack":
            return None
        return Path(self.host_path or "/nonexistent") / VENV_DIR / "bin" / "python"

    def parsed_manifest(self) -> AgentManifest | ToolpackManifest:
        """Validate the stored manifest again; an entry an older host wrote (or someone edited) may fail.
        The validated form is kept on this entry (frozen, like the manifest): the Lockfile hands out the
        same entry until the file changes, so a run does not parse its pack's manifest again."""
        kept = self.__dict__.get("_parsed")
        if kept is not None:
            return cast("AgentManifest | ToolpackManifest", kept)
        from host.spec.manifest.load import parse_manifest  # noqa: PLC0415  (YAML: not for `list`)

        try:
            parsed = parse_manifest(self.manifest, source=f"lockfile entry {self.slug}")
        except ManifestError as exc:
            raise ManifestError(
                exc.message,
                hint=f"reinstall it: agentnode-sandbox install <path-to-{self.slug}> (the entry was written "
                "by an older version of the host, or edited)",
            ) from None
        object.__setattr__(self, "_parsed", parsed)
        return parsed

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockEntry:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


class Lockfile:
    """The host's record of installed packs: bounded reads; writes serialized by a file lock and atomic."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._version: tuple[int, ...] | None = None
        """The file as last parsed (device, inode, size, mtime, ctime): unchanged, it is not read again."""
        self._data: dict[str, Any] = {}
        self._entries: dict[str, LockEntry] = {}
        """Entries of that version handed out so far (each keeps its parsed manifest)."""

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = open(f"{self.path}.lck", "a")  # closed by the `with` below
        except OSError as exc:
            raise self._unwritable(exc) from None
        with lock as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _unwritable(self, exc: OSError) -> PackError:
        return PackError(
            f"{self.path}: cannot write the lockfile ({type(exc).__name__})",
            hint=f"check free space and the permissions of {self.path.parent}, then try again",
        )

    def _too_big(self, size: int) -> PackError:
        return PackError(
            f"{self.path}: the lockfile is {size // 2**20} MiB, over the {MAX_LOCKFILE_BYTES // 2**20} MiB "
            "this host reads (an older host stored whole manifests in it)",
            hint="delete it (or restore a backup) and reinstall the packs",
        )

    def _read(self) -> dict[str, Any]:
        """The lockfile's data, to change and write back (its own copy of the packages table)."""
        data = self._current()[1]
        return {**data, "packages": dict(data["packages"])}

    def _current(self) -> tuple[tuple[int, ...] | None, dict[str, Any]]:
        """(version, data) of the file as it is now: parsed again only when it changed since the last read
        (a write replaces the file, an edit in place changes its size or times). The data is shared: read
        only. Runs read the lockfile on every run and every tool call; this is why they need not parse it.
        An unchanged file costs one stat: opening, checking and closing it again took a warm run ~0.15 ms."""
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with self._mutex:
                if version == self._version and stat.S_ISREG(st.st_mode):
                    return version, self._data
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None, {"lockfile_version": LOCKFILE_VERSION, "packages": {}}
        except OSError as exc:
            raise PackError(
                f"{self.path}: cannot read the lockfile ({type(exc).__name__})",
                hint="check its permissions (it belongs to the host's user, mode 0600)",
            ) from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise PackError(f"{self.path}: not a regular file", hint="delete it and reinstall the packs")
            if st.st_size > MAX_LOCKFILE_BYTES:
                raise self._too_big(st.st_size)
            version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with self._mutex:
                if version == self._version:
                    return version, self._data
            raw = fh.read(MAX_LOCKFILE_BYTES + 1)
        if len(raw) > MAX_LOCKFILE_BYTES:
            raise self._too_big(len(raw))
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise PackError(
                f"{self.path}: not valid JSON ({exc.__class__.__name__})",
                hint="restore it from a backup or delete it and reinstall the packs",
            ) from None
        packages = data.get("packages") if isinstance(data, dict) else None
        if not isinstance(packages, dict) or not all(isinstance(e, dict) for e in packages.values()):
            raise PackError(f"{self.path}: unexpected layout", hint="delete it and reinstall the packs")
        parsed = {**data, "packages": packages}
        with self._mutex:
            self._version, self._data, self._entries = version, parsed, {}
        return version, parsed

    def _write(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        if len(text) > MAX_LOCKFILE_BYTES:
            raise PackError(
                f"the lockfile would grow past {MAX_LOCKFILE_BYTES // 2**20} MiB",
                hint="uninstall packs that are no longer needed, then install again",
            )
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        try:
            tmp.write_text(text)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise self._unwritable(exc) from None

    def entries(self) -> dict[str, LockEntry]:
        version, data = self._current()
        return {slug: self._entry(version, slug, e) for slug, e in data["packages"].items()}

    def get(self, slug: str) -> LockEntry | None:
        version, data = self._current()
        raw = data["packages"].get(slug)
        return self._entry(version, slug, raw) if raw else None

    def _entry(self, version: tuple[int, ...] | None, slug: str, raw: dict[str, Any]) -> LockEntry:
        """The entry of this version of the file, made once (later calls get the same frozen object)."""
        with self._mutex:
            if version is not None and version == self._version and slug in self._entries:
                return self._entries[slug]
        entry = LockEntry.from_json(raw)
        with self._mutex:
            if version is not None and version == self._version:
                entry = self._entries.setdefault(slug, entry)
        return entry

    def put(self, entry: LockEntry) -> LockEntry | None:
        size = len(json.dumps(entry.to_json()))
        if size > MAX_LOCK_ENTRY_BYTES:
            raise entry_too_big(entry.slug, size)
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


def entry_too_big(slug: str, size: int) -> PackError:
    return PackError(
        f"the validated manifest of {slug} takes {size // 1024} KiB, over the {MAX_LOCK_ENTRY_BYTES // 1024} "
        "KiB a lockfile entry may hold",
        hint="shorten agent.goal, agent.system_prompt, tool descriptions or input schemas in agentnode.yaml",
    )
