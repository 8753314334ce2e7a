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
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from host.core.errors import PackError
from host.core.terminal import safe_line, safe_token
from host.engine.recipe import sha256_file
from host.packs.declared import Declared
from host.spec.wheels import _WHEEL_NAME, Wheel, identity, recorded_wheels

if TYPE_CHECKING:
    pass

Progress = Callable[[str], None]

MAX_WHEELS = 200
"""Wheels one resolution may bring (the requirements and everything they depend on)."""
MAX_WHEEL_BYTES = 512 * 2**20
"""Downloaded wheels in total, for one target."""
STOP_POLL_SECONDS = 0.5
"""How often a running download is checked against MAX_WHEELS and MAX_WHEEL_BYTES."""

DOWNLOAD_TIMEOUT = 900.0
_OUTPUT_TAIL = 64 * 1024



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


__all__ = [
    "Resolved",
    "Source",
    "Target",
    "Wheel",
    "compile_command",
    "download_command",
    "host_target",
    "identity",
    "image_target",
    "lock_record",
    "manylinux_platforms",
    "pip_env",
    "recorded_wheels",
    "resolve",
    "run_step",
    "summary",
    "venv_command",
    "venv_install_command",
]
