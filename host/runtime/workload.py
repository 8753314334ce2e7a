"""One run's workload behind one interface: its socket side is built and torn down here, for every backend.

A backend starts "something that serves one run's socket" (a container, a host process, a pod): the run
directory, the gRPC server on the socket and the teardown order are the same for all of them, so they
live in `Workload`. A backend adds only how its process starts, how its exit is learnt, what its cgroup
says and how it is killed. The runner sees nothing else; a new backend subclasses `Workload` and passes a
`Backend` to the runner.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from host.files.area import FilesArea
from host.runtime.rundir import RunDir, make_run_dir
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession

if TYPE_CHECKING:
    from host.egress.proxy import EgressRoute
    from host.policy.admission import Admission

logger = logging.getLogger("agentnode.sandbox.workload")

LOG_CAP_BYTES = 64 * 1024
"""How much of an agent's stdout/stderr the host keeps; the rest is read and dropped."""


MAX_LINE_BYTES = 4096
"""A live line longer than this is passed on in pieces of this size (the kept logs are not cut)."""


class CappedSink:
    """Keeps the first `cap` bytes of a stream and drops the rest, so a flooding agent costs no memory.

    `on_line`, when set, gets each line of the kept bytes as it completes (UTF-8 decoded with replacement,
    without its line end, at most MAX_LINE_BYTES a piece), then one note when the cap starts dropping:
    live output is bounded exactly like the kept logs. Lines are split per stream: stdout's unended last
    line never takes in a stderr line that arrived after it. Lines are the agent's text: whoever shows them
    on a terminal escapes them first.
    """

    def __init__(self, cap: int = LOG_CAP_BYTES, on_line: Callable[[str], None] | None = None) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0
        self.on_line = on_line
        self._partial: dict[int, bytearray] = {}

    def feed(self, chunk: bytes, stream: int = 1) -> None:
        room = self.cap - self.size
        kept = chunk[: max(room, 0)]
        if kept:
            self.parts.append(kept)
            self.size += len(kept)
            if self.on_line is not None:
                self._split(kept, self._partial.setdefault(stream, bytearray()))
        beyond = len(chunk) - len(kept)
        if beyond:
            first = not self.dropped
            self.dropped += beyond
            if first and self.on_line is not None:
                self.flush()
                self.on_line(f"[agentnode: output beyond {self.cap} bytes is dropped]")

    def _split(self, data: bytes, partial: bytearray) -> None:
        assert self.on_line is not None
        partial += data
        while (end := partial.find(b"\n")) >= 0 or len(partial) >= MAX_LINE_BYTES:
            cut = end if 0 <= end < MAX_LINE_BYTES else MAX_LINE_BYTES
            if cut != end:  # a piece of a long line: never end it inside a UTF-8 character
                back = cut
                while back > cut - 3 and back < len(partial) and partial[back] & 0xC0 == 0x80:
                    back -= 1
                cut = back if back > 0 else cut
            line = bytes(partial[:cut])
            del partial[: cut + (1 if cut == end else 0)]
            self.on_line(line.decode("utf-8", "replace").removesuffix("\r"))

    def flush(self) -> None:
        """Pass on each stream's last line that never got its line end (the output ended, or the cap was
        reached)."""
        partials, self._partial = self._partial, {}
        for partial in partials.values():
            if partial and self.on_line is not None:
                self.on_line(bytes(partial).decode("utf-8", "replace").removesuffix("\r"))

    def text(self) -> str:
        out = b"".join(self.parts).decode("utf-8", "replace")
        if self.dropped:
            out += f"\n[agentnode: {self.dropped} more bytes of output dropped]"
        return out


Frame = tuple[int, bytes]
"""A piece of a workload's output: the stream it was written to (1 stdout, 2 stderr) and its bytes."""

REREAD_EXIT_WAIT_SECONDS = 60.0
"""How long a drain whose stream ended short of the marks waits for the workload's exit before giving up on
reading the output again (the teardown ends every workload well before)."""

OUTPUT_MARKS = 2
"""The wrapper writes the run's mark once to stdout and once to stderr (sandbox_wrapper/_runner.py)."""


def new_output_mark() -> bytes:
    """A run's end-of-output mark: random, so no agent prints it by chance; led by a NUL, which text output
    never holds, so a chunk's tail is almost never held back as the start of one; ended by a line end,
    without which the engines pass nothing on (Docker's log copier and conmon hold a partial line until
    more comes, or the container exits)."""
    return b"\0agentnode:end-of-output:" + secrets.token_hex(16).encode() + b"\0\n"


