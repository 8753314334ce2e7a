"""One run's files end to end without a container (host/files/run.py, host/files/area.py): a caller's
request judged before any work, the area made (a bounded tmpfs as root) and filled, what a run leaves read
back, applied, exported or written out only when asked, every bound its own reason, and nothing of the
caller's touched on a refusal."""

from __future__ import annotations

import errno
import os
import tarfile
from pathlib import Path

import pytest

from host.audit.records import run_record
from host.core.errors import AuditReason, FilesError
from host.files.area import FilesArea, area_of, sweep_areas
from host.files.run import FilesRequest, RunFiles
from host.policy.filesystem import FilesystemGrant, filesystem_grant
from host.spec.files import FileLimits, FilesConfig

LIMITS = FileLimits()
READ, WRITE, NONE = (filesystem_grant(level, FilesConfig()) for level in
                     ("workspace_read", "workspace_write", "none"))  # fmt: skip
ROOT = os.geteuid() == 0


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "a.py").write_text("a = 1\n")
    (project / "README").write_text("hello\n")
    return project


def _files(tmp_path: Path, request: FilesRequest, grant: FilesystemGrant = WRITE,
           limits: FileLimits = LIMITS) -> RunFiles:  # fmt: skip
    return RunFiles(request, grant, limits, area_of(tmp_path / "run-x"), uid=os.geteuid(), gid=os.getegid())


@pytest.mark.parametrize(("request_", "words"), [
    (FilesRequest(apply=True), "need a workspace"),
    (FilesRequest(workspace=Path("/w"), apply=True, export_tar=Path("/nonexistent/t.tar")), "not both"),
    (FilesRequest(inputs=(("a", b""), ("a", b""))), "same name"),
    (FilesRequest(inputs=(("../x", b""),)), "name is refused"),
    (FilesRequest(inputs=(("a/b", b""),)), "name is refused"),
    (FilesRequest(inputs=(("bad\x1b[31m", b""),)), "name is refused"),
])  # fmt: skip
def test_a_request_that_cannot_be_right_is_refused_before_any_work(
    request_: FilesRequest, words: str
) -> None:
    with pytest.raises(FilesError) as caught:
        request_.check(LIMITS)
    assert words in caught.value.message and caught.value.reason is AuditReason.WORKSPACE_INVALID
    assert "\x1b" not in caught.value.message  # a hostile name is never echoed


def test_an_export_never_replaces_a_file(tmp_path: Path) -> None:
    (tmp_path / "t.tar").write_text("mine")
    with pytest.raises(FilesError, match="already exists"):
        FilesRequest(workspace=tmp_path, export_tar=tmp_path / "t.tar").check(LIMITS)
    assert (tmp_path / "t.tar").read_text() == "mine"


def test_a_workspace_for_a_pack_that_declares_none_and_a_change_set_from_a_read_one_are_refused() -> None:
    with pytest.raises(FilesError) as caught:
        FilesRequest(workspace=Path("/w")).fit(NONE)
    assert caught.value.reason is AuditReason.FILESYSTEM_REFUSED
    assert "gets no workspace" in caught.value.message
    with pytest.raises(FilesError, match="only reads its workspace"):
        FilesRequest(workspace=Path("/w"), apply=True).fit(READ)
    FilesRequest(workspace=Path("/w"), apply=True).fit(WRITE)  # the one that may
    FilesRequest(inputs=(("a", b"x"),)).fit(NONE)  # inputs and artifacts: any run


