"""Python requirements of packs: read from pyproject.toml, resolved to wheels with pip at install, placed
where the pack's code runs, so a run never downloads anything and nothing lands in the host's environment.

A pack's requirements are its `pyproject.toml` `[project].dependencies` (agentnode format §2.1), read as
data: the pack is never built, so no pack code runs on the host. Each is refused unless it is a plain PEP 508
requirement (no URL, no pip option), then handed to pip as its normalized text, never through a shell.
pip only ever sees `--only-binary=:all:` (no sdist is built, so no build backend runs either), runs in its
own process group under a timeout with a minimal environment, and its output (it can quote pack and index
text) is captured, never echoed: a failure is summarized in one escaped line.

Where the wheels go:
- code that runs in the sandbox (agents): wheels for the image's CPython 3.11 on glibc 2.36 and the engine's
  architecture, unpacked into `<import root>/.agentnode-site` inside the pack's read-only volume; the
  wrapper puts that directory on sys.path before it imports the entrypoint;
- trusted/curated toolpacks (run by the host's tool worker): wheels for the host's interpreter, installed
  into a virtual environment `<host copy>/.agentnode-venv` that the worker's interpreter is;
- trusted/curated agents on the host path: those host wheels unpacked into `<import root>/.agentnode-site`
  of the host copy (the wrapper needs the host's own grpc, so there is no venv).
The lockfile records each wheel's filename and sha256; the volume's and host copy's names and labels are
derived from them (`identity`), so a run whose volume does not hold the recorded wheels fails closed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from host.core.errors import PackError
from host.core.terminal import safe_line, safe_token
from host.engine.recipe import sha256_file
from host.engine.tararchive import upload_tar
from host.spec.wheels import _WHEEL_NAME, Wheel, identity, recorded_wheels

if TYPE_CHECKING:
    from packaging.requirements import Requirement

Progress = Callable[[str], None]

PYPROJECT = "pyproject.toml"
MAX_PYPROJECT_BYTES = 256 * 1024
MAX_REQUIREMENTS = 64
MAX_REQUIREMENT_CHARS = 200
MAX_WHEELS = 200
"""Wheels one resolution may bring (the requirements and everything they depend on)."""
MAX_WHEEL_BYTES = 512 * 2**20
"""Downloaded wheels in total, for one target."""
STOP_POLL_SECONDS = 0.5
"""How often a running download is checked against MAX_WHEELS and MAX_WHEEL_BYTES."""
MAX_SITE_BYTES = 1024 * 2**20
"""Unpacked wheels in total (a wheel's sizes are checked before anything is written)."""
MAX_SITE_FILES = 50_000

DOWNLOAD_TIMEOUT = 900.0
INSTALL_TIMEOUT = 600.0
VENV_TIMEOUT = 120.0
COMPILE_TIMEOUT = 300.0
_OUTPUT_TAIL = 64 * 1024

RESERVED_PREFIX = ".agentnode-"
"""Names the host places into a pack's copies; a pack may not bring its own (at its root or under src/)."""
SITE_DIR = ".agentnode-site"
"""Under the import root: the unpacked requirements (sandbox volume; host copy of a trusted agent)."""

HOST_RUNTIME_NAMES = frozenset({"agentnode-sdk"})
"""Distributions the host stands in for (the agentnode runtime): never resolved, a warning instead."""

IMAGE_PYTHON = (3, 11)
"""The image's interpreter (docker/: Debian 12's python3, CPython 3.11)."""
IMAGE_GLIBC = (2, 36)
"""The image's C library (Debian 12): manylinux wheels up to manylinux_2_36 run there."""

_ENV_KEEP = frozenset(
    {
        "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_DIRS",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy",
        "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC",
    }
)  # fmt: skip
"""What pip may see of the host's environment besides PIP_*: where its config, cache, proxy and CA are.
API keys and PYTHON* variables stay out."""

_PIP_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_UNREACHABLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Max retries exceeded",
    "Could not fetch URL",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "SSLError",
)


