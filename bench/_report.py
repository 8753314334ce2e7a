"""Statistics, machine facts, targets and the Markdown table: turning raw timings into a verdict."""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

SECTIONS = ("Targets", "Cold start", "Per-call overhead", "Tool sandboxes", "Broker", "Concurrency", "Warm")
"""The Markdown sections every report has, in order (smoke mode included)."""

BUSY_LOAD = 1.5
"""A 1-minute load average above this means other work competed with the benchmark."""


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, nearest-rank p95, min, max and count; an empty sample has only n = 0."""
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "median": round(statistics.median(v), 3),
        "p95": round(v[max(0, math.ceil(0.95 * len(v)) - 1)], 3),
        "min": round(v[0], 3),
        "max": round(v[-1], 3),
    }


def med(stats: Mapping[str, float] | None) -> float | None:
    return None if not stats or not stats.get("n") else stats["median"]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


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


def _mp(stats: Mapping[str, float] | None) -> str:
    """`median / p95` of a summary, in ms."""
    if not stats or not stats.get("n"):
        return "n/a"
    return f"{_fmt(stats['median'])} / {_fmt(stats['p95'])}"


def _verdict(value: float | None, ok: bool) -> str:
    return "not measured" if value is None else ("met" if ok else "missed")


def targets(results: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every target of the issues, per runtime: what was measured, the goal, and met / missed."""
    rows: list[dict[str, str]] = []

    def row(target: str, rt: str, value: float | None, *, goal: str, ok: bool, unit: str = "") -> None:
        rows.append({"target": target, "runtime": rt, "measured": _fmt(value, unit), "goal": goal,
                     "status": _verdict(value, ok)})

    for rt, c in results.get("cold", {}).items():
        r = c.get("ratio")
        row("cold run / docker floor", rt, r, goal="<= 1.3x", ok=r is not None and r <= 1.3, unit="x")
    for rt, c in results.get("calls", {}).items():
        r = c.get("tool_over_echo")
        row("tool call / bare gRPC echo", rt, r, goal="<= 1.25x", ok=r is not None and r <= 1.25, unit="x")
    for rt, t in results.get("tool_sandbox", {}).items():
        r = t.get("ratio")
        row("community tool call (tool sandbox) / trusted (host worker)", rt, r, goal="<= 1.5x",
            ok=r is not None and r <= 1.5, unit="x")
    for rt, b in results.get("broker", {}).items():
        o = b.get("overhead_ms")
        row("broker overhead (median)", rt, o, goal="<= 2 ms", ok=o is not None and o <= 2.0, unit=" ms")
        o, f = b.get("tools_overhead_ms"), b.get("tools_first_chunk_overhead_ms")
        row("broker overhead from the sandbox, 8 tools + 2 KiB JSON schema (median)", rt, o,
            goal="<= 2 ms", ok=o is not None and o <= 2.0, unit=" ms")
        row("first streamed chunk in the sandbox after the provider's, same call (median)", rt, f,
            goal="<= 5 ms", ok=f is not None and f <= 5.0, unit=" ms")
    tools: Mapping[str, Any] = results.get("broker_tools") or {}
    if tools:
        o, f = tools.get("overhead_ms"), tools.get("first_chunk_overhead_ms")
        row("broker overhead, 8 tools + 2 KiB JSON schema (median)", "host", o, goal="<= 2 ms",
            ok=o is not None and o <= 2.0, unit=" ms")
        row("first streamed chunk after the provider's, same call (median)", "host", f, goal="<= 5 ms",
            ok=f is not None and f <= 5.0, unit=" ms")
    for rt, levels in results.get("concurrency", {}).items():
        top: Mapping[str, Any] = levels.get("64") or {}
        fail, left, tp, mb = (top.get(k) for k in ("failures", "leftovers", "throughput", "host_mb_per_run"))
        row("64 concurrent: failures", rt, fail, goal="0", ok=fail == 0)
        row("64 concurrent: leftovers", rt, left, goal="0", ok=left == 0)
        row("64 concurrent: throughput", rt, tp, goal=">= 8 runs/s", ok=tp is not None and tp >= 8,
            unit=" runs/s")
        row("64 concurrent: host memory per active run", rt, mb, goal="<= 5 MB",
            ok=mb is not None and mb <= 5, unit=" MB")
    for rt, w in results.get("warm", {}).items():
        p50 = med(w.get("server_ms"))
        row("warm run p50 (server side)", rt, p50, goal="<= 25 ms", ok=p50 is not None and p50 <= 25,
            unit=" ms")
        r = w.get("speedup")
        row("warm speed-up over cold", rt, r, goal=">= 10x", ok=r is not None and r >= 10, unit="x")
        d = w.get("aio_over_sync_ms")
        row("warm run p50 through host.aio over the blocking client", rt, d, goal="<= 1 ms",
            ok=d is not None and d <= 1.0, unit=" ms")
    return rows


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
_CALL_KEYS = ("tool_ms", "tool_stub_ms", "cached_lookup_tool_ms", "free_tool_ms", "echo_ms", "stdio_ms")
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
    "bare gRPC unary echo over the same kind of bind-mounted per-run socket; line-delimited JSON over "
    "the container's attached stdio."
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
    "first streamed chunk likewise. median / p95 in ms; overhead = sandbox median - direct median."
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
_CONCURRENCY = (
    "N trivial runs submitted at once to one host (a fresh process per level; worst repetition shown), "
    "and N bare `docker run --rm ... python3 -c 'import grpc'` at once through the SDK (docker's own "
    "throughput here). Memory per active run at the peak: host process RSS growth over its baseline "
    "(largest of the repetitions); the containers' memory as `docker stats` counts it (cgroup); the "
    "containerd shims' RSS. Failures, if any, are listed below the table."
)
_WARM = (
    "`serve` (its own process) with a warm pool, one persistent `RunnerClient` over the admin socket, runs "
    "submitted one "
    "at a time after the pool refilled. Server side = `stages['done']` (request received -> result); "
    "client side = around `submit`; the host.aio client (`AsyncRunnerClient.submit`, awaited) takes every "
    "other run, interleaved with the blocking one. Cold = the cold runs above up to their result (teardown "
    "excluded, "
    "as `serve` tears down after answering). median / p95 in ms; then medians of the server-side "
    "parts, and one audit append timed alone (median / p95)."
)


