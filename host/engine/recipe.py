"""What shapes the sandbox image, read from the checkout without an engine: its inputs and their hashes, the
rootfs recipe, the pinned wheels, the OCI labels and the build context (host/engine/image.py builds it)."""

from __future__ import annotations

import compileall
import hashlib
import importlib.metadata
import py_compile
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from host.engine.labels import LABEL_PROTOCOL
from host.engine.pin import LABEL_INPUTS_HASH
from sandbox_wrapper.protocol import PROTOCOL_VERSION

REPOSITORY = "agentnode-sandbox"
DISTRIBUTION = "agentnode-sandbox"
"""The project's distribution name (its metadata labels an image built from an installed wheel)."""

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


__all__ = [
    "CUSTOMIZE_HOOK",
    "DEBIAN_ARCH",
    "DOCKER_INPUTS",
    "DPKG_OPTS",
    "MIRRORS",
    "REPOSITORY",
    "SUITE",
    "WHEEL_PYTHON",
    "PinnedWheel",
    "cached_wheels",
    "copy_wrapper",
    "default_repo_root",
    "docker_inputs",
    "image_inputs_hash",
    "image_labels",
    "parse_requirements",
    "precompile",
    "prepare_context",
    "read_packages",
    "rootfs_hash",
    "sha256_file",
    "unpack_wheel",
]
