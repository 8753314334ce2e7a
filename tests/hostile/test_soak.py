"""Soak: 500 sequential runs (alternating runc and runsc on one host) and 64 concurrent runs per runtime.

Nothing may accumulate: no containers, volumes (other than the pack volume), run directories, host threads
or file descriptors, and the audit log holds exactly one record per run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest

from host._runner import RunResult, SandboxHost
from tests.hostile.conftest import Lab, Ledger, brief

pytestmark = [pytest.mark.docker, pytest.mark.soak]

SEQUENTIAL = 500
CONCURRENT = 64
POOL_WARMUP = 12
"""Concurrent warm-up runs: enough to fill the engine client's HTTP connection pool (10 keep-alive sockets
by default), which then stays at that size; what the soak measures is growth beyond it."""
TRIVIAL = "def run(context, n=0, **kwargs):\n    return n\n"
SLACK = 3
"""Threads or fds a long-lived host may legitimately add after warm-up (gRPC and engine-client internals)."""


def _gauges() -> dict[str, int]:
    return {"threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd"))}


def _settled(baseline: dict[str, int], timeout: float = 20.0) -> dict[str, int]:
    """Gauges once the run's daemon threads (exit watcher, log drain) have finished, or after `timeout`."""
    deadline = time.monotonic() + timeout
    now = _gauges()
    while time.monotonic() < deadline and any(now[k] > baseline[k] + SLACK for k in now):
        time.sleep(0.2)
        now = _gauges()
    return now


def _volumes(client: docker.DockerClient) -> set[str]:
    return {v.name for v in client.volumes.list()}


def _record(
    ledger: Ledger,
    lab: Lab,
    results: list[RunResult],
    *,
    baseline: dict[str, int],
    volumes: set[str],
    label: str,
) -> None:
    """Record (and so assert) the soak properties after `results`."""
    after = _settled(baseline)
    # The run's captured output (capped) names what the wrapper saw, e.g. why FetchTask failed.
    failed = [(r.error_code, r.error, r.logs[-300:]) for r in results if not r.success]
    ledger.soak(
        f"soak.{label}.all_runs_succeeded",
        expected=f"{len(results)} of {len(results)} runs succeed",
        observed=brief({"succeeded": len(results) - len(failed), "first_failures": failed[:3]}),
        ok=not failed,
    )
    audit_ids = [r["run_id"] for r in lab.audit()]
    run_ids = [r.run_id for r in results]
    ledger.soak(
        f"soak.{label}.one_audit_record_per_run",
        expected="exactly one audit record per run",
        observed=brief({"runs": len(run_ids), "records": len(audit_ids), "distinct": len(set(audit_ids))}),
        ok=sorted(audit_ids) == sorted(run_ids) and len(set(run_ids)) == len(run_ids),
    )
    containers = lab.containers("soak")
    new_volumes = sorted(v for v in _volumes(lab.client) - volumes if not v.startswith("agentnode-pack-"))
    threads, fds = after["threads"] - baseline["threads"], after["fds"] - baseline["fds"]
    run_dirs = lab.run_dirs()
    ledger.count(
        "leftovers",
        len(containers) + len(new_volumes) + len(run_dirs) + max(0, threads - SLACK) + max(0, fds - SLACK),
    )
    ledger.soak(
        f"soak.{label}.no_leftovers",
        expected=f"0 containers, volumes, run dirs; threads and fds back to baseline ±{SLACK}",
        observed=brief(
            {
                "containers": len(containers),
                "volumes": new_volumes,
                "run_dirs": run_dirs,
                "threads": threads,
                "fds": fds,
            }
        ),
        ok=not containers
        and not new_volumes
        and not run_dirs
        and abs(threads) <= SLACK
        and abs(fds) <= SLACK,
    )


def test_soak_sequential(
    make_lab: Callable[[str], Lab], ledger: Ledger, runtime_pair: tuple[str, ...]
) -> None:
    lab = make_lab(runtime_pair[0])
    ledger.runtime = "+".join(runtime_pair)
    lab.agent("soak", TRIVIAL)
    host: SandboxHost = lab.host()
    results = [host.run("soak", runtime=rt) for rt in runtime_pair]  # warm-up: lazy clients, pools
    baseline, volumes = _gauges(), _volumes(lab.client)
    started = time.monotonic()
    for i in range(SEQUENTIAL):
        results.append(host.run("soak", runtime=runtime_pair[i % len(runtime_pair)], kwargs={"n": i}))
    elapsed = time.monotonic() - started
    wrong = [
        r.result
        for r, i in zip(results[len(runtime_pair) :], range(SEQUENTIAL), strict=True)
        if r.success and r.result != i
    ]
    assert not wrong, wrong[:5]
    _record(ledger, lab, results, baseline=baseline, volumes=volumes, label="sequential_500")
    ledger.soak(
        "soak.sequential_500.pace",
        expected="informational: mean seconds per run",
        observed=f"{elapsed / SEQUENTIAL:.2f} s/run over {SEQUENTIAL} runs ({elapsed / 60:.1f} min)",
        ok=True,
    )


def test_soak_concurrent(lab: Lab, ledger: Ledger) -> None:
    lab.agent("soak", TRIVIAL)
    host = lab.host()
    with ThreadPoolExecutor(max_workers=POOL_WARMUP) as pool:
        results = list(pool.map(lambda _: lab.run("soak", host=host), range(POOL_WARMUP)))
    baseline, volumes = _gauges(), _volumes(lab.client)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        results += list(pool.map(lambda i: lab.run("soak", host=host, kwargs={"n": i}), range(CONCURRENT)))
    elapsed = time.monotonic() - started
    _record(ledger, lab, results, baseline=baseline, volumes=volumes, label="concurrent_64")
    ledger.soak(
        "soak.concurrent_64.pace",
        expected="informational: wall time of 64 concurrent runs",
        observed=f"{elapsed:.1f} s",
        ok=True,
    )
