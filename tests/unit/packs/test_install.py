"""Pack install without an engine: artifact identity, volume naming, the lockfile, host copies, refusals."""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import stat
import tarfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import docker.errors
import pytest
import requests

from host.core.errors import AuditReason, EngineRejected, ManifestError, PackError
from host.engine.volumes import verify_volume, volume_name
from host.packs import files as _files
from host.packs import install as _packs
from host.packs.files import artifact_hash
from host.packs.install import install_pack, uninstall_pack
from host.spec import lockfile as _lockfile
from host.spec.config import ConfigPaths, config_paths
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.load import load_manifest, manifest_data
from tests.support.tars import assert_ends_at_marker

MARKER_MODULE = textwrap.dedent(
    """
    import pathlib
    pathlib.Path({marker!r}).write_text("pack code ran on the host")

    def run(context=None, **kwargs):
        pathlib.Path({marker!r}).write_text("pack code ran on the host")
        return "ran"
    """
)


@pytest.fixture
def paths(tmp_path: Path) -> ConfigPaths:
    return config_paths({"AGENTNODE_CONFIG": str(tmp_path / "config")})


def write_pack(
    base: Path,
    slug: str,
    *,
    kind: str = "agent",
    src: bool = False,
    marker: Path | None = None,
    extra: str = "",
    version: str = "1.0.0",
) -> Path:
    d = base / slug
    code_dir = d / "src" if src else d
    code_dir.mkdir(parents=True)
    module = MARKER_MODULE.format(marker=str(marker)) if marker else "def run(**kw):\n    return 1\n"
    (code_dir / "mod.py").write_text(module)
    if kind == "agent":
        body = 'agent:\n  entrypoint: "mod:run"\n'
    else:
        body = "entrypoint: mod\n"
    (d / "agentnode.yaml").write_text(
        f'package_id: {slug}\nversion: "{version}"\npackage_type: {kind}\n{body}{extra}'
    )
    return d


# --- artifact identity ----------------------------------------------------------------------------------