class OutputMarks:
    """Finds a run's end-of-output mark in each output stream and takes it out of what is kept.

    Each stream is scanned on its own (an engine may split one write across two frames with the other
    stream's between them), holding back a tail that could be the start of a mark: at most the mark's
    length minus one per stream, so an agent printing mark prefixes costs nothing. `read` counts every
    byte per stream, marks included: a re-read of the same output skips that many.
    """

    def __init__(self, mark: bytes, expected: int = OUTPUT_MARKS) -> None:
        self.mark = mark
        self.expected = expected
        self.seen = 0
        self.read: dict[int, int] = {}
        self._held: dict[int, bytes] = {}

    @property
    def complete(self) -> bool:
        """Every mark the wrapper writes has been seen: what was written before them is all in."""
        return bool(self.mark) and self.seen >= self.expected

    def feed(self, stream: int, chunk: bytes) -> bytes:
        """The bytes of `chunk` to keep, in order, without any mark; a possible mark's start is held."""
        self.read[stream] = self.read.get(stream, 0) + len(chunk)
        if not self.mark:
            return chunk
        data = self._held.pop(stream, b"") + chunk
        kept = bytearray()
        pos = 0
        while (at := data.find(self.mark, pos)) >= 0:  # one pass, however many marks a chunk holds
            kept += data[pos:at]
            pos = at + len(self.mark)
            self.seen += 1
        data = data[pos:]
        hold = self._prefix_at_end(data)
        if hold:
            self._held[stream] = data[-hold:]
            data = data[:-hold]
        kept += data
        return bytes(kept)

    def _prefix_at_end(self, data: bytes) -> int:
        """The length of the longest tail of `data` that begins the mark (never the whole mark)."""
        first = self.mark[:1]
        start = max(len(data) - len(self.mark) + 1, 0)
        while (at := data.find(first, start)) >= 0:
            if self.mark.startswith(data[at:]):
                return len(data) - at
            start = at + 1
        return 0

    def rest(self) -> list[Frame]:
        """What each stream still holds at the output's end: it was no mark after all."""
        held, self._held = list(self._held.items()), {}
        return held


def drain(
    frames: Iterable[Frame],
    sink: CappedSink,
    marks: OutputMarks | None = None,
    on_marked: Callable[[], None] = lambda: None,
) -> None:
    """Read a stream to its end into a capped sink, marks taken out; `on_marked` is called once when the
    last mark is seen. A broken stream just ends the drain. What `marks` holds back is left there: the
    caller keeps it (`finish`) once no more output is coming."""
    marks = marks if marks is not None else OutputMarks(b"")
    with contextlib.suppress(Exception):
        for stream, chunk in frames:
            was = marks.complete
            sink.feed(marks.feed(stream, chunk), stream)
            if marks.complete and not was:
                sink.flush()  # the agent returned: its last line is whole, even without a line end
                on_marked()


def finish(sink: CappedSink, marks: OutputMarks) -> None:
    """The output ended: keep what was held back as a possible mark, and pass on a last unended line."""
    with contextlib.suppress(Exception):
        for stream, held in marks.rest():
            sink.feed(held, stream)
        sink.flush()


def _unread(frames: Iterable[Frame], read: Mapping[int, int]) -> Iterator[Frame]:
    """The frames of a re-read output past the first `read[stream]` bytes of each stream."""
    skip = dict(read)
    for stream, chunk in frames:
        left = skip.get(stream, 0)
        if left >= len(chunk):
            skip[stream] = left - len(chunk)
            continue
        skip[stream] = 0
        yield stream, chunk[left:]


class SocketServer(Protocol):
    """What serves a workload's socket: the run's gRPC server, or a tool sandbox's ToolLink."""

    def start(self) -> None: ...

    def stop(self, grace: float | None) -> Any: ...


