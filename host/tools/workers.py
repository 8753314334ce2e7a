"""The host's tool runner: allowed calls of trusted packs run in persistent worker processes
(sandbox_wrapper/_tool_exec.py run as a script, the same executor a tool sandbox uses), one pack per worker,
with a minimal environment that holds no API keys, so a failing, hanging or crashing tool fails only its
call."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from host.core.strictjson import JsonRejected, dumps_strict, loads_strict
from host.tools.calls import InstalledToolpack, ResolvedTool, ToolOutcome, failed, reply_outcome
from sandbox_wrapper.protocol import MAX_RESULT_BYTES, tool_worker_script

logger = logging.getLogger("host.tools.gate")

_WORKER_SCRIPT = Path(tool_worker_script())
# A reply line is result_json escaped once more; anything longer is not our worker speaking.
_MAX_REPLY_LINE = 4 * MAX_RESULT_BYTES


class _WorkerGone(Exception):
    """The worker died or broke the protocol."""


class _WorkerTimeout(Exception):
    """The worker did not reply in time."""


def _worker_env() -> dict[str, str]:
    """Only what an interpreter needs: no API keys, no PYTHON* variables (ignored under -I anyway)."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


class _Worker:
    """One worker process serving one pack's import root, in its own process group.

    `interpreter` is the pack's own virtual environment's python (its requirements; -I keeps that
    environment's site-packages, which pyvenv.cfg names, and drops the host's); None runs the host's.
    """

    def __init__(self, root: Path, interpreter: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(interpreter or sys.executable), "-I", "-B", str(_WORKER_SCRIPT), str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the tool's own output: discarded, so it can never block
            env=_worker_env(),
            cwd=root,
            start_new_session=True,
        )
        self._kill_lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, request: bytes, timeout: float) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        deadline = time.monotonic() + timeout
        try:
            stdin.write(request)
            stdin.flush()
        except OSError:
            raise _WorkerGone from None
        try:
            reply = loads_strict(self._read_line(stdout.fileno(), deadline), max_depth=4)
        except JsonRejected:
            raise _WorkerGone from None
        if not isinstance(reply, dict):
            raise _WorkerGone
        return reply

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    @staticmethod
    def _read_line(fd: int, deadline: float) -> bytes:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        buffer = bytearray()
        while not buffer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _WorkerTimeout
            if not poller.poll(remaining * 1000):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk or len(buffer) + len(chunk) > _MAX_REPLY_LINE:
                raise _WorkerGone
            buffer += chunk
        return bytes(buffer)

    def kill(self) -> None:
        """Kill the whole process group (tools may have started children); safe from any thread."""
        with self._kill_lock:
            if self.proc.returncode is None:  # not reaped yet, so the pid cannot have been reused
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def dispose(self) -> None:
        """Kill and close the pipes; only the thread that owns the worker calls this."""
        self.kill()
        for pipe in self._pipes():
            with contextlib.suppress(OSError):
                pipe.close()


_PoolKey = tuple[str, str, Path, Path | None]


class ToolRunner:
    """Host-wide tool executor with a small pool of persistent workers, keyed by (slug, version, root,
    interpreter).

    A worker only ever serves one pack, so packs never share an interpreter; a worker that timed out,
    crashed or broke the protocol is killed and never reused. Calls of one pack share module state
    across runs through reused workers (the pack is trusted or curated).
    """

    def __init__(self, *, max_idle_per_pack: int = 2) -> None:
        self._max_idle_per_pack = max_idle_per_pack
        self._lock = threading.Lock()
        self._idle: dict[_PoolKey, list[_Worker]] = {}
        self._busy: set[_Worker] = set()
        self._closed = False
        atexit.register(self.close)

    def run(
        self, pack: InstalledToolpack, tool: ResolvedTool, arguments: dict[str, Any], *, timeout: float
    ) -> ToolOutcome:
        """Run one tool call; every failure is an unsuccessful outcome for this call only."""
        key: _PoolKey = (pack.slug, pack.version, pack.root, pack.interpreter)
        try:  # before a worker is taken: a refusal here must not keep it busy for good
            line = dumps_strict(
                {"entrypoint": tool.entrypoint, "fallback": tool.fallback, "arguments": arguments}
            )
        except (JsonRejected, TypeError):
            return failed("tool arguments are not strict JSON")
        request = (line + "\n").encode()
        try:
            worker = self._acquire(key)
        except OSError as exc:
            logger.warning("tool worker failed to start: %s", type(exc).__name__)
            return failed("tool worker failed to start")
        if worker is None:
            return failed("tool runner is closed")
        try:
            reply = worker.call(request, timeout)
        except _WorkerTimeout:
            self._discard(worker)
            return failed(f"tool timed out after {timeout:.1f} s")
        except _WorkerGone:
            self._discard(worker)
            return failed("tool worker crashed")
        self._release(key, worker)
        return reply_outcome(reply)

    def close(self) -> None:
        """Kill every worker; calls in flight fail as crashed. Idempotent."""
        with self._lock:
            self._closed = True
            idle = [worker for workers in self._idle.values() for worker in workers]
            busy = list(self._busy)
            self._idle.clear()
        for worker in idle:
            worker.dispose()
        for worker in busy:
            worker.kill()  # its owner sees the pipe close and disposes it

    def _acquire(self, key: _PoolKey) -> _Worker | None:
        with self._lock:
            if self._closed:
                return None
            # A call of a pack version retires idle workers of its other versions (a reinstall): they
            # run code from a host copy that is gone and are never asked again.
            stale = [k for k in self._idle if k[0] == key[0] and k != key]
            replaced = [worker for k in stale for worker in self._idle.pop(k)]
            reused: _Worker | None = None
            idle = self._idle.get(key, [])
            while idle and reused is None:
                candidate = idle.pop()
                if candidate.alive():
                    self._busy.add(candidate)
                    reused = candidate
                else:
                    replaced.append(candidate)
        for old in replaced:
            old.dispose()
        if reused is not None:
            return reused
        worker = _Worker(key[2], key[3])
        with self._lock:
            if not self._closed:
                self._busy.add(worker)
                return worker
        worker.dispose()
        return None

    def _release(self, key: _PoolKey, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            idle = self._idle.setdefault(key, [])
            keep = not self._closed and len(idle) < self._max_idle_per_pack
            if keep:
                idle.append(worker)
        if not keep:
            worker.dispose()

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
        worker.dispose()
