"""Machine facts, targets and the Markdown reports: turning repetitions of raw timings into a verdict.

Pure apart from `machine_facts`: the reports are functions of the JSON written beside them.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._plan import CALL_ROUNDS, SECTION_NAMES
from bench._roots import REPO
from bench._stats import (
    UNSTABLE_SPREAD,
    combine,
    figure,
    med,
    ratio,
    rep_value,
    summary,
    unstable_figures,
    walk_figures,
)

SECTIONS = ("Targets", "Load", "Cold start", "Per-call overhead", "Tool sandboxes", "Broker", "Concurrency",
            "Warm")
"""The Markdown sections every report has, in order (smoke mode included)."""

BUSY_LOAD = 1.5
"""A 1-minute load average above this means other work competed with the benchmark."""

WARM_P50_MS = {"runc": 6.0, "runsc": 15.0}
CLI_RATIO = 1.15
"""Issue 19: a process-to-process cold `run` within this factor of the bare `docker run`."""
"""The warm run's server-side p50 goal per runtime (another runtime gets runsc's)."""

THROUGHPUT_LEVELS = ("16", "32", "64")
"""Concurrency levels whose throughput is held against docker's at the same N."""

MAX_UNSTABLE_LISTED = 60


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cmd(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO, check=False)
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_facts(client: Any) -> dict[str, Any]:
    """What the numbers were measured on; absolute times mean little without it."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                if ln.startswith("model name")), platform.processor())
    mem_kb = next((int(ln.split()[1]) for ln in _read("/proc/meminfo").splitlines()
                   if ln.startswith("MemTotal:")), 0)
    info = client.info()
    rev = _cmd("git", "rev-parse", "--short=12", "HEAD")
    if rev and _cmd("git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"):
        rev += "+dirty"
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_revision": rev or "unknown",
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker_server": str(client.version().get("Version", "")),
        "docker_runtimes": sorted((info.get("Runtimes") or {}).keys()),
        "runsc": (_cmd("runsc", "--version").splitlines() or [""])[0],
        "load_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, int):
        return f"{x}{unit}"
    text = f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
    return text + unit


def _pct(spread: float | None) -> str:
    return " ±n/a" if spread is None else f" ±{spread * 100:.0f}%"


def _spread_text(fig: Mapping[str, Any], which: str = "median") -> str:
    """` ±8%` (and ` ⚠` above UNSTABLE_SPREAD) when the figure has two repetitions or more."""
    prefix = "" if which == "median" else "p95_"
    reps = fig.get("rep_medians" if which == "median" else "rep_p95s") or []
    if len(reps) < 2:
        return ""
    text = _pct(fig.get(f"{prefix}spread"))
    return text + (" ⚠" if fig.get(f"{prefix}unstable") else "")


def _f(fig: Any, unit: str = "") -> str:
    """A figure's median (median of the repetitions' medians) with its spread: `13.0 ms ±8%`."""
    if isinstance(fig, int | float) and not isinstance(fig, bool):
        return _fmt(fig, unit)
    if not isinstance(fig, Mapping) or not fig.get("n") or fig.get("median") is None:
        return "n/a"
    return _fmt(fig["median"], unit) + _spread_text(fig)


def _mp(fig: Any) -> str:
    """`median ±spread / p95 ±spread` of a combined summary, in ms."""
    if not isinstance(fig, Mapping) or not fig.get("n") or "p95" not in fig:
        return _f(fig)
    return f"{_fmt(fig['median'])}{_spread_text(fig)} / {_fmt(fig['p95'])}{_spread_text(fig, 'p95')}"


def _get(tree: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(tree, Mapping):
            return None
        tree = tree.get(key)
    return tree


def _m(tree: Any, *keys: str) -> str:
    """The median of the figure at `keys`, formatted, without its spread (for breakdowns)."""
    return _fmt(med(_get(tree, *keys)))


# -- targets ---------------------------------------------------------------------------------------


CPU_PARTS = ("machine", "process", "engine", "rest")
"""The concurrency section's CPU split per run (bench/_concurrency._cpu_per_run)."""


def _warm_floor(w: Mapping[str, Any]) -> str:
    return (f"stages (median ms): claim {_m(w, 'stages_ms', 'claim')} · task fetched "
            f"{_m(w, 'stages_ms', 'handover')} · agent done {_m(w, 'stages_ms', 'agent')} · result "
            f"{_m(w, 'stages_ms', 'finish')}; audit append alone {_m(w, 'audit_append_ms')}")


