"""Attacks on files across the boundary (issue 38), from both sides: a caller's workspace holding what must
never reach a run (a link to a host secret, a hard link to a file outside, a FIFO, a device node, names with
newlines and escapes, a 10 GB sparse file, a million empty files), and a run that writes to its disk bound,
plants links to the host's /etc, sets setuid bits, renames out of its tree and races its own output. Each is
refused or bounded, the host's files stay as they were, each run leaves one audit record naming no file, and
no files area is left behind."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.files.run import FilesRequest
from tests.hostile.conftest import Lab, Ledger, brief
from tests.support.packs import write_agent

pytestmark = [pytest.mark.docker, pytest.mark.podman]

SECRET = "host-secret-files-7f3a9c"

LOOKER = """
import os

def run(context, **kwargs):
    seen, texts = [], []
    for d, dirs, files in os.walk(context.workspace):
        for name in dirs + files:
            path = os.path.join(d, name)
            seen.append(os.path.relpath(path, context.workspace))
            try:
                texts.append(open(path, errors="replace").read(200))
            except OSError:
                pass
    return {"seen": sorted(seen), "texts": texts}
"""

WRITER = """
import os, errno, subprocess, sys

def run(context, **kwargs):
    ws, out = context.workspace, {}
    written = 0
    try:
        with open(os.path.join(ws, "flood"), "wb") as f:
            while written < (1 << 30):
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1 << 20
        out["flood"] = "no bound"
    except OSError as exc:
        out["flood"] = errno.errorcode.get(exc.errno, str(exc.errno))
    out["flood_mib"] = written >> 20
    if kwargs.get("leave_flood"):
        return out  # its bound is full: nothing more fits
    os.unlink(os.path.join(ws, "flood"))
    os.symlink("/etc", os.path.join(ws, "etc-link"))
    os.symlink("/etc/passwd", os.path.join(ws, "passwd-link"))
    os.symlink("../../../../etc/shadow", os.path.join(ws, "src", "climb"))
    with open(os.path.join(ws, "tool.sh"), "w") as f:
        f.write("#!/bin/sh\\n")
    os.chmod(os.path.join(ws, "tool.sh"), 0o6777)
    os.mkfifo(os.path.join(ws, "pipe"))
    open(os.path.join(ws, "bad\\nname\\x1b[31m"), "w").write("x")
    try:
        os.rename(os.path.join(ws, "src", "main.py"), os.path.join(ws, "..", "..", "x"))
        out["rename_out"] = "renamed"
    except OSError as exc:
        out["rename_out"] = errno.errorcode.get(exc.errno, str(exc.errno))
    context.write_artifact("report.txt", "final\\n" * 1000)
    racer = ("import time\\nwhile True:\\n    open('/outputs/report.txt', 'w').write('raced')\\n"
             "    time.sleep(0.001)\\n")
    subprocess.Popen([sys.executable, "-c", racer], start_new_session=True)
    return out
"""


def _agent(lab: Lab, slug: str, source: str, level: str) -> str:
    pack = write_agent(lab.root / "packs", slug, source, goal="hostile")
    with (pack / "agentnode.yaml").open("a") as manifest:
        manifest.write(f"permissions:\n  filesystem:\n    level: {level}\n")
    entry = lab.state.install(pack)
    if entry.sandbox_volume:
        lab.volumes.add(entry.sandbox_volume)
    return slug


def _no_areas(lab: Lab) -> bool:
    return not list(lab.run_root.glob("*.files")) and not list(lab.run_root.glob("*.files.owner"))


def _records(lab: Lab, run_id: str) -> list[dict[str, Any]]:
    return [r for r in lab.audit() if r.get("run_id") == run_id and r.get("event") == "agent_run"]


@pytest.fixture(scope="module")
def flood(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory of 1,000,000 empty files, made once for every runtime's run, on a tmpfs of its own where
    root may mount one (seconds, against a minute on this disk)."""
    found = tmp_path_factory.mktemp("million")
    mount = ["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=1100000", "tmpfs", str(found)]
    mounted = subprocess.run(mount, capture_output=True, check=False).returncode == 0
    try:
        fd = os.open(found, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(1_000_000):
                os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        finally:
            os.close(fd)
        yield found
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(found)], check=False)


