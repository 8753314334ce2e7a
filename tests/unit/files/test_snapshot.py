"""Workspace snapshots (host/files/snapshot.py) of real trees on this disk: what is carried, what is left out
and counted (a symlink to a host secret, a hard link to a file outside, a FIFO, a socket, a device node,
names with newlines and escapes), and the bounds that fail a snapshot before its bytes are read (a 10 GB
sparse file, a flood of empty files, a deep tree), leaving nothing half-made."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from host.core.errors import AuditReason, FilesError
from host.files.snapshot import snapshot, tree_digest
from host.spec.files import FileLimits


def _tree(root: Path) -> Path:
    src = root / "project"
    (src / "src" / "pkg").mkdir(parents=True)
    (src / "src" / "pkg" / "main.py").write_text("print('hi')\n")
    (src / "README.md").write_text("# project\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o4777)  # setuid and world-writable on the host: neither is carried
    (src / "link-inside").symlink_to("src/pkg/main.py")
    (src / "src" / "up").symlink_to("../README.md")
    (src / "abs-inside").symlink_to(src / "README.md")
    return src


def _listing(root: Path) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = f"link:{os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else "file"
    return found


def test_a_tree_is_carried_with_its_inside_links_and_no_special_bits(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    report = snapshot(src, tmp_path / "snap", FileLimits())
    assert _listing(tmp_path / "snap") == {
        "README.md": "file", "abs-inside": "link:README.md", "link-inside": "link:src/pkg/main.py",
        "run.sh": "file", "src": "dir", "src/pkg": "dir", "src/pkg/main.py": "file",
        "src/up": "link:../README.md",
    }  # fmt: skip
    assert (tmp_path / "snap" / "src" / "pkg" / "main.py").read_text() == "print('hi')\n"
    assert stat.S_IMODE((tmp_path / "snap" / "run.sh").stat().st_mode) == 0o755
    assert (report.files, report.dirs, report.links, report.skipped) == (3, 2, 3, {})
    assert report.bytes == len("print('hi')\n") + len("# project\n") + len("#!/bin/sh\n")
    assert report.digest == tree_digest(report.entries) and len(report.digest) == 64
    assert set(report.summary()) == {"files", "dirs", "links", "bytes", "skipped", "digest"}


def test_the_same_tree_anywhere_has_the_same_digest(tmp_path: Path) -> None:
    one = snapshot(_tree(tmp_path / "a"), tmp_path / "s1", FileLimits())
    two = snapshot(_tree(tmp_path / "b"), tmp_path / "s2", FileLimits())
    assert one.digest == two.digest
    (tmp_path / "b" / "project" / "README.md").write_text("# changed\n")
    assert snapshot(tmp_path / "b" / "project", tmp_path / "s3", FileLimits()).digest != one.digest


def test_hostile_entries_are_left_out_and_counted(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("TOKEN")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside")
    src = tmp_path / "ws"
    src.mkdir()
    (src / "ok.txt").write_text("fine")
    (src / "to-secret").symlink_to(secret)
    (src / "to-etc").symlink_to("/etc")
    (src / "climb").symlink_to("../../../../etc/passwd")
    os.link(outside, src / "hard")
    os.mkfifo(src / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(src / "sock"))
    os.mknod(src / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    for name in ("new\nline", "\x1b[2Jclear", "bidi\u202etxt.exe"):
        (src / name).write_text("x")
    (src / os.fsdecode(b"latin\xe9")).write_text("x")
    try:
        report = snapshot(src, tmp_path / "snap", FileLimits())
    finally:
        listener.close()
    assert _listing(tmp_path / "snap") == {"ok.txt": "file"}
    assert report.skipped == {"symlink_outside": 3, "hard_link": 1, "fifo": 1, "socket": 1, "device": 1,
                              "name_refused": 4}  # fmt: skip
    assert "TOKEN" not in repr(report) and "clear" not in repr(report.summary())


@pytest.mark.parametrize(
    ("make", "bound"),
    [
        (lambda src: os.truncate(src / "sparse", 10 << 30), "max_file_bytes"),
        (lambda src: [(src / f"f{i}").touch() for i in range(300)], "max_files_in"),
        (lambda src: (src / "/".join("d" * 40)).mkdir(parents=True), "max_depth"),
        (lambda src: [(src / f"b{i}").write_bytes(b"x" * 4096) for i in range(8)], "max_bytes_in"),
    ],
    ids=["sparse-10GB", "file-flood", "deep", "bytes"],
)
def test_a_bound_fails_the_snapshot_before_its_bytes_are_read_and_leaves_nothing(
    tmp_path: Path, make: object, bound: str
) -> None:
    src = tmp_path / "ws"
    src.mkdir()
    (src / "sparse").touch()
    make(src)  # type: ignore[operator]
    limits = FileLimits(max_files_in=200, max_bytes_in=16 << 10, max_file_bytes=1 << 20)
    with pytest.raises(FilesError) as caught:
        snapshot(src, tmp_path / "snap", limits)
    assert caught.value.reason is AuditReason.FILES_OVER_BOUND
    assert f"agent_sandbox.filesystem.limits.{bound}" in caught.value.message
    assert bound in caught.value.hint
    assert not (tmp_path / "snap").exists()


def test_a_missing_or_unreadable_workspace_is_refused(tmp_path: Path) -> None:
    for source in (tmp_path / "nope", tmp_path / "file.txt"):
        if source.name == "file.txt":
            source.write_text("x")
        with pytest.raises(FilesError) as caught:
            snapshot(source, tmp_path / "snap", FileLimits())
        assert caught.value.reason is AuditReason.WORKSPACE_INVALID
        assert "--workspace" in caught.value.hint
        assert not (tmp_path / "snap").exists()


def test_a_long_snapshot_reports_progress(tmp_path: Path) -> None:
    src = tmp_path / "ws"
    src.mkdir()
    for i in range(2500):
        (src / f"f{i}").touch()
    lines: list[str] = []
    report = snapshot(src, tmp_path / "snap", FileLimits(), progress=lines.append)
    assert report.files == 2500 and len(lines) == 2
    assert lines[0] == "workspace: 1000 entries, 0 bytes"