def _at_most(limit: float) -> Callable[[float], bool]:
    return lambda value: value <= limit


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every target, per runtime: the figure, its repetitions, the goal, and met / missed / unstable (the
    repetitions disagree by more than UNSTABLE_SPREAD, so neither verdict can be trusted) / not measured;
    where it is not met, the measured floor or breakdown beside it."""
    rows: list[dict[str, Any]] = []

    def row(target: str, rt: str, fig: Any, *, goal: str, ok: Callable[[float], bool], unit: str = "",
            floor: str = "") -> None:
        value: float | None = None
        unstable, reps = False, []
        if isinstance(fig, Mapping):
            value = med(fig)
            unstable, reps = bool(fig.get("unstable")), list(fig.get("rep_medians") or [])
        elif isinstance(fig, int | float) and not isinstance(fig, bool):
            value = fig
        if value is None:
            status = "not measured"
        elif unstable:
            status = "unstable"
        else:
            status = "met" if ok(value) else "missed"
        rows.append({"target": target, "runtime": rt, "measured": _f(fig, unit), "value": value,
                     "reps": reps, "goal": goal, "status": status,
                     "floor": floor if status in ("missed", "unstable") else ""})

    for rt, w in results.get("warm", {}).items():
        goal = WARM_P50_MS.get(rt, WARM_P50_MS["runsc"])
        row("warm run p50 (server side)", rt, w.get("server_ms"), goal=f"<= {goal:g} ms",
            ok=_at_most(goal), unit=" ms", floor=_warm_floor(w))
        row("warm run p95 / p50 (server side)", rt, w.get("p95_over_p50"), goal="<= 2x", ok=lambda v: v <= 2,
            unit="x", floor=f"p50 {_m(w, 'server_ms')} ms, p95 {_fmt(_get(w, 'server_ms', 'p95'))} ms")
        if w.get("aio_share_over_sync_ms") is not None:
            row("warm run through host.aio - blocking client (each client's share of its runs)", rt,
                w.get("aio_share_over_sync_ms"), goal="<= 1 ms", ok=_at_most(1), unit=" ms",
                floor=f"client p50 {_m(w, 'aio_client_ms')} (host.aio) vs {_m(w, 'client_ms')} ms "
                      f"(blocking), their share {_m(w, 'aio_client_share_ms')} vs "
                      f"{_m(w, 'sync_client_share_ms')} ms")
    for rt, c in results.get("cli", {}).items():
        row("process to process: run --json / docker run", rt, c.get("ratio"), goal=f"<= {CLI_RATIO:g}x",
            ok=_at_most(CLI_RATIO), unit="x",
            floor=f"docker run {_m(c, 'docker_cli_ms')} ms, ours {_m(c, 'process_ms')} ms: the run "
                  f"{_m(c, 'run_duration_ms')} ms, imports alone {_m(c, 'imports_ms')} ms (before the "
                  f"container is asked for: {_m(c, 'prelaunch_imports_ms')} ms), a new interpreter importing "
                  f"only gRPC {_m(c, 'library_imports_ms')} ms")
        if c.get("served_ratio") is not None:
            row("process to process, a serve host running: run --json / docker run", rt,
                c.get("served_ratio"), goal=f"<= {CLI_RATIO:g}x", ok=_at_most(CLI_RATIO), unit="x",
                floor=f"docker run {_m(c, 'served_docker_cli_ms')} ms, ours {_m(c, 'served_process_ms')} ms")
    for rt, levels in results.get("concurrency", {}).items():
        for n in THROUGHPUT_LEVELS:
            c = levels.get(n) or {}
            row(f"{n} concurrent: throughput / docker's at {n}", rt, c.get("throughput_over_floor"),
                goal=">= 0.95x", ok=lambda v: v >= 0.95, unit="x",
                floor=f"ours {_m(c, 'throughput')} runs/s, docker alone "
                      f"{_m(c, 'floor', 'throughput')} runs/s, docker with a run's hardened spec "
                      f"{_m(c, 'hardened_floor', 'throughput')} runs/s (ours / that "
                      f"{_m(c, 'throughput_over_hardened_floor')}x); CPU per run (ms) ours / docker's: "
                      + ", ".join(f"{part} {_m(c, 'cpu_ms_per_run', part)} / "
                                  f"{_m(c, 'floor', 'cpu_ms_per_run', part)}" for part in CPU_PARTS))
        top: Mapping[str, Any] = levels.get("64") or {}
        row("64 concurrent: failures", rt, top.get("failures"), goal="0", ok=lambda v: v == 0)
        row("64 concurrent: leftovers", rt, top.get("leftovers"), goal="0", ok=lambda v: v == 0)
        row("64 concurrent: host memory per active run", rt, top.get("host_mb_per_run"), goal="<= 1 MB",
            ok=lambda v: v <= 1, unit=" MB",
            floor=f"containers {_m(top, 'container_mb_per_run')} MB/run, shims {_m(top, 'shim_mb_per_run')} "
                  "MB/run (engine side)")
    for rt, c in results.get("calls", {}).items():
        if rt == "runc":
            row("tool call / (bare gRPC echo + worker round trip)", rt, c.get("tool_over_floor"),
                goal="<= 1.3x", ok=lambda v: v <= 1.3, unit="x",
                floor=f"tool call {_m(c, 'tool_ms')} ms; echo {_m(c, 'echo_ms')} + worker "
                      f"{_m(c, 'host_side', 'worker_ms')} ms; free tool (no worker) "
                      f"{_m(c, 'free_tool_ms')} ms; floor measured: a bare server relaying to an idle "
                      f"worker {_m(c, 'worker_relay_ms')} ms (itself {_m(c, 'worker_relay_over_floor')}x "
                      f"echo + worker: an idle worker's wake-up), tool call / that "
                      f"{_m(c, 'tool_over_worker_relay')}x")
        # A run's gate looks each tool pack up once per run (host/runtime/wiring.run_services): the gate call
        # with the pack looked up once, minus the worker round trip it includes.
        row("the gate's own share of a tool call (host-timed gate call - worker round trip)", rt,
            _get(c, "host_side", "gate_cached_share_ms"),
            goal="<= 0.1 ms", ok=lambda v: v <= 0.1, unit=" ms",
            floor=f"gate call {_m(c, 'host_side', 'gate_cached_lookup_ms')} ms, worker round trip "
                  f"{_m(c, 'host_side', 'worker_ms')} ms; looking the pack up on every call "
                  f"{_m(c, 'host_side', 'gate_share_ms')} ms")
    for rt, b in results.get("broker", {}).items():
        row("broker overhead: sandbox call_llm - direct SDK (median)", rt, b.get("overhead_ms"),
            goal="<= 1 ms", ok=lambda v: v <= 1, unit=" ms",
            floor=f"direct {_m(b, 'direct_ms')} ms, sandbox {_m(b, 'sandbox_ms')} ms; sandbox RPC floor "
                  f"(ListTools) {_m(b, 'sandbox_rpc_floor_ms')} ms, overhead beyond it "
                  f"{_m(b, 'overhead_beyond_hop_ms')} ms; {_relayed(b, 'ms')}")
        row("first streamed chunk: sandbox - direct provider (median)", rt, b.get("first_chunk_overhead_ms"),
            goal="<= 1 ms", ok=lambda v: v <= 1, unit=" ms",
            floor=f"direct {_m(b, 'direct_first_chunk_ms')} ms, sandbox "
                  f"{_m(b, 'sandbox_first_chunk_ms')} ms; {_relayed(b, 'first_chunk_ms')}")
        # Issue 15: the same with 8 installed tool definitions and a 2 KiB JSON-schema response format.
        row("broker overhead, 8 tools + 2 KiB schema: sandbox call_llm - direct SDK", rt,
            b.get("tools_overhead_ms"), goal="<= 2 ms", ok=lambda v: v <= 2, unit=" ms",
            floor=f"direct {_m(b, 'direct_tools_ms')} ms, sandbox {_m(b, 'sandbox_tools_ms')} ms; "
                  f"sandbox RPC floor (ListTools) {_m(b, 'sandbox_rpc_floor_ms')} ms, overhead beyond it "
                  f"{_m(b, 'tools_overhead_beyond_hop_ms')} ms; {_relayed(b, 'tools_ms')}")
        row("first streamed chunk, 8 tools + 2 KiB schema: sandbox - direct", rt,
            b.get("tools_first_chunk_overhead_ms"), goal="<= 5 ms", ok=lambda v: v <= 5, unit=" ms",
            floor=f"direct {_m(b, 'direct_tools_first_chunk_ms')} ms, sandbox "
                  f"{_m(b, 'sandbox_tools_first_chunk_ms')} ms; {_relayed(b, 'tools_first_chunk_ms')}")
    return rows


def _relayed(b: Mapping[str, Any], what: str) -> str:
    """The floor of a broker overhead: the same direct call behind a bare gRPC hop from the sandbox."""
    return (f"the direct call behind a bare hop from the sandbox (no broker) {_m(b, f'relay_{what}')} ms, "
            f"{_m(b, f'relay_{what}_over_direct')} ms over direct; the broker's own beyond it "
            f"{_m(b, f'sandbox_{what}_over_relay')} ms")


# -- combining repetitions -------------------------------------------------------------------------


def aggregate(raw: Mapping[str, Mapping[str, Sequence[Any]]]) -> dict[str, dict[str, Any]]:
    """section -> runtime -> the repetitions combined (bench._stats.combine); a runtime none of whose
    repetitions succeeded is left out. Then the figures derived across sections (the warm speed-up)."""
    out: dict[str, dict[str, Any]] = {}
    for section, by_runtime in raw.items():
        combined = {rt: combine(list(reps)) for rt, reps in by_runtime.items()}
        out[section] = {rt: c for rt, c in combined.items() if c is not None}
    for rt, w in out.get("warm", {}).items():
        to_result = _get(out, "cold", rt, "stages_ms", "to_result")
        cold_ms = med(to_result)
        if cold_ms is None:
            continue
        w["cold_to_result_ms"] = to_result
        warm_ms = _get(w, "server_ms", "rep_medians") or []
        w["speedup"] = figure([round(cold_ms / m, 2) for m in warm_ms if m])
    for c in out.get("calls", {}).values():
        # The gate's own share: the host-timed gate call (which includes the worker's round trip) minus
        # the worker's round trip timed alone, per repetition.
        side = c.get("host_side") or {}
        workers = _get(side, "worker_ms", "rep_medians") or []
        for key, share in (("gate_ms", "gate_share_ms"), ("gate_cached_lookup_ms", "gate_cached_share_ms")):
            gates = _get(side, key, "rep_medians") or []
            if gates and len(gates) == len(workers):
                side[share] = figure([round(g - w, 3) for g, w in zip(gates, workers, strict=True)])
    return out


def unstable_list(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every figure of every section whose repetitions disagree by more than UNSTABLE_SPREAD."""
    return [u for section in SECTION_NAMES for rt, tree in results.get(section, {}).items()
            for u in unstable_figures(tree, f"{section} {rt}")]