def test_a_hostile_workspace_never_reaches_the_run(
    lab: Lab, ledger: Ledger, tmp_path: Path, flood: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('hi')\n")
    (project / "to-secret").symlink_to(secret)
    (project / "abs-etc").symlink_to("/etc/passwd")
    os.link(secret, project / "hard-secret")
    os.mkfifo(project / "pipe")
    os.mknod(project / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (project / "new\nline").write_text(SECRET)
    (project / "esc\x1b]0;pwned\x07").write_text(SECRET)
    slug = _agent(lab, "files-looker", LOOKER, "workspace_read")
    result = lab.run(slug, files=FilesRequest(workspace=project))
    seen = result.result or {}
    ws = (result.files or {}).get("workspace", {})
    ledger.attack(
        "files.hostile_workspace",
        expected="links leading out, a hard link, a FIFO, a device node and names with a newline or an "
        "escape are left out and counted; only the plain file reaches the run",
        observed=brief({"seen": seen.get("seen"), "skipped": ws.get("skipped")}),
        ok=result.success and seen.get("seen") == ["src", "src/main.py"]
        and not any(SECRET in t for t in seen.get("texts", []))
        and ws.get("skipped") == {"symlink_outside": 2, "hard_link": 1, "fifo": 1, "device": 1,
                                  "name_refused": 2},
    )  # fmt: skip
    record = _records(lab, result.run_id)
    text = json.dumps(record)
    ledger.attack(
        "files.hostile_workspace_audit",
        expected="one record, counts only: no file name, no byte of a file, no escape",
        observed=brief(record[0]["files"] if record else None),
        ok=len(record) == 1 and SECRET not in text and "main.py" not in text and "pwned" not in text,
    )

    sparse = tmp_path / "sparse"
    (sparse / "big").parent.mkdir()
    with (sparse / "big").open("wb") as f:
        f.truncate(10 << 30)
    t0 = time.monotonic()
    big = lab.run(slug, files=FilesRequest(workspace=sparse))
    sparse_s = time.monotonic() - t0
    ledger.attack(
        "files.sparse_10gb",
        expected="a 10 GB sparse file: refused by its stat (files_over_bound, max_file_bytes), no byte read",
        observed=brief({"code": big.error_code, "error": big.error, "seconds": round(sparse_s, 1)}),
        ok=big.error_code == "files_over_bound" and "max_file_bytes" in big.error
        and len(_records(lab, big.run_id)) == 1,
    )  # fmt: skip

    t0 = time.monotonic()
    many = lab.run(slug, files=FilesRequest(workspace=flood))
    flood_s = time.monotonic() - t0
    ledger.attack(
        "files.million_files",
        expected="1,000,000 empty files: refused at the entry bound (files_over_bound, max_files_in), "
        "without listing them all",
        observed=brief({"code": many.error_code, "error": many.error, "seconds": round(flood_s, 1)}),
        ok=many.error_code == "files_over_bound" and "max_files_in" in many.error
        and len(_records(lab, many.run_id)) == 1,
    )  # fmt: skip
    left = sorted(p.name for p in lab.run_root.iterdir())
    ledger.attack("files.no_leftovers_in", expected="no files area left after any of these runs",
                  observed=brief(left), ok=_no_areas(lab))  # fmt: skip


def test_a_hostile_run_writes_only_within_its_bounds_and_never_outside_its_copy(
    lab: Lab, ledger: Ledger, tmp_path: Path
) -> None:
    mib = 1 << 20
    lab.configure(filesystem={"limits": {"max_bytes_in": 8 * mib, "max_bytes_out": 8 * mib}})
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('hi')\n")
    slug = _agent(lab, "files-writer", WRITER, "workspace_write")
    out = tmp_path / "out"
    etc_before = sorted(os.listdir("/etc"))
    result = lab.run(slug, files=FilesRequest(workspace=project, apply=True, output_dir=out))
    got = result.result or {}
    ledger.attack(
        "files.disk_bound",
        expected="writing without end in its copy: ENOSPC at the run's own bound (about 16 MiB here), never "
        "the host's disk",
        observed=brief({k: got.get(k) for k in ("flood", "flood_mib")}),
        ok=got.get("flood") == "ENOSPC" and 0 < got.get("flood_mib", 0) <= 17,
    )
    tool = project / "tool.sh"
    ledger.attack(
        "files.planted_links_and_modes",
        expected="links to the host's /etc (absolute, or climbing out) never come back; a setuid/setgid/"
        "world-writable file comes back 0755; a FIFO and an escape-laden name are left out",
        observed=brief({"success": result.success, "error": result.error,
                        "files": sorted(p.name for p in project.rglob("*")),
                        "mode": oct(tool.stat().st_mode) if tool.exists() else None}),
        ok=result.success and not any(p.is_symlink() for p in project.rglob("*"))
        and tool.exists() and stat.S_IMODE(tool.stat().st_mode) == 0o755
        and sorted(p.name for p in project.rglob("*")) == ["main.py", "src", "tool.sh"]
        and sorted(os.listdir("/etc")) == etc_before,
    )  # fmt: skip
    ledger.attack(
        "files.rename_out",
        expected="a rename to ../../x from the copy cannot leave it (the file stays, or is only deleted)",
        observed=brief(got.get("rename_out")),
        ok=got.get("rename_out") != "renamed" and (project / "src" / "main.py").exists(),
    )
    report = out / "report.txt"
    ledger.attack(
        "files.raced_output",
        expected="an artifact the run keeps rewriting after it returned: read once its sandbox is gone, "
        "whole and as its SHA-256 says",
        observed=brief(report.read_text()[:20] if report.exists() else None),
        ok=report.exists() and report.read_text() in ("final\n" * 1000, "raced"),
    )

    left = lab.run(slug, kwargs={"leave_flood": True}, files=FilesRequest(workspace=project, apply=True))
    ledger.attack(
        "files.over_bound_out",
        expected="a run that leaves more than max_bytes_out fails files_over_bound and nothing is applied",
        observed=brief({"code": left.error_code, "files": sorted(p.name for p in project.rglob("*"))}),
        ok=left.error_code == "files_over_bound" and sorted(p.name for p in project.rglob("*"))
        == ["main.py", "src", "tool.sh"] and len(_records(lab, left.run_id)) == 1,
    )  # fmt: skip
    remaining = sorted(p.name for p in lab.run_root.iterdir())
    ledger.attack("files.no_leftovers_out", expected="no files area left after the runs",
                  observed=brief(remaining), ok=_no_areas(lab))  # fmt: skip
