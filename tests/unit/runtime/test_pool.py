"""Warm pools without a daemon: filling, single-use claims, back-off, retiring pools, closing.

A fake launch and destroy stand in for the engine and fake members for sandboxes. The pool's real
filler thread runs; tests wait on conditions (never on the clock) and `settle()` waits until the filler,
looking afresh at the pool, finds nothing to launch or destroy, so "nothing more happened" is an
observation, not a guess after a sleep.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import host.runtime.pool
from host.core.errors import SandboxError
from host.engine.contract import ContainerLimits
from host.runtime.backends.container import SandboxSpec
from host.runtime.pool import PoolSettings, WarmPools

WAIT = 10.0
"""How long any wait may take before the test fails (never reached when the pool works)."""
GIB = 1024**3


class FakeBox:
    """Stands in for a launched Sandbox: the pool reads only `ready`, `exited`, `launched_at` and `run_id`."""

    def __init__(
        self, spec: SandboxSpec, n: int, *, ready: bool = True, exited: bool = False, age: float = 0
    ) -> None:
        self.spec = spec
        self.n = n
        self.run_id = f"{spec.slug}-{n}"
        self.ready = ready
        self.exited = exited
        self.launched_at = time.monotonic() - age
        self.destroyed = 0

    def __repr__(self) -> str:
        return f"FakeBox({self.spec.slug}#{self.n})"


def spec(slug: str = "agent", artifact: str = "a" * 64, memory: int = 512 * 1024 * 1024) -> SandboxSpec:
    return SandboxSpec(
        slug=slug, artifact_hash=artifact, runtime="runc", pin="sha256:" + "1" * 64, image_id="sha256:x",
        volume=f"agentnode-pack-{slug}-{artifact[:8]}", import_root="/pack",
        limits=ContainerLimits(memory_bytes=memory),
    )  # fmt: skip


def name(s: SandboxSpec) -> str:
    """The key `counts()` uses for the pool of `s`."""
    return "/".join(s.pool_key[:3])


class ObservedPools(WarmPools):
    """WarmPools whose filler reports each pass that found nothing to do; checks currency every 10 ms."""

    CURRENT_CHECK_SECONDS = 0.01

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.idle_passes = 0
        self.idle = threading.Condition()
        super().__init__(*args, **kwargs)

    def _next_job(self) -> tuple[list[Any], SandboxSpec | None]:
        doomed, job = super()._next_job()
        if job is None and not doomed:
            with self.idle:
                self.idle_passes += 1
                self.idle.notify_all()
        return doomed, job

    def settle(self) -> None:
        """Wait for a filler pass that starts after this call and finds nothing to launch or destroy."""
        with self.idle:
            start = self.idle_passes
        with self._cond:
            self._cond.notify_all()
        with self.idle:
            assert self.idle.wait_for(lambda: self.idle_passes > start, WAIT), "the filler never settled"

    def poke(self) -> None:
        """Wake the filler now (an idle filler otherwise looks again after a second)."""
        with self._cond:
            self._cond.notify_all()


def poking(pools: ObservedPools, check: Callable[[], bool]) -> None:
    """Wait for `check`, waking the filler meanwhile so its next pass (and currency check) comes soon."""
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        pools.poke()
        time.sleep(0.005)


class Engine:
    """The fake launch and destroy, with everything they were asked to do.

    `permits` (None: unlimited) is how many launches may complete; a launch beyond them blocks until
    `permit()`, which freezes the filler (it launches synchronously) so the pool's lists stay as they are.
    `failures` are raised by the next launches, in order. `shapes` give the n-th member its attributes.
    """

    def __init__(self, permits: int | None = None) -> None:
        self.cond = threading.Condition()
        self.permits = permits
        self.started = 0
        self.launched: list[FakeBox] = []
        self.destroyed: list[FakeBox] = []
        self.failures: list[Exception] = []
        self.shapes: dict[int, dict[str, Any]] = {}
        self.destroy_error: tuple[FakeBox, Exception] | None = None

    def launch(self, s: SandboxSpec) -> Any:
        with self.cond:
            n = self.started
            self.started += 1
            self.cond.notify_all()
            ok = self.cond.wait_for(lambda: self.permits is None or self.permits > 0, WAIT)
            assert ok, "a launch was never permitted"
            if self.permits is not None:
                self.permits -= 1
            if self.failures:
                raise self.failures.pop(0)
            box = FakeBox(s, n, **self.shapes.get(n, {}))
            self.launched.append(box)
            self.cond.notify_all()
            return box

    def destroy(self, box: Any) -> None:
        with self.cond:
            box.destroyed += 1
            self.destroyed.append(box)
            self.cond.notify_all()
        if self.destroy_error is not None and box is self.destroy_error[0]:
            raise self.destroy_error[1]

    def permit(self, n: int = 1) -> None:
        with self.cond:
            self.permits = (self.permits or 0) + n
            self.cond.notify_all()

    def unblock(self) -> None:
        with self.cond:
            self.permits = None
            self.cond.notify_all()

    def wait(self, check: Callable[[], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(check, WAIT), "the engine never saw that"

    def of(self, s: SandboxSpec) -> list[FakeBox]:
        with self.cond:
            return [b for b in self.launched if b.spec == s]


def until(check: Callable[[], bool]) -> None:
    """Poll a condition of the pool itself (it has no hook to wait on); fails after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def make_pools(engine: Engine) -> Iterator[Callable[..., ObservedPools]]:
    made: list[ObservedPools] = []

    def make(settings: PoolSettings | None = None, **kwargs: Any) -> ObservedPools:
        settings = settings or PoolSettings(size=2)
        pools = ObservedPools(engine.launch, settings, destroy=engine.destroy, **kwargs)
        made.append(pools)
        return pools

    yield make
    engine.unblock()
    for pools in made:
        pools.close()


