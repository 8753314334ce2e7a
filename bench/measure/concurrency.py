"""The concurrency section: N simultaneous runs through one host, each level in a fresh process.

A fresh process, so its memory growth is this level's alone. The parent calls `levels(...)` once per
repetition, which calls `concurrency(...)` once per level; that runs `python -m bench.measure.concurrency`
with the job on stdin and reads one JSON line back. The same process then starts N bare docker runs at
once: docker's own throughput on this machine at that moment, the floor for ours.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker

from bench._drive import quiesce
from bench._roots import CODE_ROOT
from bench._state import BENCH_LABEL, BenchState
from bench._stats import ratio, summary
from host.core.owner import owner_token
from host.engine.labels import LABEL_OWNER
from host.engine.spec import container_spec
from host.runtime.runner import RunResult, SandboxHost

_MB = 1024 * 1024


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cgroup_memory(cid: str) -> int | None:
    """A container's memory as `docker stats` counts it (usage minus inactive file cache); None if the
    cgroup is not found. Under gVisor this includes the sandbox's own memory file."""
    for usage, stat, inactive in (
        (f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes", "memory.stat", "total_inactive_file"),
        (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.current", "memory.stat", "inactive_file"),
        (f"/sys/fs/cgroup/docker/{cid}/memory.current", "memory.stat", "inactive_file"),
    ):
        path = Path(usage)
        try:
            used = int(path.read_text())
            stats = dict(line.split() for line in (path.parent / stat).read_text().splitlines())
        except (OSError, ValueError):
            continue
        return used - int(stats.get(inactive, 0))
    return None


def _shim_rss(ids: set[str]) -> int:
    """Resident memory of the containerd shims serving these containers (each names its container id)."""
    total = 0
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"containerd-shim" not in argv[0] or not ids.intersection(a.decode() for a in argv):
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        total += next((int(ln.split()[1]) * 1024 for ln in status.splitlines() if ln.startswith("VmRSS:")), 0)
    return total


_ENGINE_DAEMONS = frozenset({"dockerd", "containerd"})
_ENGINE_SIDE_EVERY = 1.0
"""Seconds between the sampler's engine-side looks (a container list, a /proc scan): it runs during the
measured batch, on the same two cores, so it must stay cheap."""


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far: the whole machine (busy, from /proc/stat), this process (all its threads),
    and the engine's daemons (dockerd, containerd). Containers, shims and runc come and go: they are what
    the machine used beyond the two others."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    engine = 0
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "comm").read_text().strip() in _ENGINE_DAEMONS:
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                engine += int(stat[11]) + int(stat[12])
        except (OSError, IndexError, ValueError):
            continue
    return {"machine": (sum(fields) - fields[3] - fields[4]) / hz, "process": usage.ru_utime + usage.ru_stime,
            "engine": engine / hz}


def _cpu_per_run(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """CPU ms per run between two `_cpu_seconds`: machine, this process, engine daemons, and the rest."""
    used = {k: (after[k] - before[k]) * 1000 / n for k in before}
    used["rest"] = used["machine"] - used["process"] - used["engine"]
    return {k: round(v, 1) for k, v in used.items()}


class _Sampler:
    """Samples the host's RSS and active-run count; at each new peak of active runs, the engine side too."""

    def __init__(self, host: SandboxHost) -> None:
        self.host = host
        self.max_rss = 0
        self.peak_active = 0
        self.containers_seen = 0
        self.container_mb: float | None = None
        self.shim_mb: float | None = None
        self.cpu_ms = 0.0  # the sampler thread's own CPU: part of this process's in the batch's figures
        self._engine_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-sampler")

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.max_rss = max(self.max_rss, _rss())
            active = len(self.host.active_runs())
            if active and active >= self.peak_active:
                self.peak_active = active
                now = time.monotonic()
                if now - self._engine_at >= _ENGINE_SIDE_EVERY:
                    self._engine_at = now
                    self._engine_side()
        self.cpu_ms = round(time.thread_time() * 1000, 1)

    def _engine_side(self) -> None:
        listed = self.host.client().containers(labels=[f"{LABEL_OWNER}={self.host.owner}"], stopped=False)
        ids = {c["Id"] for c in listed}
        if not ids or len(ids) < self.containers_seen:
            return
        self.containers_seen = len(ids)
        self.shim_mb = round(_shim_rss(ids) / len(ids) / _MB, 2)
        # A sandbox just started may have no memory cgroup yet (gVisor makes it as it boots).
        known = [m for m in (_cgroup_memory(cid) for cid in ids) if m is not None]
        if known:
            self.container_mb = round(sum(known) / len(known) / _MB, 2)


def batch(host: SandboxHost, slug: str, runtime: str, n: int, base_rss: int) -> dict[str, Any]:
    """Submit `n` runs at once; throughput, failures, leftovers and memory per active run at the peak.

    Host memory per run is the peak RSS over `base_rss` (taken once, after a warm-up run) per active run.
    """
    with _Sampler(host) as sampler, ThreadPoolExecutor(max_workers=n) as pool:
        cpu = _cpu_seconds()
        t = time.perf_counter()
        results: list[RunResult] = list(pool.map(lambda _i: host.run(slug, runtime=runtime), range(n)))
        wall = time.perf_counter() - t
        cpu_ms = _cpu_per_run(cpu, _cpu_seconds(), n)
    leftovers = host.client().containers(labels=[f"{LABEL_OWNER}={host.owner}"])
    failed = [r for r in results if not r.success]
    return {
        "wall_s": round(wall, 3),
        "throughput": round(n / wall, 2),
        "failures": len(failed),
        # host-written texts (codes and exception type names), never agent output
        "failure_reasons": sorted({f"{r.error_code}: {r.error}" for r in failed}),
        "leftovers": len(leftovers),
        "peak_active": sampler.peak_active,
        "host_mb_per_run": round((sampler.max_rss - base_rss) / _MB / max(1, sampler.peak_active), 2),
        "host_rss_mb": [round(base_rss / _MB, 1), round(sampler.max_rss / _MB, 1)],
        "container_mb_per_run": sampler.container_mb,
        "shim_mb_per_run": sampler.shim_mb,
        "run_ms": summary([r.duration_ms for r in results]),
        "cpu_ms_per_run": cpu_ms,
        "sampler_cpu_ms": sampler.cpu_ms,
    }


FLOOR_COMMAND = ["/usr/bin/python3", "-c", "import grpc"]


def _hardened_spec(image: str, runtime: str, tag: str, volume: str, *, socket_dir: str,
                   owner: str) -> dict[str, Any]:
    """A run's container spec exactly (host/engine/spec.container_spec: read-only root, no capabilities,
    init, limits, tmpfs mounts, the pack volume and a socket directory), running the floor's command."""
    run_id = uuid.uuid4().hex
    spec = container_spec(image=image, run_id=run_id, name=f"bench-floor-{run_id[:20]}", owner=owner,
                          slug=f"bench-floor-{tag}", runtime=runtime, pack_volume=volume, import_root="/pack",
                          socket_dir=socket_dir)  # fmt: skip
    return {**spec, "command": FLOOR_COMMAND[1:], "labels": {**spec["labels"], BENCH_LABEL: tag}}


FLOOR_REQUEST_TIMEOUT_S = 180
"""One engine request of a floor run (create, start, wait, remove) taking longer is a failed floor run: a
full run once hung 17 minutes in gVisor's `runsc create` under docker's own bare containers."""


def floor_batch(env: dict[str, str], image: str, runtime: str, n: int, tag: str, *,
                hardened_volume: str | None = None) -> dict[str, Any]:
    """`n` bare `docker run --rm python3 -c 'import grpc'` at once through the SDK: docker's throughput.
    With `hardened_volume` (a pack volume), each container is created from a run's own spec instead (see
    `_hardened_spec`): what the engine's work for our hardening costs, without any of our code.

    Its own client, with a connection pool as large as the batch: with the SDK's default (10 per URL),
    n concurrent creates on one URL overflow the pool, and the SDK then races with its own pool eviction
    (AttributeError from urllib3's _put_conn), which is not what this measures.
    """
    client = docker.DockerClient.from_env(environment=env, max_pool_size=2 * n,
                                          timeout=FLOOR_REQUEST_TIMEOUT_S)
    errors: list[str] = []
    socket_dir = tempfile.mkdtemp(prefix="bench-floor-")
    owner = owner_token()  # once, outside the timed batch

    def one(_i: int) -> bool:
        try:
            if hardened_volume is None:
                container = client.containers.create(
                    image, FLOOR_COMMAND[1:], entrypoint=FLOOR_COMMAND[:1], network_mode="none",
                    runtime=runtime, labels={BENCH_LABEL: tag},
                )  # fmt: skip
            else:
                container = client.containers.create(
                    **_hardened_spec(image, runtime, tag, hardened_volume, socket_dir=socket_dir, owner=owner)
                )
            try:
                container.start()
                return int(container.wait(timeout=FLOOR_REQUEST_TIMEOUT_S).get("StatusCode", -1)) == 0
            finally:
                container.remove(force=True)
        except Exception as exc:  # noqa: BLE001 (a failed floor run is counted, not fatal)
            errors.append(type(exc).__name__)
            return False

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            cpu = _cpu_seconds()
            t = time.perf_counter()
            ok = list(pool.map(one, range(n)))
            wall = time.perf_counter() - t
            cpu_ms = _cpu_per_run(cpu, _cpu_seconds(), n)
    finally:
        client.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
    return {"wall_s": round(wall, 3), "throughput": round(n / wall, 2), "failures": ok.count(False),
            "errors": sorted(set(errors)), "cpu_ms_per_run": cpu_ms}


def concurrency(job: dict[str, Any]) -> dict[str, Any]:
    """One repetition of one level in a child process: a batch of N runs, then the docker floor at the
    same N; our throughput over docker's is the figure the target reads.

    `job`: env, slug, runtime, n, image, tag.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "bench.measure.concurrency"], input=json.dumps(job), capture_output=True,
        text=True,
        cwd=CODE_ROOT, timeout=1800, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"concurrency child failed: {proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    hardened = out.get("hardened_floor") or {}
    ours = out["batch"]["throughput"]
    return {**out["batch"], "floor": out["floor"], "hardened_floor": hardened,
            "throughput_over_floor": over_floor(ours, out["floor"]),
            "throughput_over_hardened_floor": over_floor(ours, hardened)}


def levels(state: BenchState, runtime: str, ns: Sequence[int], *, quiet: bool) -> dict[str, Any]:
    """One repetition: every level `ns` in turn. A level that fails is named under "errors" and the other
    levels still run."""
    out: dict[str, Any] = {}
    errors: list[str] = []
    for i, n in enumerate(ns):
        if i:
            quiesce(quiet)  # the previous level's teardowns must not be charged to this one
        job = {"env": state.env, "slug": state.trivial, "runtime": runtime, "n": n, "image": state.image,
               "tag": state.tag, "volume": state.volume}
        try:
            out[str(n)] = concurrency(job)
        except Exception as exc:  # noqa: BLE001 (one failed level must not discard the others)
            errors.append(f"{n} concurrent: {type(exc).__name__}: {str(exc)[:300]}")
    if errors:
        out["errors"] = errors
    return out


def over_floor(throughput: float, floor: dict[str, Any]) -> float | None:
    """Our throughput over a floor batch's; none over a batch with failed runs (timed-out requests made its
    wall time, not docker's pace), so a broken floor is never quoted as our result."""
    return None if floor.get("failures") else ratio(throughput, floor.get("throughput"))


def main() -> None:
    job = json.loads(sys.stdin.read())
    host = SandboxHost(env=job["env"])
    try:
        host.run(job["slug"], runtime=job["runtime"])  # imports, clients and caches belong to the baseline
        gc.collect()
        base = _rss()
        ours = batch(host, job["slug"], job["runtime"], job["n"], base)
        floor = floor_batch(job["env"], job["image"], job["runtime"], job["n"], job["tag"])
        hardened = floor_batch(job["env"], job["image"], job["runtime"], job["n"], job["tag"],
                               hardened_volume=job["volume"]) if job.get("volume") else None  # fmt: skip
    finally:
        host.close()
    sys.stdout.write(json.dumps({"batch": ours, "floor": floor, "hardened_floor": hardened}) + "\n")


if __name__ == "__main__":
    main()
