"""Hostile packs at install: YAML alias bombs, huge sparse files, FIFOs and devices, traversing versions."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.core.errors import SandboxError
from host.packs.install import LABEL_PACK, uninstall_pack
from host.spec.config import load_config
from host.spec.lockfile import LockEntry, Lockfile
from tests.hostile.conftest import Lab, Ledger, brief, host_subprocess

pytestmark = pytest.mark.docker

RSS_BOUND_KIB = 16 * 1024
"""Peak RSS an install may add: a refusal reads nothing, and a real pack is read in 1 MiB chunks."""
TIME_BOUND = 5.0
"""Seconds a refused install may take (the old host read a 3 GiB file, or a FIFO forever)."""
CHILD_TIMEOUT = 60.0

CHILD = r"""
import json, sys, time
from pathlib import Path
from host.spec.config import load_config
from host.engine.sdk import connect
from host.core.errors import SandboxError
from host.packs.install import install_pack

def peak_rss_kib():
    # VmHWM belongs to this process image; ru_maxrss would carry over the forking parent's peak.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0

env, pack, trust = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cfg = load_config(env)
client = connect(env)
out = {}
before = peak_rss_kib()
started = time.monotonic()
try:
    entry = install_pack(pack, trust=trust, paths=cfg.paths, client=client, image=cfg.agent_sandbox.image)
    out["installed"] = {"volume": entry.sandbox_volume, "host_path": entry.host_path}
except SandboxError as exc:
    out["error"] = type(exc).__name__
    out["message"] = exc.message
out["seconds"] = round(time.monotonic() - started, 3)
out["rss_growth_kib"] = peak_rss_kib() - before
client.close()
print(json.dumps(out))
"""
"""An install in its own interpreter, so its peak RSS and any hang are measured without touching ours."""


def install_in_child(lab: Lab, pack: Path, trust: str = "unverified") -> dict[str, Any]:
    """Install `pack` in a child process; a child still running after CHILD_TIMEOUT is killed and reported."""
    env = dict(lab.state.env)
    if "DOCKER_HOST" in os.environ:
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    child = host_subprocess(CHILD, json.dumps(env), str(pack), trust)
    started = time.monotonic()
    try:
        out, _ = child.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"hung": True, "wall_seconds": round(time.monotonic() - started, 1)}
    lines = out.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"crashed": True, "exit": child.returncode, "tail": out[-400:]}
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    return result


def pack_volumes(client: docker.DockerClient, slug: str) -> list[str]:
    return [v.name for v in client.volumes.list(filters={"label": f"{LABEL_PACK}={slug}"})]


def write_pack(lab: Lab, slug: str, manifest: str, files: dict[str, str] | None = None) -> Path:
    pack = lab.root / "hostile-packs" / slug
    pack.mkdir(parents=True)
    (pack / "agent.py").write_text("def run(context, **kwargs):\n    return 1\n")
    for rel, text in (files or {}).items():
        (pack / rel).parent.mkdir(parents=True, exist_ok=True)
        (pack / rel).write_text(text)
    (pack / "agentnode.yaml").write_text(manifest)
    return pack


def agent_yaml(slug: str, *, version: str = "1.0.0", agent: str = "", extra: str = "") -> str:
    return (
        f"package_id: {slug}\nversion: {json.dumps(version)}\npackage_type: agent\n"
        f'agent:\n  entrypoint: "agent:run"\n  goal: hostile\n{agent}{extra}'
    )


@pytest.fixture
def hlab(make_lab: Callable[[str], Lab]) -> Lab:
    """A lab for install-time attacks: nothing runs, so the runtime does not matter."""
    return make_lab("runc")


@pytest.fixture
def no_pack_volumes(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Slugs a test installs; afterwards none may have a volume (a leftover fails the test)."""
    slugs: list[str] = []
    yield slugs
    left = [name for slug in slugs for name in pack_volumes(docker_client, slug)]
    for name in left:
        with contextlib.suppress(docker.errors.APIError):
            docker_client.volumes.get(name).remove(force=True)
    assert not left, f"pack volumes left behind: {left}"


def refused(result: dict[str, Any], error: str, *needles: str) -> bool:
    """The install was refused with `error` naming every needle, quickly and with bounded memory."""
    return (
        result.get("error") == error
        and all(n in result.get("message", "") for n in needles)
        and result.get("seconds", 1e9) < TIME_BOUND
        and result.get("rss_growth_kib", 1 << 40) < RSS_BOUND_KIB
    )


