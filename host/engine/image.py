"""Builds and pulls the pinned sandbox image through the engine and reports its status, so every run uses
a known, offline-built rootfs (its inputs: host/engine/recipe.py; a run checks it: host/engine/pin.py)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host.core.errors import AuditReason, EngineError, EngineRejected
from host.engine.errors import engine_errors
from host.engine.facts import EngineKind, facts_from
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
from host.engine.recipe import (
    CUSTOMIZE_HOOK,
    DEBIAN_ARCH,
    DPKG_OPTS,
    MIRRORS,
    REPOSITORY,
    SUITE,
    WHEEL_PYTHON,
    cached_wheels,
    default_repo_root,
    docker_inputs,
    image_inputs_hash,
    image_labels,
    parse_requirements,
    prepare_context,
    read_packages,
    rootfs_hash,
)
from sandbox_wrapper.protocol import PROTOCOL_VERSION

if TYPE_CHECKING:
    import docker


Progress = Callable[[str], None]

BASE_REPOSITORY = "agentnode-sandbox-base"
LATEST_TAG = f"{REPOSITORY}:latest"
LABEL_ROOTFS_HASH = "io.agentnode.sandbox.rootfs-hash"
PULL_HINT = (
    "check the reference and that the engine can reach its registry (docker pull REF); "
    "without a registry, build the image here: agentnode-sandbox image build"
)


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
    "image_status",
    "pinned_image_missing",
    "pull_image",
    "verify_pinned_image",
]