# -- filling ----------------------------------------------------------------------------------------------


def test_want_fills_the_pool_up_to_its_size_and_no_further(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    pools = make_pools(PoolSettings(size=3))
    s = spec()
    assert pools.counts() == {} and pools.total() == 0
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 3})
    pools.settle()
    pools.want(s)  # wanting it again changes nothing
    pools.settle()
    assert len(engine.launched) == 3 and engine.started == 3 and pools.total() == 3
    assert engine.destroyed == []


def test_nothing_is_launched_before_want_or_with_size_zero(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    idle = make_pools(PoolSettings(size=2))
    idle.settle()
    off = make_pools(PoolSettings(size=0))
    off.want(spec())
    off.settle()
    idle.settle()
    assert engine.started == 0 and off.counts() == {} and off.claim(spec().pool_key) is None


def test_each_wanted_pool_is_filled(engine: Engine, make_pools: Callable[..., ObservedPools]) -> None:
    pools = make_pools(PoolSettings(size=2))
    a, b = spec("agent-a"), spec("agent-b")
    pools.want(a)
    pools.want(b)
    until(lambda: pools.counts() == {name(a): 2, name(b): 2})
    pools.settle()
    assert len(engine.of(a)) == 2 and len(engine.of(b)) == 2


# -- claiming ---------------------------------------------------------------------------------------------


def test_a_claim_prefers_a_ready_member_then_a_live_one_never_an_exited_one() -> None:
    engine = Engine(permits=3)
    engine.shapes = {0: {"ready": False}, 1: {"ready": True}, 2: {"ready": False}}
    pools = ObservedPools(engine.launch, PoolSettings(size=3), destroy=engine.destroy)
    try:
        s = spec()
        pools.want(s)
        until(lambda: pools.counts() == {name(s): 3})
        first, second, third = engine.launched
        assert pools.ready_counts() == {name(s): 1}  # of the three, the one whose wrapper waits for a task
        assert pools.claim(s.pool_key) is second  # the ready one, though launched after a live one
        engine.wait(lambda: engine.started == 4)  # the refill has begun and waits: the filler is frozen
        first.exited = True
        assert pools.claim(s.pool_key) is third  # none ready: the live one, not the exited first one
        assert pools.claim(s.pool_key) is None  # only the exited one is left, and it is not handed out
        assert pools.claim(spec("other").pool_key) is None  # no such pool
        assert first.destroyed == 0
        engine.unblock()
        until(lambda: first.destroyed == 1)  # the filler removes the exited member
        until(lambda: pools.counts() == {name(s): 3})
        pools.settle()
        later = {pools.claim(s.pool_key) for _ in range(3)}
        assert None not in later and not later & {second, third}  # a claimed member is never handed out again
    finally:
        engine.unblock()
        pools.close()
    assert second.destroyed == 0 and third.destroyed == 0


def test_a_claim_takes_a_member_for_good_and_the_pool_refills(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    pools = make_pools(PoolSettings(size=2))
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 2})
    seen: list[Any] = []
    for round_ in range(1, 4):
        box = pools.claim(s.pool_key)
        assert box is not None and box not in seen and box.destroyed == 0
        seen.append(box)
        until(lambda: pools.counts() == {name(s): 2})
        pools.settle()
        assert len(engine.launched) == 2 + round_  # exactly one refill per claim
    pools.close()
    assert all(b.destroyed == 1 for b in engine.launched if b not in seen)
    assert all(b.destroyed == 0 for b in seen)