# --- finding 4: YAML aliases ---------------------------------------------------------------------------

LAUGHS = "".join(
    f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(8)
)
"""About 500 bytes under an unknown key that SafeLoader expands to 9**8 strings (hundreds of MB as JSON)."""

ALIAS_VARIANTS = {  # (lines inside agent:, top-level lines after it)
    "top-level-unknown-key": ("", "x: &a [1, 2, 3]\ny: *a\n"),
    "nested-in-agent": ("  tool_access: &t {allowed_packages: [hostile-tools]}\n", ""),
    "alias-into-limits": ("  limits: {max_tool_calls: *n}\n", "n: &n 3\n"),
    "merge-key": ("  llm_access: {<<: *base, enabled: true}\n", "base: &base {max_calls: 3}\n"),
    "anchor-without-alias": ("", "metadata: &m {author: x}\n"),
    "anchor-on-a-scalar": ("", "note: &s text\n"),
    "alias-as-a-key": ("", "k: &k name\n*k : value\n"),
}


def test_a_yaml_alias_bomb_is_refused_before_it_expands(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str]
) -> None:
    slug = "hx-laughs"
    no_pack_volumes.append(slug)
    manifest = agent_yaml(slug, extra=LAUGHS)
    pack = write_pack(hlab, slug, manifest)
    lock = hlab.state.dir / "agentnode.lock"
    lock_before = lock.stat().st_size
    result = install_in_child(hlab, pack)
    lock_after = lock.stat().st_size
    reads, started = 0, time.monotonic()
    while reads < 50 and time.monotonic() - started < 2:  # what every later run pays, bounded here
        Lockfile(lock).get("hostile-tools")
        reads += 1
    read_ms = (time.monotonic() - started) * 1000 / reads
    ledger.attack(
        "pack-yaml-alias-bomb",
        expected="install refused at the first anchor (ManifestError naming file:line:col); lockfile "
        f"unchanged; peak RSS growth < {RSS_BOUND_KIB // 1024} MiB; < {TIME_BOUND} s; a lockfile read "
        "stays < 20 ms",
        observed=brief(
            {
                "manifest_bytes": len(manifest),
                **{k: result.get(k) for k in ("error", "seconds", "rss_growth_kib", "hung")},
                "names_location": "agentnode.yaml:" in result.get("message", ""),
                "lockfile_bytes": [lock_before, lock_after],
                "lockfile_read_ms": round(read_ms, 2),
                "volumes": pack_volumes(hlab.client, slug),
            }
        ),
        ok=refused(result, "ManifestError", "agentnode.yaml:", "YAML not accepted: anchors")
        and lock_after == lock_before
        and read_ms < 20
        and not pack_volumes(hlab.client, slug),
    )


@pytest.mark.parametrize("variant", list(ALIAS_VARIANTS))
def test_anchors_and_aliases_anywhere_are_refused(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str], variant: str
) -> None:
    agent, extra = ALIAS_VARIANTS[variant]
    slug = f"hx-alias-{variant}"
    no_pack_volumes.append(slug)
    pack = write_pack(hlab, slug, agent_yaml(slug, agent=agent, extra=extra))
    lock = hlab.state.dir / "agentnode.lock"
    before = lock.read_bytes()
    started = time.monotonic()
    try:
        hlab.state.install(pack)
        outcome = "installed"
    except SandboxError as exc:
        outcome = f"{type(exc).__name__}: {exc.message.removeprefix(str(pack))}"
    seconds = time.monotonic() - started
    ledger.attack(
        f"pack-yaml-{variant}",
        expected="ManifestError 'YAML not accepted' naming agentnode.yaml:line:col; lockfile unchanged; "
        "no volume",
        observed=brief({"outcome": outcome, "seconds": round(seconds, 3)}),
        ok=outcome.startswith("ManifestError: /agentnode.yaml:")
        and "YAML not accepted: a" in outcome
        and lock.read_bytes() == before
        and not pack_volumes(hlab.client, slug)
        and seconds < TIME_BOUND,
    )