# --- what the pack declares ----------------------------------------------------------------------------


def _refused(what: str, problem: str, hint: str) -> PackError:
    return PackError(f"{PYPROJECT}: {what} {problem}", hint=hint)


def _shown(text: str) -> str:
    """A requirement as the pack wrote it, for an error line: escaped (once) and short, in quotes."""
    return f"'{safe_line(text, limit=80)}'"


_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".egg")


def validate_requirement(text: object, index: int) -> Requirement:
    """`[project].dependencies[index]` as a plain PEP 508 requirement, or a PackError saying why not.

    Refused: anything that is not a string, longer than MAX_REQUIREMENT_CHARS or not printable ASCII;
    anything that starts with `-` (a pip option, `-e`, `-r`, `--index-url`, ...); what packaging cannot
    parse as PEP 508 (which includes `--hash` and other per-line options); direct references (`name @ URL`).
    """
    where = f"[project].dependencies[{index}]"
    if not isinstance(text, str):
        raise _refused(where, "is not a string", "list requirements as strings, e.g. \"requests>=2.31\"")
    if len(text) > MAX_REQUIREMENT_CHARS:
        raise _refused(
            where, f"is longer than {MAX_REQUIREMENT_CHARS} characters", "shorten the requirement"
        )
    if not all(" " <= ch <= "~" for ch in text):
        raise _refused(
            where,
            f"{_shown(text)} holds characters other than printable ASCII",
            "write the requirement in plain ASCII (PEP 508)",
        )
    if text.strip().startswith("-"):
        raise _refused(
            where,
            f"{_shown(text)} looks like a pip option; only PEP 508 requirements are installed",
            "remove it; the host decides where packages come from (install --offline --find-links DIR)",
        )
    from packaging.requirements import InvalidRequirement, Requirement  # noqa: PLC0415  (install only)

    try:
        req = Requirement(text)
    except InvalidRequirement:
        raise _refused(
            where,
            f"{_shown(text)} is not a PEP 508 requirement",
            "write it as NAME[extras] SPECIFIERS [; marker], e.g. \"requests>=2.31\"",
        ) from None
    if req.name.lower().endswith(_ARCHIVE_SUFFIXES):
        # pip reads such a name as a local file to unpack (and build), whatever --only-binary says
        raise _refused(
            where,
            f"{_shown(text)} names an archive file, not a package",
            "list the package by its name; for a wheel that is on no index, install with --offline "
            "--find-links DIR holding it",
        )
    if req.url:
        raise _refused(
            where,
            f"{_shown(text)} is a direct URL reference ({req.name} @ ...); only requirements resolved "
            "from an index are installed",
            f"use a version specifier for {req.name}; for a wheel that is on no index, install with "
            "--offline --find-links DIR holding it",
        )
    return req


@dataclass(frozen=True)
class Declared:
    """A pack's requirements, validated: what goes to pip (normalized text), and what installs but is odd."""

    requirements: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        from packaging.requirements import Requirement  # noqa: PLC0415  (install only)

        return frozenset(canonicalize_name(Requirement(r).name) for r in self.requirements)


