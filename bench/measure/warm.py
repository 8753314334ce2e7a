"""The warm section: runs from a `serve` warm pool, blocking and host.aio clients; the filler probe."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket as socket_module
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from bench._state import BenchState
from bench._stats import med, ratio, summary
from bench.measure.shared import pool_ready, serve_running, since, succeeded, timed
from host.aio import AsyncRunnerClient
from host.api.client import RunnerClient
from host.audit.log import AuditLog
from host.audit.records import run_record
from host.runtime.pool import PoolSettings
from host.runtime.runner import SandboxHost


def _scraped_ready(state: BenchState, port: int) -> int | None:
    """serve's agentnode_warm_pool_ready for the trivial agent's pools; None without that gauge."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "agentnode_warm_pool_ready":
            return _trivial_members(state, {s.labels.get("pool", ""): s.value for s in family.samples})
    return None


def _in_process_ready(host: SandboxHost, state: BenchState) -> Callable[[], int | None]:
    """The in-process twin of _scraped_ready (None for a revision without WarmPools.ready_counts)."""

    def count() -> int | None:
        counts = getattr(host.pools, "ready_counts", None)
        return None if counts is None else _trivial_members(state, counts())

    return count


def _trivial_members(state: BenchState, by_pool: Mapping[str, float]) -> int:
    """The trivial agent's share of counts by pool name (`slug/...`, as WarmPools names its pools)."""
    return int(sum(n for pool, n in by_pool.items() if pool.startswith(f"{state.trivial}/")))


def _audit_append(state: BenchState, n: int) -> dict[str, float]:
    """One audit append alone (flock, chained line, fsync, head file rewrite): every run pays it."""
    log = AuditLog(state.root / f"audit-{uuid.uuid4().hex}" / "audit.jsonl")
    log.path.parent.mkdir()
    record = run_record(
        slug=state.trivial, trust="unverified", run_id=uuid.uuid4().hex, action="allow",
        source="agent_sandbox", reason="agent_completed", sandbox=True, runtime="runc", image=state.image,
        duration_ms=20,
        timed_out=False, llm=None, tool_calls=0, tool_refusals=0,
    )
    return summary([timed(lambda: log.append(record)) for _ in range(n)])


def _filler_probe(state: BenchState, runtime: str, n: int, settle: float) -> dict[str, dict[str, float]]:
    """Warm runs on an in-process host with serve's settings, once with the pool filler refilling while
    each run goes on (what serve does), once with the filler paused: `n` members launched first, then
    the pool's size set to 0 so no launch competes with the runs."""
    out: dict[str, dict[str, float]] = {}
    for mode in ("refilling", "paused"):
        size = 2 if mode == "refilling" else n
        host = SandboxHost(env=state.env, pool=PoolSettings(size=size, idle_ttl_seconds=3600),
                           async_teardown=True)
        used: set[str] = set()
        done: list[float] = []
        try:
            host.prewarm(state.trivial, runtime)
            ready = _in_process_ready(host, state)
            pool_ready(state, used, size, ready=ready)
            time.sleep(1.0)  # every member reaches FetchTask (a revision that cannot tell)
            if mode == "paused" and host.pools is not None:
                host.pools.settings = PoolSettings(size=0, idle_ttl_seconds=3600)
            for _ in range(n):
                if mode == "refilling":
                    pool_ready(state, used, size, ready=ready)
                    time.sleep(settle)
                result = succeeded(host.run(state.trivial, runtime=runtime))
                used.add(result.run_id)
                if result.warm:
                    done.append(result.stages["done"])
        finally:
            host.close()
        out[mode] = summary(done)
    return out