def test_unknown_keys_never_reach_the_lockfile(hlab: Lab, ledger: Ledger, no_pack_volumes: list[str]) -> None:
    """Without aliases the bloat must be typed out; it installs, but only validated fields are stored."""
    slug = "hx-bloat"
    no_pack_volumes.append(slug)
    bloat = "readme_md: |\n" + "  lorem ipsum dolor sit amet\n" * 6000 + "publisher: {deep: [[[[1]]]]}\n"
    pack = write_pack(hlab, slug, agent_yaml(slug, extra=bloat))
    entry = hlab.state.install(pack)
    if entry.sandbox_volume:
        hlab.volumes.add(entry.sandbox_volume)
    raw = json.loads((hlab.state.dir / "agentnode.lock").read_text())["packages"][slug]
    size = len(json.dumps(raw))
    ledger.attack(
        "pack-manifest-bloat-in-lockfile",
        expected="a ~170 KiB manifest installs, and its lockfile entry holds only validated fields (< 4 KiB)",
        observed=brief(
            {
                "manifest_bytes": (pack / "agentnode.yaml").stat().st_size,
                "entry_bytes": size,
                "manifest_keys": sorted(raw["manifest"]),
            }
        ),
        ok=size < 4096 and "readme_md" not in raw["manifest"] and "publisher" not in raw["manifest"],
    )
    hlab.client.volumes.get(entry.sandbox_volume).remove(force=True)
    hlab.volumes.discard(entry.sandbox_volume or "")
    Lockfile(hlab.state.dir / "agentnode.lock").remove(slug)


def test_an_older_hosts_bloated_lockfile_is_refused_unparsed(hlab: Lab, ledger: Ledger) -> None:
    """What an older host wrote after an alias bomb: every run read it; now it is refused at once, by size."""
    path = hlab.root / "old-agentnode.lock"
    with path.open("wb") as fh:
        fh.write(b'{"lockfile_version": 1, "packages": {"x": {"manifest": {"x": ["')
        fh.truncate(200 << 20)  # sparse: costs no disk
    started = time.monotonic()
    try:
        Lockfile(path).get("x")
        outcome, hint = "parsed", ""
    except SandboxError as exc:
        outcome, hint = f"{type(exc).__name__}: {exc.message.removeprefix(str(path))}", exc.hint
    seconds = time.monotonic() - started
    ledger.attack(
        "pack-lockfile-oversized-read",
        expected="a 200 MiB lockfile is refused by size before parsing (< 0.5 s), hint: reinstall the packs",
        observed=brief({"outcome": outcome, "ms": round(seconds * 1000, 1), "hint": hint}),
        ok=outcome.startswith("PackError")
        and "over the 16 MiB" in outcome
        and seconds < 0.5
        and "reinstall" in hint,
    )


# --- findings 5 and 6: sizes before reading; FIFOs, sockets and devices refused -----------------------------


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)


def _one_huge_file(pack: Path) -> None:
    _sparse(pack / "model.bin", 3 << 30)


def _files_over_the_total(pack: Path) -> None:
    for i in range(3):  # each under the per-file limit, together over the pack limit
        _sparse(pack / "data" / f"part{i}.bin", 30 << 20)


SIZE_VARIANTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "sparse-3GiB-file": (_one_huge_file, "model.bin: the file is larger than"),
    "sparse-files-over-the-total": (_files_over_the_total, "the pack is larger than 64 MiB"),
}


@pytest.mark.parametrize("variant", list(SIZE_VARIANTS))
def test_huge_files_are_refused_before_they_are_read(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str], variant: str
) -> None:
    make, needle = SIZE_VARIANTS[variant]
    slug = f"hx-size-{variant}".lower()
    no_pack_volumes.append(slug)
    pack = write_pack(hlab, slug, agent_yaml(slug))
    make(pack)
    result = install_in_child(hlab, pack)
    ledger.attack(
        f"pack-{variant}",
        expected=f"PackError '{needle}' from lstat alone: < {TIME_BOUND} s, peak RSS growth "
        f"< {RSS_BOUND_KIB // 1024} MiB, no volume",
        observed=brief({**result, "volumes": pack_volumes(hlab.client, slug)}),
        ok=refused(result, "PackError", needle) and not pack_volumes(hlab.client, slug),
    )


