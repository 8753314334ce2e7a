"""Placing resolved wheels where a pack's code runs: checked and unpacked into the import root's
`.agentnode-site` (the sandbox volume; a trusted agent's host copy) or installed into a trusted toolpack's
virtual environment, then compiled, with every size bounded before anything is written."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from host.core.errors import PackError
from host.core.terminal import safe_line, safe_token
from host.engine.tararchive import upload_tar

if TYPE_CHECKING:
    pass


from host.packs.requirements import (
    IMAGE_PYTHON,
    Finished,
    Progress,
    Resolved,
    compile_command,
    run_step,
    summary,
    venv_command,
    venv_install_command,
)

MAX_SITE_BYTES = 1024 * 2**20
"""Unpacked wheels in total (a wheel's sizes are checked before anything is written)."""
MAX_SITE_FILES = 50_000
SITE_DIR = ".agentnode-site"
"""Under the import root: the unpacked requirements (sandbox volume; host copy of a trusted agent)."""
INSTALL_TIMEOUT = 600.0
VENV_TIMEOUT = 120.0
COMPILE_TIMEOUT = 300.0


# --- placing them --------------------------------------------------------------------------------------


def _unsafe_member(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return (
        not parts
        or name.startswith("/")
        or "\\" in name
        or any(part in ("", ".", "..") or not part.isprintable() for part in parts)
    )


def _site_members(zf: zipfile.ZipFile, wheel: Path) -> list[tuple[zipfile.ZipInfo, tuple[str, ...]]]:
    """The files of a wheel that land in a site, with their paths there; an unsafe path is refused."""
    members: list[tuple[zipfile.ZipInfo, tuple[str, ...]]] = []
    for info in zf.infolist():
        if _unsafe_member(info.filename):
            shown = safe_line(info.filename, limit=80)
            raise PackError(
                f"{safe_token(wheel.name)} holds an unsafe path '{shown}'",
                hint="ask the pack's publisher to replace that requirement",
            )
        parts = PurePosixPath(info.filename).parts
        if parts[0].endswith(".data"):
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            parts = parts[2:]
        if not info.is_dir():
            members.append((info, parts))
    return members


def check_archives(wheels: Sequence[Path]) -> None:
    """Refuse wheels that hold an unsafe path or unpack, all together, to more than MAX_SITE_FILES files or
    MAX_SITE_BYTES, judged from their zip directories before a byte is extracted (by us or by pip)."""
    total = files = 0
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = _site_members(zf, wheel)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
            raise PackError(
                f"cannot read {safe_token(wheel.name)} ({type(exc).__name__})",
                hint="check free space in the temporary directory (TMPDIR), then install again",
            ) from None
        files += len(members)
        total += sum(info.file_size for info, _ in members)
        if files > MAX_SITE_FILES or total > MAX_SITE_BYTES:
            raise PackError(
                f"the pack's requirements unpack to more than {MAX_SITE_FILES} files or "
                f"{MAX_SITE_BYTES // 2**20} MiB",
                hint="ask the pack's publisher to trim its requirements",
            )


def unpack_site(wheels: Sequence[Path], site: Path) -> None:
    """Install wheels by unpacking them into `site` (an import root), each archive checked first.

    `<name>.data/purelib` and `platlib` merge into the root; scripts, headers and data are dropped (nothing
    runs them). Sizes and counts are bounded by what the archives declare, before any byte is written
    (zipfile stops at the declared size and fails the CRC of anything longer).
    """
    check_archives(wheels)
    site.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info, parts in _site_members(zf, wheel):
                    dest = site.joinpath(*parts)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, dest.open("wb") as out:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                    dest.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
            raise PackError(
                f"cannot unpack {safe_token(wheel.name)} ({type(exc).__name__})",
                hint="check free space in the temporary directory (TMPDIR), then install again",
            ) from None


def compile_site(site: Path, shown_as: str) -> None:
    """Byte-compile an unpacked site when this host's interpreter writes the bytecode its user reads; an
    optimization only, so a failure or timeout leaves the site as it is (the sources still import)."""
    run_step(compile_command(site, shown_as), timeout=COMPILE_TIMEOUT, cwd=site)


@contextlib.contextmanager
def site_archive(site: Path, prefix: str) -> Iterator[IO[bytes]]:
    """A tar of `site` under `prefix/` (directories 0755, files 0644 or 0755, owned by root, mtime 0)."""
    with tempfile.TemporaryFile(prefix="agentnode-site-") as archive:
        with upload_tar(archive) as tar:
            for top, dirs, names in os.walk(site):
                dirs.sort()
                rel_top = Path(top).relative_to(site)
                entries = [(name, True) for name in dirs] + [(name, False) for name in sorted(names)]
                if rel_top == Path("."):
                    entries.insert(0, ("", True))
                for name, is_dir in entries:
                    path = Path(top) / name if name else Path(top)
                    rel = (rel_top / name) if name else rel_top
                    arcname = f"{prefix}/{rel.as_posix()}" if rel != Path(".") else prefix
                    st = path.lstat()
                    info = tarfile.TarInfo(arcname)
                    info.uid = info.gid = 0
                    info.mtime = 0
                    if is_dir:
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        tar.addfile(info)
                    elif stat.S_ISREG(st.st_mode):
                        info.size = st.st_size
                        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                        with path.open("rb") as fh:
                            tar.addfile(info, fh)
        yield archive


def _step_failed(what: str, done: Finished, timeout: float) -> PackError:
    if done.code is None:
        return PackError(f"{what} did not finish within {timeout:.0f} s", hint="install again")
    return PackError(
        f"{what} failed (exit code {done.code}): {summary(done.output)}",
        hint="check free space and permissions under the host's config directory, then install again",
    )


def build_venv(env_dir: Path, resolved: Resolved, progress: Progress | None = None) -> None:
    """A virtual environment at `env_dir` holding exactly the resolved wheels (for a trusted toolpack)."""
    say = progress or (lambda _line: None)
    check_archives(resolved.paths())  # the same bounds as an unpacked site, before pip extracts anything
    say(f"requirements: creating the tool environment {env_dir.name}")
    done = run_step(venv_command(env_dir), timeout=VENV_TIMEOUT, cwd=env_dir.parent)
    if done.code != 0:
        raise _step_failed("creating the tool environment", done, VENV_TIMEOUT)
    say(f"requirements: installing {len(resolved.wheels)} wheel(s) into it")
    done = run_step(venv_install_command(env_dir, resolved.paths()), timeout=INSTALL_TIMEOUT, cwd=env_dir)
    if done.code != 0:
        raise _step_failed("installing the requirements into the tool environment", done, INSTALL_TIMEOUT)


def build_site(site: Path, resolved: Resolved, *, shown_as: str, progress: Progress | None = None) -> None:
    """The resolved wheels unpacked into `site`, byte-compiled when this host writes the right bytecode."""
    say = progress or (lambda _line: None)
    say(f"requirements: unpacking {len(resolved.wheels)} wheel(s) for {resolved.target.label}")
    unpack_site(resolved.paths(), site)
    target_python = IMAGE_PYTHON if resolved.target.platforms is not None else sys.version_info[:2]
    if sys.implementation.name == "cpython" and sys.version_info[:2] == target_python:
        compile_site(site, shown_as)