@dataclass
class Workload:
    """A started workload wired to its own socket; it serves exactly one run and is then destroyed.

    Subclasses implement `_kill` (stop and remove what they started; idempotent, verified) and may
    override the probes (`poll`, `pids_hits`, `oom_killed`: a host process has no cgroup of its own).
    """

    run_id: str
    name: str
    session: RunSession
    rundir: RunDir
    server: SocketServer | None
    """The run's socket server; None for a workload that serves no socket (runtime/backends/sequential.py)."""
    egress: SocketServer | None = None
    """The sandbox's egress listener (host/egress/proxy.py), when its run grants it egress."""
    launched_at: float = field(default_factory=time.monotonic)
    sink: CappedSink = field(default_factory=CappedSink)
    exit_info: dict[str, Any] = field(default_factory=dict)
    files_area: Path | None = None
    """A warm member's files area (host/files/area.py), removed with it unless a run took it over."""
    stages: dict[str, float] = field(default_factory=dict)
    _destroyed: bool = False
    _drainer: threading.Thread | None = None
    _output_in: threading.Event = field(default_factory=threading.Event)
    _gone: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    deadline_grace: ClassVar[float] = 0.0
    """How long past the run's deadline the watch loop waits: a workload that enforces the deadline itself
    and reports its own timeout gets that long to do so; the deadline plus this is the backstop."""

    reads_output: ClassVar[bool] = False
    """Whether this backend drains the workload's output (`start_drain`): only then is a mark handed out."""

    def __post_init__(self) -> None:
        if self.sink.on_line is None:
            self.sink.on_line = self.session.log_line  # live lines go to whoever listens to the run
        if self.reads_output and not self.session.output_mark:
            self.session.output_mark = new_output_mark()  # before the server starts: FetchTask hands it out
    @staticmethod
    def open_socket(
        run_id: str,
        owner: str,
        env: Mapping[str, str],
        session: RunSession,
        run_info: Mapping[str, object] | None,
        *,
        serve: Callable[[str], SocketServer] | None = None,
    ) -> tuple[RunDir, SocketServer]:
        """The run's directory (its crash record written first, so a host death from here on is audited)
        and its socket server, built but not started; nothing is left behind if building fails. `serve`
        builds another server on the socket path instead of the run's (a tool sandbox's ToolLink)."""
        rundir = make_run_dir(run_id, owner, env)
        if run_info is not None:
            rundir.record_run(run_info)
        try:
            path = str(rundir.socket_path)
            return rundir, serve(path) if serve is not None else build_run_server(session, path)
        except BaseException:
            rundir.remove()
            raise

    def mark(self, stage: str) -> None:
        self.stages[stage] = round((time.monotonic() - self.launched_at) * 1000, 2)

    def open_egress(self, route: EgressRoute | None, uid: int, gid: int) -> None:
        """Serve the egress socket of a run granted egress (`route`), handed to the sandbox's uid; before
        the wrapper gets its task, which is when it looks for it. No route: no socket, no way out."""
        if route is None or route.grant.empty or self.egress is not None:
            return
        proxy = route.serve(str(self.rundir.egress_path))
        proxy.start()
        self.egress = proxy
        self.rundir.grant(uid, gid)

    def record_run(self, info: Mapping[str, object]) -> None:
        """What a restarted host needs to audit this run if this host dies first."""
        self.rundir.record_run(info)

    def exited_with(self, status: int) -> None:
        """Called by the backend's exit watcher: the workload is gone; wake the run's watch loop."""
        self.exit_info.setdefault("StatusCode", status)
        self._gone.set()
        self.session.reported.set()

    def start_drain(
        self, source: Callable[[], Iterable[Frame]], reread: Callable[[], Iterable[Frame]] | None = None
    ) -> None:
        """Drain the workload's output into its capped sink on a thread (`source` is opened there). The
        output is in once the wrapper's marks were seen, or the stream ended. When it ended short of them
        and the workload, once gone, turns out to have reported (so the wrapper wrote them), `reread` (for
        an engine whose followed stream can end early) reads the whole output again and what was not read
        yet is taken from it."""

        def run() -> None:
            marks = OutputMarks(self.session.output_mark)
            try:
                with contextlib.suppress(Exception):
                    drain(source(), self.sink, marks, self._output_in.set)
                if reread is not None and not marks.complete and self._gone.wait(REREAD_EXIT_WAIT_SECONDS):
                    if self.session.outcome is not None:  # the wrapper reported: it wrote its marks first
                        with contextlib.suppress(Exception):
                            drain(_unread(reread(), dict(marks.read)), self.sink, marks, self._output_in.set)
                finish(self.sink, marks)
            finally:
                self._output_in.set()

        self._drainer = threading.Thread(target=run, daemon=True, name=f"logs-{self.name}")
        self._drainer.start()

    @property
    def ready(self) -> bool:
        """The wrapper is connected and waiting for its task."""
        return self.session.inflight > 0 and not self.exited

    @property
    def exited(self) -> bool:
        return bool(self.exit_info)

    def wait_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the workload to end (every process of it gone); whether it did."""
        return self._gone.wait(timeout)

    @property
    def exit_status(self) -> int | None:
        status = self.exit_info.get("StatusCode")
        return None if status is None else int(status)

    def lost(self) -> bool:
        """The run's socket directory disappeared from the host (something removed it under us)."""
        return not self.rundir.path.exists()

    @property
    def logs_lag(self) -> bool:
        """Whether the engine delivers the workload's output well after the process wrote it, so a result
        must wait for the log stream's end to carry its last lines (see the runner's settle)."""
        return False

    def settle_logs(self, timeout: float) -> None:
        """Wait, at most `timeout`, until the output is in: the wrapper's marks seen, or the stream ended."""
        if self._drainer is not None:
            self._output_in.wait(timeout)

    def poll(self) -> None:
        """Read the workload's resource counters; called every 50 ms while the run lasts."""

    def pids_hits(self) -> int:
        """How often the pids limit refused a process or thread, as of now."""
        return 0

    def oom_killed(self) -> bool:
        """Whether the memory limit killed the workload."""
        return False

    def _kill(self) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        """Cancel the session, stop the server, kill what the backend started, remove the run dir; once."""
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
        self.session.cancel()
        try:
            if self.egress is not None:
                with contextlib.suppress(Exception):
                    self.egress.stop(grace=None)
            if self.server is not None:
                with contextlib.suppress(Exception):
                    self.server.stop(grace=None)
            self._kill()
        finally:
            self.rundir.remove()
            if self.files_area is not None:
                FilesArea(self.files_area, True).remove()


