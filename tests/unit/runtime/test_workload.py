"""The run's end-of-output mark (host/runtime/workload.py): found in each stream wherever frames split it,
never kept, and the reason a result waits only until the output is in, not until the stream ends."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from host.runtime.rundir import RunDir
from host.runtime.session import RunSession
from host.runtime.workload import (
    CappedSink,
    Frame,
    OutputMarks,
    Workload,
    _unread,
    drain,
    finish,
    new_output_mark,
)

MARK = new_output_mark()


def test_marks_are_random_start_with_a_byte_text_never_holds_and_end_a_line() -> None:
    assert MARK != new_output_mark() and MARK.startswith(b"\0") and len(MARK) >= 40
    assert MARK.endswith(b"\n")  # the engines pass a partial line on only when more comes, or at the exit


def test_a_mark_split_at_every_position_between_frames_is_found_and_taken_out() -> None:
    for cut in range(len(MARK) + 1):
        marks = OutputMarks(MARK)
        kept = [
            marks.feed(1, b"last line\n" + MARK[:cut]),
            marks.feed(2, b"err\n"),  # the other stream between the two halves
            marks.feed(1, MARK[cut:] + b"after\n"),
            marks.feed(2, MARK),
        ]
        assert b"".join(kept) == b"last line\nerr\nafter\n", cut
        assert marks.complete and marks.seen == 2
        assert marks.read == {1: 10 + len(MARK) + 6, 2: 4 + len(MARK)}


def test_output_that_only_looks_like_a_mark_is_kept_as_written() -> None:
    marks = OutputMarks(MARK)
    fake = b"\0agentnode:end-of-output:" + b"0" * 32 + b"\0"
    kept = marks.feed(1, b"a\0b\0" + fake + MARK[:-1]) + marks.feed(1, b"x") + marks.feed(1, MARK[:5])
    kept += b"".join(held for _, held in marks.rest())
    assert kept == b"a\0b\0" + fake + MARK[:-1] + b"x" + MARK[:5]
    assert marks.seen == 0 and not marks.complete


def test_what_is_held_back_is_less_than_a_mark_per_stream() -> None:
    marks = OutputMarks(MARK)
    for stream in (1, 2):
        assert marks.feed(stream, b"text" + MARK[:-1]) == b"text"
    assert marks.rest() == [(1, MARK[:-1]), (2, MARK[:-1])]
    assert marks.rest() == []


def test_random_frames_of_two_streams_keep_exactly_what_the_agent_wrote() -> None:
    rng = random.Random(7)
    alphabet = b"ab\n\0" + MARK[:3]
    for _ in range(300):
        written = {s: bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 80))) for s in (1, 2)}
        pending: dict[int, list[bytes]] = {}
        for stream in (1, 2):
            data = written[stream] + MARK + (b"late\n" if rng.random() < 0.3 else b"")
            cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randrange(0, 6))))
            pending[stream] = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        frames: list[Frame] = []
        while any(pending.values()):  # a random interleaving that keeps each stream's own order
            stream = rng.choice([s for s, left in pending.items() if left])
            frames.append((stream, pending[stream].pop(0)))
        marks = OutputMarks(MARK)
        kept: dict[int, bytes] = {1: b"", 2: b""}
        for stream, chunk in frames:
            kept[stream] += marks.feed(stream, chunk)
        assert marks.complete
        for stream in (1, 2):
            kept[stream] += marks._held.pop(stream, b"")
            assert kept[stream].replace(b"late\n", b"") == written[stream]


def test_an_empty_mark_finds_nothing_and_holds_nothing() -> None:
    marks = OutputMarks(b"")
    assert marks.feed(1, b"\0" + MARK) == b"\0" + MARK and not marks.complete and marks.rest() == []


def test_the_drain_passes_the_last_line_on_when_the_marks_arrive_not_when_the_stream_ends() -> None:
    lines: list[str] = []
    sink = CappedSink(on_line=lines.append)
    marks = OutputMarks(MARK)
    marked: list[int] = []
    drain([(1, b"one\ntwo"), (1, MARK), (2, MARK)], sink, marks, lambda: marked.append(len(lines)))
    assert marked == [2] and lines == ["one", "two"]
    finish(sink, marks)
    assert sink.text() == "one\ntwo" and lines == ["one", "two"]


def test_a_reread_skips_what_each_stream_already_gave() -> None:
    frames = [(1, b"abc"), (2, b"XY"), (1, b"def"), (2, b"Z"), (1, b"g")]
    assert list(_unread(frames, {1: 4, 2: 2})) == [(1, b"ef"), (2, b"Z"), (1, b"g")]
    assert list(_unread(frames, {})) == frames


def workload(tmp_path: Path) -> Workload:
    class Draining(Workload):
        reads_output = True

    return Draining(run_id="r", name="w", session=RunSession(), rundir=RunDir(tmp_path), server=None)


def test_a_workload_that_reads_output_hands_its_session_a_mark_and_others_none(tmp_path: Path) -> None:
    work = workload(tmp_path)
    assert work.session.output_mark.startswith(b"\0")
    plain = Workload(run_id="r", name="w", session=RunSession(), rundir=RunDir(tmp_path), server=None)
    assert plain.session.output_mark == b""


def test_settle_returns_once_the_marks_are_in_while_the_stream_stays_open(tmp_path: Path) -> None:
    work = workload(tmp_path)
    mark = work.session.output_mark
    hold = threading.Event()

    def stream() -> Iterator[Frame]:
        yield 1, b"out\n" + mark
        yield 2, b"err\n" + mark
        hold.wait(30)  # the container has not exited yet

    work.start_drain(stream)
    started = time.monotonic()
    work.settle_logs(20)
    assert time.monotonic() - started < 10  # not the 20 s bound: the marks said the output is in
    assert work.sink.text() == "out\nerr\n"
    hold.set()


def test_a_stream_that_ends_short_of_the_marks_is_completed_from_a_reread(tmp_path: Path) -> None:
    work = workload(tmp_path)
    mark = work.session.output_mark
    full = [(1, b"line 1\nline 2\n"), (2, b"oops\n"), (1, b"line 3\n" + mark), (2, mark)]
    work.session.outcome = object()  # type: ignore[assignment]  # the wrapper reported: it wrote its marks
    work.start_drain(lambda: iter([*full[:1], (1, b"line 3\n")]), reread=lambda: iter(full))
    work.settle_logs(0.2)
    assert work.sink.text() == "line 1\nline 2\nline 3\n"  # the engine's log is read again once it exited
    work.exited_with(0)
    work.settle_logs(20)
    assert work.sink.text() == "line 1\nline 2\nline 3\noops\n"


def test_no_reread_for_a_run_that_never_reported(tmp_path: Path) -> None:
    work = workload(tmp_path)
    rereads: list[int] = []

    def reread() -> Iterator[Frame]:
        rereads.append(1)
        yield 1, b"again"

    work.start_drain(lambda: iter([(1, b"partial")]), reread=reread)
    work.exited_with(1)
    work.settle_logs(20)
    assert work.sink.text() == "partial" and rereads == []


def test_live_lines_are_split_per_stream() -> None:
    lines: list[str] = []
    sink = CappedSink(on_line=lines.append)
    drain([(1, b"no line end"), (2, b"err 0\n"), (1, b" yet\n"), (2, b"tail")], sink)
    sink.flush()
    assert lines == ["err 0", "no line end yet", "tail"]
    assert sink.text() == "no line enderr 0\n yet\ntail"  # the kept logs are the bytes as they came


def test_a_flood_of_marks_in_one_chunk_is_counted_and_kept_out() -> None:
    marks = OutputMarks(MARK)
    flood = (b"x" + MARK) * 5000
    assert marks.feed(1, flood) == b"x" * 5000 and marks.seen == 5000 and marks.read == {1: len(flood)}


def test_what_was_held_back_goes_back_to_its_own_stream_at_the_end() -> None:
    lines: list[str] = []
    sink = CappedSink(on_line=lines.append)
    marks = OutputMarks(MARK)
    drain([(1, b"out"), (2, b"err" + MARK[:5])], sink, marks)
    finish(sink, marks)
    assert lines == ["out", "err" + MARK[:5].decode()]  # not "out" + the held bytes