def warm(state: BenchState, runtime: str, *, reps: int, pool_size: int, settle: float,
         filler: int) -> dict[str, Any]:
    """`serve` with a pool; a persistent client submits one run at a time once the pool is full again,
    alternating the blocking client and host.aio's (same socket, same pool), so their request-to-result
    times are interleaved in one run. Then the filler probe, `filler` runs with the filler on and off.

    Before each run, every member is ready (serve's agentnode_warm_pool_ready gauge; for a revision without
    it, running), then `settle` more seconds pass, so the newest member's start-up has calmed down.
    (The speed-up over a cold run is derived from the cold section afterwards: bench.report.warm.derive.)
    """
    state.configure(runtime, pool={"size": pool_size, "idle_ttl_seconds": 3600})
    socket = state.root / "admin.sock"
    with contextlib.closing(socket_module.socket()) as probe:  # a free port for serve's metrics
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server_ms: list[float] = []
    client_ms: list[float] = []
    aio_ms: list[float] = []
    aio_server_ms: list[float] = []
    stages: dict[str, list[float]] = {}
    # The async client lives in a loop that runs all along on its own thread, as in an asyncio service.
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True, name="bench-aio-loop")
    loop_thread.start()

    def in_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=900)

    async def awaited(coro: Any) -> tuple[Any, float]:
        """`coro`'s result and the ms its await took, timed in the loop as the service awaiting it sees it
        (not this thread's hand-off to the loop and back, which no asyncio service pays)."""
        t = time.perf_counter()
        value = await coro
        return value, since(t)

    warm_runs = 0
    used: set[str] = set()
    with contextlib.ExitStack() as serving:
        serving.callback(loop.close)  # (last: callbacks run in reverse, after serve has stopped)
        serving.callback(loop_thread.join, 30)
        serving.callback(loop.call_soon_threadsafe, loop.stop)
        serving.enter_context(serve_running(state, runtime, "--socket", str(socket), "--warm", state.trivial,
                                            "--metrics", f"127.0.0.1:{port}"))
        aclient = AsyncRunnerClient(socket)  # its channel opens in `loop`, on first use
        with RunnerClient(socket) as client:
            for i in range(2 * reps + 2):
                through_aio = i % 2 == 1
                pool_ready(state, used, pool_size, ready=functools.partial(_scraped_ready, state, port))
                time.sleep(settle)
                if through_aio:
                    result, elapsed = in_loop(awaited(aclient.submit(state.trivial, timeout=600)))
                    result = succeeded(result)
                else:
                    t = time.perf_counter()
                    result = succeeded(client.submit(state.trivial, timeout=600))
                    elapsed = since(t)
                used.add(result.run_id)
                if i < 2:
                    continue  # each client's first call also opens its channel
                if through_aio:
                    if result.warm:
                        aio_ms.append(elapsed)
                        aio_server_ms.append(result.stages["done"])
                    continue
                warm_runs += result.warm
                if result.warm:
                    client_ms.append(elapsed)
                    server_ms.append(result.stages["done"])
                    s = result.stages
                    for key, value in (("claim", s["claimed"]), ("handover", s["fetched"] - s["claimed"]),
                                       ("agent", s["agent_done"] - s["fetched"]),
                                       ("finish", s["done"] - s["agent_done"])):
                        stages.setdefault(key, []).append(value)
        in_loop(aclient.close())
    server = summary(server_ms)
    sync_client, aio_client = summary(client_ms), summary(aio_ms)
    # Each client's own share of its runs (client side - server side, run by run): the server's time is the
    # same path for both and its spread (large under runsc) cancels out of the difference of these.
    aio_share = summary([c - s for c, s in zip(aio_ms, aio_server_ms, strict=True)])
    sync_share = summary([c - s for c, s in zip(client_ms, server_ms, strict=True)])
    p50, p95 = med(server), server.get("p95")
    return {
        "pool_size": pool_size,
        "submitted": reps,
        "warm_runs": warm_runs,
        "server_ms": server,
        "client_ms": sync_client,
        "aio_client_ms": aio_client,
        "aio_server_ms": summary(aio_server_ms),
        "aio_over_sync_ms": (None if med(aio_client) is None or med(sync_client) is None
                             else round((med(aio_client) or 0.0) - (med(sync_client) or 0.0), 3)),
        "aio_client_share_ms": aio_share,
        "sync_client_share_ms": sync_share,
        "aio_share_over_sync_ms": (None if med(aio_share) is None or med(sync_share) is None
                                   else round((med(aio_share) or 0.0) - (med(sync_share) or 0.0), 3)),
        "p95_over_p50": ratio(p95, p50),
        "stages_ms": {k: summary(v) for k, v in stages.items()},
        "audit_append_ms": _audit_append(state, max(reps, 5)),
        "filler_probe_ms": _filler_probe(state, runtime, filler, settle),
    }


__all__ = ["warm"]
