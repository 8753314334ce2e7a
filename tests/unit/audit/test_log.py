"""AuditLog: the hash chain it appends, its head file, rotation, concurrent writers, failures and retries,
held descriptors, tail."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import resource
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host.audit.chain import GENESIS
from host.audit.log import AuditLog
from host.audit.verify import verify_audit
from tests.support.paths import REPO
from tests.unit.audit._support import edit_field, filled, lines, record, start, write_lines

# --- the hash chain -----------------------------------------------------------------------------------------


def test_append_chains_records_and_verifies(tmp_path: Path) -> None:
    path = filled(tmp_path, 5)
    raw = lines(path)
    recs = [json.loads(line) for line in raw]
    assert [r["seq"] for r in recs] == [1, 2, 3, 4, 5]
    assert recs[0]["prev"] == GENESIS
    for before, rec in zip(raw, recs[1:], strict=False):
        assert rec["prev"] == hashlib.sha256(before).hexdigest()
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["ts"]) for r in recs)
    assert recs[2]["slug"] == "agent-2" and recs[2]["llm"]["model"] == "gpt-a"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    report = verify_audit(path)
    assert (report.ok, report.records, report.problems) == (True, 5, [])


def test_append_overrides_chain_fields_supplied_by_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    assert AuditLog(path).append({**record(), "seq": 99, "prev": "f" * 64, "ts": "forged"})
    rec = json.loads(lines(path)[0])
    assert (rec["seq"], rec["prev"]) == (1, GENESIS) and rec["ts"] != "forged"
    assert verify_audit(path).ok


def _other_writer(path: Path) -> None:
    assert AuditLog(path).append(record(slug="elsewhere"))


def _stale_head(path: Path) -> None:
    head = path.with_name("audit.jsonl.head")
    data = json.loads(head.read_bytes())
    head.write_bytes(json.dumps({**data, "seq": data["seq"] - 1}).encode().ljust(len(head.read_bytes())))


def _lines_tamper(tamper: Callable[[list[bytes]], list[bytes]]) -> Callable[[Path], None]:
    return lambda path: write_lines(path, tamper(lines(path)))


@pytest.mark.parametrize(
    "change",
    [
        lambda path: None,
        _other_writer,
        _stale_head,
        _lines_tamper(edit_field),
        _lines_tamper(lambda raw: raw[:-1]),
        _lines_tamper(lambda raw: [*raw[:-1], raw[-1].replace(b"agent-4", b"agent-X")]),  # same size
        _lines_tamper(lambda raw: [*raw[:-1], raw[-1][:-1] + b" "]),  # in place, same size: broken JSON
        lambda path: path.write_bytes(path.read_bytes()[:-1] + b" "),  # the last newline overwritten
    ],
    ids=["untouched", "other-writer", "stale-head", "edit", "delete-last", "edit-last", "break-last",
         "newline-gone"],
)
def test_the_log_that_wrote_the_tip_continues_as_a_fresh_reader_would(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    """An AuditLog remembers where its last append left the file (skipping the reads of the tip); whatever
    happened to the file meanwhile, its next record is the one a log opened afresh would write."""
    kept, fresh = tmp_path / "kept" / "audit.jsonl", tmp_path / "fresh" / "audit.jsonl"
    log = AuditLog(kept)
    for i in range(5):
        assert log.append(record(slug=f"agent-{i}"))
    change(kept)
    fresh.parent.mkdir(mode=0o700)
    for name in ("audit.jsonl", "audit.jsonl.head"):  # the same files, read by a log that wrote none
        shutil.copyfile(kept.with_name(name), fresh.with_name(name))
    assert log.append(record(slug="next"))
    assert AuditLog(fresh).append(record(slug="next"))
    assert len(lines(kept)) == len(lines(fresh))  # the new record on a line of its own in both
    got = [{k: v for k, v in json.loads(line).items() if k != "ts"} for line in lines(kept)[-1:]]
    want = [{k: v for k, v in json.loads(line).items() if k != "ts"} for line in lines(fresh)[-1:]]
    assert got == want
    assert verify_audit(kept).problems == verify_audit(fresh).problems
    assert log.append(record(slug="after"))  # and the remembered tip after it is right again
    assert json.loads(lines(kept)[-1])["prev"] == hashlib.sha256(lines(kept)[-2]).hexdigest()


def test_lost_head_update_is_healed_by_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = tmp_path / "audit.jsonl.head"
    log = AuditLog(path)
    assert log.append(record())
    stale = head.read_bytes()
    assert log.append(record())
    head.write_bytes(stale)  # as if the process died between writing the line and the head
    assert not verify_audit(path).ok
    assert log.append(record())
    assert [json.loads(line)["seq"] for line in lines(path)] == [1, 2, 3]
    assert verify_audit(path).ok


def test_torn_last_line_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    path = filled(tmp_path, 2)
    with path.open("ab") as fh:
        fh.write(b'{"ts":"2024-')
    log = AuditLog(path)
    assert log.append(record(slug="after-tear"))
    assert json.loads(lines(path)[-1])["slug"] == "after-tear"
    assert verify_audit(path).problems[0] == "audit.jsonl:3: not a JSON object"


# --- rotation -----------------------------------------------------------------------------------------


def test_rotation_continues_the_chain_and_respects_keep(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    line_size = len(json.dumps(record())) + 80
    log = AuditLog(path, max_bytes=3 * line_size, keep=2)
    for i in range(20):
        assert log.append(record(slug=f"agent-{i}"))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.head", "audit.jsonl.lock"]
    assert all(p.stat().st_size <= 3 * line_size for p in tmp_path.glob("audit.jsonl*"))
    first_new = json.loads(lines(path)[0])
    assert first_new["prev"] == hashlib.sha256(lines(tmp_path / "audit.jsonl.1")[-1]).hexdigest()
    seqs = [json.loads(x)["seq"] for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")
            for x in lines(tmp_path / name)]
    assert seqs == list(range(seqs[0], 21)) and seqs[0] > 1
    report = verify_audit(path)
    assert (report.ok, report.records) == (True, len(seqs))

    oldest = tmp_path / "audit.jsonl.2"
    write_lines(oldest, lines(oldest)[1:])
    assert any(p.startswith("audit.jsonl.2:1: chain starts at seq") for p in verify_audit(path).problems)


# --- concurrency --------------------------------------------------------------------------------------


def assert_intact(path: Path, count: int) -> list[dict[str, Any]]:
    recs = [json.loads(line) for line in lines(path)]
    assert sorted(r["seq"] for r in recs) == list(range(1, count + 1))
    report = verify_audit(path)
    assert (report.ok, report.records, report.problems) == (True, count, [])
    return recs


def test_parallel_appends_from_threads_keep_the_chain_intact(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    barrier = threading.Barrier(64)
    results: list[bool] = []

    def worker(i: int) -> None:
        barrier.wait()
        results.append(log.append(record(slug=f"t{i}")))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 64
    recs = assert_intact(path, 64)
    assert {r["slug"] for r in recs} == {f"t{i}" for i in range(64)}


def test_parallel_appends_from_processes_keep_the_chain_intact(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    code = (
        "import sys; from pathlib import Path; from host.audit.log import AuditLog\n"
        "log = AuditLog(Path(sys.argv[1]))\n"
        "ok = [log.append({'event': 'agent_run', 'slug': 'p' + sys.argv[2], 'n': n}) for n in range(8)]\n"
        "sys.exit(0 if all(ok) else 1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), str(i)], env=env, cwd=REPO) for i in range(8)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * 8
    recs = assert_intact(path, 64)
    expected = sorted((f"p{i}", n) for i in range(8) for n in range(8))
    assert sorted((r["slug"], r["n"]) for r in recs) == expected


# --- failures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["file-is-a-directory", "parent-is-a-file"])
def test_unwritable_log_returns_false_and_warns_without_contents(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, layout: str
) -> None:
    if layout == "file-is-a-directory":
        path = tmp_path / "audit.jsonl"
        path.mkdir()
    else:
        (tmp_path / "blocker").write_text("not a directory")
        path = tmp_path / "blocker" / "audit.jsonl"
    caplog.set_level(logging.WARNING, logger="agentnode.sandbox.audit")
    assert AuditLog(path).append(record(slug="secret-marker", run_id="run-marker")) is False
    assert len(caplog.records) == 1
    warning = caplog.records[0]
    assert warning.name == "agentnode.sandbox.audit" and warning.levelno == logging.WARNING
    assert "marker" not in caplog.text and "gpt-a" not in caplog.text


def test_unserializable_record_returns_false(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "audit.jsonl"
    caplog.set_level(logging.WARNING, logger="agentnode.sandbox.audit")
    assert AuditLog(path).append({"event": "agent_run", "value": object()}) is False
    assert len(caplog.records) == 1
    assert not path.exists() or path.read_bytes() == b""


def test_constructor_rejects_nonsense_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a.jsonl", keep=0)
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a.jsonl", max_bytes=0)


# --- tail ---------------------------------------------------------------------------------------------


def test_tail_returns_last_records_oldest_first_across_rotations(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=len(json.dumps(record())) * 3, keep=10)
    for i in range(12):
        assert log.append(record(slug="even" if i % 2 == 0 else "odd", run_id=f"r{i}"))
    assert (tmp_path / "audit.jsonl.2").exists()
    assert [r["run_id"] for r in log.tail(3)] == ["r9", "r10", "r11"]
    assert [r["run_id"] for r in log.tail(4, slug="odd")] == ["r5", "r7", "r9", "r11"]
    assert [r["run_id"] for r in log.tail(100, slug="even")] == [f"r{i}" for i in range(0, 12, 2)]
    assert log.tail(5, slug="nobody") == []
    assert log.tail(0) == []


def test_tail_of_a_missing_log_is_empty(tmp_path: Path) -> None:
    assert AuditLog(tmp_path / "none" / "audit.jsonl").tail(5) == []


def test_appends_need_no_new_descriptor_once_open(tmp_path: Path) -> None:
    """With its descriptors held, the log is written even when the process's table is full."""
    code = f"""
import os, resource, sys
sys.path.insert(0, {str(REPO)!r})
from host.audit.log import AuditLog
from host.audit.verify import verify_audit
from pathlib import Path
path = Path({str(tmp_path / "audit.jsonl")!r})
log = AuditLog(path)
log.open()
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
ok = [log.append({{"event": "agent_run", "n": n}}) for n in range(20)]
for fd in hog:
    os.close(fd)
print(all(ok), verify_audit(path).ok)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_a_transient_failure_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    real_write = os.write
    failures = {"left": 2}

    def flaky(fd: int, data: bytes) -> int:
        if failures["left"] and data.endswith(b"\n") and b'"seq"' in data:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", flaky)
    assert log.append(record())
    assert failures["left"] == 0
    monkeypatch.setattr(os, "write", real_write)
    report = verify_audit(path)
    assert report.ok and report.records == 1, report.problems


def test_another_writer_rotating_the_file_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    one, two = AuditLog(path, max_bytes=600), AuditLog(path, max_bytes=600)
    for n in range(12):
        assert (one if n % 3 else two).append(record(run_id=f"r{n}"))
    assert verify_audit(path).ok
    assert [r["run_id"] for r in one.tail(12)][-3:] == ["r9", "r10", "r11"]


def test_tail_can_select_events(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.append(start("a"), sync=False)
    log.append(record(run_id="a"))
    assert [r["event"] for r in log.tail(5)] == ["agent_run_start", "agent_run"]
    assert [r["event"] for r in log.tail(5, events=frozenset({"agent_run"}))] == ["agent_run"]


def test_a_failed_end_record_is_written_with_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.mkdir()  # unwritable for now
    log = AuditLog(path)
    assert not log.append(start("a"), sync=False)  # a start record is not kept: its run never started
    assert not log.append(record(run_id="a"))
    assert log.pending == 1 and not log.flush()
    path.rmdir()
    assert log.append(record(run_id="b"))
    assert log.pending == 0
    assert [r["run_id"] for r in log.tail(5)] == ["a", "b"]
    assert verify_audit(path).ok


def test_close_flushes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.mkdir()
    log = AuditLog(path)
    assert not log.append(record(run_id="late"))
    path.rmdir()
    log.close()
    assert [r["run_id"] for r in AuditLog(path).tail(5)] == ["late"]


def test_a_run_end_record_is_durable_before_its_head_and_the_head_is_never_two_behind(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = tmp_path / "audit.jsonl.head"
    log = AuditLog(path)
    synced: list[int] = []
    real_fsync = os.fsync
    head_fd = -1

    def fsync(fd: int) -> None:
        synced.append(0 if fd == head_fd else 1)
        real_fsync(fd)

    assert log.append(record())
    head_fd = log._head_fd
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", fsync)
        assert log.append(record(), head_later=True)
        assert synced == [1]  # the log line only: the head is left for later
        assert log.append(record(), head_later=True)
        assert synced == [1, 0, 1]  # the previous head first, then this line
        log.sync_head()
        log.sync_head()  # nothing left: no second fsync
        assert synced == [1, 0, 1, 0]
    assert json.loads(head.read_bytes())["seq"] == 3 and verify_audit(path).ok


def head_left_behind(tmp_path: Path, behind: int = 3) -> tuple[Path, AuditLog]:
    """A log of 1 + `behind` records whose head file still records the first, as a crash can leave it
    when several processes appended and none of their head updates reached the disk."""
    path = tmp_path / "audit.jsonl"
    head = tmp_path / "audit.jsonl.head"
    log = AuditLog(path)
    assert log.append(record())
    stale = head.read_bytes()
    for _ in range(behind):
        assert log.append(record())
    head.write_bytes(stale)
    return path, log


def test_a_head_several_records_behind_an_unbroken_chain_is_caught_up(tmp_path: Path) -> None:
    path, log = head_left_behind(tmp_path)
    assert log.append(record())
    assert [json.loads(line)["seq"] for line in lines(path)] == [1, 2, 3, 4, 5]
    assert verify_audit(path).ok


def test_a_head_behind_a_broken_chain_still_wins(tmp_path: Path) -> None:
    path, _ = head_left_behind(tmp_path)
    kept = lines(path)
    del kept[2]  # a record removed from between the head and the end
    write_lines(path, kept)
    log = AuditLog(path)
    assert log.append(record())
    assert json.loads(lines(path)[-1])["seq"] == 2  # chained to the head: the removal stays visible
    assert not verify_audit(path).ok
