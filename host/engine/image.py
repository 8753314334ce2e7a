"""Builds, labels and verifies the pinned sandbox image, so every run uses a known, offline-built rootfs."""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from host.core.errors import AuditReason, EngineError, EngineRejected
from host.engine.errors import engine_errors
from host.engine.facts import EngineKind, facts_from
from host.engine.labels import LABEL_PROTOCOL
from host.engine.pin import (
    _ID_PIN,
    BUILD_HINT,
    LABEL_INPUTS_HASH,
    AnyClient,
    _get_image,
    _labels,
    _matches_pin,
    _protocol,
    pinned_image_missing,
    verify_pinned_image,
)
from sandbox_wrapper.protocol import PROTOCOL_VERSION

if TYPE_CHECKING:
    import docker


Progress = Callable[[str], None]

REPOSITORY = "agentnode-sandbox"
DISTRIBUTION = "agentnode-sandbox"
"""The project's distribution name (its metadata labels an image built from an installed wheel)."""
BASE_REPOSITORY = "agentnode-sandbox-base"
LATEST_TAG = f"{REPOSITORY}:latest"
LABEL_ROOTFS_HASH = "io.agentnode.sandbox.rootfs-hash"
PULL_HINT = (
    "check the reference and that the engine can reach its registry (docker pull REF); "
    "without a registry, build the image here: agentnode-sandbox image build"
)

DOCKER_INPUTS = ("Dockerfile", "requirements.txt", "rootfs.packages", "agentnode.pth")
"""The files under docker/ that shape the image (README.md does not)."""

SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
DPKG_OPTS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",  # licence texts stay with the binaries
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
CUSTOMIZE_HOOK = """set -eu
r="$1"
echo 'sandbox:*:65532:65532:agentnode sandbox:/home/sandbox:/usr/sbin/nologin' >>"$r/etc/passwd"
echo 'sandbox:*:65532:' >>"$r/etc/group"
install -d -m 0750 -o 65532 -g 65532 "$r/home/sandbox"
install -d -m 0755 "$r/pack" "$r/run/agentnode"
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/* "$r"/var/log/* \\
  "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/*
find "$r" -xdev -type f -perm /6000 -exec chmod ug-s {} +
chroot "$r" /usr/bin/python3 -m compileall -q -j0 --invalidation-mode unchecked-hash /usr/lib/python3.11
"""
"""Runs inside mmdebstrap as root: the non-root user, the mountpoints, no setuid/setgid binaries (su,
newgrp, ...: nothing in a run may gain privileges), nothing else a run does not need, and the standard
library's bytecode: Debian compiles only part of it at install, and the root is read-only at run time, so
without it every sandbox compiled asyncio, json, email, ... from source again (~0.1 s of each cold run)."""

# Wheel architecture (`EngineFacts.architecture`) -> Debian architecture.
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
WHEEL_PYTHON = "3.11"
BYTECODE_VERSION = (3, 11)


@dataclass(frozen=True)
class BuildResult:
    """What `build_image` produced; `image_id` is what the caller records as the pin."""

    image_id: str
    tag: str
    inputs_hash: str
    built: bool


@dataclass(frozen=True)
class PullResult:
    """What `pull_image` got; `pin` is what the caller records (agent_sandbox.image)."""

    ref: str
    image_id: str
    pin: str


@dataclass(frozen=True)
class ImageStatus:
    """What `doctor`/`image status` report about the pinned (or latest built) image."""

    present: bool
    image_id: str | None
    protocol: int | None
    inputs_hash: str | None
    matches_pin: bool
    current_inputs_hash: str | None
    up_to_date: bool


@dataclass(frozen=True)
class PinnedWheel:
    """One `name==version --hash=...` line of docker/requirements.txt."""

    name: str
    version: str
    hashes: frozenset[str]


def default_repo_root() -> Path:
    """Where the image inputs are: the source checkout this module lives in (docker/, sandbox_wrapper/),
    or, installed from a wheel, the site-packages directory (sandbox_wrapper/ and host/_image_inputs/)."""
    return Path(__file__).resolve().parents[2]


