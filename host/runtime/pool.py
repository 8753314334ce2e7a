"""Single-use warm pools: sandboxes started ahead of demand, each claimed by exactly one run, never reused."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from host.core.errors import SandboxError

logger = logging.getLogger("agentnode.sandbox.pool")

PoolKey = tuple[str, str, str, str]


class MemberLimits(Protocol):
    """What the pools read of a member's limits: its memory, which the members' budget divides."""

    @property
    def memory_bytes(self) -> int: ...


class MemberSpec(Protocol):
    """What a pool is kept for (the Docker backend's SandboxSpec): its key and its members' limits."""

    @property
    def pool_key(self) -> PoolKey: ...

    @property
    def limits(self) -> MemberLimits: ...


class Member(Protocol):
    """A started, unclaimed sandbox as the pools see it (the Docker backend's Sandbox)."""

    run_id: str
    launched_at: float

    @property
    def ready(self) -> bool: ...

    @property
    def exited(self) -> bool: ...

    def destroy(self) -> None: ...


SpecT = TypeVar("SpecT", bound=MemberSpec)
MemberT = TypeVar("MemberT", bound=Member)

REFILL_DEFER_SECONDS = 0.15
"""How long a refill waits for the runs just claimed from a pool to get their results first. Starting a
container keeps both cores of a small host busy for a while, and a warm run's few milliseconds are the
reason the pool exists; a run that takes longer than this shares the machine with the refill as before."""


@dataclass(frozen=True)
class PoolSettings:
    """How many members each pool keeps, how long a member may wait, and the memory they may reserve."""

    size: int = 2
    idle_ttl_seconds: float = 300.0
    memory_budget_bytes: int = 4 * 1024 * 1024 * 1024

    def max_members(self, member_memory_bytes: int) -> int:
        return max(0, self.memory_budget_bytes // max(1, member_memory_bytes))


def _pool_name(key: PoolKey) -> str:
    """A pool as counts() and the metrics name it: slug/artifact hash/runtime (the image pin left out)."""
    return "/".join(key[:3])


class WarmPools(Generic[SpecT, MemberT]):
    """Pools per (pack version, runtime, image); a background filler keeps each at its size.

    A claimed member leaves the pool for good: the caller runs it once and destroys it. Members that
    exited, outlived the idle TTL, or belong to a pool nobody asked for are destroyed by the filler.
    Every `CURRENT_CHECK_SECONDS` the filler asks `is_current(spec)` (is that pack version still the
    installed one?); a pool whose pack was uninstalled or replaced stops refilling, its members are
    destroyed and `retired(spec)` lets the owner drop what only that pool used (its pack volume). Closing
    offers every pool to `retired` too, once its members are gone: a pack uninstalled while its members
    were still up (their volume in use, so kept) is dropped then, not left on the engine for good.
    """

    CURRENT_CHECK_SECONDS = 1.0

    def __init__(
        self,
        launch: Callable[[SpecT], MemberT],
        settings: PoolSettings,
        *,
        destroy: Callable[[MemberT], None] | None = None,
        is_current: Callable[[SpecT], bool] | None = None,
        retired: Callable[[SpecT], None] | None = None,
    ) -> None:
        self._launch = launch
        self._destroy = destroy or (lambda box: box.destroy())
        self._is_current = is_current
        self._retired = retired
        self._checked_at = 0.0
        self.settings = settings
        self._members: dict[PoolKey, list[MemberT]] = {}
        self._specs: dict[PoolKey, SpecT] = {}
        self._launching: dict[PoolKey, int] = {}
        self._unsettled: dict[str, float] = {}
        """Run ids of claimed members whose runs have no result yet, with when they were claimed."""
        self._cond = threading.Condition()
        self._closed = False
        self.launch_failures = 0
        self.retired_pools = 0
        self.hits = 0
        """Claims of a pooled agent that got a member."""
        self.misses = 0
        """Claims of a pooled agent that found none (the run started cold)."""
        self._filler = threading.Thread(target=self._fill_loop, daemon=True, name="agentnode-pool-filler")
        self._filler.start()

    # -- public -------------------------------------------------------------------------------------

    def want(self, spec: SpecT) -> None:
        """Start (or keep) a pool for this spec."""
        with self._cond:
            if self._closed or self.settings.size <= 0:
                return
            self._specs[spec.pool_key] = spec
            self._members.setdefault(spec.pool_key, [])
            self._cond.notify_all()

    def claim(self, key: PoolKey) -> MemberT | None:
        """Take a ready member of this pool (or any live one); None when the pool is empty.

        Members were verified (engine, image pin, pack volume) when they were launched, and what they
        stand on cannot be removed while they run, so a claim needs no engine round trip.
        """
        with self._cond:
            members = self._members.get(key, [])
            pick: MemberT | None = None
            for box in members:
                if box.ready:
                    pick = box
                    break
            if pick is None:
                pick = next((b for b in members if not b.exited), None)
            if pick is not None:
                members.remove(pick)
                self.hits += 1
                self._unsettled[pick.run_id] = time.monotonic()
            elif key in self._specs:
                self.misses += 1
            self._cond.notify_all()
        return pick

    def settled(self, run_id: str) -> None:
        """The run of a claimed member has its result: a refill need not wait for it any longer."""
        with self._cond:
            if self._unsettled.pop(run_id, None) is not None:
                self._cond.notify_all()

    def counts(self) -> dict[str, int]:
        with self._cond:
            return {_pool_name(k): len(v) for k, v in self._members.items()}

    def ready_counts(self) -> dict[str, int]:
        """Of counts(), the members whose wrapper is connected and waiting for its task (the rest start)."""
        with self._cond:
            return {_pool_name(k): sum(1 for b in v if b.ready) for k, v in self._members.items()}

    def total(self) -> int:
        with self._cond:
            return sum(len(v) for v in self._members.values()) + sum(self._launching.values())

    def close(self) -> None:
        """Destroy every member; no member survives the pool. Then offer each pool to `retired`."""
        with self._cond:
            self._closed = True
            doomed = [b for v in self._members.values() for b in v]
            self._members.clear()
            specs = list(self._specs.values())
            self._cond.notify_all()
        self._filler.join(timeout=60)
        for box in doomed:
            with contextlib.suppress(Exception):
                self._destroy(box)
        if self._retired is not None:
            for spec in specs:
                with contextlib.suppress(Exception):
                    self._retired(spec)

    # -- filler -------------------------------------------------------------------------------------

    def _next_job(self) -> tuple[list[MemberT], SpecT | None]:
        """Under the lock: members to destroy and the spec of one member to launch (if any)."""
        now = time.monotonic()
        doomed: list[MemberT] = []
        for members in self._members.values():
            for box in list(members):
                if box.exited or now - box.launched_at > self.settings.idle_ttl_seconds:
                    members.remove(box)
                    doomed.append(box)
        cap = self.settings.max_members(max((s.limits.memory_bytes for s in self._specs.values()), default=1))
        if self.total() >= cap:
            return doomed, None
        for key, spec in self._specs.items():
            have = len(self._members.get(key, [])) + self._launching.get(key, 0)
            if have < self.settings.size:
                self._launching[key] = self._launching.get(key, 0) + 1
                return doomed, spec
        return doomed, None

    def _defer_refill(self) -> None:
        """Under the lock: wait while a run claimed less than REFILL_DEFER_SECONDS ago has no result yet,
        never longer than that in all (claims that keep coming cannot starve the pool)."""
        give_up = time.monotonic() + REFILL_DEFER_SECONDS
        while not self._closed:
            now = time.monotonic()
            for run_id, at in list(self._unsettled.items()):  # a run that never settles is forgotten
                if now - at >= REFILL_DEFER_SECONDS:
                    del self._unsettled[run_id]
            if not self._unsettled:
                return
            hold = min(max(self._unsettled.values()) + REFILL_DEFER_SECONDS, give_up) - now
            if hold <= 0:
                return
            self._cond.wait(timeout=hold)

    def _retire_stale(self) -> None:
        """Drop pools whose pack version is no longer the installed one (outside the lock: it reads files)."""
        now = time.monotonic()
        if self._is_current is None or now - self._checked_at < self.CURRENT_CHECK_SECONDS:
            return
        self._checked_at = now
        with self._cond:
            specs = list(self._specs.values())
        stale: list[SpecT] = []
        for spec in specs:
            try:
                current = self._is_current(spec)
            except Exception as exc:  # noqa: BLE001 (unknown is not stale: keep the pool, check again)
                logger.warning("warm pool check failed: %s", type(exc).__name__)
                current = True
            if not current:
                stale.append(spec)
        if not stale:
            return
        doomed: list[MemberT] = []
        with self._cond:
            for spec in stale:
                self._specs.pop(spec.pool_key, None)
                doomed.extend(self._members.pop(spec.pool_key, []))
            self._cond.notify_all()
        for box in doomed:
            with contextlib.suppress(Exception):
                self._destroy(box)
        for spec in stale:
            self.retired_pools += 1
            if self._retired is not None:
                with contextlib.suppress(Exception):
                    self._retired(spec)

    def _fill_loop(self) -> None:
        backoff = 0.0
        while True:
            self._retire_stale()
            with self._cond:
                if self._closed:
                    return
                doomed, spec = self._next_job()
                if spec is None and not doomed:
                    self._cond.wait(timeout=1.0)
                    continue
                if spec is not None:
                    self._defer_refill()
                    if self._closed:
                        self._launching[spec.pool_key] -= 1
                        return
            for old in doomed:
                with contextlib.suppress(Exception):
                    self._destroy(old)
            if spec is None:
                continue
            box: MemberT | None = None
            try:
                box = self._launch(spec)
                backoff = 0.0
            except SandboxError as exc:
                self.launch_failures += 1
                logger.warning("warm pool launch failed: %s", exc.reason.value)
                backoff = min(30.0, backoff * 2 or 0.5)
            except Exception as exc:  # noqa: BLE001 (the filler must survive anything and retry)
                self.launch_failures += 1
                logger.warning("warm pool launch failed: %s", type(exc).__name__)
                backoff = min(30.0, backoff * 2 or 0.5)
            with self._cond:
                self._launching[spec.pool_key] -= 1
                if box is not None and not self._closed and spec.pool_key in self._specs:
                    self._members.setdefault(spec.pool_key, []).append(box)
                    box = None
                self._cond.notify_all()
            if box is not None:  # the pool closed while it launched
                with contextlib.suppress(Exception):
                    self._destroy(box)
            if backoff:
                time.sleep(backoff)


__all__ = ["Member", "MemberLimits", "MemberSpec", "PoolSettings", "WarmPools"]