def test_a_large_legitimate_file_is_streamed_not_held(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str], docker_client: docker.DockerClient
) -> None:
    """The control: a 30 MiB file under the limits installs, read in chunks and tarred on disk."""
    slug = "hx-size-streamed"
    no_pack_volumes.append(slug)
    pack = write_pack(hlab, slug, agent_yaml(slug))
    with (pack / "weights.bin").open("wb") as fh:
        for _ in range(30):
            fh.write(os.urandom(1 << 20))
    result = install_in_child(hlab, pack)
    volumes = pack_volumes(docker_client, slug)
    if "installed" in result:
        uninstall_pack(slug, paths=load_config(hlab.state.env).paths, client=docker_client)
    ledger.attack(
        "pack-large-file-streamed",
        expected=f"installs; peak RSS growth < {RSS_BOUND_KIB // 1024} MiB (never the whole file, never the "
        "whole tar in memory)",
        observed=brief({**result, "volumes": volumes}),
        ok="installed" in result
        and result.get("rss_growth_kib", 1 << 40) < RSS_BOUND_KIB
        and len(volumes) == 1,
    )


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    """A socket file bound under a short directory (sun_path holds 108 bytes), then moved into the pack."""
    short = Path(tempfile.mkdtemp(prefix="anp-", dir="/tmp"))
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s"))
        os.rename(short / "s", path)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _zero_device(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # like /dev/zero: a read never ends


SPECIAL_VARIANTS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "fifo": (_fifo, "lib/pipe", "a FIFO (named pipe) is not allowed"),
    "fifo-manifest": (_fifo, "agentnode.yaml", "the manifest is not a regular file"),
    "unix-socket": (_socket, "s.sock", "a Unix socket is not allowed"),
    "char-device-zero": (_zero_device, "data/zero", "a character device is not allowed"),
}


@pytest.mark.parametrize("trust", ["unverified", "trusted"])
@pytest.mark.parametrize("variant", list(SPECIAL_VARIANTS))
def test_fifos_sockets_and_devices_are_refused_at_once(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str], variant: str, trust: str
) -> None:
    make, rel, needle = SPECIAL_VARIANTS[variant]
    if variant.startswith("char-device") and os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    slug = f"hx-special-{variant}"
    no_pack_volumes.append(slug)
    pack = write_pack(hlab, slug, agent_yaml(slug))
    if rel == "agentnode.yaml":
        (pack / rel).unlink()
    (pack / rel).parent.mkdir(parents=True, exist_ok=True)
    make(pack / rel)
    result = install_in_child(hlab, pack, trust)
    copies = hlab.state.dir / "packs" / slug
    ledger.attack(
        f"pack-{variant}-{trust}",
        expected=f"refused within {TIME_BOUND} s naming {rel!r} ({needle}); no volume, no host copy",
        observed=brief({**result, "volumes": pack_volumes(hlab.client, slug), "host_copy": copies.exists()}),
        ok=refused(result, "ManifestError" if rel == "agentnode.yaml" else "PackError", rel, needle)
        and not pack_volumes(hlab.client, slug)
        and not copies.exists(),
    )


# --- finding 11: version path traversal, and paths the host derives checked before create/remove ------------

VERSIONS = ["../../../x", "1.0.0/../x", "..", "1.0.0\n", "1.0.0\x1b[31m", "1.0.0/../../../../tmp/x"]


@pytest.mark.parametrize("version", VERSIONS, ids=[json.dumps(v) for v in VERSIONS])
def test_a_traversing_version_is_refused(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str], version: str
) -> None:
    slug = "hx-version"
    no_pack_volumes.append(slug)
    pack = write_pack(hlab, slug, agent_yaml(slug, version=version))
    top = sorted(p.name for p in hlab.state.dir.iterdir())
    try:
        hlab.state.install(pack, trust="trusted")
        outcome = "installed"
    except SandboxError as exc:
        outcome = f"{type(exc).__name__}: {exc.message.removeprefix(str(pack))}"
    ledger.attack(
        f"pack-version-{json.dumps(version)}",
        expected="ManifestError naming `version` (the value not echoed); nothing created in or beside packs/",
        observed=brief({"outcome": outcome, "config_dir": sorted(p.name for p in hlab.state.dir.iterdir())}),
        ok=outcome.startswith("ManifestError: /agentnode.yaml: version: expected a semantic version")
        and "\x1b" not in outcome
        and "\n" not in outcome
        and sorted(p.name for p in hlab.state.dir.iterdir()) == top
        and not (hlab.state.dir / "packs" / slug).exists()
        and not pack_volumes(hlab.client, slug),
    )