def _section(title: str, prose: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    return ["", f"## {title}" if title else prose, "", *([prose, ""] if title else []), *table]


def render(results: Mapping[str, Any]) -> str:
    """The Markdown report; every section in SECTIONS appears even when a part was not measured."""
    m = results["machine"]
    facts = [m["date"], f"rev `{m['git_revision']}`", m["cpu_model"], f"{m['cores']} cores",
             f"{m['memory_gib']} GiB", f"kernel {m['kernel']}", f"Docker {m['docker_server']}",
             m["runsc"] or "no runsc", f"mode **{results['mode']}**",
             f"load average at start {m['load_at_start']}, at end {m['load_at_end']}"]
    out = ["# agentnode-sandbox benchmarks", "", " · ".join(facts)]
    loads = results.get("load_by_section", {})
    if loads:
        out += ["", "1-minute load average as each section started: "
                + ", ".join(f"{name} {load}" for name, load in loads.items()) + "."]
    waits = results.get("quiesce_s", {})
    if waits:
        out += ["", "Each section started once at most one process per core was runnable or blocked for 3 s "
                "(the previous section's teardowns done; bounded at 180 s); seconds waited: "
                + ", ".join(f"{name} {w}" for name, w in waits.items()) + "."]
    # The sections' own load (64 sandboxes at once) shows in the lagging average; only the load found at
    # the start says whether something else was running.
    if m["load_at_start"][0] > BUSY_LOAD:
        out += ["", f"**The machine was busy when the run began (1-minute load above {BUSY_LOAD}): absolute "
                    "numbers are noisy.**"]
    if results.get("errors"):
        out += ["", "**Sections that failed (their numbers are missing below):**", "",
                *(f"- {e}" for e in results["errors"])]
    out += _section("Targets", "Each target of the issues, per runtime.",
                    ("target", "runtime", "measured", "goal", "status"),
                    [(t["target"], t["runtime"], t["measured"], t["goal"], f"**{t['status']}**")
                     for t in results["targets"]])
    cold = results.get("cold", {})
    out += _section("Cold start", _COLD,
                    ("runtime", "floor: SDK", "floor: CLI", "agentnode cold run", "ratio to floor"),
                    [(rt, _mp(c["floor_sdk_ms"]), _mp(c["floor_cli_ms"]), _mp(c["run_ms"]),
                      f"{_fmt(c['ratio'])}x") for rt, c in cold.items()])
    out += _section("", "Per stage (median ms); the floor's own steps (SDK) beside each runtime:",
                    ("stage", "what", *(f"{rt} {kind}" for rt in cold for kind in ("run", "floor"))),
                    [(key, what, *(cell for c in cold.values() for cell in (
                        _fmt(med(c["stages_ms"].get(key))),
                        _fmt(med(c["floor_stages_ms"].get(floor))) if floor else "")))
                     for key, what, floor in STAGE_ROWS])
    out += _section("", "Boot probe (median ms, a container hardened like a run's): interpreter start-up "
                    "(process age at its first line, 10 ms resolution), `import grpc`, then the wrapper's "
                    "own imports (`sandbox_wrapper._runner`: generated stubs, asyncio, ...).",
                    ("runtime", "interpreter", "import grpc", "wrapper imports"),
                    [(rt, *(_fmt(med(c["boot_probe_ms"].get(k)))
                            for k in ("interpreter", "import_grpc", "import_wrapper")))
                     for rt, c in cold.items()])
    out += _section("", "Teardown of a real sandbox after the trivial agent reported: Sandbox.destroy's "
                    "steps timed one by one (median ms), at once or after waiting for the wrapper to exit "
                    "by itself.",
                    ("runtime", "destroy", "wait for exit", "server stop", "remove + verify", "run dir",
                     "total"),
                    [(rt, mode, *(_fmt(med(v.get(k))) for k in _STEP_KEYS))
                     for rt, c in cold.items() for mode, v in c["teardown_steps_ms"].items()])
    out += _section("Per-call overhead", _CALLS,
                    ("runtime", "tool call", "same, bare stub", "same, lookup cached", "same, free tool",
                     "bare gRPC echo", "stdio JSON line", "tool / echo", "stdio / echo"),
                    [(rt, *(_mp(c[k]) for k in _CALL_KEYS),
                      f"{_fmt(c['tool_over_echo'])}x", f"{_fmt(c['stdio_over_echo'])}x")
                     for rt, c in results.get("calls", {}).items()])
    out += _section("", "The host's share of a tool call (median / p95 ms, timed on the host): the gate as "
                    "runs use it, the gate with the toolpack looked up once, the worker round trip alone.",
                    ("runtime", "gate (as runs use it)", "gate, lookup cached", "worker round trip"),
                    [(rt, *(_mp(c["host_side"][k]) for k in _HOST_TOOL_KEYS))
                     for rt, c in results.get("calls", {}).items()])
    sandboxes = results.get("tool_sandbox", {})
    out += _section("Tool sandboxes", _TOOL_SANDBOX,
                    ("runtime", "trusted (host worker)", "community (tool sandbox)", "ratio", "first call",
                     *TOOL_SANDBOX_STAGES),
                    [(rt, _mp(t["trusted_ms"]), _mp(t["community_ms"]), f"{_fmt(t['ratio'])}x",
                      _fmt(t["first_call_ms"]),
                      *(_fmt(t["first_start_ms"].get(k)) for k in TOOL_SANDBOX_STAGES))
                     for rt, t in sandboxes.items()])
    out += _section("Broker", _BROKER,
                    ("runtime", "direct SDK", "host LlmSession.call", "sandbox call_llm", "overhead",
                     "first chunk: direct", "first chunk: LlmSession", "first chunk: sandbox"),
                    [(rt, _mp(b["direct_ms"]), _mp(b["session_ms"]), _mp(b["sandbox_ms"]),
                      _fmt(b["overhead_ms"], " ms"), _mp(b["direct_first_chunk_ms"]),
                      _mp(b["session_first_chunk_ms"]), _mp(b["sandbox_first_chunk_ms"]))
                     for rt, b in results.get("broker", {}).items()])
    out += _section("", _BROKER_SANDBOX_TOOLS,
                    ("runtime", "direct SDK", "sandbox call_llm", "overhead", "sandbox RPC floor",
                     "first chunk: direct", "first chunk: sandbox", "first chunk overhead"),
                    [(rt, _mp(b["direct_tools_ms"]), _mp(b["sandbox_tools_ms"]),
                      _fmt(b["tools_overhead_ms"], " ms"), _mp(b.get("sandbox_rpc_floor_ms")),
                      _mp(b["direct_tools_first_chunk_ms"]), _mp(b["sandbox_tools_first_chunk_ms"]),
                      _fmt(b["tools_first_chunk_overhead_ms"], " ms"))
                     for rt, b in results.get("broker", {}).items() if "sandbox_tools_ms" in b])
    bt: Mapping[str, Any] = results.get("broker_tools") or {}
    out += _section("", _BROKER_TOOLS,
                    ("tools", "schema bytes", "request bytes", "direct SDK", "host LlmSession.call",
                     "overhead", "first chunk: direct", "first chunk: LlmSession", "first chunk overhead"),
                    [(str(bt["tools"]), str(bt["schema_bytes"]), str(bt["request_bytes"]),
                      _mp(bt["direct_ms"]), _mp(bt["session_ms"]), _fmt(bt["overhead_ms"], " ms"),
                      _mp(bt["direct_first_chunk_ms"]), _mp(bt["session_first_chunk_ms"]),
                      _fmt(bt["first_chunk_overhead_ms"], " ms"))]
                    if bt else [])
    out += _section("Concurrency", _CONCURRENCY,
                    ("runtime", "N", "runs/s", "docker floor runs/s", "wall s", "failures", "leftovers",
                     "peak active", "host MB/run", "container MB/run", "shim MB/run"),
                    [(rt, n, _fmt(c["throughput"]), _fmt(c["floor"]["throughput"]), _fmt(c["wall_s"]),
                      str(c["failures"]), str(c["leftovers"]), str(c["peak_active"]),
                      _fmt(c["host_mb_per_run"]), _fmt(c["container_mb_per_run"]), _fmt(c["shim_mb_per_run"]))
                     for rt, levels in results.get("concurrency", {}).items() for n, c in levels.items()])
    reasons = [f"- {rt} x{n}: {reason}" for rt, levels in results.get("concurrency", {}).items()
               for n, c in levels.items() for r in c["repetitions"] for reason in r["failure_reasons"]]
    out += ["", "Failures:", "", *reasons] if reasons else []
    out += _section("Warm", _WARM,
                    ("runtime", "warm, server", "warm, client", "warm, host.aio client", "cold to result",
                     "speed-up",
                     "warm / submitted", "claim", "claimed -> task fetched", "fetched -> agent done",
                     "agent done -> result",
                     "audit append alone"),
                    [(rt, _mp(w["server_ms"]), _mp(w["client_ms"]), _mp(w.get("aio_client_ms")),
                      _mp(w["cold_to_result_ms"]),
                      f"{_fmt(w['speedup'])}x", f"{w['warm_runs']} / {w['submitted']}",
                      *(_fmt(med(w["stages_ms"].get(k))) for k in ("claim", "handover", "agent", "finish")),
                      _mp(w["audit_append_ms"]))
                     for rt, w in results.get("warm", {}).items()])
    out += _section("", "Is the pool filler in the way? Warm runs on an in-process host with serve's "
                    "settings (no admin socket), server side, median / p95 ms: the filler refilling during "
                    "each run (as serve does) against the filler paused.",
                    ("runtime", "filler refilling", "filler paused"),
                    [(rt, _mp(w["filler_probe_ms"]["refilling"]), _mp(w["filler_probe_ms"]["paused"]))
                     for rt, w in results.get("warm", {}).items()])
    out += ["", f"Reproduce: `{results['command']}`", ""]
    return "\n".join(out)


__all__ = ["BUSY_LOAD", "SECTIONS", "machine_facts", "med", "ratio", "render", "summary", "targets"]
