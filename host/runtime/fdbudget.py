"""The host's file-descriptor budget: runs are admitted only while a reserve stays free for the host itself.

A run's socket can hold at most a bounded number of connections (the per-run server refuses the rest
before the HTTP/2 handshake), so each run costs at most `per_run` descriptors. Admission keeps
`reserve` descriptors free for what every run depends on (the admin socket, the audit log, tool workers,
the engine's connection pool): one run exhausting its own bound hurts only itself, and a host full of
runs refuses the next one cleanly instead of failing the runs it already has.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator

from host.core.errors import AuditReason, SandboxError

RESERVED_FDS = 256
"""Descriptors kept free for the host itself whatever its runs do."""
PER_RUN_OVERHEAD_FDS = 24
"""A run's own descriptors besides its socket's connections: listener, gRPC pollers, the engine's log
stream and attach, pipes of a host-path wrapper, the run directory."""
NOFILE_TARGET = 1 << 16
"""How high the host raises its own soft open-file limit at start (never above the hard limit)."""
COUNT_MARGIN_FDS = 1024
"""Within this many descriptors of the limit (reserve and one more run included) admission counts the
open descriptors every time; further away it may use a count up to COUNT_MAX_AGE_SECONDS old."""
COUNT_MAX_AGE_SECONDS = 5.0
"""How old a count admission may use far from the limit. Listing /proc/self/fd after the host sat idle
took ~0.5 ms with 300 descriptors open, on the way of every run; runs refresh it after their result."""


def raise_nofile_limit(target: int = NOFILE_TARGET) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `target` (bounded by the hard limit); the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    return int(soft) if soft != resource.RLIM_INFINITY else target


def open_fds() -> int:
    """How many descriptors this process holds now."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


class FdBudget:
    """Admits a run while the worst case still leaves the reserve free.

    The worst case is every admitted run using its full share on top of what the host held when the
    budget was made (`baseline`); the descriptors open right now are checked too, so a leak elsewhere
    in the host shows up as refusals rather than as an exhausted table.
    """

    def __init__(
        self,
        *,
        per_run: int,
        reserve: int = RESERVED_FDS,
        limit: int | None = None,
        count: Callable[[], int] = open_fds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_run = per_run
        self.reserve = reserve
        self.limit = raise_nofile_limit() if limit is None else limit
        self._count = count
        self._clock = clock
        self.baseline = count()
        self._counted, self._counted_at = self.baseline, clock()
        self._lock = threading.Lock()
        self._held = 0
        self.refused = 0

    @classmethod
    def for_host(cls, *, connections_per_run: int, warm_members: int) -> FdBudget:
        """A host's budget: each run may hold its connections plus its own overhead, and warm members,
        which hold their sockets before any run claims them, have their share kept in reserve."""
        return cls(
            per_run=connections_per_run + PER_RUN_OVERHEAD_FDS,
            reserve=RESERVED_FDS + warm_members * (PER_RUN_OVERHEAD_FDS + 1),
        )

    @property
    def capacity(self) -> int:
        """How many runs fit when the host holds nothing else (for messages and doctor)."""
        return max(0, (self.limit - self.reserve) // self.per_run)

    def check(self) -> None:
        """Raise SandboxError(host_at_capacity) unless one more run would fit now."""
        with self._lock:
            self._check_locked()

    def refresh(self, older_than: float = 1.0) -> None:
        """Count the open descriptors again if the last count is older than `older_than` seconds (called
        after a run's result, so that admission rarely has to)."""
        with self._lock:
            if self._clock() - self._counted_at > older_than:
                self._counted, self._counted_at = self._count(), self._clock()

    def _open_now(self, projected: int) -> int:
        """The open descriptors: counted now near the limit or when the last count is too old, else that."""
        now = self._clock()
        near = max(self._counted, projected) + self.per_run + COUNT_MARGIN_FDS > self.limit - self.reserve
        if near or now - self._counted_at > COUNT_MAX_AGE_SECONDS:
            self._counted, self._counted_at = self._count(), now
        return self._counted

    def _check_locked(self) -> None:
        projected = self.baseline + self._held * self.per_run
        in_use = max(self._open_now(projected), projected)
        if in_use + self.per_run > self.limit - self.reserve:
            self.refused += 1
            raise SandboxError(
                f"the host is at its descriptor capacity ({self._held} runs, {in_use} of "
                f"{self.limit} descriptors in use, {self.reserve} kept in reserve)",
                reason=AuditReason.HOST_AT_CAPACITY,
                hint="retry when runs have finished, or raise the host's open-file limit "
                "(ulimit -n, or LimitNOFILE= for a systemd service)",
            )

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Admit one run for the duration of the block, or raise SandboxError(host_at_capacity)."""
        with self._lock:
            self._check_locked()
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1


__all__ = [
    "COUNT_MARGIN_FDS",
    "COUNT_MAX_AGE_SECONDS",
    "NOFILE_TARGET",
    "PER_RUN_OVERHEAD_FDS",
    "RESERVED_FDS",
    "FdBudget",
    "open_fds",
    "raise_nofile_limit",
]
