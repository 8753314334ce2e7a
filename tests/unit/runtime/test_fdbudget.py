"""The descriptor budget: runs are admitted only while the host's reserve stays free."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from host.core.errors import AuditReason, SandboxError
from host.runtime.fdbudget import (
    COUNT_MARGIN_FDS,
    COUNT_MAX_AGE_SECONDS,
    FdBudget,
    open_fds,
    raise_nofile_limit,
)

REPO = Path(__file__).resolve().parents[3]


def test_runs_are_admitted_until_the_reserve_would_be_touched() -> None:
    budget = FdBudget(per_run=10, reserve=50, limit=200, count=lambda: 100)
    assert budget.capacity == 15
    with budget.hold():  # 100 + 10 <= 150
        assert budget._held == 1
        with budget.hold(), budget.hold(), budget.hold(), budget.hold():  # 100 + 4 * 10 + 10 = 150
            with pytest.raises(SandboxError) as err, budget.hold():
                pass
    assert err.value.reason is AuditReason.HOST_AT_CAPACITY
    assert "ulimit -n" in err.value.hint and "reserve" in err.value.message
    assert budget._held == 0 and budget.refused == 1
    with budget.hold():  # shares came back
        pass


def test_descriptors_opened_elsewhere_count_too() -> None:
    in_use = {"n": 10}
    budget = FdBudget(per_run=10, reserve=20, limit=100, count=lambda: in_use["n"])
    budget.check()
    in_use["n"] = 75  # a leak or a busy host: the open count is over the worst case of held runs
    with pytest.raises(SandboxError):
        budget.check()


def test_far_from_the_limit_a_recent_count_is_used_and_an_old_one_taken_again() -> None:
    counted = {"calls": 0, "n": 100}
    now = {"t": 0.0}

    def count() -> int:
        counted["calls"] += 1
        return counted["n"]

    budget = FdBudget(per_run=10, reserve=256, limit=65536, count=count, clock=lambda: now["t"])
    assert counted["calls"] == 1  # the baseline
    for _ in range(5):
        budget.check()
    assert counted["calls"] == 1  # far from the limit, the count of a moment ago stands
    now["t"] = COUNT_MAX_AGE_SECONDS + 0.1
    budget.check()
    assert counted["calls"] == 2  # too old: counted again on admission
    now["t"] += 2.0
    budget.refresh()  # after a result: older than a second, so counted there instead
    assert counted["calls"] == 3
    budget.refresh()
    assert counted["calls"] == 3  # fresh: not again
    counted["n"] = 65536 - 256 - 5  # a leak the next count shows is refused at once
    now["t"] += COUNT_MAX_AGE_SECONDS + 0.1
    with pytest.raises(SandboxError):
        budget.check()


def test_near_the_limit_every_admission_counts() -> None:
    counted = {"calls": 0, "n": 10}

    def count() -> int:
        counted["calls"] += 1
        return counted["n"]

    limit = 256 + 10 + COUNT_MARGIN_FDS + 50  # within the margin once ~50 descriptors are open
    budget = FdBudget(per_run=10, reserve=256, limit=limit, count=count, clock=lambda: 0.0)
    budget.check()
    assert counted["calls"] == 1  # 10 open: far enough, the baseline count stands
    counted["n"] = 60
    budget.refresh()  # (not stale: no count)
    assert counted["calls"] == 1
    with budget.hold(), budget.hold(), budget.hold(), budget.hold(), budget.hold():  # projected 60
        budget.check()
        assert counted["calls"] > 1  # near: counted on each admission
        counted["n"] = limit
        with pytest.raises(SandboxError):
            budget.check()


def test_concurrent_admissions_never_overshoot() -> None:
    budget = FdBudget(per_run=10, reserve=0, limit=100, count=lambda: 0)
    admitted: list[int] = []
    gate = threading.Barrier(30)
    release = threading.Event()

    def one() -> None:
        gate.wait()
        try:
            with budget.hold():
                admitted.append(1)
                release.wait(5)
        except SandboxError:
            pass

    threads = [threading.Thread(target=one) for _ in range(30)]
    for t in threads:
        t.start()
    while budget._held + budget.refused < 30:
        threading.Event().wait(0.01)
    assert budget._held == 10 and budget.refused == 20
    release.set()
    for t in threads:
        t.join()
    assert len(admitted) == 10 and budget._held == 0


def test_the_soft_limit_is_raised_towards_the_hard_limit() -> None:
    code = (
        f"import resource, sys; sys.path.insert(0, {str(REPO)!r});"
        "from host.runtime.fdbudget import raise_nofile_limit;"
        "print(raise_nofile_limit(4096), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=30,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048)),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2048", "2048"]  # capped by the hard limit
    soft = raise_nofile_limit(16)  # never lowers
    assert soft >= 16 and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft


def test_open_fds_counts_this_process() -> None:
    before = open_fds()
    with open(__file__) as fh:
        assert open_fds() == before + 1
        fh.read(1)
