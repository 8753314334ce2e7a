"""Warm pools without a daemon: filling, single-use claims, retiring pools of uninstalled pack versions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from host._engine import ContainerLimits
from host._pool import PoolSettings, WarmPools
from host._sandbox import SandboxSpec


class FakeBox:
    """Stands in for a launched Sandbox: the pool reads only these attributes."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.exited = False
        self.ready = True
        self.launched_at = time.monotonic()
        self.destroyed = False


def spec(slug: str = "agent", artifact: str = "a" * 64) -> SandboxSpec:
    return SandboxSpec(
        slug=slug, artifact_hash=artifact, runtime="runc", pin="sha256:" + "1" * 64, image_id="sha256:x",
        volume=f"agentnode-pack-{slug}-{artifact[:8]}", import_root="/pack", limits=ContainerLimits(),
    )  # fmt: skip


def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def make_pools(
    current: Callable[[SandboxSpec], bool], retired: list[SandboxSpec]
) -> tuple[WarmPools, list[Any]]:
    launched: list[Any] = []
    lock = threading.Lock()

    def launch(s: SandboxSpec) -> Any:
        box = FakeBox(s)
        with lock:
            launched.append(box)
        return box

    def destroy(box: Any) -> None:
        box.destroyed = True

    pools = WarmPools(
        launch, PoolSettings(size=2), destroy=destroy, is_current=current, retired=retired.append
    )
    return pools, launched


def test_pool_fills_and_a_claim_takes_a_member_for_good() -> None:
    retired: list[SandboxSpec] = []
    pools, launched = make_pools(lambda s: True, retired)
    try:
        s = spec()
        pools.want(s)
        until(lambda: pools.counts() == {"agent/" + "a" * 64 + "/runc": 2})
        box: Any = pools.claim(s.pool_key)
        assert box is not None and box in launched and not box.destroyed
        until(lambda: len(launched) == 3)  # refilled, the claimed one is not handed out again
        second: Any = pools.claim(s.pool_key)
        assert second is not None and second is not box
    finally:
        pools.close()
    # what the pool still held is destroyed with it; claimed members are their runs' to destroy
    assert all(b.destroyed for b in launched if b not in (box, second)) and not box.destroyed
    assert retired == []


def test_an_uninstalled_pack_version_stops_refilling_and_is_retired() -> None:
    installed = {"agent": "a" * 64}
    retired: list[SandboxSpec] = []
    pools, launched = make_pools(lambda s: installed.get(s.slug) == s.artifact_hash, retired)
    try:
        old = spec()
        pools.want(old)
        until(lambda: len(launched) == 2)
        installed["agent"] = "b" * 64  # reinstalled: a new artifact
        until(lambda: retired == [old])
        assert all(b.destroyed for b in launched) and pools.total() == 0
        assert pools.claim(old.pool_key) is None
        time.sleep(2.5 * WarmPools.CURRENT_CHECK_SECONDS)
        assert len(launched) == 2 and pools.retired_pools == 1  # no refill of the removed version
        new = spec(artifact="b" * 64)
        pools.want(new)
        until(lambda: len(launched) == 4)
        assert {b.spec.artifact_hash for b in launched[2:]} == {"b" * 64}
    finally:
        pools.close()


def test_a_failing_check_keeps_the_pool() -> None:
    def broken(s: SandboxSpec) -> bool:
        raise OSError("lockfile unreadable")

    retired: list[SandboxSpec] = []
    pools, launched = make_pools(broken, retired)
    try:
        pools.want(spec())
        until(lambda: len(launched) == 2)
        time.sleep(2.5 * WarmPools.CURRENT_CHECK_SECONDS)
        assert retired == [] and not any(b.destroyed for b in launched)
    finally:
        pools.close()