def test_a_write_run_changes_come_back_and_are_applied_only_when_asked(tmp_path: Path) -> None:
    project = _project(tmp_path)
    files = _files(tmp_path, FilesRequest(workspace=project))
    area = files.prepare()
    try:
        assert (area.workspace / "src" / "a.py").read_text() == "a = 1\n"
        (area.workspace / "src" / "a.py").write_text("a = 2\n")  # as the run would
        (area.workspace / "new.txt").write_text("new\n")
        (area.workspace / "README").unlink()
        outcome = files.collect()
    finally:
        files.close()
    assert outcome.changes is not None
    assert {c.path: c.kind for c in outcome.changes.changes} == {
        "src/a.py": "modified", "new.txt": "added", "README": "deleted"}  # fmt: skip
    assert (project / "src" / "a.py").read_text() == "a = 1\n" and (project / "README").exists()  # not asked
    assert not area.path.exists()  # gone with the run
    record = outcome.summary()
    assert record["changes"]["modified"] == 1 and len(record["changes"]["digest"]) == 64
    assert "a.py" not in repr(record) and "README" not in repr(record)  # never a name in the audit form
    shown = outcome.to_json()
    assert {p["path"] for p in shown["changes"]["paths"]} == {"src/a.py", "new.txt", "README"}


def test_apply_writes_each_change_and_leaves_a_file_the_host_changed_meanwhile(tmp_path: Path) -> None:
    project = _project(tmp_path)
    files = _files(tmp_path, FilesRequest(workspace=project, apply=True))
    area = files.prepare()
    try:
        (area.workspace / "src" / "a.py").write_text("a = 2\n")
        (area.workspace / "README").write_text("the run's\n")
        (project / "README").write_text("the host's, since\n")  # changed on the host during the run
        outcome = files.collect()
    finally:
        files.close()
    assert (project / "src" / "a.py").read_text() == "a = 2\n"
    assert (project / "README").read_text() == "the host's, since\n"  # a conflict is never overwritten
    assert outcome.applied is not None and outcome.applied.conflicts == ["README"]
    assert outcome.to_json()["applied"]["conflicts_paths"] == ["README"]