def finish(results: dict[str, Any]) -> dict[str, Any]:
    """A run's raw repetitions -> each section combined, the targets, the unstable figures (in place)."""
    combined = aggregate(results.get("raw", {}))
    for section in SECTION_NAMES:
        results[section] = combined.get(section, {})
    results["targets"] = targets(results)
    results["unstable"] = unstable_list(results)
    return results


STAGE_ROWS = (
    # (key, what it covers, the floor's matching step)
    ("route", "lockfile, manifest, trust routing, policy", ""),
    ("verify", "engine facts (cached), image pin, pack volume", ""),
    ("socket", "run dir + gRPC server listening", ""),
    ("create", "docker create", "create"),
    ("start", "docker start (+ watcher threads)", "start"),
    ("boot", "started -> agent entered: python, imports, connect, FetchTask", "run"),
    ("python", "(in container) python process start -> agent entered", ""),
    ("report", "agent returned -> host has the result (agent_done)", ""),
    ("teardown", "agent done -> container gone, run dir removed (sync teardown)", "remove"),
    ("audit", "audit record + result", ""),
    ("total", "request -> result, container gone (server side)", "total"),
)

TOOL_SANDBOX_STAGES = ("verified", "socket_ready", "created", "started", "connected", "first_reply")
_STEP_KEYS = ("exit_wait", "server_stop", "remove_verify", "rundir", "total")
_CALL_KEYS = ("tool_ms", "tool_stub_ms", "cached_lookup_tool_ms", "free_tool_ms", "echo_ms",
              "worker_relay_ms", "stdio_ms")
_HOST_TOOL_KEYS = ("gate_ms", "gate_cached_lookup_ms", "worker_ms")