def test_a_refill_waits_for_the_claimed_run_to_settle(
    engine: Engine, make_pools: Callable[..., ObservedPools], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch keeps the host's cores busy: the refill starts once the claimed run has its result."""
    monkeypatch.setattr(host.runtime.pool, "REFILL_DEFER_SECONDS", 60.0)  # only settled() can end the wait
    pools = make_pools(PoolSettings(size=1))
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 1})
    box = pools.claim(s.pool_key)
    assert box is not None
    for _ in range(5):  # wake-ups of the filler do not end the deferral
        pools.poke()
        time.sleep(0.02)
    assert engine.started == 1
    pools.settled("some-other-run")  # unknown ids change nothing
    pools.poke()
    time.sleep(0.02)
    assert engine.started == 1
    pools.settled(box.run_id)
    engine.wait(lambda: len(engine.launched) == 2)
    until(lambda: pools.counts() == {name(s): 1})


def test_a_run_that_never_settles_delays_its_refill_only_boundedly(
    engine: Engine, make_pools: Callable[..., ObservedPools], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host.runtime.pool, "REFILL_DEFER_SECONDS", 0.05)
    pools = make_pools(PoolSettings(size=2))
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 2})
    for _ in range(3):  # claims that keep coming, none settled: the pool still refills
        assert pools.claim(s.pool_key) is not None
        until(lambda: pools.counts() == {name(s): 2})
    assert len(engine.launched) == 5


def test_close_ends_a_deferred_refill_without_launching(
    engine: Engine, make_pools: Callable[..., ObservedPools], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host.runtime.pool, "REFILL_DEFER_SECONDS", 60.0)
    pools = make_pools(PoolSettings(size=1))
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 1})
    assert pools.claim(s.pool_key) is not None
    t = time.monotonic()
    pools.close()
    assert time.monotonic() - t < WAIT and engine.started == 1


