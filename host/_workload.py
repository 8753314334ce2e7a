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
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from host._rundir import RunDir, make_run_dir
from host._session import RunSession, build_run_server

if TYPE_CHECKING:
    from host._admission import Admission

logger = logging.getLogger("agentnode.sandbox.workload")

LOG_CAP_BYTES = 64 * 1024
"""How much of an agent's stdout/stderr the host keeps; the rest is read and dropped."""


MAX_LINE_BYTES = 4096
"""A live line longer than this is passed on in pieces of this size (the kept logs are not cut)."""


class CappedSink:
    """Keeps the first `cap` bytes of a stream and drops the rest, so a flooding agent costs no memory.

    `on_line`, when set, gets each line of the kept bytes as it completes (UTF-8 decoded with replacement,
    without its line end, at most MAX_LINE_BYTES a piece), then one note when the cap starts dropping:
    live output is bounded exactly like the kept logs. Lines are the agent's text: whoever shows them on a
    terminal escapes them first.
    """

    def __init__(self, cap: int = LOG_CAP_BYTES, on_line: Callable[[str], None] | None = None) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0
        self.on_line = on_line
        self._partial = bytearray()

    def feed(self, chunk: bytes) -> None:
        room = self.cap - self.size
        kept = chunk[: max(room, 0)]
        if kept:
            self.parts.append(kept)
            self.size += len(kept)
            if self.on_line is not None:
                self._split(kept)
        beyond = len(chunk) - len(kept)
        if beyond:
            first = not self.dropped
            self.dropped += beyond
            if first and self.on_line is not None:
                self.flush()
                self.on_line(f"[agentnode: output beyond {self.cap} bytes is dropped]")

    def _split(self, data: bytes) -> None:
        assert self.on_line is not None
        self._partial += data
        while (end := self._partial.find(b"\n")) >= 0 or len(self._partial) >= MAX_LINE_BYTES:
            cut = end if 0 <= end < MAX_LINE_BYTES else MAX_LINE_BYTES
            if cut != end:  # a piece of a long line: never end it inside a UTF-8 character
                back = cut
                while back > cut - 3 and back < len(self._partial) and self._partial[back] & 0xC0 == 0x80:
                    back -= 1
                cut = back if back > 0 else cut
            line = bytes(self._partial[:cut])
            del self._partial[: cut + (1 if cut == end else 0)]
            self.on_line(line.decode("utf-8", "replace").removesuffix("\r"))

    def flush(self) -> None:
        """Pass on a last line that never got its line end (the stream ended, or the cap was reached)."""
        if self._partial and self.on_line is not None:
            line, self._partial = bytes(self._partial), bytearray()
            self.on_line(line.decode("utf-8", "replace").removesuffix("\r"))

    def text(self) -> str:
        out = b"".join(self.parts).decode("utf-8", "replace")
        if self.dropped:
            out += f"\n[agentnode: {self.dropped} more bytes of output dropped]"
        return out


def drain(chunks: Iterable[bytes], sink: CappedSink) -> None:
    """Read a stream to its end into a capped sink; a broken stream just ends the drain."""
    with contextlib.suppress(Exception):
        for chunk in chunks:
            sink.feed(chunk)
    with contextlib.suppress(Exception):
        sink.flush()


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
    """The run's socket server; None for a workload that serves no socket (host/_sequential.py)."""
    launched_at: float = field(default_factory=time.monotonic)
    sink: CappedSink = field(default_factory=CappedSink)
    exit_info: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    _destroyed: bool = False
    _drainer: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    deadline_grace: ClassVar[float] = 0.0
    """How long past the run's deadline the watch loop waits: a workload that enforces the deadline itself
    and reports its own timeout gets that long to do so; the deadline plus this is the backstop."""

    def __post_init__(self) -> None:
        if self.sink.on_line is None:
            self.sink.on_line = self.session.log_line  # live lines go to whoever listens to the run
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

    def record_run(self, info: Mapping[str, object]) -> None:
        """What a restarted host needs to audit this run if this host dies first."""
        self.rundir.record_run(info)

    def exited_with(self, status: int) -> None:
        """Called by the backend's exit watcher: the workload is gone; wake the run's watch loop."""
        self.exit_info.setdefault("StatusCode", status)
        self.session.reported.set()

    def start_drain(self, source: Callable[[], Iterable[bytes]]) -> None:
        """Drain the workload's output into its capped sink on a thread (`source` is opened there)."""

        def run() -> None:
            with contextlib.suppress(Exception):
                drain(source(), self.sink)

        self._drainer = threading.Thread(target=run, daemon=True, name=f"logs-{self.name}")
        self._drainer.start()

    @property
    def ready(self) -> bool:
        """The wrapper is connected and waiting for its task."""
        return self.session.inflight > 0 and not self.exited

    @property
    def exited(self) -> bool:
        return bool(self.exit_info)

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
        """Give the log drain a moment to reach the end: the wrapper exits right after it reports."""
        if self._drainer is not None:
            self._drainer.join(timeout)

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
            if self.server is not None:
                with contextlib.suppress(Exception):
                    self.server.stop(grace=None)
            self._kill()
        finally:
            self.rundir.remove()


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
