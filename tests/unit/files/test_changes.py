"""A run's change set (host/files/changes.py) computed from its writable copy, and applied to the caller's
directory on this disk: exactly the run's changes, atomically per file, never through a symlink, never
outside DIR, a path the host changed since the snapshot left as the host has it; what the run planted in its
copy (a link to the host's /etc, setuid bits, a FIFO, a name with an escape) never comes back."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from host.core.errors import AuditReason, FilesError
from host.files.changes import apply_changes, changes_of
from host.files.snapshot import SnapshotReport, snapshot
from host.spec.files import FileLimits

LIMITS = FileLimits()


def _start(tmp_path: Path) -> tuple[Path, Path, SnapshotReport]:
    """A caller's DIR, the run's writable copy of it (as the run would get it), and the snapshot."""
    host = tmp_path / "project"
    (host / "src").mkdir(parents=True)
    (host / "src" / "a.py").write_text("a = 1\n")
    (host / "src" / "b.py").write_text("b = 1\n")
    (host / "gone.txt").write_text("bye\n")
    (host / "old").mkdir()
    (host / "old" / "x").write_text("x\n")
    copy = tmp_path / "copy"
    base = snapshot(host, copy, LIMITS)
    return host, copy, base


def _changes(base: SnapshotReport, copy: Path) -> dict[str, str]:
    return {c.path: c.kind for c in changes_of(base, copy, LIMITS, link_root="/workspace").changes}


def test_the_change_set_names_what_was_added_modified_and_deleted(tmp_path: Path) -> None:
    _, copy, base = _start(tmp_path)
    assert _changes(base, copy) == {}
    (copy / "src" / "a.py").write_text("a = 2\n")
    (copy / "src" / "new.py").write_text("new\n")
    (copy / "gone.txt").unlink()
    shutil.rmtree(copy / "old")
    os.chmod(copy / "src" / "b.py", 0o755)  # an exec bit is a change too
    found = changes_of(base, copy, LIMITS, link_root="/workspace")
    assert {c.path: c.kind for c in found.changes} == {
        "src/a.py": "modified", "src/new.py": "added", "gone.txt": "deleted", "old": "deleted",
        "old/x": "deleted", "src/b.py": "modified",
    }  # fmt: skip
    new = next(c for c in found.changes if c.path == "src/new.py").to_json()
    assert new == {"path": "src/new.py", "change": "added", "type": "file", "size": 4,
                   "sha256": hashlib.sha256(b"new\n").hexdigest()}  # fmt: skip
    assert found.summary()["added"] == 1 and found.summary()["deleted"] == 3 and found.bytes == 6 + 6 + 4


def test_applying_writes_exactly_the_changes_and_keeps_the_rest(tmp_path: Path) -> None:
    host, copy, base = _start(tmp_path)
    (copy / "src" / "a.py").write_text("a = 2\n")
    (copy / "docs").mkdir()
    (copy / "docs" / "readme.md").write_text("# new\n")
    (copy / "gone.txt").unlink()
    (host / "untouched-by-run.txt").write_text("mine\n")  # the host's own file, made after the snapshot
    report = apply_changes(changes_of(base, copy, LIMITS, link_root="/workspace"), copy, host)
    assert sorted(report.applied) == ["docs", "docs/readme.md", "gone.txt", "src/a.py"]
    assert report.conflicts == report.mismatched == []
    assert (host / "src" / "a.py").read_text() == "a = 2\n"
    assert (host / "docs" / "readme.md").read_text() == "# new\n"
    assert not (host / "gone.txt").exists()
    assert (host / "untouched-by-run.txt").read_text() == "mine\n"
    assert not [p for p in host.rglob(".agentnode-*")]


def test_a_path_the_host_changed_since_the_snapshot_is_a_conflict_and_stays_as_the_host_has_it(
    tmp_path: Path,
) -> None:
    host, copy, base = _start(tmp_path)
    (copy / "src" / "a.py").write_text("from the run\n")
    (copy / "src" / "b.py").write_text("from the run\n")
    (copy / "added.txt").write_text("from the run\n")
    (host / "src" / "a.py").write_text("edited on the host meanwhile\n")
    (host / "added.txt").write_text("the host made it too\n")
    report = apply_changes(changes_of(base, copy, LIMITS, link_root="/workspace"), copy, host)
    assert sorted(report.conflicts) == ["added.txt", "src/a.py"] and report.applied == ["src/b.py"]
    assert (host / "src" / "a.py").read_text() == "edited on the host meanwhile\n"
    assert (host / "added.txt").read_text() == "the host made it too\n"


def test_what_the_run_plants_in_its_copy_never_comes_back(tmp_path: Path) -> None:
    host, copy, base = _start(tmp_path)
    (copy / "etc").symlink_to("/etc")
    (copy / "climb").symlink_to("../../../x")
    (copy / "inside").symlink_to("src/a.py")
    os.mkfifo(copy / "fifo")
    (copy / "\x1b[2Jclear").write_text("x")
    (copy / "suid").write_text("#!/bin/sh\n")
    os.chmod(copy / "suid", 0o6777)
    found = changes_of(base, copy, LIMITS, link_root="/workspace")
    assert {c.path for c in found.changes} == {"inside", "suid"}
    assert found.skipped == {"symlink_outside": 2, "fifo": 1, "name_refused": 1}
    apply_changes(found, copy, host)
    assert os.readlink(host / "inside") == "src/a.py"
    mode = stat.S_IMODE((host / "suid").stat().st_mode)
    assert mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH) == 0 and mode & 0o100
    assert not (host / "etc").exists() and not (tmp_path / "x").exists()


def test_applying_never_follows_a_symlink_the_host_tree_holds(tmp_path: Path) -> None:
    host, copy, base = _start(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (copy / "src" / "a.py").write_text("run\n")
    (copy / "newdir").mkdir()
    (copy / "newdir" / "f").write_text("run\n")
    shutil.rmtree(host / "src")
    (host / "src").symlink_to(outside)  # swapped after the snapshot: a path through it must not be written
    (outside / "a.py").write_text("a = 1\n")  # even the content the run started from
    report = apply_changes(changes_of(base, copy, LIMITS, link_root="/workspace"), copy, host)
    assert "src/a.py" in report.conflicts
    assert (outside / "a.py").read_text() == "a = 1\n" and sorted(os.listdir(outside)) == ["a.py"]
    assert (host / "newdir" / "f").read_text() == "run\n"


def test_bytes_that_differ_from_the_change_set_are_never_applied(tmp_path: Path) -> None:
    host, copy, base = _start(tmp_path)
    (copy / "src" / "a.py").write_text("a = 2\n")
    found = changes_of(base, copy, LIMITS, link_root="/workspace")
    (copy / "src" / "a.py").write_text("a = 3\n")  # the run raced its own output after the change set
    report = apply_changes(found, copy, host)
    assert report.mismatched == ["src/a.py"] and report.applied == []
    assert (host / "src" / "a.py").read_text() == "a = 1\n"
    assert not [p for p in host.rglob(".agentnode-*")]


@pytest.mark.parametrize(("bound", "limits"), [
    ("max_files_out", FileLimits(max_files_out=3)),
    ("max_bytes_out", FileLimits(max_bytes_out=100)),
])  # fmt: skip
def test_a_run_that_writes_past_a_bound_fails_with_its_reason(
    tmp_path: Path, bound: str, limits: FileLimits
) -> None:
    _, copy, base = _start(tmp_path)
    for i in range(5):
        (copy / f"out{i}").write_bytes(b"x" * 40)
    with pytest.raises(FilesError) as caught:
        changes_of(base, copy, limits, link_root="/workspace")
    assert caught.value.reason is AuditReason.FILES_OVER_BOUND
    assert f"limits.{bound}" in caught.value.message and "what the run wrote" in caught.value.message


def test_a_change_set_reads_again_only_what_the_run_touched_and_an_old_mtime_hides_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import host.files.snapshot as snap

    host = tmp_path / "project"
    host.mkdir()
    for i in range(50):
        (host / f"f{i}").write_text(f"file {i}\n")
    copy = tmp_path / "copy"
    base = snapshot(host, copy, LIMITS)
    before = os.stat(copy / "f7")
    (copy / "f7").write_text("file X\n")  # same size
    os.utime(copy / "f7", ns=(before.st_atime_ns, before.st_mtime_ns))  # and the old mtime back
    reads: list[int] = []
    real = snap.read_through
    monkeypatch.setattr(snap, "read_through",
                        lambda fd, size, out=None: reads.append(size) or real(fd, size, out))  # fmt: skip
    found = changes_of(base, copy, LIMITS, link_root="/workspace")
    assert [(c.path, c.kind) for c in found.changes] == [("f7", "modified")]  # ctime gave it away
    assert len(reads) == 1  # the 49 files the run left as the host wrote them were not read again
