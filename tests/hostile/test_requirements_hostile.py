"""Hostile Python requirements at install: a pack's pyproject.toml and the wheels its requirements bring.

A pack's `[project].dependencies` are pack text that reaches pip on the host (host/packs/requirements),
and the wheels pip brings are published by anyone. Every install here goes through the real
`install_pack` with the real engine (community agents get a volume), against a spy package index on the
host's loopback (PIP_INDEX_URL, which the host passes to pip as the operator's configuration): a refusal
that must come before pip is proven by the spy seeing no request, with a control install whose plain
requirement the spy does see. Wheels come from a --find-links directory built here (offline), so no row
needs the real index. Nothing may be left: no volume, no lockfile entry, no host copy, and the host's own
environment (`pip freeze` of the venv) unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.core.errors import SandboxError
from host.packs.declared import MAX_PYPROJECT_BYTES, MAX_REQUIREMENTS
from host.packs.install import LABEL_PACK, install_pack
from host.packs.requirements import MAX_WHEELS, Source
from host.spec.config import load_config
from host.spec.lockfile import Lockfile
from tests.hostile.conftest import Lab, Ledger, brief, rss_bytes
from tests.support.cli import cli

pytestmark = pytest.mark.docker

RAW = {"\x1b": "ESC", "\x07": "BEL", "\x9b": "8-bit CSI", "\u202e": "RLO"}
HOSTILE_REQ = "six\x1b]0;pwned\x07\x9b31m\u202etxt"
"""A requirement whose text would retitle the terminal and reverse the line if echoed raw."""
HOSTILE_REQ_SHOWN = "six\\x1b]0;pwned\\x07\\x9b31m\\u202etxt"
"""How the install error shows it: each escape written out once (\\x1b ...), in quotes."""

INJECTIONS = {
    "index-url-option": ("--index-url=http://127.0.0.1:9/simple", "looks like a pip option"),
    "requirements-file-option": ("-r /etc/shadow", "looks like a pip option"),
    "editable-vcs-option": ("-e git+https://127.0.0.1:9/x.git#egg=x", "looks like a pip option"),
    "spaced-extra-index": ("  --extra-index-url http://127.0.0.1:9/simple", "looks like a pip option"),
    "option-after-name": ("six --index-url http://127.0.0.1:9/simple", "is not a PEP 508 requirement"),
    "option-in-marker": ("six ; --trusted-host 127.0.0.1", "is not a PEP 508 requirement"),
    "option-in-extras": ("six[--index-url=x]", "is not a PEP 508 requirement"),
    "install-option": ("six==1.16.0 --install-option=--prefix=/tmp", "is not a PEP 508 requirement"),
    "file-url": ("six @ file:///etc/passwd", "is a direct URL reference"),
    "newline-then-option": ("six\n--index-url http://127.0.0.1:9/simple", "other than printable ASCII"),
    "host-path": ("/etc/passwd", "is not a PEP 508 requirement"),
}
"""pip options and local paths smuggled in as requirements: each must be refused before pip runs."""

ARCHIVE_NAME = "hx-sdist.tar.gz"
"""Letters, digits, `-` and `.`: a PEP 508 name that pip nevertheless takes for a path to a local archive."""
TIME_BOUND = 5.0


class SpyIndex:
    """A package index on the host's loopback that answers 404 to everything and counts what it is asked."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        spy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                spy.requests.append(self.path)
                self.send_error(404)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def pip_freeze() -> str:
    """The host venv's distributions: no install may change them."""
    cmd = [sys.executable, "-m", "pip", "freeze", "--all"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout


def make_wheel(
    directory: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel written by hand (what a package index would serve)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = {
        **files,
        f"{dist}.dist-info/METADATA": metadata.encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hx\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    records = []
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, data in entries.items():
            zf.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{arcname},sha256={digest},{len(data)}")
        zf.writestr(f"{dist}.dist-info/RECORD", "\n".join([*records, f"{dist}.dist-info/RECORD,,"]) + "\n")
    return path


def declare_size(wheel: Path, member: str, size: int) -> None:
    """Make the wheel's central directory claim `size` bytes for `member` (its data stays a few bytes)."""
    data = bytearray(wheel.read_bytes())
    name = member.encode()
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = int.from_bytes(data[at + 28 : at + 30], "little")
        if data[at + 46 : at + 46 + name_len] == name:
            data[at + 24 : at + 28] = size.to_bytes(4, "little")
            wheel.write_bytes(bytes(data))
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{member} not in {wheel}")


def write_pack(parent: Path, slug: str, kind: str, pyproject: str | bytes) -> Path:
    pack = parent / slug
    pack.mkdir(parents=True)
    module = slug.replace("-", "_")
    if kind == "agent":
        (pack / f"{module}.py").write_text("def run(context, **kwargs):\n    return 1\n")
        body = f'agent:\n  entrypoint: "{module}:run"\n  goal: probe\n'
    else:
        (pack / f"{module}.py").write_text("def run(**kwargs):\n    return 1\n")
        body = f"entrypoint: {module}\n"
    (pack / "agentnode.yaml").write_text(
        f'package_id: {slug}\nversion: "1.0.0"\npackage_type: {kind}\n' + body
    )
    text = pyproject if isinstance(pyproject, bytes) else pyproject.encode()
    (pack / "pyproject.toml").write_bytes(text)
    return pack


def deps_toml(requirements: list[str]) -> str:
    return f'[project]\nname = "x"\nversion = "1"\ndependencies = {json.dumps(requirements)}\n'


class Installs:
    """Installs into one lab, each observed: the refusal, the spy's requests, and what was left behind."""

    def __init__(self, lab: Lab, spy: SpyIndex, client: docker.DockerClient) -> None:
        self.lab = lab
        self.spy = spy
        self.client = client
        self.paths = load_config(lab.state.env).paths
        self.image = load_config(lab.state.env).agent_sandbox.image
        self.slugs: list[str] = []

    def __call__(
        self, slug: str, kind: str, pyproject: str | bytes, trust: str, source: Source | None = None
    ) -> dict[str, Any]:
        self.slugs.append(slug)
        pack = write_pack(self.lab.root / "req-packs", slug, kind, pyproject)
        asked = len(self.spy.requests)
        rss = rss_bytes()
        started = time.monotonic()
        try:
            entry = install_pack(
                pack, trust=trust, paths=self.paths, client=self.client, image=self.image, source=source
            )
            outcome = f"installed {entry.slug}"
            if entry.sandbox_volume:
                self.lab.volumes.add(entry.sandbox_volume)
        except SandboxError as exc:
            outcome = f"{type(exc).__name__}: {exc.message}"
        slug_dir = self.paths.packs_dir / slug
        return {
            "outcome": outcome,
            "empty_slug_dir": slug_dir.is_dir() and not any(slug_dir.iterdir()),
            "seconds": round(time.monotonic() - started, 2),
            "index_requests": len(self.spy.requests) - asked,
            "rss_growth_mib": round((rss_bytes() - rss) / 2**20, 1),
            "left": self.left(slug),
        }

    def left(self, slug: str) -> list[str]:
        """What the install left: volumes, a lockfile entry, a host copy (an empty packs/<slug>/ directory,
        which a failed host copy leaves, holds nothing that runs: it is observed, not counted)."""
        volumes = [v.name for v in self.client.volumes.list(filters={"label": f"{LABEL_PACK}={slug}"})]
        entry = ["lockfile entry"] if Lockfile(self.paths.lockfile).get(slug) is not None else []
        slug_dir = self.paths.packs_dir / slug
        copy = ["host copy"] if slug_dir.is_dir() and any(slug_dir.iterdir()) else []
        return volumes + entry + copy

    def cleanup(self) -> None:
        for slug in self.slugs:
            for volume in self.client.volumes.list(filters={"label": f"{LABEL_PACK}={slug}"}):
                with contextlib.suppress(docker.errors.APIError):
                    volume.remove(force=True)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[SpyIndex]:
    """The spy index as pip's configured index (pip sees PIP_* variables); no retries, short timeouts."""
    index = SpyIndex()
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    yield index
    index.close()


@pytest.fixture
def installs(
    make_lab: Callable[[str], Lab], spy: SpyIndex, docker_client: docker.DockerClient
) -> Iterator[Installs]:
    book = Installs(make_lab("runc"), spy, docker_client)
    yield book
    book.cleanup()


def refused(seen: dict[str, Any], *needles: str) -> bool:
    return seen["outcome"].startswith("PackError: ") and all(n in seen["outcome"] for n in needles)


def test_hostile_requirements_are_refused_before_pip(installs: Installs, ledger: Ledger) -> None:
    before = pip_freeze()
    # The control: a plain requirement reaches pip, which asks the spy index (and finds no wheel there).
    control = installs("hx-req-control", "agent", deps_toml(["six==1.16.0"]), "unverified")
    observed: dict[str, dict[str, Any]] = {}
    for variant, (requirement, _) in INJECTIONS.items():
        for kind, trust in (("agent", "unverified"), ("toolpack", "trusted")):
            slug = f"hx-req-{variant}-{kind}"
            observed[f"{variant}-{trust}"] = installs(slug, kind, deps_toml(["six", requirement]), trust)
    big = (
        deps_toml(["six"]) + "[tool.padding]\ntext = " + json.dumps("x" * (MAX_PYPROJECT_BYTES + 1024)) + "\n"
    )
    observed["pyproject-oversized"] = installs("hx-req-oversized", "agent", big, "unverified")
    deep = deps_toml(["six"]) + "[tool.deep]\nx = " + "[" * 20000 + "]" * 20000 + "\n"
    observed["pyproject-toml-nesting"] = installs("hx-req-deep", "agent", deep, "unverified")
    for kind, trust in (("agent", "unverified"), ("toolpack", "trusted")):
        slug = f"hx-req-archive-name-{kind}"
        observed[f"archive-name-{trust}"] = installs(slug, kind, deps_toml([ARCHIVE_NAME]), trust)
    many = [f"pkg{i}>=1" for i in range(10_000)]
    observed["requirements-10000"] = installs("hx-req-many", "toolpack", deps_toml(many), "trusted")
    unchanged = pip_freeze() == before

    control_ok = (
        refused(control, "no wheel of six") and control["index_requests"] >= 1 and not control["left"]
    )
    for variant, (_, needle) in INJECTIONS.items():
        for trust in ("unverified", "trusted"):
            seen = observed[f"{variant}-{trust}"]
            ledger.attack(
                f"pack-requirements-{variant}-{trust}",
                expected=f"install refused naming [project].dependencies[1] ({needle}) before pip runs: the "
                "package index gets no request (a plain requirement's install gets some: the control), no "
                "volume, lockfile entry or host copy, the host venv unchanged",
                observed=brief(
                    {**seen, "control_index_requests": control["index_requests"], "venv_unchanged": unchanged}
                ),
                ok=refused(seen, "[project].dependencies[1]", needle)
                and seen["index_requests"] == 0
                and not seen["left"]
                and seen["seconds"] < TIME_BOUND
                and control_ok
                and unchanged,
            )
    for trust in ("unverified", "trusted"):
        seen = observed[f"archive-name-{trust}"]
        ledger.attack(
            f"pack-requirements-archive-name-{trust}",
            expected=f"{ARCHIVE_NAME!r}, a valid PEP 508 name spelled like an sdist (which pip would read "
            "as a local archive to unpack and build), is refused before pip runs: no index request, nothing "
            "unpacked, built or installed, the host venv unchanged",
            observed=brief({**seen, "venv_unchanged": unchanged}),
            ok=refused(seen, "names an archive file")
            and seen["index_requests"] == 0
            and not seen["left"]
            and unchanged,
        )
    for variant, needle in (
        ("pyproject-oversized", f"is larger than {MAX_PYPROJECT_BYTES // 1024} KiB"),
        ("pyproject-toml-nesting", "is not valid TOML (nests too deep)"),
        ("requirements-10000", f"lists 10000 requirements, more than the {MAX_REQUIREMENTS}"),
    ):
        seen = observed[variant]
        ledger.attack(
            f"pack-requirements-{variant}",
            expected=f"install refused ({needle}) before pip runs: no index request, < {TIME_BOUND:g} s, "
            "host RSS grows < 64 MiB, nothing installed, the host venv unchanged",
            observed=brief({**seen, "venv_unchanged": unchanged}),
            ok=refused(seen, needle)
            and seen["index_requests"] == 0
            and seen["seconds"] < TIME_BOUND
            and seen["rss_growth_mib"] < 64
            and not seen["left"]
            and control_ok
            and unchanged,
        )


def test_a_requirement_with_terminal_escapes_is_shown_escaped(
    installs: Installs, ledger: Ledger, spy: SpyIndex
) -> None:
    env = {**installs.lab.state.env, "LANG": "C.UTF-8", "PIP_INDEX_URL": spy.url}
    for key in ("DOCKER_HOST", "DOCKER_CONFIG"):
        if key in os.environ:
            env[key] = os.environ[key]
    pack = write_pack(
        installs.lab.root / "req-packs", "hx-req-term", "agent", deps_toml(["six", HOSTILE_REQ])
    )
    installs.slugs.append("hx-req-term")
    proc = cli(env, "install", pack, timeout=300)
    lines = proc.stderr.splitlines()
    raw = [name for ch, name in RAW.items() if ch in proc.stdout + proc.stderr]
    shaped = len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")
    ledger.attack(
        "terminal.install_error.requirement",
        expected="install refused (exit 1, one error and one hint line, no traceback): the error names "
        "[project].dependencies[1] and shows the requirement with ESC/OSC/C1/bidi escaped, nothing raw; the "
        "index gets no request",
        observed=f"exit {proc.returncode}; error+hint lines: {shaped}; raw: {raw or 'none'}; index requests "
        f"{len(spy.requests)}; stderr {brief(ascii(proc.stderr), 240)}",
        ok=proc.returncode == 1
        and proc.stdout == ""
        and shaped
        and "Traceback" not in proc.stderr
        and not raw
        and "[project].dependencies[1]" in lines[0]
        and HOSTILE_REQ_SHOWN in lines[0]
        and not spy.requests
        and not installs.left("hx-req-term"),
    )


class _WheelWatch:
    """The most wheels seen at once in the install's download directories (the host's temp dir)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.most = max(self.most, sum(1 for _ in self.root.glob("agentnode-wheels-*/*/*.whl")))
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def test_hostile_wheels_are_refused_and_bounded(
    installs: Installs, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = pip_freeze()
    # The install's temporary directories go under a directory of the test's, so a watcher can count them.
    temp = tmp_path / "host-tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    fanout = tmp_path / "links-fanout"
    deps = tuple(f"hx-fan-{i}" for i in range(MAX_WHEELS))  # with the root: one over the bound
    make_wheel(fanout, "hx_fan_root", "1.0", {"hx_fan_root.py": b"X = 1\n"}, requires=deps)
    for dep in deps:
        name = dep.replace("-", "_")
        make_wheel(fanout, name, "1.0", {f"{name}.py": b"X = 1\n"})
    watch = _WheelWatch(temp)
    seen_fanout = installs(
        "hx-req-fanout", "agent", deps_toml(["hx-fan-root==1.0"]), "unverified",
        source=Source(offline=True, find_links=(fanout,)),
    )  # fmt: skip
    most_wheels = watch.stop()

    victim = Path(tempfile.gettempdir()).parent / f"anx-pwned-{uuid.uuid4().hex[:12]}.py"
    climb = "../" * 16 + str(victim).lstrip("/")
    traversal = tmp_path / "links-traversal"
    make_wheel(traversal, "hx_climb", "1.0", {"hx_climb.py": b"X = 1\n", climb: b"PWNED = True\n"})
    traversals = {
        f"{kind}-{trust}": installs(
            f"hx-req-climb-{kind}-{trust}", kind, deps_toml(["hx-climb==1.0"]), trust,
            source=Source(offline=True, find_links=(traversal,)),
        )
        for kind, trust in (("agent", "unverified"), ("toolpack", "trusted"), ("agent", "trusted"))
    }  # fmt: skip
    victim_written = victim.exists() or any(tmp_path.rglob(victim.name))

    bomb = tmp_path / "links-bomb"
    wheel = make_wheel(bomb, "hx_bomb", "1.0", {"hx_bomb.py": b"X = 1\n", "hx_bomb/zeros.bin": b"\0" * 16})
    declare_size(wheel, "hx_bomb/zeros.bin", 0xF000_0000)
    seen_bomb = installs(
        "hx-req-bomb", "agent", deps_toml(["hx-bomb==1.0"]), "unverified",
        source=Source(offline=True, find_links=(bomb,)),
    )  # fmt: skip
    unchanged = pip_freeze() == before

    ledger.attack(
        "pack-requirements-dependency-fanout",
        expected=f"a requirement that pulls {len(deps) + 1} wheels (offline, from a --find-links directory) "
        f"is refused naming the {MAX_WHEELS}-wheel bound; nothing installed, the host venv unchanged",
        observed=brief({**seen_fanout, "most_wheels_on_disk": most_wheels, "venv_unchanged": unchanged}),
        ok=refused(seen_fanout, f"resolve to more than {MAX_WHEELS} wheels")
        and not seen_fanout["left"]
        and unchanged,
    )
    for label, seen in traversals.items():
        ledger.attack(
            f"pack-requirements-wheel-traversal-{label}",
            expected="a wheel holding ../../…/anx-pwned-*.py (16 levels up, to beside the host's temp dir) "
            "is refused (the unpacker's unsafe path, or pip's 'outside the target directory' for a venv); "
            "the file is written nowhere, nothing installed, the host venv unchanged",
            observed=brief({**seen, "victim_written": victim_written, "venv_unchanged": unchanged}),
            ok=seen["outcome"].startswith("PackError: ")
            and not seen["left"]
            and not victim_written
            and unchanged,
        )
    ledger.attack(
        "pack-requirements-wheel-size-bomb",
        expected="a wheel whose member claims 3.75 GiB (its data is 16 bytes) is refused from the zip's "
        f"directory before any byte is written: < {TIME_BOUND:g} s, host RSS grows < 64 MiB, no volume",
        observed=brief({**seen_bomb, "venv_unchanged": unchanged}),
        ok=refused(seen_bomb, "unpack to more than")
        and seen_bomb["seconds"] < TIME_BOUND
        and seen_bomb["rss_growth_mib"] < 64
        and not seen_bomb["left"]
        and unchanged,
    )