def test_members_that_exited_or_outlived_the_idle_ttl_are_destroyed_and_replaced(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    engine.shapes = {0: {"age": 301.0}, 1: {}}
    pools = make_pools(PoolSettings(size=2, idle_ttl_seconds=300))
    s = spec()
    pools.want(s)
    engine.wait(lambda: len(engine.launched) >= 1)
    stale = engine.launched[0]
    until(lambda: stale.destroyed == 1)
    until(lambda: pools.counts() == {name(s): 2})
    pools.settle()
    assert len(engine.launched) == 3 and engine.destroyed == [stale]
    crashed = engine.launched[1]
    crashed.exited = True
    until(lambda: crashed.destroyed == 1)
    until(lambda: pools.counts() == {name(s): 2})
    pools.settle()
    assert len(engine.launched) == 4 and engine.destroyed == [stale, crashed]
    assert {pools.claim(s.pool_key), pools.claim(s.pool_key)} == set(engine.launched[2:])


# -- memory budget ----------------------------------------------------------------------------------------


def test_max_members_is_the_budget_over_the_member_memory() -> None:
    settings = PoolSettings(memory_budget_bytes=4 * GIB)
    assert settings.max_members(GIB) == 4
    assert settings.max_members(3 * GIB) == 1
    assert settings.max_members(5 * GIB) == 0
    assert settings.max_members(0) == 4 * GIB  # no division by zero
    assert PoolSettings(memory_budget_bytes=0).max_members(GIB) == 0


def test_all_pools_together_stay_within_the_memory_budget(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    pools = make_pools(PoolSettings(size=3, memory_budget_bytes=2 * GIB))
    a, b = spec("agent-a", memory=GIB), spec("agent-b", memory=GIB)
    pools.want(a)
    pools.want(b)
    until(lambda: pools.total() == 2)
    pools.settle()
    assert pools.total() == 2 and len(engine.launched) == 2
    claimed = pools.claim(a.pool_key) or pools.claim(b.pool_key)
    assert claimed is not None
    until(lambda: len(engine.launched) == 3)  # room again: one more, not more
    pools.settle()
    assert pools.total() == 2 and len(engine.launched) == 3


def test_a_member_larger_than_the_budget_is_never_launched(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    pools = make_pools(PoolSettings(size=2, memory_budget_bytes=GIB))
    pools.want(spec(memory=2 * GIB))
    pools.settle()
    pools.settle()
    assert engine.started == 0 and pools.total() == 0


# -- launch failures --------------------------------------------------------------------------------------


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The filler's back-off sleeps, recorded instead of slept (the pool module's clock otherwise)."""
    asked: list[float] = []
    fake = types.SimpleNamespace(monotonic=time.monotonic, sleep=asked.append)
    monkeypatch.setattr(host.runtime.pool, "time", fake)
    return asked


def test_launch_failures_are_counted_back_off_and_reset_after_a_success(
    engine: Engine, make_pools: Callable[..., ObservedPools], sleeps: list[float]
) -> None:
    engine.failures = [SandboxError("engine down"), SandboxError("still down"), RuntimeError("odd")]
    pools = make_pools(PoolSettings(size=2))
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 2})
    pools.settle()
    assert pools.launch_failures == 3 and engine.started == 5
    assert sleeps == [0.5, 1.0, 2.0]  # doubling after each failure; none after the successes
    engine.failures = [OSError("again")]
    assert pools.claim(s.pool_key) is not None
    until(lambda: pools.counts() == {name(s): 2})
    pools.settle()
    assert pools.launch_failures == 4 and sleeps == [0.5, 1.0, 2.0, 0.5]  # started over from 0.5


def test_the_back_off_is_capped_at_30_seconds(
    engine: Engine, make_pools: Callable[..., ObservedPools], sleeps: list[float]
) -> None:
    engine.failures = [SandboxError(f"down {i}") for i in range(9)]
    pools = make_pools(PoolSettings(size=1))
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 1})
    assert pools.launch_failures == 9
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


# -- retiring pools of pack versions no longer installed -------------------------------------------------


class Installed:
    """The lockfile as `is_current` sees it; counts the checks per slug."""

    def __init__(self, **versions: str) -> None:
        self.versions = versions
        self.checks: dict[str, int] = {}
        self.cond = threading.Condition()

    def is_current(self, s: SandboxSpec) -> bool:
        with self.cond:
            self.checks[s.slug] = self.checks.get(s.slug, 0) + 1
            self.cond.notify_all()
            return self.versions.get(s.slug) == s.artifact_hash

    def more_checks(self, pools: ObservedPools, slug: str, n: int = 3) -> None:
        """Wait for `n` more checks of `slug` (each in a separate pass of the filler)."""
        with self.cond:
            start = self.checks.get(slug, 0)
        poking(pools, lambda: self.checks.get(slug, 0) >= start + n)


def test_a_pool_whose_pack_version_is_gone_is_retired_once(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    installed = Installed(agent="a" * 64, keeper="a" * 64)
    retired: list[SandboxSpec] = []
    called = threading.Event()

    def on_retired(s: SandboxSpec) -> None:
        retired.append(s)
        called.set()

    pools = make_pools(PoolSettings(size=2), is_current=installed.is_current, retired=on_retired)
    old, keeper = spec("agent"), spec("keeper")
    pools.want(old)
    pools.want(keeper)
    until(lambda: pools.counts() == {name(old): 2, name(keeper): 2})
    installed.versions["agent"] = "b" * 64  # reinstalled: a new artifact
    poking(pools, called.is_set)
    assert retired == [old] and pools.retired_pools == 1
    assert [b.destroyed for b in engine.of(old)] == [1, 1]
    assert pools.claim(old.pool_key) is None
    installed.more_checks(pools, "keeper")  # later passes check the other pool ...
    pools.settle()
    assert retired == [old] and pools.retired_pools == 1  # ... and never retire this one again
    assert len(engine.of(old)) == 2 and installed.checks["agent"] >= 1  # nor refill it
    assert pools.counts() == {name(keeper): 2} and not any(b.destroyed for b in engine.of(keeper))
    new = spec("agent", artifact="b" * 64)
    pools.want(new)
    until(lambda: len(engine.of(new)) == 2)
    installed.more_checks(pools, "agent")
    assert retired == [old]


def test_a_failing_check_keeps_the_pool(engine: Engine, make_pools: Callable[..., ObservedPools]) -> None:
    checks: list[SandboxSpec] = []

    def broken(s: SandboxSpec) -> bool:
        checks.append(s)
        raise OSError("lockfile unreadable")

    retired: list[SandboxSpec] = []
    pools = make_pools(PoolSettings(size=2), is_current=broken, retired=retired.append)
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 2})
    seen = len(checks)
    poking(pools, lambda: len(checks) >= seen + 3)
    pools.settle()
    assert retired == [] and pools.retired_pools == 0 and engine.destroyed == []
    assert pools.claim(s.pool_key) is not None


def test_a_failing_retired_callback_still_retires_the_pool(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    installed = Installed(agent="a" * 64)
    calls: list[SandboxSpec] = []

    def on_retired(s: SandboxSpec) -> None:
        calls.append(s)
        raise OSError("volume busy")

    pools = make_pools(PoolSettings(size=1), is_current=installed.is_current, retired=on_retired)
    s = spec()
    pools.want(s)
    until(lambda: pools.counts() == {name(s): 1})
    installed.versions.clear()  # uninstalled
    poking(pools, lambda: pools.retired_pools == 1)
    pools.settle()
    assert calls == [s] and pools.counts() == {} and [b.destroyed for b in engine.launched] == [1]


# -- closing ----------------------------------------------------------------------------------------------


def test_close_destroys_every_member_and_stops_the_filler(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    pools = make_pools(PoolSettings(size=2))
    a, b = spec("agent-a"), spec("agent-b")
    pools.want(a)
    pools.want(b)
    until(lambda: pools.total() == 4)
    claimed = pools.claim(a.pool_key)
    until(lambda: pools.total() == 4)
    engine.destroy_error = (engine.of(b)[0], OSError("engine hiccup"))  # one destroy fails; the rest still go
    pools.close()
    assert not pools._filler.is_alive()
    assert all(box.destroyed == 1 for box in engine.launched if box is not claimed)
    assert claimed is not None and claimed.destroyed == 0  # a claimed member is its run's to destroy
    started = engine.started
    pools.want(a)  # a closed pool takes no more wishes
    assert pools.claim(a.pool_key) is None and pools.counts() == {} and pools.total() == 0
    assert engine.started == started


def test_close_offers_every_pool_to_retired_once_its_members_are_gone(
    engine: Engine, make_pools: Callable[..., ObservedPools]
) -> None:
    """A pack uninstalled while its members ran kept its volume (in use): closing is its last chance."""
    offered: list[tuple[SandboxSpec, list[int]]] = []

    def on_retired(s: SandboxSpec) -> None:
        offered.append((s, [b.destroyed for b in engine.of(s)]))
        raise OSError("volume busy")  # one failing offer does not stop the others

    pools = make_pools(PoolSettings(size=1), retired=on_retired)
    a, b = spec("agent-a"), spec("agent-b")
    pools.want(a)
    pools.want(b)
    until(lambda: pools.total() == 2)
    pools.close()
    assert sorted((s.slug, d) for s, d in offered) == [("agent-a", [1]), ("agent-b", [1])]
    assert pools.retired_pools == 0  # nothing was found stale: the count stays the filler's


def test_a_member_launched_while_closing_is_destroyed() -> None:
    engine = Engine(permits=1)
    pools = ObservedPools(engine.launch, PoolSettings(size=2), destroy=engine.destroy)
    s = spec()
    pools.want(s)
    engine.wait(lambda: engine.started == 2)  # the first is in the pool, the second launch is waiting
    until(lambda: pools.counts() == {name(s): 1})
    closer = threading.Thread(target=pools.close)
    closer.start()
    try:
        until(lambda: pools.counts() == {})  # close() has begun: the pool is closed and emptied
        assert closer.is_alive()  # it waits for the launch in progress
        engine.permit()
        closer.join(WAIT)
        assert not closer.is_alive()
    finally:
        engine.unblock()
        closer.join(WAIT)
    assert len(engine.launched) == 2 and [b.destroyed for b in engine.launched] == [1, 1]
    assert not pools._filler.is_alive() and engine.started == 2