def read_requirements(pyproject: bytes | None, pack_refs: Iterable[str] = ()) -> Declared:
    """`[project].dependencies` of a pack's pyproject.toml (None: the pack has none), validated.

    Optional dependencies are never installed (as by the agentnode SDK); `agentnode-sdk` is left to the
    host (a warning); so is a requirement naming an agentnode pack in `pack_refs` (the manifest's
    `dependencies` and the packs installed here): real packs list other packs there, which are no PyPI
    projects (a warning). Dependencies declared `dynamic` cannot be known without building the pack (a
    warning: nothing is installed).
    """
    packs = frozenset(canonicalize_name(ref) for ref in pack_refs)
    if pyproject is None:
        return Declared()
    if len(pyproject) > MAX_PYPROJECT_BYTES:
        raise _refused("", f"is larger than {MAX_PYPROJECT_BYTES // 1024} KiB", "shorten pyproject.toml")
    try:
        data = tomllib.loads(pyproject.decode("utf-8"))
    except UnicodeDecodeError:
        raise _refused("", "is not UTF-8", "save pyproject.toml as UTF-8") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        problem = "nests too deep" if isinstance(exc, RecursionError) else safe_line(str(exc), limit=120)
        raise _refused("", f"is not valid TOML ({problem})", "fix it, then install again") from None
    project = data.get("project")
    if project is None:
        return Declared()
    if not isinstance(project, dict):
        raise _refused("[project]", "is not a table", "fix pyproject.toml, then install again")
    warnings: list[str] = []
    dynamic = project.get("dynamic")
    if isinstance(dynamic, list) and "dependencies" in dynamic:
        warnings.append(
            f"{PYPROJECT} declares [project].dependencies dynamic: the host never builds a pack, so none "
            "are installed (list them in [project].dependencies)"
        )
    raw = project.get("dependencies")
    if raw is None:
        return Declared(warnings=tuple(warnings))
    if not isinstance(raw, list):
        raise _refused("[project].dependencies", "is not a list", "make it a list of requirement strings")
    if len(raw) > MAX_REQUIREMENTS:
        raise _refused(
            "[project].dependencies",
            f"lists {len(raw)} requirements, more than the {MAX_REQUIREMENTS} this host installs",
            "trim the list to what the pack imports",
        )
    requirements: list[str] = []
    for index, text in enumerate(raw):
        req = validate_requirement(text, index)
        if canonicalize_name(req.name) in HOST_RUNTIME_NAMES:
            warnings.append(
                f"requirement {req.name} is not installed: this host provides the agentnode runtime "
                "(AgentContext) itself"
            )
            continue
        if canonicalize_name(req.name) in packs:
            warnings.append(
                f"requirement {req.name} names an agentnode pack, not a Python package: it is not installed "
                "with pip (install the pack itself; agents call it with run_tool)"
            )
            continue
        requirements.append(str(req))
    return Declared(tuple(requirements), tuple(warnings))


# --- where wheels must run, and where they come from -------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The interpreter and platform wheels are chosen for; `platforms` None means pip's running one."""

    name: str
    """Recorded in the lockfile, e.g. `cp311-manylinux_2_36_x86_64`."""
    label: str
    """For people, e.g. `CPython 3.11 manylinux x86_64 (the sandbox image)`."""
    pip_args: tuple[str, ...] = ()
    platforms: frozenset[str] | None = None


def manylinux_platforms(arch: str, glibc: tuple[int, int] = IMAGE_GLIBC) -> tuple[str, ...]:
    """Every manylinux platform tag a glibc `glibc` system of `arch` runs, newest first (pip expands only
    the legacy aliases itself, so the list is spelled out)."""
    tags = [f"manylinux_{glibc[0]}_{minor}_{arch}" for minor in range(glibc[1], 16, -1)]
    tags.append(f"manylinux2014_{arch}")
    if arch in ("x86_64", "i686"):
        tags += [f"manylinux_2_{minor}_{arch}" for minor in range(16, 4, -1)]
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tuple(tags)


def image_target(arch: str) -> Target:
    """The sandbox image's interpreter on the engine's architecture (`x86_64` or `aarch64`)."""
    major, minor = IMAGE_PYTHON
    platforms = manylinux_platforms(arch)
    args: list[str] = []
    for platform in platforms:
        args += ["--platform", platform]
    args += [
        "--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}",
    ]  # fmt: skip
    return Target(
        name=f"cp{major}{minor}-manylinux_{IMAGE_GLIBC[0]}_{IMAGE_GLIBC[1]}_{arch}",
        label=f"CPython {major}.{minor} manylinux {arch} (the sandbox image)",
        pip_args=tuple(args),
        platforms=frozenset(platforms),
    )


