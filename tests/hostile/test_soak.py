"""Soak: 500 sequential runs (alternating runc and runsc on one host) and 64 concurrent runs per runtime.

Nothing may accumulate: no containers, volumes (other than the pack volume), run directories, host threads
or file descriptors, and the audit log holds exactly one record per run. Runs do not get slower as they
pile up, and the concurrent runs really overlap.

The leftover probes (containers of the soak agent, run directories under the lab's root) are sampled while
the runs are live too: each must have seen what it later finds gone, else "none left" would prove nothing.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import docker
import pytest
import requests

from host.core.owner import owner_token
from host.engine.labels import LABEL_OWNER, LABEL_SLUG
from host.engine.sdk import connect
from host.runtime.runner import RunResult, SandboxHost
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
SEQUENTIAL_MEAN_MAX_S = 5.0
"""Mean seconds per sequential run allowed (measured 0.6 s alternating runc and runsc): a loose ceiling."""
SLOWDOWN = 3.0
"""How much slower the median of the last 100 sequential runs may be than that of the first 100 (+0.5 s):
a host that accumulates state (leaked sessions, a growing audit scan) gets slower run by run."""
OVERLAP_MIN = 8
"""Runs that must have been in progress at once among the 64 concurrent ones (from their audit records)."""
CONCURRENT_MAX_S = 180.0
"""Wall time the 64 concurrent runs may take (measured 15-25 s): a loose ceiling."""


ENGINE_CONNECTIONS_MAX = 32
"""Connections to the engine's socket the engine clients' keep-alive pools may hold (the host's one pool
keeps up to host.engine.engine.ENGINE_SHARED_POOL_SIZE idle, the test's own client a few more). They are
counted apart from the host's own descriptors and held to this bound: a leak of them would pass it within a
few dozen runs."""


def _engine_sockets() -> set[str]:
    """The engine socket paths a connection of this process may have as its peer."""
    host = os.environ.get("DOCKER_HOST", "")
    named = {host.removeprefix("unix://")} if host.startswith("unix://") else set()
    return {"/var/run/docker.sock", "/run/docker.sock"} | named


def _to_engine(fd: str, engines: set[str]) -> bool:
    """Is descriptor `fd` a connection to the engine? (its peer, read through a duplicate)"""
    try:
        dup = os.dup(int(fd))
    except (OSError, ValueError):  # gone meanwhile
        return False
    try:
        sock = socket.socket(fileno=dup)
    except OSError:  # not a socket: the duplicate is still ours to close
        os.close(dup)
        return False
    with sock:
        try:
            return sock.family == socket.AF_UNIX and sock.getpeername() in engines
        except OSError:
            return False


def _gauges() -> dict[str, int]:
    """Threads, descriptors other than engine connections, and engine connections (bounded apart)."""
    engines = _engine_sockets()
    fds = os.listdir("/proc/self/fd")
    engine = sum(_to_engine(fd, engines) for fd in fds)
    return {"threads": threading.active_count(), "fds": len(fds) - engine, "engine_connections": engine}


QUIET_S = 1.0
"""How long threads and fds must hold still for a gauge to count as settled: a run's daemon threads (exit
watcher, log drain) end shortly after its result, so a reading taken at once still counts some of them."""


def _quiet(baseline: dict[str, int] | None = None, timeout: float = 20.0) -> dict[str, int]:
    """Gauges once threads and fds have not changed for QUIET_S and, given a `baseline`, are no more than
    SLACK above it (the runs' daemon threads and teardowns end); after `timeout`, as they are then.

    The baseline is taken this way too: one taken while the warm-up runs' threads were still ending was
    higher than the host's steady count (CI saw threads -4 after the soak), which would also hide a leak of
    as many threads.
    """
    deadline = time.monotonic() + timeout
    now = _gauges()
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        later = _gauges()
        if (later["threads"], later["fds"]) != (now["threads"], now["fds"]):
            still_since = time.monotonic()
        now = later
        above = baseline is not None and any(now[k] > baseline[k] + SLACK for k in ("threads", "fds"))
        if time.monotonic() - still_since >= QUIET_S and not above:
            break
    return now


def _volumes(client: docker.DockerClient) -> set[str]:
    return {v.name for v in client.volumes.list()}


@contextmanager
def _watching(lab: Lab) -> Iterator[dict[str, int]]:
    """Peaks of the leftover probes while runs are live: the positive control for "no leftovers".

    The same label query as `Lab.containers` but only its listing (one request; inspecting each container
    as well raced 64 concurrent removals), on a client of its own (closed afterwards), so the sampling adds
    no pooled connection to the host's descriptor count. A sample the loaded engine fails to answer is
    counted (`sample_errors`, reported) and skipped: the probe only has to see one of each while live.
    """
    peaks = {"containers": 0, "run_dirs": 0, "samples": 0, "sample_errors": 0}
    stop = threading.Event()
    client = connect()
    labels = [f"{LABEL_SLUG}=soak", f"{LABEL_OWNER}={owner_token()}"]

    def sample() -> None:
        while not stop.is_set():
            try:
                listed = client.api.containers(all=True, filters={"label": labels})
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                peaks["sample_errors"] += 1
            else:
                peaks["containers"] = max(peaks["containers"], len(listed))
            peaks["run_dirs"] = max(peaks["run_dirs"], len(lab.live_run_dirs()))
            peaks["samples"] += 1
            stop.wait(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        yield peaks
    finally:
        stop.set()
        watcher.join()
        client.close()


def _ts(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(record["ts"]).replace("Z", "+00:00")).timestamp()


def _peak_overlap(lab: Lab, run_ids: set[str]) -> int:
    """Most of these runs in progress at once, from their start and end audit records."""
    events: list[tuple[float, int]] = []
    for rec in lab.state.audit_all():
        if rec.get("run_id") in run_ids:
            events.append((_ts(rec), 1 if rec.get("event") == "agent_run_start" else -1))
    live = peak = 0
    for _, step in sorted(events):  # an end sorts before a start at the same millisecond
        live += step
        peak = max(peak, live)
    return peak


def _record(
    ledger: Ledger,
    lab: Lab,
    results: list[RunResult],
    *,
    baseline: dict[str, int],
    volumes: set[str],
    label: str,
    seen: dict[str, int],
) -> None:
    """Record (and so assert) the soak properties after `results`; `seen`: the probes' peaks while live."""
    after = _quiet(baseline)
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
        len(containers) + len(new_volumes) + len(run_dirs) + max(0, threads - SLACK) + max(0, fds - SLACK)
        + max(0, after["engine_connections"] - ENGINE_CONNECTIONS_MAX),
    )
    ledger.soak(
        f"soak.{label}.no_leftovers",
        expected=f"0 containers, volumes, run dirs; threads and fds back to baseline ±{SLACK}, engine "
        f"connections (the client's keep-alive pool, counted apart) at most {ENGINE_CONNECTIONS_MAX} (the "
        "container and run-dir probes saw at least one of each while runs were live)",
        observed=brief(
            {
                "containers": len(containers),
                "volumes": new_volumes,
                "run_dirs": run_dirs,
                "threads": threads,
                "fds": fds,
                "engine_connections": after["engine_connections"],
                "seen_while_live": seen,
            }
        ),
        ok=not containers
        and not new_volumes
        and not run_dirs
        and abs(threads) <= SLACK
        and abs(fds) <= SLACK
        and after["engine_connections"] <= ENGINE_CONNECTIONS_MAX
        and seen["containers"] >= 1
        and seen["run_dirs"] >= 1,
    )