_COLD = (
    "Trivial agent, `SandboxHost.run` with synchronous teardown (API call -> result returned, container "
    "gone), against the floor `docker run --rm --network none --runtime R <pinned image> python3 -c "
    "'import grpc'` timed interleaved in the same run, through the docker SDK step by step (create, "
    "start, wait, remove: `containers.run(..., remove=True)` without its log fetch; entrypoint "
    "overridden) and through the docker CLI; the floor is the faster of the two. median / p95 in ms."
)
_CALLS = (
    "Round trips timed inside the container (median / p95 in ms): `context.run_tool` of a no-op trusted "
    "tool; the same RunTool request through the bare generated stub (interleaved with the former); the "
    "same request against the real run server (`build_run_server`) with the gate's toolpack looked up "
    "once instead of from the lockfile per call, then also with tools that cost nothing (no worker); a "
    "bare gRPC unary echo over the same kind of bind-mounted per-run socket; a bare server on such a "
    "socket whose handler makes one round trip to an idle tool worker process (the same tool and pipe "
    "protocol, none of the servicer, gate or pool: the floor of any design with a worker behind a per-run "
    "socket); line-delimited JSON over the container's attached stdio. tool / floor = the tool call against "
    "the bare echo plus the worker's own round trip in a hot loop (below), per repetition. Each repetition "
    f"measures the tool call and every floor in {CALL_ROUNDS} rounds of about 1/{CALL_ROUNDS} of its "
    "calls, in a rotated order, so what a ratio divides spans the same minutes."
)
_TOOL_SANDBOX = (
    "One sandboxed agent calls the same no-op tool installed twice, as a trusted pack (run by a host worker "
    "process) and as an unverified one (run in the run's tool sandbox), interleaved, timed around "
    "`context.run_tool` inside the agent: median / p95 in ms of the calls after the first. The community "
    "pack's first call starts its tool sandbox: its total as the agent saw it, then the host's stages of "
    "that start, cumulative ms from the call: verified (engine, image pin, the pack's volume), socket "
    "ready, docker create, docker start, connected (the tool server said hello), first reply."
)
_BROKER = (
    "The same local fake provider (its own process on 127.0.0.1) called directly with the openai SDK, "
    "through the host's `LlmSession.call`, and by an agent's `call_llm` inside the sandbox; time to the "
    "first streamed chunk likewise. A repetition takes its samples in rounds: the direct and LlmSession "
    "paths in turn, then one sandbox run doing the same number of calls, so drift reaches both sides. "
    "median / p95 in ms; overhead = sandbox median - direct median, per repetition; beyond the hop = that "
    "overhead minus the sandbox RPC floor (ListTools on the same socket). relayed: the same direct SDK call "
    "made by the handler of a bare gRPC server that the sandbox calls over the same kind of socket (no "
    "broker, no session; for the first chunk, text chunks relayed as they come): the floor of a brokered "
    "call, since a handler that waits milliseconds on the provider costs more than ListTools' instant "
    "answer (the threads on both sides wake from idle); beyond the relay = sandbox median - relayed "
    "median, the broker's own share."
)
_BROKER_TOOLS = (
    "Host side, no sandbox: a call offering the installed tool definitions of a trusted pack (8 tools, "
    "each a described object schema) and asking for a ~2 KiB JSON-schema response format, through the "
    "host's `LlmSession.call` and `.stream`, against the openai SDK sending the very request the broker "
    "sends (the adapter's `openai_request` of the prepared call, same `max_completion_tokens`) to the same "
    "fake provider, interleaved in one loop. median / p95 in ms; overhead = LlmSession median - direct "
    "median."
)
_BROKER_SANDBOX_TOOLS = (
    "The same call (8 tool definitions from `allowed_tool_context()`, a ~2 KiB JSON-schema response format) "
    "made by an agent in the sandbox with `call_llm` / `stream_llm`, through the socket and the broker, "
    "against the openai SDK sending the broker's request straight to the provider (interleaved with the "
    "section's other direct paths). overhead = sandbox median - direct median. sandbox RPC floor: the "
    "smallest call on the same socket and run server (ListTools, answered from the run's cached catalog), "
    "the share of the overhead that is the sandbox-to-host hop itself rather than the broker."
)
_CLI = (
    "A one-shot run as a script meets it: `agentnode-sandbox run SLUG --json` of the trivial agent (a new "
    "process: interpreter start, imports, the run with its synchronous teardown, exit; invoked as "
    "`python -m host`), against `docker run --rm --network none --runtime R --entrypoint python3 <pinned "
    "image> -c 'import grpc'`, interleaved. median / p95 in ms; ratio = ours / docker's, per repetition. "
    "The run's own duration_ms (from its JSON) and a new interpreter doing only the command's imports say "
    "where the process's time goes (the run's duration counts from its container's head start or "
    "prelaunch, and only the imports made before that container is asked for precede the engine's work: "
    "the rest overlap it; every run after the section's first starts from the command's record, "
    "host/runtime/headstart.py); a new interpreter importing only gRPC is the floor of any host of this "
    "design written in Python. Then the "
    "same command while `serve` runs for the same config with a pool of one for the agent (`run` finds its "
    "default socket and submits there; `path` serve), interleaved with docker run again."
)
_CONCURRENCY = (
    "N trivial runs submitted at once to one host (a fresh process per level and repetition), then N "
    "bare `docker run --rm ... python3 -c 'import grpc'` at once through the SDK in the same process "
    "(docker's own throughput at that moment); ratio = ours / docker's, per repetition. Memory per active "
    "run at the peak: host process RSS growth over its baseline; the containers' memory as `docker stats` "
    "counts it (cgroup); the containerd shims' RSS. Failures and leftovers add up over the repetitions, "
    "peak active is the lowest; failures, if any, are listed below the table. CPU per run (ms, the batch's "
    "whole duration over N): the machine's busy time (/proc/stat), of it the process submitting the runs "
    "(all its threads: for ours the host, for docker's the SDK client), the engine's daemons (dockerd, "
    "containerd), and the rest (the containers themselves, their shims and runtime, the kernel). On two "
    "cores throughput follows the machine's CPU per run, so the CPU split says where a throughput gap is "
    "spent. Hardened floor: the same N containers created from a run's own spec (read-only root, no "
    "capabilities, init, limits, tmpfs mounts, the pack volume, a socket directory) running the same "
    "command, through the same SDK calls: the engine's own cost of our hardening, none of our code."
)
_WARM = (
    "`serve` (its own process) with a warm pool, one persistent `RunnerClient` over the admin socket, runs "
    "submitted one "
    "at a time after the pool refilled and its members are ready (their wrappers wait for a task: serve's "
    "`agentnode_warm_pool_ready`), then a short settle. Server side = `stages['done']` (request received -> "
    "result); "
    "client side = around `submit`; the host.aio client (`AsyncRunnerClient.submit`, awaited, timed in its "
    "event loop) takes every "
    "other run, interleaved with the blocking one; host.aio over blocking = the difference of their client "
    "medians, and the Targets table's host.aio row the difference of each client's share of its runs "
    "(client side - server side, run by run), from which the server's own spread cancels out. Cold = the "
    "cold runs above up to their result (teardown "
    "excluded, as `serve` tears down after answering); speed-up = that over each repetition's warm median. "
    "median / p95 in ms; p95 / p50 per repetition; then medians of the server-side parts, and one audit "
    "append timed alone (median / p95)."
)