def host_target() -> Target:
    """This host's own interpreter (what a trusted pack's code runs under)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform = sysconfig.get_platform()
    return Target(
        name=f"{sys.implementation.cache_tag}-{platform}",
        label=f"this host's Python {version} ({platform})",
    )


@dataclass(frozen=True)
class Source:
    """Where pip may look: the configured index (the operator's pip configuration), or with `offline` only
    the `find_links` directories (and any pip's own configuration names)."""

    offline: bool = False
    find_links: tuple[Path, ...] = ()

    def pip_args(self) -> list[str]:
        args = ["--no-index"] if self.offline else []
        for directory in self.find_links:
            args += ["--find-links", str(directory.resolve())]
        return args


# --- commands, as data ---------------------------------------------------------------------------------

_PIP = (sys.executable, "-I", "-m", "pip")
_QUIET = ("--no-input", "--disable-pip-version-check", "--progress-bar", "off")


def download_command(requirements: Sequence[str], target: Target, source: Source, dest: Path) -> list[str]:
    """Resolve `requirements` (dependencies included) to wheels for `target`, saved into `dest`."""
    return [
        *_PIP, "download", *_QUIET, "--only-binary=:all:", "--dest", str(dest),
        *target.pip_args, *source.pip_args(), "--", *requirements,
    ]  # fmt: skip


def venv_command(env_dir: Path) -> list[str]:
    """An empty virtual environment (no pip inside: the host's pip installs into it)."""
    return [sys.executable, "-I", "-m", "venv", "--without-pip", str(env_dir)]


def venv_install_command(env_dir: Path, wheels: Sequence[Path]) -> list[str]:
    """Install exactly these wheel files into the environment: no index, no resolution, no build, and
    (`--isolated`) no PIP_* variable such as PIP_TARGET or PIP_USER sending them somewhere else."""
    python = env_dir / "bin" / "python"
    return [
        *_PIP, "--python", str(python), "--isolated", "install", *_QUIET, "--no-index", "--no-deps",
        "--only-binary=:all:", "--no-warn-script-location", "--", *(str(w) for w in wheels),
    ]  # fmt: skip


def compile_command(site: Path, shown_as: str) -> list[str]:
    """Byte-compile an unpacked site (hash-based, unchecked: the volume never changes), with tracebacks
    naming `shown_as` (where the site is seen at run time)."""
    return [
        sys.executable, "-I", "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
        "-d", shown_as, str(site),
    ]  # fmt: skip


def pip_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """pip's environment: the host's pip configuration, proxies and CA, nothing else (no API keys)."""
    source = os.environ if env is None else env
    kept = {k: v for k, v in source.items() if k in _ENV_KEEP or k.startswith("PIP_")}
    return {**kept, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@dataclass(frozen=True)
class Finished:
    """How a step (pip, venv, compileall) ended: its exit code (None: killed at the timeout) and the tail
    of its output."""

    code: int | None
    output: str
    stopped: bool = False
    """The caller's `stop()` ended it (a bound was crossed), not the timeout."""


def run_step(
    cmd: Sequence[str], *, timeout: float, cwd: Path, stop: Callable[[], bool] | None = None
) -> Finished:
    """Run one command in its own process group, output captured to a file; the group is killed at the
    timeout (pip --python starts a second interpreter), when the caller is interrupted, or as soon as
    `stop()` (polled every STOP_POLL_SECONDS) says so: code None, `stopped` True."""
    with tempfile.TemporaryFile(prefix="agentnode-pip-") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=pip_env(),
            start_new_session=True,
        )
        code: int | None = None
        stopped = False
        deadline = time.monotonic() + timeout
        try:
            while code is None and time.monotonic() < deadline and not stopped:
                try:
                    code = proc.wait(timeout=min(STOP_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    stopped = stop is not None and stop()
        finally:
            if proc.returncode is None:  # not reaped yet: the group id is still this process's
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - _OUTPUT_TAIL))
        return Finished(code, out.read().decode("utf-8", "replace"), stopped)


def summary(output: str, limit: int = 240) -> str:
    """pip's last error line (or its last line), escaped and short: pip quotes pack and index text."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    pick = errors[-1] if errors else (lines[-1] if lines else "no output")
    return safe_line(pick.removeprefix("ERROR:").strip(), limit=limit)


# --- resolving -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """The wheels for one target, downloaded into `directory` and hashed."""

    target: Target
    wheels: tuple[Wheel, ...]
    directory: Path

    def paths(self) -> list[Path]:
        return [self.directory / w.filename for w in self.wheels]

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target.name, "wheels": [w.to_json() for w in self.wheels]}


def _missing_wheel(name: str, declared: Declared, target: Target, source: Source) -> PackError:
    shown = safe_token(name)
    whose = "" if canonicalize_name(name) in declared.names else " (needed by one of the pack's requirements)"
    where = " in the --find-links directories" if source.offline else ""
    if source.offline:
        hint = (
            f"put a wheel of {shown} for {target.label} into a --find-links directory (pip download "
            f"--only-binary=:all: ... {shown}), then install again"
        )
    else:
        hint = (
            f"ask the pack's publisher for a requirement that has a wheel for {target.label}, or install "
            "with --offline --find-links DIR holding one"
        )
    return PackError(f"no wheel of {shown}{whose} for {target.label}{where}", hint=hint)


def _resolve_failed(done: Finished, declared: Declared, target: Target, source: Source) -> PackError:
    if done.code is None:
        return PackError(
            f"resolving the pack's requirements for {target.label} did not finish within "
            f"{DOWNLOAD_TIMEOUT:.0f} s",
            hint="check the connection to the package index, or install with --offline --find-links DIR",
        )
    if match := _NO_MATCH.search(done.output):
        name = _PIP_NAME.match(match.group(1))
        if name:
            return _missing_wheel(name.group(), declared, target, source)
    if "ResolutionImpossible" in done.output or "conflicting dependencies" in done.output:
        return PackError(
            f"the pack's requirements conflict for {target.label}: {summary(done.output)}",
            hint="ask the pack's publisher to fix the requirements in pyproject.toml",
        )
    if not source.offline and any(marker in done.output for marker in _UNREACHABLE):
        return PackError(
            "cannot reach the package index to resolve the pack's requirements",
            hint="check the network and pip's index configuration, or install with --offline --find-links "
            "DIR",
        )
    return PackError(
        f"resolving the pack's requirements for {target.label} failed (pip exit code {done.code}): "
        f"{summary(done.output)}",
        hint="check the requirements in pyproject.toml and pip's configuration, then install again",
    )


def _over_download_bounds(directory: Path) -> bool:
    """Whether pip's download directory already holds more than the wheels or bytes one resolution may
    bring (pip's partial files included)."""
    files = total = 0
    with os.scandir(directory) as it:
        for entry in it:
            files += 1
            with contextlib.suppress(OSError):
                total += entry.stat(follow_symlinks=False).st_size
    return files > MAX_WHEELS or total > MAX_WHEEL_BYTES


def _downloaded(directory: Path, target: Target) -> tuple[Wheel, ...]:
    """The wheels pip saved, checked (names, count, total size, platform) and hashed."""
    with os.scandir(directory) as it:
        entries = sorted(it, key=lambda e: e.name)
    if len(entries) > MAX_WHEELS:
        raise PackError(
            f"the pack's requirements resolve to more than {MAX_WHEELS} wheels",
            hint="ask the pack's publisher to trim its requirements",
        )
    total = 0
    wheels: list[Wheel] = []
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or not _WHEEL_NAME.fullmatch(entry.name):
            raise PackError(
                f"pip left something other than a wheel: {safe_token(entry.name)}",
                hint="check pip's configuration, then install again",
            )
        try:
            _, _, _, tags = parse_wheel_filename(entry.name)
        except InvalidWheelFilename:
            raise PackError(
                f"pip saved a wheel with an invalid name: {safe_token(entry.name)}", hint="report this"
            ) from None
        if target.platforms is not None and not any(
            t.platform == "any" or t.platform in target.platforms for t in tags
        ):
            raise PackError(
                f"{safe_token(entry.name)} does not run on {target.label}",
                hint="remove it from the --find-links directory, then install again",
            )
        total += st.st_size
        if total > MAX_WHEEL_BYTES:
            raise PackError(
                f"the pack's requirements take more than {MAX_WHEEL_BYTES // 2**20} MiB of wheels",
                hint="ask the pack's publisher to trim its requirements",
            )
        wheels.append(Wheel(entry.name, sha256_file(Path(entry.path))))
    return tuple(wheels)


def resolve(
    declared: Declared, target: Target, source: Source, directory: Path, progress: Progress | None = None
) -> Resolved:
    """Resolve the requirements for `target` with `pip download` into `directory` (empty), or refuse
    naming the requirement that has no wheel."""
    say = progress or (lambda _line: None)
    count = len(declared.requirements)
    say(f"requirements: resolving {count} requirement(s) for {target.label}")
    done = run_step(
        download_command(declared.requirements, target, source, directory),
        timeout=DOWNLOAD_TIMEOUT,
        cwd=directory,
        stop=lambda: _over_download_bounds(directory),  # refused while pip downloads, not after
    )
    if done.stopped:
        raise PackError(
            f"the pack's requirements resolve to more than {MAX_WHEELS} wheels or "
            f"{MAX_WHEEL_BYTES // 2**20} MiB of downloads",
            hint="ask the pack's publisher to trim its requirements",
        )
    if done.code != 0:
        raise _resolve_failed(done, declared, target, source)
    wheels = _downloaded(directory, target)
    size = sum((directory / w.filename).stat().st_size for w in wheels)
    say(f"requirements: {len(wheels)} wheel(s), {size / 2**20:.1f} MiB, sha256 recorded")
    return Resolved(target, wheels, directory)


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


# --- the lockfile's record -----------------------------------------------------------------------------


def lock_record(declared: Declared, sandbox: Resolved | None, host: Resolved | None) -> dict[str, Any] | None:
    """What the lockfile keeps about a pack's requirements (None when it has none)."""
    if not declared.requirements:
        return None
    record: dict[str, Any] = {"declared": list(declared.requirements)}
    if sandbox is not None:
        record["sandbox"] = sandbox.to_json()
    if host is not None:
        record["host"] = host.to_json()
    return record


def reserved_name(paths: Iterable[str]) -> str | None:
    """The first pack path that uses a name the host reserves (at the root, or directly under src/)."""
    for rel in paths:
        parts = rel.split("/")
        if parts[0].startswith(RESERVED_PREFIX) or (
            parts[0] == "src" and len(parts) > 1 and parts[1].startswith(RESERVED_PREFIX)
        ):
            return rel
    return None


__all__ = [
    "HOST_RUNTIME_NAMES",
    "MAX_PYPROJECT_BYTES",
    "MAX_REQUIREMENTS",
    "MAX_REQUIREMENT_CHARS",
    "PYPROJECT",
    "SITE_DIR",
    "Declared",
    "Resolved",
    "Source",
    "Target",
    "Wheel",
    "build_site",
    "build_venv",
    "compile_command",
    "download_command",
    "host_target",
    "identity",
    "image_target",
    "lock_record",
    "manylinux_platforms",
    "pip_env",
    "read_requirements",
    "recorded_wheels",
    "reserved_name",
    "resolve",
    "run_step",
    "site_archive",
    "summary",
    "validate_requirement",
    "venv_command",
    "venv_install_command",
]