def test_export_tar_and_patch_instead_of_applying(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for kind in ("tar", "patch"):
        out = tmp_path / f"changes.{kind}"
        request = FilesRequest(workspace=project, **{f"export_{kind}": out})  # type: ignore[arg-type]
        files = _files(tmp_path, request)
        area = files.prepare()
        try:
            (area.workspace / "src" / "a.py").write_text("a = 3\n")
            outcome = files.collect()
        finally:
            files.close()
        assert outcome.exported == kind and (project / "src" / "a.py").read_text() == "a = 1\n"
        if kind == "tar":
            with tarfile.open(out) as tar:
                member = tar.extractfile("src/a.py")
                assert member is not None and member.read() == b"a = 3\n"
        else:
            assert "-a = 1\n+a = 3\n" in out.read_text()


def test_inputs_are_written_and_artifacts_come_back_verified(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("x,y\n1,2\n")
    out = tmp_path / "out"
    request = FilesRequest(inputs=(("data.csv", tmp_path / "data.csv"), ("raw", b"\x00\x01")), output_dir=out)
    files = _files(tmp_path, request, grant=NONE)
    area = files.prepare()
    try:
        assert (area.inputs / "data.csv").read_text() == "x,y\n1,2\n"
        assert (area.inputs / "raw").read_bytes() == b"\0\1"
        assert not any(area.workspace.iterdir())  # no workspace: nothing there, and nothing mounted
        (area.outputs / "report.md").write_text("# done\n")
        (area.outputs / "plots").mkdir()
        (area.outputs / "plots" / "a.svg").write_text("<svg/>")
        outcome = files.collect()
    finally:
        files.close()
    assert (out / "report.md").read_text() == "# done\n" and (out / "plots" / "a.svg").read_text() == "<svg/>"
    summary = outcome.summary()
    assert summary["inputs"]["files"] == 2 and summary["inputs"]["bytes"] == 10
    assert summary["artifacts"]["added"] == 3 and summary["artifacts"]["applied"] == 3


def test_an_artifact_already_in_the_output_dir_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("the caller's")
    files = _files(tmp_path, FilesRequest(output_dir=out), grant=NONE)
    area = files.prepare()
    try:
        (area.outputs / "report.md").write_text("the run's")
        with pytest.raises(FilesError) as caught:
            files.collect()
    finally:
        files.close()
    assert caught.value.reason is AuditReason.FILES_INCOMPLETE
    assert (out / "report.md").read_text() == "the caller's"


@pytest.mark.parametrize(("bound", "limits"), [
    ("max_bytes_out", FileLimits(max_bytes_out=100)),
    ("max_files_out", FileLimits(max_files_out=3)),
])  # fmt: skip
def test_a_run_that_leaves_too_much_fails_with_its_reason_and_writes_nothing(
    tmp_path: Path, bound: str, limits: FileLimits
) -> None:
    project, out = _project(tmp_path), tmp_path / "out"
    files = _files(tmp_path, FilesRequest(workspace=project, apply=True, output_dir=out), limits=limits)
    area = files.prepare()
    try:
        for i in range(5):
            (area.outputs / f"o{i}").write_bytes(b"x" * 30)
        (area.workspace / "README").write_text("changed\n")
        with pytest.raises(FilesError) as caught:
            files.collect()
    finally:
        files.close()
    assert caught.value.reason is AuditReason.FILES_OVER_BOUND and bound in caught.value.message
    assert (project / "README").read_text() == "hello\n" and not out.exists()


def test_an_input_over_its_bound_is_refused_and_the_area_goes(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(10 << 30)  # sparse: judged by its stat before a byte is read
    files = _files(tmp_path, FilesRequest(inputs=(("big", big),)), grant=NONE)
    with pytest.raises(FilesError) as caught:
        files.prepare()
    files.close()
    assert caught.value.reason is AuditReason.FILES_OVER_BOUND and "max_file_bytes" in caught.value.message
    assert not area_of(tmp_path / "run-x").exists()


@pytest.mark.skipif(not ROOT, reason="only root mounts the bounding tmpfs (the test command runs as root)")
def test_as_root_the_area_is_a_tmpfs_the_kernel_bounds(tmp_path: Path) -> None:
    limits = FileLimits(max_bytes_in=1 << 20, max_bytes_out=1 << 20, max_files_in=10, max_files_out=10)
    area = FilesArea.make(tmp_path / "run-y.files", limits, uid=65532, gid=65532, writable=True)
    try:
        assert area.bounded and os.path.ismount(area.path)
        assert os.stat(area.outputs).st_uid == 65532 and os.stat(area.workspace).st_uid == 65532
        with pytest.raises(OSError) as full, (area.outputs / "flood").open("wb") as f:
            for _ in range(8):
                f.write(b"x" * (1 << 20))
                f.flush()
        assert full.value.errno == errno.ENOSPC  # the run's own bound is full, never the host's disk
        with pytest.raises(OSError) as inodes:
            for i in range(200):
                (area.inputs / f"f{i}").touch()
        assert inodes.value.errno == errno.ENOSPC
    finally:
        area.remove()
    assert not os.path.ismount(tmp_path / "run-y.files") and not (tmp_path / "run-y.files").exists()


def test_a_dead_hosts_areas_are_swept_and_a_live_hosts_kept(tmp_path: Path) -> None:
    (tmp_path / "run-live").mkdir()  # its run is going: its area stays whoever owns it
    for name, owner in (("run-live.files", "dead"), ("run-dead.files", "dead"), ("run-read.files", "alive"),
                        ("run-lost.files", "")):  # fmt: skip
        FilesArea.make(tmp_path / name, LIMITS, uid=os.geteuid(), gid=os.getegid(), writable=False,
                       owner=owner)  # fmt: skip
    # run-read: the host is reading it back after its sandbox (and run directory) went
    swept = sweep_areas(tmp_path, lambda owner: owner == "alive")
    assert sorted(swept) == ["run-dead.files", "run-lost.files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run-live", "run-live.files", "run-live.files.owner", "run-read.files", "run-read.files.owner"]
    for name in ("run-live.files", "run-read.files"):
        FilesArea(tmp_path / name, True).remove()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-live"]


@pytest.mark.parametrize(("run_ws", "level", "mounted"), [
    ("write", "workspace_write", "write"), ("write", "workspace_read", "read"),
    ("read", "workspace_write", "read"),
    ("write", "none", None), ("write", "temp", None), ("none", "workspace_write", None),
])  # fmt: skip
def test_a_tool_sandbox_sees_the_run_workspace_as_its_own_pack_declares(
    tmp_path: Path, run_ws: str, level: str, mounted: str | None
) -> None:
    grant = {"write": WRITE, "read": READ, "none": NONE}[run_ws]
    files = _files(tmp_path, FilesRequest(workspace=tmp_path if run_ws != "none" else None), grant=grant)
    got = files.tool_mounts(level, FilesConfig())
    assert (got.workspace if got else None) == mounted
    assert got is None or not got.io  # never the agent's inputs or outputs
    narrowed = FilesConfig(allow=("workspace_read",))  # a level the config does not grant: nothing
    assert files.tool_mounts("workspace_write", narrowed) is None


def test_the_audit_section_carries_counts_and_digests_only() -> None:
    digest = "a" * 64
    record = run_record(
        slug="s", trust="unverified", run_id="r", action="allow", source="agent_sandbox",
        reason="agent_completed",
        sandbox=True, runtime="runc", image="i", duration_ms=1, timed_out=False, llm=None, tool_calls=0,
        tool_refusals=0,
        files={"workspace": {"files": 3, "bytes": 10, "digest": digest,
                             "skipped": {"fifo": 1, "x y": 2}, "paths": ["secret.txt"]},
               "changes": {"added": 1, "digest": "not-hex\n", "paths": [{"path": "secret.txt"}]},
               "exported": "tar\x1b", "name": "secret.txt"},
    )  # fmt: skip
    assert record["files"] == {
        "workspace": {"files": 3, "bytes": 10, "digest": digest, "skipped": {"fifo": 1}},
        "changes": {"added": 1, "skipped": {}},
    }
    assert "secret" not in repr(record)


@pytest.mark.skipif(not ROOT, reason="only root mounts the bounding tmpfs (the test command runs as root)")
def test_a_sealed_area_is_read_only_under_every_mount_and_a_file_open_for_writing_stops_the_seal(
    tmp_path: Path,
) -> None:
    import subprocess

    area = FilesArea.make(tmp_path / "run-z.files", LIMITS, uid=0, gid=0, writable=True)
    bind = tmp_path / "bind"  # as a sandbox's bind mount of the outputs
    bind.mkdir()
    subprocess.run(["mount", "--bind", str(area.outputs), str(bind)], check=True)
    try:
        held = (bind / "held").open("w")  # a writer the run left going
        assert not area.seal()  # EBUSY: the caller waits for the sandbox to end instead
        held.close()
        assert area.seal()
        with pytest.raises(OSError) as refused:
            (bind / "late").write_text("x")
        assert refused.value.errno == errno.EROFS  # through the sandbox's mount too
        assert (bind / "held").exists()
    finally:
        subprocess.run(["umount", "-l", str(bind)], check=False)
        area.remove()
    assert not area.path.exists() and not FilesArea(tmp_path / "run-q", False).seal()  # no tmpfs: False


def test_an_output_directory_the_host_cannot_write_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the output directory should go")
    files = _files(tmp_path, FilesRequest(output_dir=blocker / "out"), grant=NONE)
    area = files.prepare()
    try:
        (area.outputs / "report.md").write_text("# done\n")
        with pytest.raises(FilesError) as caught:
            files.collect()
    finally:
        files.close()
    assert caught.value.reason is AuditReason.FILES_INCOMPLETE and "ENOTDIR" in caught.value.message