_LOAD = (
    "The 1-minute load average and the processes runnable or blocked at that instant, before and after "
    "each section; its duration; the seconds spent before its measurements waiting for a calm machine "
    "(full mode: at most one process per core runnable or blocked for 3 s, bounded at 180 s each)."
)


def _section(title: str, prose: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    return ["", f"## {title}" if title else prose, "", *([prose, ""] if title else []), *table]


def _load_rows(loads: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [(name, _fmt(_get(x, "before", "load1")), str(_get(x, "before", "busy")),
             _fmt(_get(x, "after", "load1")), str(_get(x, "after", "busy")), _fmt(x.get("seconds")),
             _fmt(x.get("quiesce_s"))) for name, x in loads.items()]


_LOAD_HEADER = ("section", "load before", "runnable before", "load after", "runnable after", "seconds",
                "waited s")


def _unstable_lines(unstable: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per unstable figure (its median and p95 together): value ±spread (the repetitions)."""
    grouped: dict[str, list[str]] = {}
    for u in unstable:
        grouped.setdefault(u["figure"], []).append(
            f"{u['which']} {_fmt(u['value'])}{_pct(u['spread'])} ("
            + " / ".join(_fmt(v) for v in u["reps"]) + ")")
    if not grouped:
        return []
    lines = [f"- {name}: {'; '.join(parts)}" for name, parts in list(grouped.items())[:MAX_UNSTABLE_LISTED]]
    if len(grouped) > MAX_UNSTABLE_LISTED:
        lines.append(f"- ... and {len(grouped) - MAX_UNSTABLE_LISTED} more (the JSON's `unstable`)")
    return ["", f"⚠ unstable: figures whose repetitions disagree by more than {UNSTABLE_SPREAD:.0%} "
            "(spread = (max - min) / median of the per-repetition values, shown with the repetitions); a "
            "target read from one says `unstable`, not met or missed:", "", *lines]


def _reps_text(reps: Sequence[float]) -> str:
    return " / ".join(_fmt(v) for v in reps) if len(reps) > 1 else ""


def _method(plan: Mapping[str, Any]) -> str:
    return (f"Each section ran {plan.get('reps')} repetition(s), the runtimes interleaved within each "
            "(repetition 1 runc, repetition 1 runsc, repetition 2 runc, ...). Every figure is the median of "
            "the per-repetition medians (p95: of the per-repetition p95s; ratios and overheads: of the "
            "per-repetition values), ±spread = (max - min) / median of those per-repetition values; ⚠ marks "
            f"a spread above {UNSTABLE_SPREAD:.0%}.")


def render(results: Mapping[str, Any]) -> str:
    """The Markdown report; every section in SECTIONS appears even when a part was not measured."""
    m = results["machine"]
    facts = [m["date"], f"rev `{m['git_revision']}`", m["cpu_model"], f"{m['cores']} cores",
             f"{m['memory_gib']} GiB", f"kernel {m['kernel']}", f"Docker {m['docker_server']}",
             m["runsc"] or "no runsc", f"mode **{results['mode']}**",
             f"load average at start {m['load_at_start']}, at end {m.get('load_at_end')}"]
    out = ["# agentnode-sandbox benchmarks", "", " · ".join(facts), "", _method(results.get("plan", {}))]
    # The sections' own load (64 sandboxes at once) shows in the lagging average; only the load found at
    # the start says whether something else was running.
    if m["load_at_start"][0] > BUSY_LOAD:
        out += ["", f"**The machine was busy when the run began (1-minute load above {BUSY_LOAD}): absolute "
                    "numbers are noisy.**"]
    if results.get("errors"):
        out += ["", "**Measurements that failed (their repetitions are missing below):**", "",
                *(f"- {e}" for e in results["errors"])]
    out += _section("Targets", "Each target, per runtime; where one is not met, the measured floor or "
                    "breakdown beside it.",
                    ("target", "runtime", "measured", "repetitions", "goal", "status", "floor / breakdown"),
                    [(t["target"], t["runtime"], t["measured"], _reps_text(t.get("reps", [])), t["goal"],
                      f"**{t['status']}**", t.get("floor", "")) for t in results["targets"]])
    out += _unstable_lines(results.get("unstable", []))
    out += _section("Load", _LOAD, _LOAD_HEADER, _load_rows(results.get("load_by_section", {})))
    out += _body(results)
    out += ["", f"Reproduce: `{results['command']}`", ""]
    return "\n".join(out)


def _body(results: Mapping[str, Any]) -> list[str]:
    """The per-section tables, from the combined results."""
    out: list[str] = []
    cold: Mapping[str, Any] = results.get("cold", {})
    out += _section("Cold start", _COLD,
                    ("runtime", "floor: SDK", "floor: CLI", "agentnode cold run", "ratio to floor"),
                    [(rt, _mp(c.get("floor_sdk_ms")), _mp(c.get("floor_cli_ms")), _mp(c.get("run_ms")),
                      _f(c.get("ratio"), "x")) for rt, c in cold.items()])
    out += _section("", "Per stage (median ms); the floor's own steps (SDK) beside each runtime:",
                    ("stage", "what", *(f"{rt} {kind}" for rt in cold for kind in ("run", "floor"))),
                    [(key, what, *(cell for c in cold.values() for cell in (
                        _f(_get(c, "stages_ms", key)),
                        _f(_get(c, "floor_stages_ms", floor)) if floor else "")))
                     for key, what, floor in STAGE_ROWS])
    out += _section("", "Boot probe (median ms, a container hardened like a run's): interpreter start-up "
                    "(process age at its first line, 10 ms resolution), `import grpc`, then the wrapper's "
                    "own imports (`sandbox_wrapper._runner`: generated stubs, asyncio, ...).",
                    ("runtime", "interpreter", "import grpc", "wrapper imports"),
                    [(rt, *(_f(_get(c, "boot_probe_ms", k))
                            for k in ("interpreter", "import_grpc", "import_wrapper")))
                     for rt, c in cold.items()])
    out += _section("", "Teardown of a real sandbox after the trivial agent reported: Sandbox.destroy's "
                    "steps timed one by one (median ms), at once or after waiting for the wrapper to exit "
                    "by itself.",
                    ("runtime", "destroy", "wait for exit", "server stop", "remove + verify", "run dir",
                     "total"),
                    [(rt, mode, *(_f(v.get(k)) for k in _STEP_KEYS))
                     for rt, c in cold.items() for mode, v in (c.get("teardown_steps_ms") or {}).items()])
    out += _section("Process to process", _CLI,
                    ("runtime", "docker run (CLI)", "agentnode-sandbox run --json", "ratio",
                     "of it: the run (duration_ms)", "imports alone (new interpreter)",
                     "of them, before the container is asked for", "gRPC import alone",
                     "a serve host running: run --json",
                     "its docker run", "its ratio"),
                    [(rt, _mp(c.get("docker_cli_ms")), _mp(c.get("process_ms")), _f(c.get("ratio"), "x"),
                      _mp(c.get("run_duration_ms")), _mp(c.get("imports_ms")),
                      _mp(c.get("prelaunch_imports_ms")), _mp(c.get("library_imports_ms")),
                      _mp(c.get("served_process_ms")),
                      _mp(c.get("served_docker_cli_ms")), _f(c.get("served_ratio"), "x"))
                     for rt, c in results.get("cli", {}).items()])
    calls: Mapping[str, Any] = results.get("calls", {})
    out += _section("Per-call overhead", _CALLS,
                    ("runtime", "tool call", "same, bare stub", "same, lookup cached", "same, free tool",
                     "bare gRPC echo", "bare relay to a worker", "stdio JSON line", "tool / echo",
                     "stdio / echo", "tool / floor"),
                    [(rt, *(_mp(c.get(k)) for k in _CALL_KEYS), _f(c.get("tool_over_echo"), "x"),
                      _f(c.get("stdio_over_echo"), "x"), _f(c.get("tool_over_floor"), "x"))
                     for rt, c in calls.items()])
    out += _section("", "The host's share of a tool call (median / p95 ms, timed on the host): the gate "
                    "looking the pack up in the lockfile on every call, the gate with the pack looked up "
                    "once (as a run's gate does), each including the worker round trip, which is also timed "
                    "alone.",
                    ("runtime", "gate, lookup per call", "gate, lookup once per run", "worker round trip"),
                    [(rt, *(_mp(_get(c, "host_side", k)) for k in _HOST_TOOL_KEYS))
                     for rt, c in calls.items()])
    out += _section("Tool sandboxes", _TOOL_SANDBOX,
                    ("runtime", "trusted (host worker)", "community (tool sandbox)", "ratio", "first call",
                     *TOOL_SANDBOX_STAGES),
                    [(rt, _mp(t.get("trusted_ms")), _mp(t.get("community_ms")), _f(t.get("ratio"), "x"),
                      _f(t.get("first_call_ms")),
                      *(_f(_get(t, "first_start_ms", k)) for k in TOOL_SANDBOX_STAGES))
                     for rt, t in results.get("tool_sandbox", {}).items()])
    broker: Mapping[str, Any] = results.get("broker", {})
    out += _section("Broker", _BROKER,
                    ("runtime", "direct SDK", "host LlmSession.call", "sandbox call_llm", "overhead",
                     "beyond the hop", "relayed", "beyond the relay", "first chunk: direct",
                     "first chunk: LlmSession", "first chunk: sandbox", "first chunk overhead",
                     "first chunk: relayed", "first chunk beyond the relay"),
                    [(rt, _mp(b.get("direct_ms")), _mp(b.get("session_ms")), _mp(b.get("sandbox_ms")),
                      _f(b.get("overhead_ms"), " ms"), _f(b.get("overhead_beyond_hop_ms"), " ms"),
                      _mp(b.get("relay_ms")), _f(b.get("sandbox_ms_over_relay"), " ms"),
                      _mp(b.get("direct_first_chunk_ms")),
                      _mp(b.get("session_first_chunk_ms")), _mp(b.get("sandbox_first_chunk_ms")),
                      _f(b.get("first_chunk_overhead_ms"), " ms"), _mp(b.get("relay_first_chunk_ms")),
                      _f(b.get("sandbox_first_chunk_ms_over_relay"), " ms")) for rt, b in broker.items()])
    out += _section("", _BROKER_SANDBOX_TOOLS,
                    ("runtime", "direct SDK", "sandbox call_llm", "overhead", "sandbox RPC floor",
                     "beyond the hop", "relayed", "beyond the relay", "first chunk: direct",
                     "first chunk: sandbox", "first chunk overhead", "first chunk: relayed",
                     "first chunk beyond the relay"),
                    [(rt, _mp(b.get("direct_tools_ms")), _mp(b.get("sandbox_tools_ms")),
                      _f(b.get("tools_overhead_ms"), " ms"), _mp(b.get("sandbox_rpc_floor_ms")),
                      _f(b.get("tools_overhead_beyond_hop_ms"), " ms"),
                      _mp(b.get("relay_tools_ms")), _f(b.get("sandbox_tools_ms_over_relay"), " ms"),
                      _mp(b.get("direct_tools_first_chunk_ms")), _mp(b.get("sandbox_tools_first_chunk_ms")),
                      _f(b.get("tools_first_chunk_overhead_ms"), " ms"),
                      _mp(b.get("relay_tools_first_chunk_ms")),
                      _f(b.get("sandbox_tools_first_chunk_ms_over_relay"), " ms"))
                     for rt, b in broker.items() if "sandbox_tools_ms" in b])
    bt: Mapping[str, Any] = _get(results, "broker_tools", "host") or {}
    out += _section("", _BROKER_TOOLS,
                    ("tools", "schema bytes", "request bytes", "direct SDK", "host LlmSession.call",
                     "overhead", "first chunk: direct", "first chunk: LlmSession", "first chunk overhead"),
                    [(_f(bt.get("tools")), _f(bt.get("schema_bytes")), _f(bt.get("request_bytes")),
                      _mp(bt.get("direct_ms")), _mp(bt.get("session_ms")), _f(bt.get("overhead_ms"), " ms"),
                      _mp(bt.get("direct_first_chunk_ms")), _mp(bt.get("session_first_chunk_ms")),
                      _f(bt.get("first_chunk_overhead_ms"), " ms"))]
                    if bt else [])
    levels_by_rt: Mapping[str, Any] = results.get("concurrency", {})
    out += _section("Concurrency", _CONCURRENCY,
                    ("runtime", "N", "runs/s", "docker floor runs/s", "ours / docker",
                     "hardened floor runs/s", "ours / hardened", "wall s", "failures", "leftovers",
                     "peak active", "host MB/run", "container MB/run", "shim MB/run"),
                    [(rt, n, _f(c.get("throughput")), _f(_get(c, "floor", "throughput")),
                      _f(c.get("throughput_over_floor"), "x"), _f(_get(c, "hardened_floor", "throughput")),
                      _f(c.get("throughput_over_hardened_floor"), "x"), _f(c.get("wall_s")),
                      _f(c.get("failures")),
                      _f(c.get("leftovers")), _f(c.get("peak_active")), _f(c.get("host_mb_per_run")),
                      _f(c.get("container_mb_per_run")), _f(c.get("shim_mb_per_run")))
                     for rt, levels in levels_by_rt.items() for n, c in levels.items()
                     if isinstance(c, Mapping)])
    out += _section("", "CPU per run (median ms): ours / docker's alone / docker's with the hardened spec, "
                    "split as above.",
                    ("runtime", "N", *(f"{part}: ours / docker / hardened" for part in CPU_PARTS)),
                    [(rt, n, *(f"{_m(c, 'cpu_ms_per_run', part)} / {_m(c, 'floor', 'cpu_ms_per_run', part)}"
                               f" / {_m(c, 'hardened_floor', 'cpu_ms_per_run', part)}" for part in CPU_PARTS))
                     for rt, levels in levels_by_rt.items() for n, c in levels.items()
                     if isinstance(c, Mapping) and "cpu_ms_per_run" in c])
    reasons = [f"- {rt} x{n}: {reason}" for rt, levels in levels_by_rt.items() for n, c in levels.items()
               if isinstance(c, Mapping)
               for reason in [*(c.get("failure_reasons") or []),
                              *(f"docker floor: {e}" for e in _get(c, "floor", "errors") or []),
                              *(f"hardened floor: {e}" for e in _get(c, "hardened_floor", "errors") or [])]]
    out += ["", "Failures:", "", *reasons] if reasons else []
    warm: Mapping[str, Any] = results.get("warm", {})
    out += _section("Warm", _WARM,
                    ("runtime", "warm, server", "warm, client", "warm, host.aio client",
                     "host.aio over blocking",
                     "cold to result", "speed-up", "p95 / p50", "warm / submitted", "claim",
                     "claimed -> task fetched", "fetched -> agent done", "agent done -> result",
                     "audit append alone"),
                    [(rt, _mp(w.get("server_ms")), _mp(w.get("client_ms")), _mp(w.get("aio_client_ms")),
                      _f(w.get("aio_over_sync_ms"), " ms"), _mp(w.get("cold_to_result_ms")),
                      _f(w.get("speedup"), "x"), _f(w.get("p95_over_p50"), "x"),
                      f"{_f(w.get('warm_runs'))} / {_f(w.get('submitted'))}",
                      *(_f(_get(w, "stages_ms", k)) for k in ("claim", "handover", "agent", "finish")),
                      _mp(w.get("audit_append_ms")))
                     for rt, w in warm.items()])
    out += _section("", "Is the pool filler in the way? Warm runs on an in-process host with serve's "
                    "settings (no admin socket), server side, median / p95 ms: the filler refilling during "
                    "each run (as serve does) against the filler paused.",
                    ("runtime", "filler refilling", "filler paused"),
                    [(rt, _mp(_get(w, "filler_probe_ms", "refilling")),
                      _mp(_get(w, "filler_probe_ms", "paused")))
                     for rt, w in warm.items()])
    return out


# -- --compare --------------------------------------------------------------------------------------

SIDES = ("base", "candidate")

SECTION_TITLES = {
    "broker_tools": "Broker, 8 tools + 2 KiB schema (host side)", "cold": "Cold start",
    "cli": "Process to process",
    "calls": "Per-call overhead", "tool_sandbox": "Tool sandboxes", "broker": "Broker", "warm": "Warm",
    "concurrency": "Concurrency",
}


def _brief(fig: Any, which: str) -> dict[str, Any]:
    """One side's figure (its median, or its p95) shaped as a figure: n, median, spread, unstable, reps."""
    if isinstance(fig, int | float) and not isinstance(fig, bool):
        return {"n": 1, "median": fig, "spread": None, "unstable": False, "rep_medians": [fig]}
    if not isinstance(fig, Mapping) or not fig.get("n"):
        return {"n": 0}
    if which == "median":
        return {k: fig.get(k) for k in ("n", "median", "spread", "unstable", "rep_medians")}
    return {"n": fig["n"], "median": fig.get("p95"), "spread": fig.get("p95_spread"),
            "unstable": bool(fig.get("p95_unstable")), "rep_medians": fig.get("rep_p95s") or []}


def compare_figures(results: Mapping[str, Mapping[str, Any]],
                    raw: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every figure of either revision, side by side: each side's median ±spread and candidate / base as
    the median of the per-repetition ratios (repetition i of both sides ran back to back), with the
    ratio of the medians beside it (the only ratio for figures combined across sections)."""
    rows: list[dict[str, Any]] = []
    base, candidate = results.get("base") or {}, results.get("candidate") or {}
    for section in SECTION_NAMES:
        b_section, c_section = base.get(section) or {}, candidate.get(section) or {}
        for rt in dict.fromkeys([*b_section, *c_section]):
            b_figs, c_figs = dict(walk_figures(b_section.get(rt))), dict(walk_figures(c_section.get(rt)))
            b_reps = _get(raw, "base", section, rt) or []
            c_reps = _get(raw, "candidate", section, rt) or []
            for path in dict.fromkeys([*b_figs, *c_figs]):
                for which in ("median", "p95"):
                    bf, cf = b_figs.get(path), c_figs.get(path)
                    if which == "p95" and not any(isinstance(f, Mapping) and "p95" in f for f in (bf, cf)):
                        continue
                    b, c = _brief(bf, which), _brief(cf, which)
                    pairs = zip([rep_value(r, path, which) for r in b_reps],
                                [rep_value(r, path, which) for r in c_reps], strict=False)
                    paired = figure([round(cv / bv, 4) for bv, cv in pairs if bv and cv is not None])
                    rows.append({
                        "section": section, "runtime": rt,
                        "figure": ".".join(path) + (" p95" if which == "p95" else ""),
                        "base": b, "candidate": c, "ratio": paired,
                        "ratio_of_medians": ratio(med(c), med(b)),
                        "unstable": bool(b.get("unstable") or c.get("unstable") or paired.get("unstable")),
                    })
    return rows


def finish_compare(data: dict[str, Any]) -> dict[str, Any]:
    """A comparison's raw repetitions per side -> combined, targets per side, the figures side by side."""
    raw: Mapping[str, Any] = data.get("raw") or {}
    data["results"] = {side: aggregate(raw.get(side) or {}) for side in SIDES}
    data["targets"] = {side: targets(data["results"][side]) for side in SIDES}
    data["unstable"] = {side: unstable_list(data["results"][side]) for side in SIDES}
    data["figures"] = compare_figures(data["results"], raw)
    return data


def _ratio_cell(row: Mapping[str, Any]) -> str:
    paired, of_medians = row.get("ratio") or {}, row.get("ratio_of_medians")
    text = _f(paired, "x") if paired.get("n") else ("n/a" if of_medians is None else f"{_fmt(of_medians)}x")
    return text + (" ⚠" if row.get("unstable") and "⚠" not in text else "")


def _side_line(name: str, side: Mapping[str, Any]) -> str:
    facts = [f"**{name}**: {side.get('label', '')} (`{side.get('commit', '')}`)",
             f"image `{side.get('image') or 'not built'}`", f"host from `{side.get('host_module') or '?'}`"]
    if side.get("error"):
        facts.append(f"**did not start: {side['error']}**")
    return "- " + ", ".join(facts)


def render_compare(data: Mapping[str, Any]) -> str:
    """compare.md: two revisions measured side by side in one run, figure by figure."""
    m = data["machine"]
    facts = [m["date"], m["cpu_model"], f"{m['cores']} cores", f"{m['memory_gib']} GiB",
             f"kernel {m['kernel']}", f"Docker {m['docker_server']}", m["runsc"] or "no runsc",
             f"mode **{data['mode']}**",
             f"load average at start {m['load_at_start']}, at end {m.get('load_at_end')}"]
    out = ["# agentnode-sandbox benchmarks: base vs candidate", "", " · ".join(facts), "",
           _side_line("base", data.get("base") or {}),
           _side_line("candidate", data.get("candidate") or {}), "",
           _method(data.get("plan", {})) + " Within each runtime of a repetition, base and candidate ran "
           "back to back in alternating order, each in its own worker process that imports `host` and "
           "`sandbox_wrapper` from its revision and runs its revision's image (this checkout's `bench` "
           "measures both). candidate / base = the median of the per-repetition ratios ±spread (the ratio "
           "of the medians where a figure is combined across sections)."]
    if m["load_at_start"][0] > BUSY_LOAD:
        out += ["", f"**The machine was busy when the run began (1-minute load above {BUSY_LOAD}): absolute "
                    "numbers are noisy.**"]
    errors: Mapping[str, Sequence[str]] = data.get("errors") or {}
    for side in SIDES:
        if errors.get(side):
            out += ["", f"**{side}: measurements that failed:**", "", *(f"- {e}" for e in errors[side])]
    by_key: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for side in SIDES:
        for t in (data.get("targets") or {}).get(side, []):
            by_key.setdefault((t["target"], t["runtime"]), {})[side] = t
    rows = []
    for (target, rt), sides in by_key.items():
        b, c = sides.get("base") or {}, sides.get("candidate") or {}
        r = ratio(c.get("value"), b.get("value"))
        rows.append((target, rt, str((b or c).get("goal", "")), str(b.get("measured", "n/a")),
                     f"**{b.get('status', 'not measured')}**", str(c.get("measured", "n/a")),
                     f"**{c.get('status', 'not measured')}**", "n/a" if r is None else f"{_fmt(r)}x"))
    out += _section("Targets", "Each target per runtime, for both revisions.",
                    ("target", "runtime", "goal", "base", "base status", "candidate", "candidate status",
                     "candidate / base"), rows)
    out += _section("Load", _LOAD, _LOAD_HEADER, _load_rows(data.get("load_by_section", {})))
    figures: Sequence[Mapping[str, Any]] = data.get("figures") or []
    for section in SECTION_NAMES:
        mine = [f for f in figures if f["section"] == section]
        if not mine:
            continue
        out += _section(SECTION_TITLES[section], "median ±spread of each revision (ms unless named "
                        "otherwise); ⚠: a side or the ratio is unstable.",
                        ("figure", "runtime", "base", "candidate", "candidate / base"),
                        [(f"`{f['figure']}`", f["runtime"], _f(f["base"]), _f(f["candidate"]), _ratio_cell(f))
                         for f in mine])
    out += ["", f"Reproduce: `{data['command']}`", ""]
    return "\n".join(out)


__all__ = [
    "BUSY_LOAD", "SECTIONS", "aggregate", "compare_figures", "finish",
    "finish_compare", "machine_facts", "med", "ratio", "render", "render_compare", "summary", "targets",
    "unstable_list",
]