def docker_inputs(repo_root: Path) -> Path:
    """The directory holding DOCKER_INPUTS: docker/ in a source checkout, else the copy a wheel ships as
    package data (host/_image_inputs; a symlink to docker/ in the checkout). Never site-packages' docker/,
    which is the Docker SDK."""
    checkout = repo_root / "docker"
    if (checkout / "Dockerfile").is_file():
        return checkout
    return repo_root / "host" / "_image_inputs"


def _wrapper_sources(repo_root: Path) -> list[Path]:
    """The wrapper files that go into the image: every .py of the package, never bytecode caches."""
    pkg = repo_root / "sandbox_wrapper"
    return sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.relative_to(pkg).parts)


def _recipe() -> bytes:
    """The rootfs recipe as bytes, so changing how the rootfs is made changes the hashes too."""
    return "\n".join((SUITE, *MIRRORS, *DPKG_OPTS, CUSTOMIZE_HOOK)).encode()


def _digest(entries: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over named entries, sorted by name and length-framed so no two inputs can collide."""
    h = hashlib.sha256()
    for name, data in sorted(entries):
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def image_inputs_hash(repo_root: Path) -> str:
    """Hash of everything that shapes the image; the tag and label that let a rebuild be skipped."""
    inputs = docker_inputs(repo_root)
    entries = [(f"docker/{n}", (inputs / n).read_bytes()) for n in DOCKER_INPUTS]
    entries += [(p.relative_to(repo_root).as_posix(), p.read_bytes()) for p in _wrapper_sources(repo_root)]
    entries += [("PROTOCOL_VERSION", str(PROTOCOL_VERSION).encode()), ("recipe", _recipe())]
    entries += [("bytecode", f"unchecked-hash {BYTECODE_VERSION}".encode())]
    return _digest(entries)


def rootfs_hash(repo_root: Path, arch: str) -> str:
    """Hash of what shapes the imported base alone, so wrapper edits reuse the slow mmdebstrap rootfs."""
    packages = (docker_inputs(repo_root) / "rootfs.packages").read_bytes()
    return _digest([("packages", packages), ("recipe", _recipe()), ("arch", arch.encode())])


def read_packages(path: Path) -> list[str]:
    """The Debian package list: one name a line, `#` comments and blank lines ignored."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def parse_requirements(text: str) -> tuple[PinnedWheel, ...]:
    """Parse a hash-pinned requirements file; refuses anything not `name==version` with hashes."""
    logical = re.sub(r"\\\n", " ", text)
    pins = []
    for raw in logical.splitlines():
        tokens = raw.split("#", 1)[0].split()
        if not tokens:
            continue
        name, sep, version = tokens[0].partition("==")
        hashes = frozenset(
            t.removeprefix("--hash=sha256:") for t in tokens[1:] if t.startswith("--hash=sha256:")
        )
        if not sep or not name or not version or not hashes or len(hashes) != len(tokens) - 1:
            raise ValueError(f"requirements: {tokens[0]!r} must be `name==version --hash=sha256:...` only")
        pins.append(PinnedWheel(name=name, version=version, hashes=hashes))
    return tuple(pins)


def sha256_file(path: Path) -> str:
    """A file's sha256 (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_wheels(pins: Iterable[PinnedWheel], cache_dir: Path, arch: str) -> dict[str, Path] | None:
    """The cached wheel for each pin (right name, version, arch and a pinned hash), or None if any is missing.

    Hashes are re-checked on every use, so a tampered cache is never trusted.
    """
    found: dict[str, Path] = {}
    candidates = sorted(cache_dir.glob("*.whl")) if cache_dir.is_dir() else []
    for pin in pins:
        prefix = f"{re.sub(r'[-_.]+', '_', pin.name).lower()}-{pin.version}-"
        for wheel in candidates:
            platform = wheel.name.removesuffix(".whl").rsplit("-", 1)[-1]
            if (
                wheel.name.lower().startswith(prefix)
                and (platform == "any" or f"_{arch}" in platform)
                and sha256_file(wheel) in pin.hashes
            ):
                found[pin.name] = wheel
                break
        else:
            return None
    return found


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Install a wheel by unpacking it: the archive *is* the pure-file layout of an import root.

    `<name>.data/purelib` and `platlib` merge into the root; scripts, headers and data have no place in
    an image without a shell-facing install, so they are dropped.
    """
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.filename.startswith("/") or ".." in parts or "\\" in info.filename:
                raise ValueError(f"{wheel.name}: unsafe path {info.filename!r}")
            if parts and parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            if info.is_dir():
                continue
            dest = site.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out)
            dest.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def copy_wrapper(repo_root: Path, site: Path) -> None:
    """Copy the sandbox_wrapper sources (exactly the hashed set) into the image's import root."""
    for src in _wrapper_sources(repo_root):
        dest = site / src.relative_to(repo_root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        dest.chmod(0o644)


def _stream(cmd: list[str], progress: Progress, stage: str) -> int:
    """Run a command, passing each output line to `progress` as `<stage>: <line>`; returns the exit code."""
    with subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                progress(f"{stage}: {line.rstrip()}")
        return proc.wait()


def _build_failed(message: str, hint: str = BUILD_HINT) -> EngineError:
    return EngineError(message, reason=AuditReason.IMAGE_MISSING, hint=hint, check="image")


def daemon_arch(client: docker.DockerClient) -> str:
    """The engine's CPU architecture in wheel terms (`EngineFacts.architecture`, normalized from either
    engine's answer); refuses ones the image has no wheels for."""
    with engine_errors():
        arch = facts_from(client.info(), EngineKind.DOCKER).architecture  # the kind changes no architecture
    if arch not in DEBIAN_ARCH:
        raise _build_failed(
            f"no sandbox image recipe for engine architecture {arch!r}",
            hint="use an x86_64 or aarch64 engine",
        )
    return arch


def _ensure_base(
    client: docker.DockerClient, repo_root: Path, arch: str, progress: Progress, force: bool
) -> str:
    """Make (or reuse) the imported mmdebstrap rootfs image; returns its tag."""
    fs_hash = rootfs_hash(repo_root, arch)
    tag = f"{BASE_REPOSITORY}:{fs_hash[:12]}"
    existing = _get_image(client, tag)
    if existing is not None and not force and _labels(existing).get(LABEL_ROOTFS_HASH) == fs_hash:
        progress(f"rootfs: reusing {tag}")
        return tag
    if shutil.which("mmdebstrap") is None:
        raise _build_failed(
            "mmdebstrap is not installed", hint="apt-get install mmdebstrap (or run scripts/provision-engine)"
        )
    packages = read_packages(docker_inputs(repo_root) / "rootfs.packages")
    with tempfile.TemporaryDirectory(prefix="agentnode-rootfs-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        cmd = [
            "mmdebstrap",
            "--variant=essential",
            f"--architectures={DEBIAN_ARCH[arch]}",
            f"--include={','.join(packages)}",
            # merged /usr without the usrmerge package (which drags in perl, ~50 MB)
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            "--skip=cleanup/run",  # keep /run/agentnode, the socket mountpoint
            *(f"--dpkgopt={opt}" for opt in DPKG_OPTS),
            f"--customize-hook={CUSTOMIZE_HOOK}",
            SUITE,
            str(tar),
            *MIRRORS,
        ]
        progress(f"rootfs: mmdebstrap {SUITE} + {', '.join(packages)}")
        code = _stream(cmd, progress, "rootfs")
        if code != 0:
            raise _build_failed(f"mmdebstrap failed with exit code {code} (see the rootfs: lines)")
        progress(f"import: {tar.stat().st_size // 2**20} MiB rootfs as {tag}")
        with engine_errors():
            answer = client.api.import_image_from_file(
                str(tar),
                repository=BASE_REPOSITORY,
                tag=fs_hash[:12],
                changes=[f"LABEL {LABEL_ROOTFS_HASH}={fs_hash}"],
            )
            # Podman's compatible API ignores `tag` on import (it names the image `…:latest`): tag the
            # imported id ourselves, which dockerd has already done and takes again as a no-op.
            client.images.get(imported_image_id(answer)).tag(BASE_REPOSITORY, fs_hash[:12])
    return tag


def imported_image_id(answer: object) -> str:
    """The image id an engine's import answer names (its last JSON line's `status`, on dockerd and Podman)."""
    text = answer.decode("utf-8", "replace") if isinstance(answer, bytes) else str(answer)
    for line in reversed(text.splitlines()):
        try:
            status = json.loads(line).get("status", "") if line.strip() else ""
        except (ValueError, AttributeError):
            continue
        if isinstance(status, str) and _ID_PIN.fullmatch(status):
            return status
    raise _build_failed("the engine's answer to the rootfs import names no image id")


def wheel_cache_dir() -> Path:
    """Where downloaded wheels are kept between builds (XDG cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentnode-sandbox" / "wheels"


def fetch_wheels(repo_root: Path, arch: str, cache_dir: Path, progress: Progress) -> list[Path]:
    """The hash-verified wheels for `arch`, from the cache or `pip download --require-hashes`."""
    requirements = docker_inputs(repo_root) / "requirements.txt"
    try:
        pins = parse_requirements(requirements.read_text())
    except ValueError as exc:
        raise _build_failed(
            f"docker/requirements.txt cannot be used: {exc}",
            hint="pin every wheel as `name==version --hash=sha256:...` in docker/requirements.txt, "
            "then rerun the build",
        ) from None
    found = cached_wheels(pins, cache_dir, arch)
    if found is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "pip", "download", "--require-hashes", "--no-deps", "--only-binary=:all:",
            "--platform", f"manylinux2014_{arch}", "--python-version", WHEEL_PYTHON, "--implementation", "cp",
            "--disable-pip-version-check", "-d", str(cache_dir), "-r", str(requirements),
        ]  # fmt: skip
        code = _stream(cmd, progress, "wheels")
        found = cached_wheels(pins, cache_dir, arch) if code == 0 else None
        if found is None:
            raise _build_failed(
                f"pip download of the pinned wheels failed (exit code {code})",
                hint="check PyPI access and docker/requirements.txt, then rerun the build",
            )
    for wheel in found.values():
        progress(f"wheels: {wheel.name} (sha256 verified)")
    return list(found.values())


def _project_metadata(repo_root: Path) -> dict[str, Any]:
    """pyproject.toml's [project] in a checkout; the installed distribution's metadata from a wheel."""
    pyproject = repo_root / "pyproject.toml"
    if pyproject.is_file():
        with pyproject.open("rb") as fh:
            project: dict[str, Any] = tomllib.load(fh).get("project", {})
        return project
    try:
        meta = importlib.metadata.metadata(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return {}
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or () if ", " in u)
    def field(name: str) -> str:
        return str((meta.get_all(name) or [""])[0])

    licence = field("License-Expression") or field("License")
    return {"description": field("Summary"), "version": field("Version"), "license": licence, "urls": urls}


def _git_revision(repo_root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo_root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def image_labels(repo_root: Path, inputs_hash: str) -> dict[str, str]:
    """OCI annotations plus the two labels the host checks (protocol, inputs hash)."""
    project = _project_metadata(repo_root)
    licence = project.get("license")
    licence_text = licence.get("text", "") if isinstance(licence, dict) else licence or ""
    urls = project.get("urls") or {}
    labels = {
        "org.opencontainers.image.title": REPOSITORY,
        "org.opencontainers.image.description": str(project.get("description", "")),
        "org.opencontainers.image.version": str(project.get("version", "")),
        "org.opencontainers.image.created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.opencontainers.image.licenses": str(licence_text),
        LABEL_PROTOCOL: str(PROTOCOL_VERSION),
        LABEL_INPUTS_HASH: inputs_hash,
    }
    source = urls.get("Source") or urls.get("Repository") or urls.get("Homepage")
    if source:
        labels["org.opencontainers.image.source"] = str(source)
    revision = _git_revision(repo_root) if (repo_root / ".git").exists() else None
    if revision:
        labels["org.opencontainers.image.revision"] = revision
    return labels


def prepare_context(repo_root: Path, ctx: Path, wheels: Iterable[Path]) -> None:
    """Lay out the build context: the docker/ inputs and site/ (unpacked wheels + wrapper)."""
    for name in DOCKER_INPUTS:
        shutil.copyfile(docker_inputs(repo_root) / name, ctx / name)
    site = ctx / "site"
    site.mkdir()
    for wheel in wheels:
        unpack_wheel(wheel, site)
    copy_wrapper(repo_root, site)
    precompile(site)


def precompile(site: Path) -> None:
    """Ship bytecode: the root is read-only, so without it every sandbox recompiles grpc and protobuf.

    Unchecked-hash pycs are never revalidated against their sources, which cannot change in the image.
    The image's Python is 3.11; bytecode from another minor version would just be ignored, so skip it.
    """
    if sys.version_info[:2] != BYTECODE_VERSION:
        return
    compileall.compile_dir(
        site, quiet=1, workers=1, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )


def _build_stream(chunks: Iterator[dict[str, Any]], progress: Progress) -> str:
    """Relay `docker build` output; returns the built image id or raises on a build error."""
    image_id = ""
    for chunk in chunks:
        if "error" in chunk:
            raise _build_failed(f"docker build failed: {str(chunk['error']).strip()}")
        for line in str(chunk.get("stream", "")).splitlines():
            if line.strip():
                progress(f"build: {line.rstrip()}")
        image_id = str((chunk.get("aux") or {}).get("ID", image_id))
    if not image_id:
        raise _build_failed("docker build reported no image id")
    return image_id


def build_image(
    client: docker.DockerClient,
    *,
    repo_root: Path,
    progress: Progress,
    force: bool = False,
    cache_dir: Path | None = None,
) -> BuildResult:
    """Build the sandbox image from docker/ (or reuse it when its inputs hash is unchanged)."""
    if not (docker_inputs(repo_root) / "Dockerfile").is_file():
        raise _build_failed(
            f"{repo_root} has no docker/ directory to build the image from",
            hint="build from a source checkout of agentnode-sandbox, or pull a published image: "
            "agentnode-sandbox image pull REF",
        )
    inputs_hash = image_inputs_hash(repo_root)
    tag = f"{REPOSITORY}:{inputs_hash[:12]}"
    cache = cache_dir or wheel_cache_dir()
    with _build_lock(cache, progress):
        existing = _get_image(client, tag)
        if existing is not None and not force and _labels(existing).get(LABEL_INPUTS_HASH) == inputs_hash:
            with engine_errors():
                client.api.tag(existing.id, REPOSITORY, "latest")
            progress(f"build: {tag} is up to date ({existing.id})")
            return BuildResult(image_id=existing.id, tag=tag, inputs_hash=inputs_hash, built=False)
        image_id = _build(
            client, repo_root=repo_root, tag=tag, inputs_hash=inputs_hash, cache_dir=cache, progress=progress,
            force=force,
        )  # fmt: skip
    progress(f"build: built {tag} ({image_id})")
    return BuildResult(image_id=image_id, tag=tag, inputs_hash=inputs_hash, built=True)


@contextlib.contextmanager
def _build_lock(cache_dir: Path, progress: Progress) -> Iterator[None]:
    """One build at a time per machine: concurrent builds would race on the tags and repeat mmdebstrap."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / "build.lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("build: waiting for another image build to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _build(
    client: docker.DockerClient,
    *,
    repo_root: Path,
    tag: str,
    inputs_hash: str,
    cache_dir: Path,
    progress: Progress,
    force: bool,
) -> str:
    """The slow path of `build_image`: base rootfs, wheels, context, `docker build`; returns the id."""
    arch = daemon_arch(client)
    base = _ensure_base(client, repo_root, arch, progress, force)
    wheels = fetch_wheels(repo_root, arch, cache_dir, progress)
    with tempfile.TemporaryDirectory(prefix="agentnode-build-") as tmp:
        ctx = Path(tmp)
        try:
            prepare_context(repo_root, ctx, wheels)
        except (OSError, ValueError) as exc:  # ValueError: a wheel holds an unsafe path
            raise _build_failed(
                f"cannot lay out the build context ({type(exc).__name__}: {exc})",
                hint="check free space in the temporary directory (TMPDIR), then rerun the build",
            ) from None
        progress(f"build: {tag} from {base}")
        with engine_errors():
            image_id = _build_stream(
                client.api.build(
                    path=str(ctx), dockerfile="Dockerfile", tag=tag, buildargs={"BASE": base},
                    labels=image_labels(repo_root, inputs_hash), rm=True, forcerm=True, pull=False,
                    network_mode="none", decode=True,
                ),
                progress,
            )  # fmt: skip
            client.images.get(image_id).tag(REPOSITORY, "latest")
    return image_id


def image_status(
    client: AnyClient, pin: str | None, *, repo_root: Path | None = None
) -> ImageStatus:
    """Describe the pinned image (or `agentnode-sandbox:latest` when nothing is pinned) from its labels."""
    root = repo_root or default_repo_root()
    current = image_inputs_hash(root) if (root / "docker").is_dir() else None
    image = _get_image(client, pin or LATEST_TAG)
    if image is None:
        return ImageStatus(False, None, None, None, False, current, False)
    labels = _labels(image)
    protocol = _protocol(labels)
    inputs_hash = labels.get(LABEL_INPUTS_HASH)
    return ImageStatus(
        present=True,
        image_id=image.id,
        protocol=protocol,
        inputs_hash=inputs_hash,
        matches_pin=pin is not None and _matches_pin(image, pin),
        current_inputs_hash=current,
        up_to_date=current is not None and inputs_hash == current and protocol == PROTOCOL_VERSION,
    )


def _pull_failed(message: str) -> EngineError:
    return EngineError(message, reason=AuditReason.IMAGE_MISSING, hint=PULL_HINT, check="image")


def pull_image(
    client: docker.DockerClient, ref: str, *, progress: Progress, bars: bool = False
) -> PullResult:
    """`docker pull REF` through the SDK, relaying status lines (and progress bars with `bars`), then the pin
    it makes, verified like any pin: a digest reference is itself a pin, a tag is pinned by the id of what
    was pulled. Recording the pin is the caller's (set_image_pin)."""
    try:
        with engine_errors():
            for event in client.api.pull(ref, stream=True, decode=True):
                if "error" in event:
                    raise _pull_failed(f"could not pull {ref}: {str(event['error']).strip()[:200]}")
                status = str(event.get("status", "")).strip()
                bar = str(event.get("progress", "")) if bars else ""
                if status and (bars or not event.get("progressDetail")):
                    layer = f"{event['id']}: " if event.get("id") else ""
                    progress(f"pull: {layer}{status} {bar}".rstrip())
    except EngineRejected as exc:
        if exc.status in (400, 404, 500):
            raise _pull_failed(f"could not pull {ref} ({exc.status}): {exc.explanation[:200]}") from None
        raise
    if "@sha256:" in ref:
        pin = ref
    else:
        pulled = _get_image(client, ref)
        if pulled is None:
            raise _pull_failed(f"{ref} was pulled but the engine does not have it")
        pin = str(pulled.id)
    image = verify_pinned_image(client, pin)
    return PullResult(ref=ref, image_id=str(image.id), pin=pin)


__all__ = [
    "BuildResult",
    "ImageStatus",
    "PullResult",
    "build_image",
    "image_inputs_hash",
    "image_status",
    "pinned_image_missing",
    "pull_image",
    "sha256_file",
    "verify_pinned_image",
]
