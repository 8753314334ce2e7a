"""Image build logic without a daemon: the inputs hash, pinned requirements, wheel unpacking, pin checks."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socketserver
import subprocess
import threading
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import docker
import docker.errors
import pytest
import requests
import requests.exceptions

from host.core.errors import AuditReason, EngineError
from host.engine import image as _image
from host.engine.image import (
    PULL_HINT,
    ImageStatus,
    PullResult,
    daemon_arch,
    image_status,
    pull_image,
    verify_pinned_image,
)
from host.engine.recipe import (
    CUSTOMIZE_HOOK,
    PinnedWheel,
    cached_wheels,
    copy_wrapper,
    image_inputs_hash,
    image_labels,
    parse_requirements,
    read_packages,
    rootfs_hash,
    unpack_wheel,
)
from host.engine.sdk import connect
from sandbox_wrapper import PROTOCOL_VERSION
from tests.support.fake_engine import FakeEngine

REPO = Path(__file__).resolve().parents[3]
WRAPPER_FILES = {
    "__init__.py": "PROTOCOL_VERSION = 1\n",
    "__main__.py": "print('main')\n",
    "_proto/__init__.py": "",
    "_proto/gen_pb2.py": "X = 1\n",
}


def make_repo(root: Path, order: list[str]) -> Path:
    """A minimal checkout: the real docker/ inputs and a small wrapper package, written in `order`."""
    shutil.copytree(REPO / "docker", root / "docker")
    for rel in order:
        path = root / "sandbox_wrapper" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(WRAPPER_FILES[rel])
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", list(WRAPPER_FILES))


def test_inputs_hash_is_stable_and_independent_of_listing_order(tmp_path: Path, repo: Path) -> None:
    other = make_repo(tmp_path / "other", list(reversed(WRAPPER_FILES)))
    first = image_inputs_hash(repo)
    assert len(first) == 64 and int(first, 16) >= 0
    assert image_inputs_hash(repo) == first
    assert image_inputs_hash(other) == first


def test_inputs_hash_changes_with_each_input(repo: Path) -> None:
    seen = {image_inputs_hash(repo)}
    edits: list[Callable[[], object]] = [
        lambda: (repo / "sandbox_wrapper" / "__main__.py").write_text("print('changed')\n"),
        lambda: (repo / "sandbox_wrapper" / "_proto" / "new.py").write_text(""),
        lambda: (repo / "docker" / "requirements.txt").write_text("grpcio==1.0 --hash=sha256:00\n"),
        lambda: (repo / "docker" / "Dockerfile").write_text("FROM scratch\n"),
        lambda: (repo / "docker" / "rootfs.packages").write_text("python3-minimal\n"),
        lambda: (repo / "sandbox_wrapper" / "_proto" / "gen_pb2.py").rename(
            repo / "sandbox_wrapper" / "_proto" / "gen2_pb2.py"
        ),
    ]
    for edit in edits:
        edit()
        seen.add(image_inputs_hash(repo))
    assert len(seen) == len(edits) + 1


def test_inputs_hash_ignores_bytecode_docs_and_non_python_files(repo: Path) -> None:
    before = image_inputs_hash(repo)
    cache = repo / "sandbox_wrapper" / "__pycache__"
    cache.mkdir()
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\0junk")
    (cache / "stray.py").write_text("x = 1\n")
    (repo / "sandbox_wrapper" / "py.typed").write_text("")
    (repo / "docker" / "README.md").write_text("changed docs\n")
    assert image_inputs_hash(repo) == before


def test_rootfs_hash_ignores_the_wrapper_but_not_packages_or_arch(repo: Path) -> None:
    base = rootfs_hash(repo, "x86_64")
    (repo / "sandbox_wrapper" / "__main__.py").write_text("print('changed')\n")
    assert rootfs_hash(repo, "x86_64") == base
    assert rootfs_hash(repo, "aarch64") != base
    (repo / "docker" / "rootfs.packages").write_text("python3-minimal\n")
    assert rootfs_hash(repo, "x86_64") != base


def test_requirements_pin_the_host_venv_versions_with_hashes() -> None:
    # The same versions as the host's lock (tests/unit/project/test_lock.py), not as whatever is installed:
    # scripts/check-latest runs this suite with the newest grpcio on purpose.
    pins = parse_requirements((REPO / "docker" / "requirements.txt").read_text())
    assert [p.name for p in pins] == ["grpcio", "protobuf", "typing-extensions"]
    locked = (REPO / "requirements" / "lock.txt").read_text().splitlines()
    for pin in pins:
        assert f"{pin.name}=={pin.version} \\" in locked
        assert pin.hashes and all(len(h) == 64 for h in pin.hashes)


@pytest.mark.parametrize(
    "text",
    [
        "grpcio\n",
        "grpcio>=1.0 --hash=sha256:aa\n",
        "grpcio==1.0\n",
        "grpcio==1.0 --hash=sha256:aa --index-url=https://example.invalid\n",
    ],
)
def test_requirements_refuse_anything_but_hash_pinned_exact_versions(text: str) -> None:
    with pytest.raises(ValueError, match="name==version"):
        parse_requirements(text)


def test_requirements_join_continuations_and_skip_comments() -> None:
    text = "# header\ngrpcio==1.2.3 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb  # trailing\n\n"
    assert parse_requirements(text) == (PinnedWheel("grpcio", "1.2.3", frozenset({"aa", "bb"})),)


def test_rootfs_package_list_is_exactly_the_five_packages() -> None:
    assert read_packages(REPO / "docker" / "rootfs.packages") == [
        "python3-minimal",
        "libpython3.11-stdlib",
        "libstdc++6",
        "ca-certificates",
        "curl",
    ]


def make_wheel(path: Path, entries: dict[str, tuple[bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, (data, mode) in entries.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


def test_unpack_wheel_lays_out_an_import_root(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        {
            "demo/__init__.py": (b"VALUE = 1\n", 0o644),
            "demo/_native.so": (b"\x7fELF", 0o755),
            "demo-1.0.dist-info/METADATA": (b"Name: demo\n", 0o644),
            "demo-1.0.data/purelib/demo_extra.py": (b"EXTRA = 2\n", 0o644),
            "demo-1.0.data/platlib/demo/_plat.py": (b"PLAT = 3\n", 0o644),
            "demo-1.0.data/scripts/demo-cli": (b"#!/bin/sh\n", 0o755),
            "demo-1.0.data/headers/demo.h": (b"/* */\n", 0o644),
        },
    )
    site = tmp_path / "site"
    site.mkdir()
    unpack_wheel(wheel, site)
    files = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    assert files == [
        "demo-1.0.dist-info/METADATA",
        "demo/__init__.py",
        "demo/_native.so",
        "demo/_plat.py",
        "demo_extra.py",
    ]
    assert (site / "demo_extra.py").read_text() == "EXTRA = 2\n"
    assert (site / "demo" / "_native.so").stat().st_mode & 0o777 == 0o755
    assert (site / "demo" / "__init__.py").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("name", ["../escape.py", "/abs.py", "demo/../../escape.py", "demo\\..\\x.py"])
def test_unpack_wheel_refuses_paths_outside_the_root(tmp_path: Path, name: str) -> None:
    wheel = make_wheel(tmp_path / "evil-1.0-py3-none-any.whl", {name: (b"x", 0o644)})
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(ValueError, match="unsafe path"):
        unpack_wheel(wheel, site)
    assert not (tmp_path / "escape.py").exists()


def test_cached_wheels_need_the_pinned_hash_and_the_right_arch(tmp_path: Path) -> None:
    def put(name: str, data: bytes) -> tuple[Path, str]:
        path = tmp_path / name
        path.write_bytes(data)
        return path, hashlib.sha256(data).hexdigest()

    x86, x86_hash = put("grpcio-1.2.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", b"x86")
    arm, arm_hash = put("grpcio-1.2.3-cp311-cp311-manylinux2014_aarch64.whl", b"arm")
    pure, pure_hash = put("typing_extensions-4.0-py3-none-any.whl", b"pure")
    pins = [
        PinnedWheel("grpcio", "1.2.3", frozenset({x86_hash, arm_hash})),
        PinnedWheel("typing-extensions", "4.0", frozenset({pure_hash})),
    ]
    assert cached_wheels(pins, tmp_path, "x86_64") == {"grpcio": x86, "typing-extensions": pure}
    assert cached_wheels(pins, tmp_path, "aarch64") == {"grpcio": arm, "typing-extensions": pure}
    x86.write_bytes(b"tampered")
    assert cached_wheels(pins, tmp_path, "x86_64") is None
    assert cached_wheels(pins, tmp_path / "missing", "aarch64") is None


def test_copy_wrapper_copies_exactly_the_hashed_sources(tmp_path: Path, repo: Path) -> None:
    cache = repo / "sandbox_wrapper" / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    (repo / "sandbox_wrapper" / "notes.txt").write_text("not code\n")
    site = tmp_path / "site"
    copy_wrapper(repo, site)
    copied = sorted(
        p.relative_to(site / "sandbox_wrapper").as_posix() for p in site.rglob("*") if p.is_file()
    )
    assert copied == sorted(WRAPPER_FILES)


def test_labels_carry_protocol_inputs_hash_and_oci_keys() -> None:
    labels = image_labels(REPO, "f" * 64)
    assert labels["io.agentnode.sandbox.protocol"] == str(PROTOCOL_VERSION)
    assert labels["io.agentnode.sandbox.inputs-hash"] == "f" * 64
    assert labels["org.opencontainers.image.title"] == "agentnode-sandbox"
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.created"].endswith("Z")
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], check=False, capture_output=True, text=True
    )
    if head.returncode == 0:
        assert labels["org.opencontainers.image.revision"] == head.stdout.strip()


def test_build_stream_relays_lines_and_fails_on_a_build_error() -> None:
    lines: list[str] = []
    chunks: list[dict[str, Any]] = [
        {"stream": "Step 1/2 : FROM x\n ---> abc\n"},
        {"aux": {"ID": "sha256:" + "a" * 64}},
        {"stream": "\n"},
    ]
    assert _image._build_stream(iter(chunks), lines.append) == "sha256:" + "a" * 64
    assert lines == ["build: Step 1/2 : FROM x", "build:  ---> abc"]
    with pytest.raises(EngineError) as err:
        _image._build_stream(iter([{"error": "COPY failed\n"}]), lines.append)
    assert err.value.check == "image" and "COPY failed" in err.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="the hook chowns /home/sandbox, as it does inside mmdebstrap")
def test_customize_hook_adds_the_user_and_mountpoints_and_drops_setuid(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for d in ("etc", "run", "var/lib/apt/lists", "var/cache/apt", "var/log", "usr/share/man/man1", "home"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "var" / "lib" / "apt" / "lists" / "deb.debian.org_Packages").write_text("x")
    (root / "usr" / "share" / "man" / "man1" / "ls.1.gz").write_text("x")
    su = root / "usr" / "bin" / "su"
    su.parent.mkdir(parents=True)
    su.write_text("x")
    su.chmod(0o6755)
    stub = tmp_path / "bin"  # chroot needs root and a real interpreter in the rootfs: record its call
    stub.mkdir()
    (stub / "chroot").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "chroot.args"}\n')
    (stub / "chroot").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", CUSTOMIZE_HOOK, "hook", str(root)], check=True, env=env)
    # The whole stdlib is byte-compiled by the rootfs's own interpreter (the root is read-only at run time).
    assert (tmp_path / "chroot.args").read_text().splitlines() == [
        str(root), "/usr/bin/python3", "-m", "compileall", "-q", "-j0",
        "--invalidation-mode", "unchecked-hash",
        "/usr/lib/python3.11",
    ]  # fmt: skip
    assert (
        "sandbox:*:65532:65532:agentnode sandbox:/home/sandbox:/usr/sbin/nologin"
        in (root / "etc" / "passwd").read_text().splitlines()
    )
    assert "sandbox:*:65532:" in (root / "etc" / "group").read_text().splitlines()
    home = (root / "home" / "sandbox").stat()
    assert (home.st_uid, home.st_gid, home.st_mode & 0o777) == (65532, 65532, 0o750)
    assert (root / "pack").is_dir() and (root / "run" / "agentnode").is_dir()
    assert not any((root / "var" / "lib" / "apt" / "lists").iterdir())
    assert not any((root / "var" / "cache").iterdir())
    assert not any((root / "usr" / "share" / "man").iterdir())
    assert su.stat().st_mode & 0o7777 == 0o755


GOOD = "sha256:" + "1" * 64
DIGEST = "agentnode-sandbox@sha256:" + "2" * 64
GOOD_LABELS = {
    "io.agentnode.sandbox.protocol": str(PROTOCOL_VERSION),
    "io.agentnode.sandbox.inputs-hash": "h",
}


def image_attrs(image_id: str, labels: dict[str, str], digests: list[str] | None = None) -> dict[str, Any]:
    return {"Id": image_id, "RepoDigests": digests or [], "Config": {"Labels": labels}}


IMAGES: dict[str, dict[str, Any]] = {
    GOOD: image_attrs(GOOD, GOOD_LABELS, [DIGEST]),
    DIGEST: image_attrs(GOOD, GOOD_LABELS, [DIGEST]),
    "agentnode-sandbox:latest": image_attrs(GOOD, GOOD_LABELS, [DIGEST]),
    # resolves to another image than the one pinned
    "sha256:" + "3" * 64: image_attrs("sha256:" + "4" * 64, GOOD_LABELS),
    # some other image: no inputs-hash label
    "sha256:" + "5" * 64: image_attrs("sha256:" + "5" * 64, {}),
    "sha256:" + "6" * 64: image_attrs(
        "sha256:" + "6" * 64, {**GOOD_LABELS, "io.agentnode.sandbox.protocol": "0"}
    ),
    # found by digest, but the digest is not among its RepoDigests
    "other@sha256:" + "7" * 64: image_attrs(GOOD, GOOD_LABELS, [DIGEST]),
}
BROKEN = "sha256:" + "9" * 64


class _EngineHandler(BaseHTTPRequestHandler):
    """Answers `GET /v*/images/<ref>/json` the way the Engine API does, from IMAGES; records each ref."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        match = re.fullmatch(r"/v[0-9.]+/images/(.+)/json", urllib.parse.unquote(self.path))
        ref = match.group(1) if match else ""
        self.asked.append(ref)
        if ref == BROKEN:
            status, body = 500, {"message": "engine failure"}
        elif ref in IMAGES:
            status, body = 200, IMAGES[ref]
        else:
            status, body = 404, {"message": f"No such image: {ref}"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test output is the assertions."""


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[docker.DockerClient]:
    """A real SDK client talking to a real HTTP server on a Unix socket that serves image inspections."""
    sock = tmp_path_factory.mktemp("engine") / "engine.sock"
    server = _UnixHTTPServer(str(sock), _EngineHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    client = docker.DockerClient(base_url=f"unix://{sock}", version="1.41")
    yield client
    client.close()
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("pin", [None, "", "agentnode-sandbox:latest", "sha256:abc", "repo@sha256:xyz"])
def test_unusable_pins_are_refused_before_the_engine_is_asked(
    engine: docker.DockerClient, pin: str | None
) -> None:
    asked = len(_EngineHandler.asked)
    with pytest.raises(EngineError) as err:
        verify_pinned_image(engine, pin)
    assert len(_EngineHandler.asked) == asked
    assert err.value.reason is AuditReason.IMAGE_NOT_PINNED
    assert err.value.check == "image"
    assert "agentnode-sandbox image build" in err.value.hint


@pytest.mark.parametrize("pin", [GOOD, DIGEST])
def test_a_present_matching_image_is_returned(engine: docker.DockerClient, pin: str) -> None:
    assert verify_pinned_image(engine, pin).id == GOOD
    assert _EngineHandler.asked[-1] == pin


@pytest.mark.parametrize(
    ("pin", "reason"),
    [
        ("sha256:" + "8" * 64, AuditReason.IMAGE_MISSING),
        ("agentnode-sandbox@sha256:" + "8" * 64, AuditReason.IMAGE_MISSING),
        ("sha256:" + "3" * 64, AuditReason.IMAGE_MISMATCH),
        ("sha256:" + "5" * 64, AuditReason.IMAGE_MISMATCH),
        ("other@sha256:" + "7" * 64, AuditReason.IMAGE_MISMATCH),
        ("sha256:" + "6" * 64, AuditReason.PROTOCOL_MISMATCH),
    ],
)
def test_unusable_images_are_refused_with_their_reason(
    engine: docker.DockerClient, pin: str, reason: AuditReason
) -> None:
    with pytest.raises(EngineError) as err:
        verify_pinned_image(engine, pin)
    assert err.value.reason is reason
    assert err.value.check == "image"
    assert "agentnode-sandbox image build" in err.value.hint


def test_an_engine_failure_is_an_engine_error_not_a_missing_image(engine: docker.DockerClient) -> None:
    with pytest.raises(EngineError) as err:
        verify_pinned_image(engine, BROKEN)
    assert err.value.reason is AuditReason.ENGINE_UNAVAILABLE
    assert err.value.check == "engine"


def test_image_status_reads_the_labels(
    engine: docker.DockerClient, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = image_inputs_hash(repo)
    fresh_labels = {**GOOD_LABELS, "io.agentnode.sandbox.inputs-hash": current}
    monkeypatch.setitem(IMAGES, "sha256:" + "a" * 64, image_attrs("sha256:" + "a" * 64, fresh_labels))
    fresh = image_status(engine, "sha256:" + "a" * 64, repo_root=repo)
    assert fresh == ImageStatus(True, "sha256:" + "a" * 64, PROTOCOL_VERSION, current, True, current, True)
    stale = image_status(engine, DIGEST, repo_root=repo)
    assert (stale.present, stale.matches_pin, stale.inputs_hash, stale.up_to_date) == (True, True, "h", False)
    unpinned = image_status(engine, None, repo_root=repo)
    assert (unpinned.present, unpinned.image_id, unpinned.matches_pin) == (True, GOOD, False)
    missing = image_status(engine, "sha256:" + "8" * 64, repo_root=repo)
    assert missing == ImageStatus(False, None, None, None, False, current, False)


# --- pull_image: the pull, its progress lines and the pin it makes, against a stub client ----------------


class _FakeResponse(requests.Response):
    def __init__(self, status: int) -> None:
        super().__init__()
        self.status_code = status


class _StubPullClient:
    """Just what pull_image asks of an SDK client: `api.pull` (streamed events) and `api.inspect_image`."""

    def __init__(
        self, events: list[dict[str, Any]] | None = None, error: BaseException | None = None
    ) -> None:
        self.events, self.error = events or [], error
        self.api, self.images = self, self

    def pull(self, ref: str, *, stream: bool, decode: bool) -> Iterator[dict[str, Any]]:
        assert stream and decode
        if self.error is not None:
            raise self.error
        yield from self.events

    def inspect_image(self, ref: str) -> dict[str, Any]:
        if ref not in IMAGES:
            raise docker.errors.ImageNotFound("no such image", response=_FakeResponse(404))
        return IMAGES[ref]


PULL_EVENTS: list[dict[str, Any]] = [
    {"status": "Pulling from agentnode-sandbox", "id": "latest"},
    {"status": "Downloading", "id": "abc", "progressDetail": {"current": 1}, "progress": "[=>  ]"},
    {"status": "Status: Downloaded newer image"},
]


@pytest.mark.parametrize(
    ("bars", "lines"),
    [
        (False, ["pull: latest: Pulling from agentnode-sandbox", "pull: Status: Downloaded newer image"]),
        (
            True,
            [
                "pull: latest: Pulling from agentnode-sandbox",
                "pull: abc: Downloading [=>  ]",
                "pull: Status: Downloaded newer image",
            ],
        ),
    ],
)
def test_a_pulled_tag_is_pinned_by_the_id_of_what_was_pulled(bars: bool, lines: list[str]) -> None:
    seen: list[str] = []
    client = _StubPullClient(PULL_EVENTS)
    pulled = pull_image(client, "agentnode-sandbox:latest", progress=seen.append, bars=bars)
    assert pulled == PullResult(ref="agentnode-sandbox:latest", image_id=GOOD, pin=GOOD)
    assert seen == lines


def test_a_pulled_digest_is_its_own_pin() -> None:
    pulled = pull_image(_StubPullClient(), DIGEST, progress=lambda _: None)
    assert pulled == PullResult(ref=DIGEST, image_id=GOOD, pin=DIGEST)


@pytest.mark.parametrize(
    ("client", "reason", "check", "message"),
    [
        (_StubPullClient([{"error": "  manifest unknown\n"}]), AuditReason.IMAGE_MISSING, "image",
         "could not pull r:1: manifest unknown"),
        (_StubPullClient(error=docker.errors.NotFound("x", _FakeResponse(404), " not found: r ")),
         AuditReason.IMAGE_MISSING, "image", "could not pull r:1 (404): not found: r"),
        (_StubPullClient(error=docker.errors.APIError("x", _FakeResponse(500), "x" * 300)),
         AuditReason.IMAGE_MISSING, "image", f"could not pull r:1 (500): {'x' * 200}"),
        (_StubPullClient(error=docker.errors.APIError("x", _FakeResponse(403), "denied")),
         AuditReason.ENGINE_PERMISSION_DENIED, "engine", "the container engine refused the request"),
        (_StubPullClient(error=requests.exceptions.ConnectionError("aborted")),
         AuditReason.ENGINE_UNAVAILABLE, "engine", "no container engine answers"),
    ],
)  # fmt: skip
def test_a_failed_pull_says_why(
    client: _StubPullClient, reason: AuditReason, check: str, message: str
) -> None:
    with pytest.raises(EngineError) as err:
        pull_image(client, "r:1", progress=lambda _: None)
    assert (err.value.reason, err.value.check, err.value.message) == (reason, check, message)
    if check == "image":
        assert err.value.hint == PULL_HINT


def test_a_pulled_image_is_verified_like_any_pin() -> None:
    with pytest.raises(EngineError) as err:
        pull_image(_StubPullClient(), "sha256:" + "5" * 64, progress=lambda _: None)
    assert err.value.reason is AuditReason.IMAGE_MISMATCH


# --- a build refuses with an EngineError, never a raw ValueError or OSError --------------------------------


def test_a_malformed_requirements_file_fails_the_build_with_its_reason(repo: Path, tmp_path: Path) -> None:
    (repo / "docker" / "requirements.txt").write_text("grpcio>=1.0\n")
    with pytest.raises(EngineError) as err:
        _image.fetch_wheels(repo, "x86_64", tmp_path / "cache", lambda _: None)
    assert (err.value.reason, err.value.check) == (AuditReason.IMAGE_MISSING, "image")
    assert "docker/requirements.txt" in err.value.message and "name==version" in err.value.hint


def test_a_build_without_docker_inputs_says_where_images_come_from(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as err:
        _image.build_image(None, repo_root=tmp_path, progress=lambda _: None)
    assert err.value.reason is AuditReason.IMAGE_MISSING and "image pull" in err.value.hint


@pytest.mark.parametrize(
    ("reported", "normalized"),
    [("x86_64", "x86_64"), ("amd64", "x86_64"), ("aarch64", "aarch64"), ("arm64", "aarch64"),
     ("AMD64", "x86_64")],
)
def test_engine_architecture_is_normalized(reported: str, normalized: str) -> None:
    """dockerd reports `uname -m` names, Podman Go's: both mean the same rootfs recipe and wheel tags."""
    with FakeEngine(info={"Architecture": reported}) as engine:
        client = connect({"DOCKER_HOST": engine.docker_host})
        try:
            assert daemon_arch(client) == normalized
        finally:
            client.close()


def test_an_engine_architecture_without_a_recipe_is_refused() -> None:
    with FakeEngine(info={"Architecture": "riscv64"}) as engine:
        client = connect({"DOCKER_HOST": engine.docker_host})
        try:
            with pytest.raises(EngineError, match="riscv64") as caught:
                daemon_arch(client)
        finally:
            client.close()
    assert caught.value.reason is AuditReason.IMAGE_MISSING and "x86_64 or aarch64" in caught.value.hint