def test_uninstall_never_removes_what_an_entry_points_outside(
    hlab: Lab, ledger: Ledger, docker_client: docker.DockerClient
) -> None:
    """An entry an older host wrote for `version: ../../../x` (or an edited one): forgotten, never deleted."""
    paths = load_config(hlab.state.env).paths
    victim = hlab.root / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    foreign = f"anh-victim-{uuid.uuid4().hex[:12]}"
    docker_client.volumes.create(name=foreign)
    try:
        lock = Lockfile(paths.lockfile)
        observed: dict[str, Any] = {}
        for host_path in (str(victim), str(paths.packs_dir / "hx-old" / ".." / ".." / ".." / "victim")):
            lock.put(
                LockEntry(
                    slug="hx-old",
                    version="../../../x",
                    package_type="agent",
                    trust_level="trusted",
                    artifact_hash="0" * 64,
                    import_subdir="",
                    sandbox_volume=foreign,
                    host_path=host_path,
                    manifest={},
                    installed_at="2024-01-01T00:00:00Z",
                )
            )
            forgotten = uninstall_pack("hx-old", paths=paths, client=docker_client)
            observed[host_path.removeprefix(str(hlab.root))] = {
                "forgotten": forgotten.slug == "hx-old" and lock.get("hx-old") is None,
                "victim_kept": (victim / "keep").is_file(),
                "foreign_volume_kept": bool(docker_client.volumes.list(filters={"name": foreign})),
            }
        ledger.attack(
            "pack-uninstall-outside-paths",
            expected="the entry is forgotten; a host_path outside packs/<slug>/ and a volume not named like "
            "a pack volume are left untouched",
            observed=brief(observed),
            ok=all(all(v.values()) for v in observed.values()),
        )
    finally:
        docker_client.volumes.get(foreign).remove(force=True)


# --- finding 9 (part): manifest integers must fit their uint32 wire fields ----------------------------------

WIRE_INTS = {
    "max_tool_calls=2**32": ("  limits: {max_tool_calls: 4294967296}\n", "agent.limits.max_tool_calls"),
    "max_iterations=-1": ("  limits: {max_iterations: -1}\n", "agent.limits.max_iterations"),
    "max_runtime_seconds=true": (
        "  limits: {max_runtime_seconds: true}\n",
        "agent.limits.max_runtime_seconds",
    ),
    "max_runtime_seconds=10**30": (
        "  limits: {max_runtime_seconds: 1000000000000000000000000000000}\n",
        "agent.limits.max_runtime_seconds",
    ),
    "llm.max_calls=2**32": (
        "  llm_access: {enabled: true, max_calls: 4294967296}\n",
        "agent.llm_access.max_calls",
    ),
    "llm.max_input_chars=-5": ("  llm_access: {max_input_chars: -5}\n", "agent.llm_access.max_input_chars"),
    "llm.max_output_chars=2**64": (
        "  llm_access: {max_output_chars: 18446744073709551616}\n",
        "agent.llm_access.max_output_chars",
    ),
}


@pytest.mark.parametrize("variant", list(WIRE_INTS))
def test_integers_that_do_not_fit_the_wire_are_refused_at_install(
    hlab: Lab, ledger: Ledger, no_pack_volumes: list[str], variant: str
) -> None:
    agent, key = WIRE_INTS[variant]
    slug = "hx-wire-int"
    no_pack_volumes.append(slug)
    pack = write_pack(hlab, slug, agent_yaml(slug, agent=agent))
    try:
        hlab.state.install(pack)
        outcome = "installed"
    except SandboxError as exc:
        outcome = f"{type(exc).__name__}: {exc.message.removeprefix(str(pack))}"
    ledger.attack(
        f"pack-wire-int-{variant}",
        expected=f"ManifestError naming {key} (uint32 on the wire); no volume, no lockfile entry",
        observed=brief({"outcome": outcome}),
        ok=outcome.startswith(f"ManifestError: /agentnode.yaml: {key}: expected a positive integer")
        and Lockfile(hlab.state.dir / "agentnode.lock").get(slug) is None
        and not pack_volumes(hlab.client, slug),
    )