SpecT = TypeVar("SpecT")


class Backend(Protocol[SpecT]):
    """Where admitted runs execute. The runner calls, per run: `claim` (a warm workload, if the backend
    keeps any), else `prepare` (verify what the workload stands on; fail closed) and `launch`; then
    `teardown`. A new backend implements these four and is chosen by the run's route in the runner."""

    def claim(self, admission: Admission) -> Workload | None:
        """A warm workload already serving an empty session, or None."""
        ...

    def prepare(self, admission: Admission) -> SpecT:
        """Everything the workload needs, verified; raises a SandboxError when the run cannot start."""
        ...

    def launch(
        self,
        spec: SpecT,
        *,
        run_id: str,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
    ) -> Workload:
        """Start the workload on its own socket; `session` None launches a warm member."""
        ...

    def teardown(self, workload: Workload) -> None:
        """Destroy a used workload and whatever it alone still held."""
        ...


class UnpooledBackend:
    """What a backend that starts every run fresh shares: the runner's owner token and environment (for
    its run directories), and a `claim` that finds nothing warm. HostBackend and SequentialBackend."""

    def __init__(self, *, owner: str, env: Mapping[str, str]) -> None:
        self.owner = owner
        self.env = env

    def claim(self, admission: Admission) -> None:
        """Nothing is kept warm: each run is started when it is admitted."""
        return None


class Teardowns:
    """Destroys used workloads: inline for a one-shot host, on a few threads for a long-running one (whose
    caller gets its result first); a failed background teardown is counted and logged, and the startup
    sweep is the backstop. Once closed, every teardown is inline: nothing is dropped at shutdown."""

    def __init__(self, *, background: bool) -> None:
        self.failures = 0
        self._pool = futures.ThreadPoolExecutor(4, "agentnode-teardown") if background else None
        self._lock = threading.Lock()

    @property
    def background(self) -> bool:
        return self._pool is not None

    def submit(
        self, backend: Backend[Any], work: Workload, done: Callable[[], None], *, inline: bool
    ) -> None:
        """Tear `work` down (now when `inline`, or when this host tears down inline); `done` is called after
        an inline teardown, whose errors propagate."""

        def destroy() -> None:
            # Let the caller's result leave first: teardown is engine-heavy and competes for the GIL.
            time.sleep(0.02)
            try:
                backend.teardown(work)
            except Exception as exc:  # noqa: BLE001 (counted and logged; the startup sweep is the backstop)
                self.failures += 1
                logger.warning("teardown of %s failed: %s", work.name, type(exc).__name__)

        with self._lock:
            if self._pool is not None and not inline:
                self._pool.submit(destroy)
                return
        backend.teardown(work)
        done()

    def close(self) -> None:
        """Wait for every background teardown; later ones run inline."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["LOG_CAP_BYTES", "Backend", "CappedSink", "SocketServer", "Teardowns", "Workload", "drain"]