def test_artifact_hash_is_stable_and_content_addressed(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha")
    first = artifact_hash(pack)
    assert len(first) == 64 and first == artifact_hash(pack)
    (pack / "mod.py").write_text("def run(**kw):\n    return 2\n")
    changed = artifact_hash(pack)
    assert changed != first
    (pack / "mod.py").rename(pack / "other.py")
    assert artifact_hash(pack) != changed  # paths are part of the identity


def test_artifact_hash_ignores_build_debris(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha")
    clean = artifact_hash(pack)
    for junk in ("__pycache__/mod.cpython-311.pyc", ".git/HEAD", "x.egg-info/PKG-INFO", "mod.pyc"):
        (pack / junk).parent.mkdir(parents=True, exist_ok=True)
        (pack / junk).write_text("junk")
    assert artifact_hash(pack) == clean


def test_symlinks_are_refused(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha")
    (pack / "link.py").symlink_to("/etc/hostname")
    with pytest.raises(PackError, match="symlinks are not allowed"):
        artifact_hash(pack)


def test_oversized_packs_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_files, "MAX_PACK_BYTES", 1000)
    pack = write_pack(tmp_path, "alpha")
    (pack / "blob.bin").write_bytes(b"x" * 2000)
    with pytest.raises(PackError, match="larger than"):
        artifact_hash(pack)


def test_volume_name_is_slug_version_and_hash_prefix() -> None:
    digest = "0123456789abcdef" + "f" * 48
    assert volume_name("alpha", "1.2.3", digest) == "agentnode-pack-alpha-1.2.3-0123456789abcdef"
    assert (
        volume_name("alpha", "1.0+local build", digest)
        == "agentnode-pack-alpha-1.0-local-build-0123456789abcdef"
    )
    assert len(volume_name("a", "9" * 100, digest)) == len("agentnode-pack-a--0123456789abcdef") + 40


def test_pack_tar_holds_exactly_the_hashed_files_with_neutral_metadata(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha", src=True)
    (pack / "src" / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(pack / "src" / "tool.sh", 0o755)
    (pack / "src" / "__pycache__").mkdir()
    (pack / "src" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    with _files.snapshot(pack) as snap, tarfile.open(fileobj=snap.archive) as tar:
        assert_ends_at_marker(snap.archive)
        assert snap.digest == artifact_hash(pack) and snap.dirs == {"src"}
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"agentnode.yaml", "src/mod.py", "src/tool.sh"}
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 and m.isfile() for m in members.values())
        assert members["src/tool.sh"].mode == 0o755 and members["src/mod.py"].mode == 0o644
        extracted = tar.extractfile("src/mod.py")
        assert extracted is not None and extracted.read() == (pack / "src" / "mod.py").read_bytes()


# --- the lockfile -------------------------------------------------------------------------------------------


def entry(slug: str = "alpha", **overrides: object) -> LockEntry:
    fields: dict[str, object] = {
        "slug": slug,
        "version": "1.0.0",
        "package_type": "agent",
        "trust_level": "unverified",
        "artifact_hash": "a" * 64,
        "import_subdir": "",
        "sandbox_volume": volume_name(slug, "1.0.0", "a" * 64),
        "host_path": None,
        "manifest": {"package_id": slug, "version": "1.0.0", "package_type": "agent"},
        "installed_at": "2024-01-01T00:00:00Z",
    }
    return LockEntry(**(fields | overrides))  # type: ignore[arg-type]


def test_lockfile_round_trip_is_private_and_atomic(tmp_path: Path) -> None:
    lock = Lockfile(tmp_path / "d" / "agentnode.lock")
    assert lock.get("alpha") is None and lock.entries() == {}
    assert lock.put(entry()) is None
    assert lock.put(entry(version="1.0.1")) == entry()
    lock.put(entry("beta"))
    assert lock.get("alpha") == entry(version="1.0.1")
    assert set(lock.entries()) == {"alpha", "beta"}
    assert stat.S_IMODE(lock.path.stat().st_mode) == 0o600
    assert json.loads(lock.path.read_text())["lockfile_version"] == 1
    assert [p.name for p in lock.path.parent.iterdir() if p.name.startswith(".")] == []  # no temp left
    assert lock.remove("alpha") == entry(version="1.0.1")
    assert lock.remove("alpha") is None and set(lock.entries()) == {"beta"}


def test_an_unchanged_lockfile_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs read it on every run and tool call: the same file gives the same entry, manifest parsed once."""
    raw = {"package_id": "alpha", "version": "1.0.0", "package_type": "agent",
           "agent": {"entrypoint": "mod:run"}}  # fmt: skip
    lock = Lockfile(tmp_path / "agentnode.lock")
    lock.put(entry(manifest=raw))
    parses: list[object] = []
    real_loads = json.loads
    monkeypatch.setattr(_lockfile.json, "loads", lambda *a, **k: parses.append(a) or real_loads(*a, **k))
    first = lock.get("alpha")
    assert first is not None and lock.get("alpha") is first and lock.entries()["alpha"] is first
    assert first.parsed_manifest() is first.parsed_manifest()
    assert len(parses) == 1
    assert "_parsed" not in first.to_json() and Lockfile(lock.path).get("alpha") == first


@pytest.mark.parametrize("how", ["put", "remove", "edit in place", "replace"])
def test_a_changed_lockfile_is_read_again(tmp_path: Path, how: str) -> None:
    lock = Lockfile(tmp_path / "agentnode.lock")
    lock.put(entry())
    assert lock.get("alpha") == entry()
    other = Lockfile(lock.path)  # another process's writes, as far as `lock` can tell
    if how == "put":
        other.put(entry(version="1.0.1"))
    elif how == "remove":
        other.remove("alpha")
    else:
        text = lock.path.read_text().replace('"1.0.0"', '"1.0.10"')
        if how == "edit in place":
            with lock.path.open("r+") as fh:  # same inode, new size
                fh.write(text)
        else:
            staged = tmp_path / "staged"
            staged.write_text(text)
            staged.replace(lock.path)
    expected = {"put": "1.0.1", "remove": None, "edit in place": "1.0.10", "replace": "1.0.10"}[how]
    got = lock.get("alpha")
    assert (got.version if got else None) == expected


@pytest.mark.parametrize("content", ["{not json", "[]", '{"packages": []}'])
def test_a_damaged_lockfile_is_a_pack_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "agentnode.lock"
    path.write_text(content)
    with pytest.raises(PackError) as info:
        Lockfile(path).get("alpha")
    assert str(path) in info.value.message and info.value.hint


@pytest.mark.parametrize("write", ["put", "remove"])
def test_an_unwritable_lockfile_is_a_pack_error(tmp_path: Path, write: str) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    path = blocker / "agentnode.lock"  # its directory cannot exist, whoever runs the test
    with pytest.raises(PackError) as info:
        getattr(Lockfile(path), write)(entry() if write == "put" else "alpha")
    assert info.value.message.startswith(f"{path}: cannot write the lockfile")
    assert str(blocker) in info.value.hint


# --- install / uninstall without an engine ---------------------------------------------------------------


def test_trusted_toolpack_gets_a_host_copy_and_no_code_runs(tmp_path: Path, paths: ConfigPaths) -> None:
    marker = tmp_path / "marker"
    pack = write_pack(tmp_path / "src", "word-tools", kind="toolpack", src=True, marker=marker)
    installed = install_pack(pack, trust="Trusted ", paths=paths, client=None, image=None)
    assert not marker.exists()
    assert installed.trust_level == "trusted" and installed.package_type == "toolpack"
    assert installed.import_subdir == "src" and installed.sandbox_volume is None
    assert installed.artifact_hash == artifact_hash(pack)
    assert installed.host_path is not None
    host_copy = Path(installed.host_path)
    assert host_copy == paths.packs_dir / "word-tools" / f"1.0.0-{installed.artifact_hash[:16]}"
    assert (host_copy / "src" / "mod.py").read_bytes() == (pack / "src" / "mod.py").read_bytes()
    assert Lockfile(paths.lockfile).get("word-tools") == installed
    assert installed.manifest["package_id"] == "word-tools"


def test_community_agent_needs_the_engine(tmp_path: Path, paths: ConfigPaths) -> None:
    pack = write_pack(tmp_path, "agent-x")
    with pytest.raises(PackError) as info:
        install_pack(pack, trust="unverified", paths=paths, client=None, image=None)
    assert info.value.reason is AuditReason.ENGINE_UNAVAILABLE
    assert "provision-engine" in info.value.hint and "doctor" in info.value.hint
    assert Lockfile(paths.lockfile).get("agent-x") is None


def test_trusted_agent_without_engine_is_host_only(tmp_path: Path, paths: ConfigPaths) -> None:
    installed = install_pack(
        write_pack(tmp_path, "agent-t"), trust="trusted", paths=paths, client=None, image=None
    )
    assert installed.sandbox_volume is None and installed.host_path is not None


def test_pack_dependencies_install_with_a_warning_for_each_missing_pack(
    tmp_path: Path, paths: ConfigPaths
) -> None:
    """`dependencies` name other packs (the format's pack references); nothing installs them."""
    install_pack(write_pack(tmp_path, "present", kind="toolpack"), trust="trusted", paths=paths, client=None,
                 image=None)  # fmt: skip
    deps = (
        "dependencies:\n  - present\n  - package_id: absent\n    is_required: false\n"
        "  - requests>=2\ndescripton: x\n"
    )
    warnings: list[str] = []
    installed = install_pack(
        write_pack(tmp_path, "needy", extra=deps), trust="trusted", paths=paths, client=None, image=None,
        warnings=warnings,
    )  # fmt: skip
    assert installed.manifest["dependencies"] == [
        {"package_slug": "present", "role": "", "required": True, "min_version": None},
        {"package_slug": "absent", "role": "", "required": False, "min_version": None},
    ]
    assert warnings[0] == "descripton: unknown key, ignored (did you mean description?)"
    assert warnings[1].startswith("dependencies[2]: expected a pack slug, got a string of 11 characters")
    assert warnings[2:] == [
        "dependency absent (optional) is not installed; install it too (dependencies are never installed "
        "automatically)"
    ]
    assert Lockfile(paths.lockfile).get("needy") == installed


@pytest.mark.parametrize("trust", ["community", "", "root"])
def test_unknown_trust_is_refused(tmp_path: Path, paths: ConfigPaths, trust: str) -> None:
    with pytest.raises(PackError, match="unknown trust level"):
        install_pack(write_pack(tmp_path, "alpha"), trust=trust, paths=paths, client=None, image=None)


def test_a_directory_without_manifest_is_refused(tmp_path: Path, paths: ConfigPaths) -> None:
    with pytest.raises(PackError, match=r"no agentnode\.yaml"):
        install_pack(tmp_path, trust="trusted", paths=paths, client=None, image=None)


def test_uninstall_forgets_the_pack_and_its_host_copy(tmp_path: Path, paths: ConfigPaths) -> None:
    installed = install_pack(
        write_pack(tmp_path, "alpha"), trust="curated", paths=paths, client=None, image=None
    )
    assert installed.host_path is not None
    assert uninstall_pack("alpha", paths=paths, client=None) == installed
    assert not Path(installed.host_path).exists() and Lockfile(paths.lockfile).get("alpha") is None
    with pytest.raises(PackError, match="not installed"):
        uninstall_pack("alpha", paths=paths, client=None)


# --- verify_volume refuses before asking the engine ---------------------------------------------------------


@pytest.mark.parametrize(
    ("volume", "expected"),
    [
        (None, AuditReason.VOLUME_MISSING),
        ("agentnode-pack-alpha-0.9-0000000000000000", AuditReason.VOLUME_STALE),
    ],
)
def test_lockfile_volume_must_match_the_artifact(volume: str | None, expected: AuditReason) -> None:
    with pytest.raises(PackError) as info:
        verify_volume(None, entry(sandbox_volume=volume))  # type: ignore[arg-type]  # never reaches the engine
    assert info.value.reason is expected and "agentnode-sandbox install" in info.value.hint


# --- findings 5 and 6: lstat first, sizes before reading, only regular files and directories ---------------


def _within(seconds: float, fn: Callable[[], object]) -> BaseException | None:
    """Run fn in a thread; a hang fails the test instead of hanging the suite."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return outcome[0]


def _make_special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # like /dev/null
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "what"),
    [("fifo", "a FIFO"), ("socket", "a Unix socket"), ("chardev", "a character device")],
)
@pytest.mark.parametrize("where", ["x", "src/deep/x"])
def test_special_files_are_refused_at_once_naming_their_path(
    tmp_path: Path, paths: ConfigPaths, kind: str, what: str, where: str
) -> None:
    pack = write_pack(tmp_path, "alpha")
    (pack / where).parent.mkdir(parents=True, exist_ok=True)
    _make_special(pack / where, kind)
    for attempt in (
        lambda: artifact_hash(pack),
        lambda: install_pack(pack, trust="trusted", paths=paths, client=None, image=None),
    ):
        error = _within(5, attempt)
        assert isinstance(error, PackError), error
        assert error.message == f"{where}: {what}" + error.message.removeprefix(f"{where}: {what}")
        assert "only regular files and directories" in error.message and error.hint
    assert not paths.packs_dir.exists() and Lockfile(paths.lockfile).get("alpha") is None


def test_symlinks_anywhere_are_refused_except_in_skipped_debris(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha")
    (pack / "node_modules").symlink_to("/")  # skipped by name: never followed
    (pack / "__pycache__").mkdir()
    (pack / "__pycache__" / "x.pyc").symlink_to("/etc/shadow")
    clean = artifact_hash(pack)
    (pack / "lib").symlink_to("/etc")  # a linked directory was silently skipped before; now refused
    with pytest.raises(PackError, match=r"^lib: symlinks are not allowed"):
        artifact_hash(pack)
    (pack / "lib").unlink()
    (pack / "sub").mkdir()
    (pack / "sub" / "dangling.py").symlink_to(tmp_path / "nowhere")
    with pytest.raises(PackError, match=r"^sub/dangling\.py: symlinks are not allowed"):
        artifact_hash(pack)
    (pack / "sub" / "dangling.py").unlink()
    assert artifact_hash(pack) == clean


def test_a_huge_sparse_file_is_refused_before_any_byte_is_read(
    tmp_path: Path, paths: ConfigPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = write_pack(tmp_path, "alpha")
    with (pack / "model.bin").open("wb") as fh:
        fh.truncate(3 << 30)
    opened: list[str] = []
    real_open = _files._open_file
    monkeypatch.setattr(_files, "_open_file", lambda fd, f: opened.append(f.rel) or real_open(fd, f))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(PackError, match=r"^model\.bin: the file is larger than 32 MiB"):
        install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    assert time.monotonic() - started < 2
    assert opened == []  # refused from lstat alone
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


def test_the_total_size_is_checked_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_files, "MAX_PACK_BYTES", 1000)
    pack = write_pack(tmp_path, "alpha")
    for name in ("a.bin", "b.bin"):
        (pack / name).write_bytes(b"x" * 450)
    monkeypatch.setattr(_files, "_open_file", lambda fd, f: pytest.fail("read before the size check"))
    with pytest.raises(PackError, match="the pack is larger than"):
        artifact_hash(pack)


@pytest.mark.parametrize("limit", ["entries", "depth"])
def test_the_walk_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str) -> None:
    pack = write_pack(tmp_path, "alpha")
    if limit == "entries":
        monkeypatch.setattr(_files, "MAX_PACK_ENTRIES", 10)
        for i in range(20):
            (pack / f"f{i}.py").write_text("")
        match = "more than 10 files and directories"
    else:
        monkeypatch.setattr(_files, "MAX_PACK_DEPTH", 3)
        (pack / "a" / "b" / "c" / "d").mkdir(parents=True)
        match = r"^a/b/c/d: directories nest deeper than 3 levels"
    with pytest.raises(PackError, match=match):
        artifact_hash(pack)


@pytest.mark.parametrize("change", ["grow", "shrink", "fifo", "symlink"])
def test_a_file_changed_after_the_scan_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    pack = write_pack(tmp_path, "alpha")
    target = pack / "mod.py"
    real_scan = _files._scan

    def scan_then_change(root_fd: int) -> Any:
        found = real_scan(root_fd)
        if change == "grow":
            with target.open("ab") as fh:
                fh.write(b"# more\n")
        elif change == "shrink":
            target.write_bytes(b"")
        else:
            target.unlink()
            if change == "fifo":
                os.mkfifo(target)
            else:
                target.symlink_to("/etc/hostname")
        return found

    monkeypatch.setattr(_files, "_scan", scan_then_change)
    error = _within(5, lambda: artifact_hash(pack))
    assert isinstance(error, PackError), error
    assert error.message == "mod.py: changed while the pack was being installed"


def test_a_growing_file_is_read_only_up_to_its_checked_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same inode, same size at open, then appended to while being read: refused, never read past."""
    pack = write_pack(tmp_path, "alpha")
    target = pack / "mod.py"
    real_open = _files._open_file

    def open_then_grow(root_fd: int, f: Any) -> int:
        fd = real_open(root_fd, f)
        if f.rel == "mod.py":
            with target.open("ab") as fh:
                fh.write(b"x" * 10)
        return fd

    monkeypatch.setattr(_files, "_open_file", open_then_grow)
    with pytest.raises(PackError, match=r"^mod\.py: changed while"):
        artifact_hash(pack)


def test_file_names_with_control_characters_are_refused_and_not_echoed(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha")
    (pack / "evil\x1b[31m\n.py").write_text("")
    with pytest.raises(PackError) as info:
        artifact_hash(pack)
    assert info.value.message.startswith("evil\\x1b[31m\\n.py: file names with control characters")
    assert "\x1b" not in info.value.message and "\n" not in info.value.message


def test_a_fifo_manifest_is_refused_at_once(tmp_path: Path, paths: ConfigPaths) -> None:
    pack = tmp_path / "alpha"
    pack.mkdir()
    os.mkfifo(pack / "agentnode.yaml")
    error = _within(5, lambda: install_pack(pack, trust="trusted", paths=paths, client=None, image=None))
    assert isinstance(error, ManifestError) and "not a regular file" in error.message


def test_the_host_copy_is_the_hashed_snapshot(tmp_path: Path, paths: ConfigPaths) -> None:
    pack = write_pack(tmp_path, "alpha", src=True)
    (pack / "src" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(pack / "src" / "run.sh", 0o755)
    installed = install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    assert installed.host_path is not None
    copy = Path(installed.host_path)
    files = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    assert files == ["agentnode.yaml", "src/mod.py", "src/run.sh"]
    assert artifact_hash(copy) == installed.artifact_hash
    assert (
        os.access(copy / "src" / "run.sh", os.X_OK)
        and stat.S_IMODE((copy / "src/mod.py").stat().st_mode) == 0o644
    )
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]  # no staging left


# --- finding 4: the lockfile holds validated manifests, bounded per entry and in total ----------------------


def test_the_lockfile_stores_the_validated_manifest_only(tmp_path: Path, paths: ConfigPaths) -> None:
    extra = "publisher: someone\nreadme_md: |\n" + "  lorem ipsum\n" * 5000 + "unknown: {a: [1, 2, 3]}\n"
    pack = write_pack(tmp_path, "alpha", kind="toolpack", extra=extra)
    installed = install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    text = paths.lockfile.read_text()
    assert "lorem" not in text and "publisher" not in text and "unknown" not in text
    assert len(text) < 2000
    stored = Lockfile(paths.lockfile).get("alpha")
    assert (
        stored is not None and stored.parsed_manifest() == load_manifest(pack) == installed.parsed_manifest()
    )
    assert stored.manifest == manifest_data(load_manifest(pack))


def test_an_older_lockfile_entry_still_reads_or_says_reinstall(tmp_path: Path) -> None:
    lock = Lockfile(tmp_path / "agentnode.lock")
    raw = {
        "package_id": "alpha",
        "version": "1.0.0",
        "package_type": "agent",
        "publisher": "x",
        "agent": {"entrypoint": "mod:run", "tier": "llm_only"},
    }
    lock.put(entry(manifest=raw))
    got = lock.get("alpha")
    assert got is not None and got.parsed_manifest().version == "1.0.0"
    lock.put(entry(manifest={**raw, "version": "../../x"}))
    got = lock.get("alpha")
    assert got is not None
    with pytest.raises(ManifestError) as info:
        got.parsed_manifest()
    assert info.value.message.startswith("lockfile entry alpha: version: expected a semantic version")
    assert "reinstall it: agentnode-sandbox install <path-to-alpha>" in info.value.hint


def test_an_oversized_lockfile_is_refused_unparsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agentnode.lock"
    with path.open("wb") as fh:  # what an older host wrote after an alias bomb, as a sparse file
        fh.truncate(1 << 30)
    started = time.monotonic()
    with pytest.raises(PackError) as info:
        Lockfile(path).entries()
    assert time.monotonic() - started < 1
    assert "over the 16 MiB this host reads" in info.value.message
    assert "reinstall the packs" in info.value.hint
    monkeypatch.setattr(_lockfile, "MAX_LOCKFILE_BYTES", 100)
    path.write_text(json.dumps({"lockfile_version": 1, "packages": {"a": {"pad": "x" * 200}}}))
    monkeypatch.setattr(_lockfile.json, "loads", lambda *a, **k: pytest.fail("parsed an oversized lockfile"))
    with pytest.raises(PackError, match="over the"):
        Lockfile(path).get("a")


def test_lock_entries_and_the_lockfile_have_size_caps(
    tmp_path: Path, paths: ConfigPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_packs, "MAX_LOCK_ENTRY_BYTES", 4096)  # an install's check
    monkeypatch.setattr(_lockfile, "MAX_LOCK_ENTRY_BYTES", 4096)  # the lockfile's own, and its message
    pack = write_pack(tmp_path, "alpha", extra="")
    manifest = pack / "agentnode.yaml"
    manifest.write_text(manifest.read_text() + f"  goal: {'g' * 5000}\n")
    with pytest.raises(PackError) as info:
        install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    assert (
        "over the 4 KiB a lockfile entry may hold" in info.value.message and "agent.goal" in info.value.hint
    )
    assert not paths.packs_dir.exists() and not paths.lockfile.exists()
    with pytest.raises(PackError, match="a lockfile entry may hold"):
        Lockfile(paths.lockfile).put(entry(manifest={"pad": "x" * 5000}))
    monkeypatch.setattr(_lockfile, "MAX_LOCKFILE_BYTES", 3000)
    lock = Lockfile(paths.lockfile)
    lock.put(entry("a", manifest={"pad": "x" * 1000}))
    with pytest.raises(PackError, match="would grow past"):
        lock.put(entry("b", manifest={"pad": "x" * 2000}))
    assert set(lock.entries()) == {"a"}


# --- finding 11: paths derived from a pack stay inside their parent -----------------------------------------


@pytest.mark.parametrize("version", ["../../../x", "1.0.0/../../x", "..", "1.0.0\n", "1.0.0\x1b[31m"])
def test_a_traversing_version_is_refused_and_nothing_is_written(
    tmp_path: Path, paths: ConfigPaths, version: str
) -> None:
    pack = tmp_path / "alpha"
    pack.mkdir()
    (pack / "mod.py").write_text("")
    (pack / "agentnode.yaml").write_text(
        f"package_id: alpha\nversion: {json.dumps(version)}\npackage_type: toolpack\nentrypoint: mod\n"
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ManifestError, match=r"agentnode\.yaml: version: expected a semantic version"):
        install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not paths.packs_dir.exists()


def test_a_link_in_the_packs_dir_is_not_followed(tmp_path: Path, paths: ConfigPaths) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths.packs_dir.mkdir(parents=True)
    (paths.packs_dir / "alpha").symlink_to(elsewhere)
    with pytest.raises(PackError, match="resolves outside"):
        install_pack(write_pack(tmp_path, "alpha"), trust="trusted", paths=paths, client=None, image=None)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("how", ["uninstall", "reinstall"])
def test_a_recorded_host_path_outside_the_packs_dir_is_never_removed(
    tmp_path: Path, paths: ConfigPaths, how: str
) -> None:
    """What an older host recorded for `version: ../../../x` (or an edit) is forgotten, never deleted."""
    victims = [tmp_path / "victim", paths.packs_dir / "alpha" / ".." / ".." / "victim2", paths.packs_dir]
    for victim in victims:
        victim.mkdir(parents=True, exist_ok=True)
        (victim / "keep").write_text("precious")
    lock = Lockfile(paths.lockfile)
    for victim in victims:
        lock.put(entry(trust_level="trusted", sandbox_volume=None, host_path=str(victim)))
        if how == "uninstall":
            assert uninstall_pack("alpha", paths=paths, client=None).host_path == str(victim)
        else:
            install_pack(
                write_pack(tmp_path / "p" / victim.name, "alpha"),
                trust="trusted",
                paths=paths,
                client=None,
                image=None,
            )
        assert (victim / "keep").read_text() == "precious"


def test_only_pack_volume_names_are_created_or_removed() -> None:
    assert _packs._is_pack_volume(volume_name("alpha", "1.0.0-rc.1+b", "a" * 64))
    for name in (None, "", "my-data", "agentnode-pack-", "agentnode-pack-../x", "x/agentnode-pack-a"):
        assert not _packs._is_pack_volume(name)
    with pytest.raises(PackError, match="refusing volume name"):  # before the engine is touched
        _packs.populate_volume(
            None,
            image="i",
            name="db-data",
            digest="d",
            slug="s",
            version="1.0.0",  # type: ignore[arg-type]
            archive=io.BytesIO(),
        )


class _Api:
    """The engine API's archive upload only, answering with the statuses it is given (None: accepted)."""

    def __init__(self, *statuses: int | None) -> None:
        self.statuses = list(statuses)
        self.uploads: list[bytes] = []

    def put_archive(self, container: str, path: str, data: IO[bytes]) -> bool:
        self.uploads.append(data.read())
        status = self.statuses.pop(0)
        if status is None:
            return True
        response = requests.Response()
        response.status_code = status
        raise docker.errors.APIError("refused", response=response, explanation=f"said {status}\x1b[2J")


class _Client:
    def __init__(self, api: _Api) -> None:
        self.api = api


@pytest.mark.parametrize(
    ("statuses", "uploads", "raises"),
    [
        ([None], 1, None),
        ([500, None], 2, None),  # an engine failure is tried once more, from the archive's start
        ([500, 500], 2, 500),
        ([400], 1, 400),  # a refusal is not retried
        ([404], 1, 404),
    ],
)
def test_an_upload_is_tried_again_once_after_an_engine_failure(
    statuses: list[int | None], uploads: int, raises: int | None
) -> None:
    api = _Api(*statuses)
    archive = io.BytesIO(b"tar bytes")
    archive.read(3)  # a previous reader left the position elsewhere
    if raises is None:
        _packs._upload(_Client(api), "holder", archive, "the pack files")  # type: ignore[arg-type]
    else:
        with pytest.raises(EngineRejected) as caught:
            _packs._upload(_Client(api), "holder", archive, "the pack files")  # type: ignore[arg-type]
        assert caught.value.status == raises
    assert api.uploads == [b"tar bytes"] * uploads


def test_an_engine_failure_while_filling_the_volume_quotes_the_engine_escaped() -> None:
    exc = EngineRejected("x", status=500, explanation="passing bulk input\x1b]0;t\x07" + "y" * 500)
    error = _packs._fill_failed(exc)
    assert "(500: passing bulk input\\x1b]0;t\\x07" in str(error) and "\x1b" not in str(error)
    assert len(str(error)) < 400 and "install again" in error.hint
    assert error.reason is AuditReason.ENGINE_UNAVAILABLE