def test_soak_sequential(
    make_lab: Callable[[str], Lab], ledger: Ledger, runtime_pair: tuple[str, ...]
) -> None:
    lab = make_lab(runtime_pair[0])
    ledger.runtime = "+".join(runtime_pair)
    lab.agent("soak", TRIVIAL)
    host: SandboxHost = lab.host()
    results = [host.run("soak", runtime=rt) for rt in runtime_pair]  # warm-up: lazy clients, pools
    baseline, volumes = _quiet(), _volumes(lab.client)
    started = time.monotonic()
    with _watching(lab) as seen:
        for i in range(SEQUENTIAL):
            results.append(host.run("soak", runtime=runtime_pair[i % len(runtime_pair)], kwargs={"n": i}))
    elapsed = time.monotonic() - started
    wrong = [
        r.result
        for r, i in zip(results[len(runtime_pair) :], range(SEQUENTIAL), strict=True)
        if r.success and r.result != i
    ]
    assert not wrong, wrong[:5]
    _record(ledger, lab, results, baseline=baseline, volumes=volumes, label="sequential_500", seen=seen)
    durations = [r.duration_ms / 1000 for r in results[len(runtime_pair) :]]
    first, last = statistics.median(durations[:100]), statistics.median(durations[-100:])
    mean = elapsed / SEQUENTIAL
    ledger.soak(
        "soak.sequential_500.pace",
        expected=f"mean <= {SEQUENTIAL_MEAN_MAX_S:g} s per run, and the last 100 runs' median <= "
        f"{SLOWDOWN:g} x the first 100's + 0.5 s (no slowdown as runs accumulate)",
        observed=brief(
            {
                "mean_s": round(mean, 2),
                "minutes": round(elapsed / 60, 1),
                "median_first_100_s": round(first, 3),
                "median_last_100_s": round(last, 3),
            }
        ),
        ok=mean <= SEQUENTIAL_MEAN_MAX_S and last <= SLOWDOWN * first + 0.5,
    )


def test_soak_concurrent(lab: Lab, ledger: Ledger) -> None:
    lab.agent("soak", TRIVIAL)
    host = lab.host()
    with ThreadPoolExecutor(max_workers=POOL_WARMUP) as pool:
        results = list(pool.map(lambda _: lab.run("soak", host=host), range(POOL_WARMUP)))
    baseline, volumes = _quiet(), _volumes(lab.client)
    started = time.monotonic()
    with _watching(lab) as seen, ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        measured = list(pool.map(lambda i: lab.run("soak", host=host, kwargs={"n": i}), range(CONCURRENT)))
    elapsed = time.monotonic() - started
    results += measured
    _record(ledger, lab, results, baseline=baseline, volumes=volumes, label="concurrent_64", seen=seen)
    overlap = _peak_overlap(lab, {r.run_id for r in measured})
    ledger.soak(
        "soak.concurrent_64.ran_concurrently",
        expected=f">= {OVERLAP_MIN} of the 64 runs in progress at once (audit start/end records), all 64 "
        f"within {CONCURRENT_MAX_S:g} s",
        observed=brief({"peak_in_progress": overlap, "wall_s": round(elapsed, 1)}),
        ok=overlap >= OVERLAP_MIN and elapsed <= CONCURRENT_MAX_S,
    )
