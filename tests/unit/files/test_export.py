"""A change set exported instead of applied (host/files/export.py): a tar holding exactly the run's added
and modified entries plus the list of what it deleted, a unified patch that `git apply -p1` applies to the
caller's tree, and neither when the run's copy no longer matches what its change set reported."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from host.core.errors import FilesError
from host.files.changes import changes_of
from host.files.export import DELETED_LIST, export_patch, export_tar
from host.files.snapshot import snapshot
from host.spec.files import FileLimits

LIMITS = FileLimits()


def _run(tmp_path: Path) -> tuple[Path, Path, Path]:
    host = tmp_path / "project"
    (host / "src").mkdir(parents=True)
    (host / "src" / "a.py").write_text("a = 1\nb = 2\n")
    (host / "gone.txt").write_text("bye\n")
    (host / "blob.bin").write_bytes(b"\x00\xff" * 10)
    snap = tmp_path / "snap"
    snapshot(host, snap, LIMITS)
    copy = tmp_path / "copy"
    shutil.copytree(snap, copy, symlinks=True)
    (copy / "src" / "a.py").write_text("a = 1\nb = 3\n")
    (copy / "src" / "new.py").write_text("new\n")
    (copy / "gone.txt").unlink()
    (copy / "blob.bin").write_bytes(b"\x01\xfe" * 10)
    (copy / "link").symlink_to("src/new.py")
    return host, snap, copy


def test_the_tar_holds_exactly_the_added_and_modified_entries_and_names_the_deleted(tmp_path: Path) -> None:
    host, _, copy = _run(tmp_path)
    found = changes_of(snapshot(host, tmp_path / "base", LIMITS), copy, LIMITS, link_root="/workspace")
    export_tar(found, copy, tmp_path / "out.tar")
    with tarfile.open(tmp_path / "out.tar") as tar:
        names = sorted(tar.getnames())
        assert names == sorted(["blob.bin", "link", "src/a.py", "src/new.py", DELETED_LIST])
        member = tar.extractfile("src/a.py")
        assert member is not None and member.read() == b"a = 1\nb = 3\n"
        deleted = tar.extractfile(DELETED_LIST)
        assert deleted is not None and json.loads(deleted.read()) == ["gone.txt"]
        assert tar.getmember("link").issym() and tar.getmember("link").linkname == "src/new.py"
    with pytest.raises(FileExistsError):
        export_tar(found, copy, tmp_path / "out.tar")  # never over a file that is there


def test_a_copy_changed_after_its_change_set_gives_no_tar_and_no_patch(tmp_path: Path) -> None:
    host, snap, copy = _run(tmp_path)
    found = changes_of(snapshot(host, tmp_path / "base", LIMITS), copy, LIMITS, link_root="/workspace")
    (copy / "src" / "new.py").write_text("raced\n")
    with pytest.raises(FilesError, match="changed after its change set"):
        export_tar(found, copy, tmp_path / "out.tar")
    assert not (tmp_path / "out.tar").exists()
    with pytest.raises(FilesError):
        export_patch(found, snap, copy)


def test_the_patch_applies_to_the_callers_tree_with_patch_p1(tmp_path: Path) -> None:
    host, snap, copy = _run(tmp_path)
    found = changes_of(snapshot(host, tmp_path / "base", LIMITS), copy, LIMITS, link_root="/workspace")
    patch = export_patch(found, snap, copy)
    assert "Binary files a/blob.bin and b/blob.bin differ\n" in patch
    assert "-b = 2\n+b = 3\n" in patch and "--- /dev/null\n+++ b/src/new.py\n" in patch
    text_only = "".join(line for line in patch.splitlines(keepends=True) if not line.startswith("Binary"))
    git = shutil.which("git") or "git"
    done = subprocess.run([git, "apply", "-p1", "-"], cwd=host, input=text_only, text=True,
                          capture_output=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (host / "src" / "a.py").read_text() == "a = 1\nb = 3\n"
    assert (host / "src" / "new.py").read_text() == "new\n"
    assert not (host / "gone.txt").exists()
