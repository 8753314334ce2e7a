"""Pack install without an engine: artifact identity, volume naming, the lockfile, host copies, refusals."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import textwrap
from pathlib import Path

import pytest

from host import _packs
from host._config import ConfigPaths, config_paths
from host._errors import AuditReason, PackError
from host._packs import (
    LockEntry,
    Lockfile,
    artifact_hash,
    install_pack,
    uninstall_pack,
    verify_volume,
    volume_name,
)

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
    monkeypatch.setattr(_packs, "MAX_PACK_BYTES", 1000)
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


def test_pack_tar_holds_exactly_the_files_with_neutral_metadata(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, "alpha", src=True)
    (pack / "src" / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(pack / "src" / "tool.sh", 0o755)
    (pack / "src" / "__pycache__").mkdir()
    (pack / "src" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    with tarfile.open(fileobj=io.BytesIO(_packs._pack_tar(pack))) as tar:
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


@pytest.mark.parametrize("content", ["{not json", "[]", '{"packages": []}'])
def test_a_damaged_lockfile_is_a_pack_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "agentnode.lock"
    path.write_text(content)
    with pytest.raises(PackError) as info:
        Lockfile(path).get("alpha")
    assert str(path) in info.value.message and info.value.hint


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


def test_dependencies_are_refused_with_a_clear_message(tmp_path: Path, paths: ConfigPaths) -> None:
    pack = write_pack(tmp_path, "needy", extra="dependencies: [requests, numpy]\n")
    with pytest.raises(PackError) as info:
        install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    message = info.value.message
    assert "needy declares dependencies (requests, numpy)" in message and "cannot install" in message
    assert "vendor" in info.value.hint
    assert Lockfile(paths.lockfile).get("needy") is None and not paths.packs_dir.exists()


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
