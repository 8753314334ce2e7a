"""Cost attacks (red-team issue 12): requests that are refused must be refused before they cost the host.

Every attack runs in a real sandbox while an innocent run on the same host makes ordinary tool calls; the
test process is the host, so its CPU time, RSS and descriptors during the attack are the host's cost.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from host.llm.admission import MAX_MESSAGES
from host.runtime.rpcwire import Call
from host.runtime.runner import RunResult, SandboxHost
from host.runtime.runserver import HANDSHAKE_TIMEOUT_MS, MAX_CONNECTIONS_PER_RUN, _RunServices
from host.runtime.session import REFUSAL_BURST, REFUSAL_REFILL_PER_SECOND, RunSession
from tests.hostile.conftest import CANARY, STUBS, Lab, Ledger, brief, rss_bytes

pytestmark = pytest.mark.docker

MiB = 1 << 20
INNOCENT_SLOWDOWN = 5
"""How much slower an innocent run's median tool call may be during an attack than the same agent's alone,
on the same host and runtime just before (the report's harm was 50x)."""
INNOCENT_MEDIAN_FLOOR_S = 0.03
"""A median under this passes whatever the baseline: timings on a shared 2-core machine move 2x between
runs, and 5x a baseline of a few milliseconds would bound noise. An echo takes 2-3 ms alone here (5-7 ms
at worst during these attacks), so this is ~10-15x the baseline: a 50x slowdown (100-150 ms) fails."""
INNOCENT_MAX_S = 0.5
"""The slowest single innocent tool call allowed during an attack. Measured 2-120 ms when this file runs
alone; it reached ~0.9 s while 1 MiB of `[[],[],...]` tool arguments was still parsed into ~340,000 lists
(full garbage collections over the whole heap, holding the GIL), which host/core/strictjson.py now refuses by
counting containers before parsing. The median bound is what catches a sustained slowdown; this one
catches a stall like decoding one 4 MB CallLlm (~24 s in the report)."""
ACCEPT_SLACK = 2
"""Connections past the bound are accepted and closed at once: a sample can catch one in between."""
RUN_FDS = 32
"""Descriptors one run may cost the host besides its socket's connections (listener, pollers, the engine's
streams, a tool worker's pipes); the innocent run and the attacker each count."""

INNOCENT = r"""
import time

def run(context, calls=6, pause=0.3, **kwargs):
    latencies = []
    for i in range(calls):
        started = time.monotonic()
        r = context.run_tool("hostile-tools", "echo", i=i)
        latencies.append(round(time.monotonic() - started, 3))
        if not r.success:
            raise RuntimeError("an innocent tool call failed: " + str(r.error))
        time.sleep(pause)
    return {"latencies": latencies}
"""

COST_ATTACKER = (
    STUBS
    + r"""
import time
from concurrent.futures import ThreadPoolExecutor

EMPTY = b"\x0a\x00" * 2_000_000           # a 4 MB CallLlmRequest: two million empty messages
NOT_AN_OBJECT = "[" + "[]," * 340_000 + "[]]"   # ~1 MiB of valid JSON that is refused once parsed

def run(context, seconds=6, **kwargs):
    ch = channel()
    llm = ch.unary_unary("/agentnode.sandbox.v1.LlmService/CallLlm")
    tools = tools_pb2_grpc.ToolServiceStub(ch)
    seen, calls, sent = Counter(), 0, 0
    def one(i):
        if i % 2:
            return status(lambda: llm(EMPTY, timeout=60)), len(EMPTY)
        return status(tool(tools, NOT_AN_OBJECT, name="echo")), len(NOT_AN_OBJECT)
    end = time.monotonic() + seconds
    with ThreadPoolExecutor(8) as pool:
        while time.monotonic() < end:
            for r, size in pool.map(one, range(8)):
                seen[f"{r.get('code', 'OK')}/{r.get('reason', '')}"] += 1
                calls, sent = calls + 1, sent + size
    ch.close()
    return {"calls": calls, "sent_mib": round(sent / 2**20), "seen": dict(seen)}
"""
)

LLM_FLOODER = (
    STUBS
    + r"""
def frame(payload):
    n, prefix = len(payload), b""
    while n >= 0x80:
        prefix, n = prefix + bytes([(n & 0x7F) | 0x80]), n >> 7
    return b"\x0a" + prefix + bytes([n]) + payload

def messages(n, role="user", content=""):
    return frame(llm_pb2.ChatMessage(role=role, content=content).SerializeToString()) * n

def run(context, **kwargs):
    ch = channel()
    raw = ch.unary_unary("/agentnode.sandbox.v1.LlmService/CallLlm")
    shapes = {
        "two_million_empty": b"\x0a\x00" * 2_000_000,
        "three_thousand_empty": messages(3000),
        "max_messages_empty": messages(__MAX__),
        "empty_system_flood": messages(__MAX__ - 1, "system") + messages(1, "user", "hi"),
        "contents_fit_but_not_roles": messages(__MAX__, "user", "x" * 75),  # 19,200 content chars
        # Characters that fit the cap but not the bytes they are sent as: \u0001 is 6, an emoji 4 (UTF-8).
        "controls_fit_only_as_chars": messages(1, "user", "\x01" * 4000),
        "emoji_fit_only_as_chars": messages(1, "user", "\U0001f600" * 6000),
        "quotes_that_fit_escaped": messages(1, "user", '"' * 9000),  # 18,000 bytes escaped
    }
    out = {name: status(lambda b=body: raw(b, timeout=30)) for name, body in shapes.items()}
    ch.close()
    return out
""".replace("__MAX__", str(MAX_MESSAGES))
)

NON_FINITE = (
    STUBS
    + r"""
def run(context, **kwargs):
    ch = channel()
    tools = tools_pb2_grpc.ToolServiceStub(ch)
    out = {name: status(tool(tools, text, name="echo")) for name, text in (
        ("1e999", '{"x": 1e999}'), ("neg_1e999", '{"x": [-1e999]}'), ("1E400", '{"x": 1E400}'),
        ("nan", '{"x": NaN}'))}
    r = context.run_tool("hostile-tools", "echo", x=float("inf"))
    out["context_inf"] = {"ok": r.success, "reason": (r.error or "").split(":")[0]}
    ch.close()
    return out
"""
)

NON_FINITE_REPORT = (
    STUBS
    + r"""
def run(context, **kwargs):
    session = session_pb2_grpc.SessionServiceStub(channel())
    session.ReportResult(session_pb2.ReportResultRequest(value_json='{"total": 1e999}'), timeout=10)
    return {"total": 1}
"""
)

IDLER = (
    STUBS
    + r"""
import time

def run(context, seconds=40, **kwargs):
    ch = channel()
    llm = llm_pb2_grpc.LlmServiceStub(ch)
    tools = tools_pb2_grpc.ToolServiceStub(ch)
    hi = llm_pb2.CallLlmRequest(messages=[llm_pb2.ChatMessage(role="user", content="hi")])
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        status(lambda: llm.CallLlm(hi, timeout=5))           # LLM_NOT_GRANTED
        status(tool(tools, "{}", slug="not-on-the-list"))    # TOOL_NOT_ALLOWED, then throttled
        n += 2
        if n % 200 == 0:
            print("refused calls so far:", n, flush=True)
        time.sleep(0.002)
    return {"refused_calls": n}
"""
)

CONNECTION_FLOOD = r"""
import json, os, socket, time

PATH = os.environ["AGENTNODE_SOCKET"]

def flood(seconds, per_round):
    connected = closed_by_host = failed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        held = []
        for _ in range(per_round):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            try:
                s.connect(PATH)
                held.append(s)
            except OSError:
                failed += 1
                s.close()
        connected += len(held)
        time.sleep(0.2)
        for s in held:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed_by_host += 1
            except BlockingIOError:
                pass
            except OSError:
                closed_by_host += 1
            s.close()
    return {"connected": connected, "closed_by_host": closed_by_host, "failed": failed}

def run(context, procs=8, seconds=6, per_round=200, **kwargs):
    read_end, write_end = os.pipe()
    pids = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            os.write(write_end, (json.dumps(flood(seconds, per_round)) + "\n").encode())
            os._exit(0)
        pids.append(pid)
    os.close(write_end)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(read_end) as fh:
        counts = [json.loads(line) for line in fh]
    total = {k: sum(c[k] for c in counts) for k in ("connected", "closed_by_host", "failed")}
    after = context.run_tool("hostile-tools", "echo", after=True)   # the wrapper's own connection
    return {"flood": total, "after_flood_call_ok": after.success}
"""


# --- measuring the host --------------------------------------------------------------------------------


def _open_fds() -> set[str]:
    """This process's descriptors, as their link targets (e.g. "socket:[123]")."""
    targets = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            targets.add(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue
    return targets


def _sandbox_pids(container: Any) -> tuple[int, ...]:
    """One process per network namespace among the sandbox's: its init, or gVisor's sandbox and gofer."""
    container.reload()
    candidates = [int(container.attrs["State"]["Pid"])]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if container.id.encode() in (entry / "cmdline").read_bytes():
                    candidates.append(int(entry.name))
            except OSError:
                continue
    by_netns: dict[str, int] = {}
    for pid in candidates:
        try:
            by_netns.setdefault(os.readlink(f"/proc/{pid}/ns/net"), pid)
        except OSError:
            continue
    return tuple(by_netns.values())


def _socket_inodes(path: str, pids: tuple[int, ...]) -> set[str]:
    """Inodes of the Unix sockets named `path` in the sandbox's network namespaces and in the host's.

    The host's end of a connection lives in the connecting socket's namespace under the listener's path:
    the sandbox's for runc, whichever gVisor process connects on the sandbox's behalf for runsc.
    """
    inodes = set()
    for table in [f"/proc/{pid}/net/unix" for pid in pids] + ["/proc/self/net/unix"]:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) >= 8 and parts[7] == path:
                inodes.add(parts[6])
    return inodes


@dataclass
class HostMeter:
    """What the host (this process) spends while an attack runs, sampled every 20 ms."""

    socket_path: Callable[[], tuple[str, tuple[int, ...]] | None] = lambda: None
    """The attacked run's socket path and its sandbox's processes, once known."""
    cpu_s: float = 0.0
    wall_s: float = 0.0
    rss_growth: int = 0
    fds_growth: int = 0
    run_connections: int = 0
    """Most connections the attacked run's socket held on the host at once (the listener excluded)."""
    _stop: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def measure(self) -> Iterator[HostMeter]:
        rss0, fds0, cpu0 = rss_bytes(), len(os.listdir("/proc/self/fd")), time.process_time()
        wall0 = time.monotonic()
        peaks = {"rss": rss0, "fds": fds0, "conns": 0}

        def sample() -> None:
            while not self._stop.is_set():
                peaks["rss"] = max(peaks["rss"], rss_bytes())
                peaks["fds"] = max(peaks["fds"], len(os.listdir("/proc/self/fd")))
                path = self.socket_path()
                if path:
                    mine = {t[len("socket:[") : -1] for t in _open_fds() if t.startswith("socket:[")}
                    # The listener is ours too and carries the path: it is not a connection.
                    peaks["conns"] = max(peaks["conns"], len(mine & _socket_inodes(*path)) - 1)
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield self
        finally:
            self._stop.set()
            sampler.join()
            self.cpu_s = round(time.process_time() - cpu0, 2)
            self.wall_s = round(time.monotonic() - wall0, 1)
            self.rss_growth = peaks["rss"] - rss0
            self.fds_growth = peaks["fds"] - fds0
            self.run_connections = peaks["conns"]

    def view(self) -> dict[str, Any]:
        return {
            "host_cpu_s": self.cpu_s,
            "window_s": self.wall_s,
            "host_rss_growth_mib": round(self.rss_growth / MiB, 1),
            "host_fds_growth": self.fds_growth,
        }


@dataclass
class ServedMeter:
    """Host CPU (the serving thread's own time) of every tool and LLM request a run's server looked at:
    each that got past the refusal throttle, whatever it was then refused for. The original harm was
    exactly this cost: ~24 s of CPU decoding one 4 MB CallLlm, ~23 MB parsing one 1 MiB tool call."""

    by_session: dict[int, tuple[RunSession, list[tuple[str, float]]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> ServedMeter:
        for name in ("run_tool", "call_llm"):
            real = getattr(_RunServices, name)

            def timed(
                svc: _RunServices, raw: bytes, call: Call, context: Any, _real: Any = real, _name: str = name
            ) -> Any:
                started = time.thread_time()
                try:
                    return _real(svc, raw, call, context)
                finally:
                    spent = time.thread_time() - started
                    with self._lock:
                        served = self.by_session.setdefault(id(svc.session), (svc.session, []))[1]
                        served.append((_name, spent))

            monkeypatch.setattr(_RunServices, name, timed)
        return self

    def of(self, run_id: str) -> tuple[RunSession, list[tuple[str, float]]]:
        """The run's session and each request it had looked at: the method and its CPU seconds."""
        with self._lock:
            return next(
                (sess, list(cpu))
                for sess, cpu in self.by_session.values()
                if sess.task is not None and sess.task.run_id == run_id
            )


@dataclass
class Bystander:
    """An innocent run on the same host, started once the attacker's sandbox is up, and the same agent's
    latencies alone on that host just before (its baseline)."""

    result: RunResult | None = None
    baseline: list[float] = field(default_factory=list)
    finished_at: float = 0.0

    @property
    def latencies(self) -> list[float]:
        ok = self.result is not None and self.result.success
        return list(self.result.result["latencies"]) if ok and self.result else []

    @property
    def median_bound(self) -> float:
        return max(INNOCENT_SLOWDOWN * statistics.median(self.baseline or [0.0]), INNOCENT_MEDIAN_FLOOR_S)

    def ok(self) -> bool:
        lat = self.latencies
        return (
            bool(lat)
            and bool(self.baseline)
            and statistics.median(lat) <= self.median_bound
            and max(lat) <= INNOCENT_MAX_S
        )

    def view(self) -> dict[str, Any]:
        alone = {"alone_median_s": round(statistics.median(self.baseline), 3) if self.baseline else None}
        if self.result is None or not self.result.success:
            return {"innocent": None if self.result is None else self.result.error_code, **alone}
        lat = self.latencies
        return {
            **alone,
            "innocent_median_s": round(statistics.median(lat), 3),
            "innocent_max_call_s": max(lat),
            "median_bound_s": round(self.median_bound, 3),
            "innocent_calls": len(lat),
        }


INNOCENT_EXPECTED = (
    f"an innocent run on the same host succeeds during the attack: its median tool call <= max("
    f"{INNOCENT_SLOWDOWN} x its median alone on the same host just before, {INNOCENT_MEDIAN_FLOOR_S} s), "
    f"every call <= {INNOCENT_MAX_S} s (the report: 50x slower)"
)


def attack(
    lab: Lab,
    slug: str,
    *,
    host: SandboxHost,
    innocent_host: SandboxHost | None = None,
    kwargs: dict[str, Any] | None = None,
    watch_socket: bool = False,
    long_running: bool = True,
) -> tuple[RunResult, HostMeter, Bystander, float]:
    """Run `slug` while the innocent run makes tool calls; the attacker's result, the meter, the bystander
    and when the attacker's run ended (monotonic). The innocent agent first runs alone on the same host for
    its baseline (outside the meter). A `long_running` attacker's sandbox is waited for first, so the
    innocent run overlaps the attack; a short one simply runs alongside."""
    alone = lab.run("innocent", host=innocent_host or host)  # the baseline: same host, same runtime
    assert alone.success, (alone.error_code, alone.error)
    bystander = Bystander(baseline=list(alone.result["latencies"]))
    path: dict[str, tuple[str, tuple[int, ...]]] = {}
    meter = HostMeter(socket_path=lambda: path.get("socket"))
    outcome: dict[str, Any] = {}

    def attacker() -> None:
        try:
            outcome["result"] = lab.run(slug, host=host, kwargs=kwargs or {})
        finally:
            outcome["ended"] = time.monotonic()

    with meter.measure():
        known = set(lab.live_run_dirs())
        thread = threading.Thread(target=attacker)
        thread.start()
        container = lab.wait_for_container(slug) if long_running else None
        if watch_socket and container is not None:
            fresh = sorted(set(lab.live_run_dirs()) - known)
            if fresh:
                path["socket"] = (str(fresh[0] / "sandbox.sock"), _sandbox_pids(container))
        bystander.result = lab.run("innocent", host=innocent_host or host)
        bystander.finished_at = time.monotonic()
        thread.join(timeout=120)
    return outcome["result"], meter, bystander, outcome.get("ended", time.monotonic())


def _innocent(lab: Lab) -> None:
    lab.agent("innocent", INNOCENT, max_runtime_seconds=120)


# --- the attacks ---------------------------------------------------------------------------------------


SERVED_LLM_CPU_MAX_S = 0.01
"""Host CPU one looked-at CallLlm may cost. An ungranted one is refused before a byte is decoded (~0.05 ms);
decoding the two million empty messages before the grant check costs ~80 ms here (tried: this test then
fails), ~0.8 s with their conversion to Python dicts, and the report's path took ~24 s."""
SERVED_TOOL_CPU_MAX_S = 1.0
"""Host CPU one looked-at RunTool may cost: 1 MiB of argument JSON decoded, scanned and refused (its
~340,000 containers are counted, never built, by host/core/strictjson.py); the refusal budget charges it
17 tokens, so a run gets one such call looked at per ~4 s. Before the container bound: ~130-180 ms alone,
up to ~0.9 s in a process with a bigger heap. A loose guard: the tight bound is the LLM's."""
ATTACK_CPU_S = 15.0
"""Host CPU over the whole attack window: startup of both runs and the transport of every request, throttled
ones included (gRPC core receives each 4 MB before the throttle refuses it unread): measured 3.5-5.5 s for
~6.5 s. The report's ~24 s for each of eight parallel 4 MB calls is ~100 s for the first batch alone (the
window stretches with it: the attacker waits for each batch)."""


def test_refused_requests_cost_the_host_little(
    lab: Lab, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 2: 4 MB CallLlm requests of two million empty messages from a run without an LLM grant,
    and 1 MiB tool arguments refused after parsing, sent eight at a time for six seconds."""
    lab.agent("cost-attacker", COST_ATTACKER, max_runtime_seconds=120)
    _innocent(lab)
    served = ServedMeter().install(monkeypatch)
    result, meter, bystander, ended = attack(lab, "cost-attacker", host=lab.host(), kwargs={"seconds": 6})
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result
    record = next(r for r in lab.audit() if r["run_id"] == result.run_id)
    session, looked = served.of(result.run_id)
    cpu = [spent for _, spent in looked]
    llm_cpu = [spent for name, spent in looked if name == "call_llm"]
    tool_cpu = [spent for name, spent in looked if name == "run_tool"]
    assert session.tools is not None and session.llm is not None
    usage = session.llm.usage()
    # Every request the server looked at was counted by the gate or the LLM session; every one it did not
    # was either throttled unread (session.throttled) or shed by gRPC before reaching Python.
    looked_at = session.tools.refusals + session.tools.calls_made + usage["requests"]
    seen = out["seen"]
    throttled = seen.get("RESOURCE_EXHAUSTED/TOO_MANY_REFUSALS", 0)
    # Tokens the attacker could spend: the burst, the refill over the window, a burst of debt, 8 in flight.
    affordable = 2 * REFUSAL_BURST + REFUSAL_REFILL_PER_SECOND * meter.wall_s + 8
    cost = {
        "looked_at": len(cpu),
        "throttled": session.throttled,
        "llm_cpu_max_ms": round(1000 * max(llm_cpu, default=0.0), 2),
        "tool_cpu_max_ms": round(1000 * max(tool_cpu, default=0.0), 1),
        "served_cpu_mean_ms": round(1000 * statistics.fmean(cpu or [0.0]), 1),
        "served_cpu_total_s": round(sum(cpu), 2),
        "host_cpu_ms_per_call": round(1000 * meter.cpu_s / max(1, out["calls"]), 2),
    }
    allowed = {"INVALID_ARGUMENT/INVALID_REQUEST", "PERMISSION_DENIED/LLM_NOT_GRANTED"}
    allowed |= {"RESOURCE_EXHAUSTED/TOO_MANY_REFUSALS", "RESOURCE_EXHAUSTED/"}
    ledger.attack(
        "cost.refused_requests_before_work",
        expected="4 MB ungranted CallLlm and 1 MiB refused tool calls (8 in parallel, 6 s) are refused "
        f"(grant first; a per-run refusal budget of {REFUSAL_BURST} tokens + "
        f"{REFUSAL_REFILL_PER_SECOND:g}/s, one a refusal plus one per 64 KiB decoded; the rest refused "
        "unread); each request the host looked "
        f"at costs <= {SERVED_LLM_CPU_MAX_S * 1000:g} ms of host CPU for a CallLlm, <= "
        f"{SERVED_TOOL_CPU_MAX_S * 1000:g} ms for a RunTool "
        f"and the whole window <= {ATTACK_CPU_S:g} s, RSS growth < 256 MiB (the report: ~24 s and ~500 MB "
        "a call, ~4 GB for eight); no tool runs",
        observed=brief({**cost, **meter.view(), **out}, limit=700),
        ok=set(seen) <= allowed
        and throttled > 0
        and throttled == session.throttled
        and len(cpu) == looked_at <= affordable
        and max(llm_cpu, default=0.0) <= SERVED_LLM_CPU_MAX_S
        and max(tool_cpu, default=0.0) <= SERVED_TOOL_CPU_MAX_S
        and meter.cpu_s <= ATTACK_CPU_S
        and meter.rss_growth < 256 * MiB
        and usage["calls"] == 0
        and not [c for c in lab.tool_calls("echo") if "i" not in c.get("keys", [])]
        and any("i" in c.get("keys", []) for c in lab.tool_calls("echo"))  # the log saw the innocent's
        and record.get("tool_calls", 0) == 0,
    )
    ledger.attack(
        "cost.innocent_run_under_refusal_flood",
        expected=INNOCENT_EXPECTED + ", overlapping the flood",
        observed=brief({**bystander.view(), "overlapped": bystander.finished_at < ended}),
        ok=bystander.ok() and bystander.finished_at < ended,
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_llm_input_cap_counts_what_is_sent(lab: Lab, ledger: Ledger, provider: str) -> None:
    """Finding 3: empty messages counted nothing against the cap; Anthropic's joined system prompt of
    empty messages counted as one character."""
    if provider == "anthropic":
        lab.state.env.update(ANTHROPIC_API_KEY=CANARY, ANTHROPIC_BASE_URL=lab.llm.base_url_anthropic)
        lab.configure(llm={"timeout_seconds": 2, "provider": "anthropic"})
    lab.agent("llm-flooder", LLM_FLOODER, llm_calls=10, max_runtime_seconds=60)
    _innocent(lab)
    result, meter, bystander, _ = attack(lab, "llm-flooder", host=lab.host(), long_running=False)
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out, cap = result.result, 20000  # lab.agent grants max_input_chars: 20000
    sent = []
    for request in lab.llm.requests:
        body = request.body
        roles_and_contents = sum(len(m["role"]) + len(m["content"]) for m in body["messages"])
        chars = roles_and_contents + len(body.get("system", ""))
        size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
        sent.append({"messages": len(body["messages"]), "chars": chars, "bytes": size})
    refused = (
        "two_million_empty",
        "three_thousand_empty",
        "contents_fit_but_not_roles",
        "controls_fit_only_as_chars",
        "emoji_fit_only_as_chars",
    )
    ledger.attack(
        f"cost.llm_input_accounting.{provider}",
        expected=f"under a {cap}-character cap: 2M and 3000 empty messages, contents that fit only without "
        "their roles, and control characters or emoji that fit only as characters (not as the JSON-escaped "
        f"UTF-8 bytes sent) are LLM_INPUT_TOO_LARGE; at most {MAX_MESSAGES} messages, <= cap characters and "
        "<= cap + 25 a message + 256 bytes of body reach the provider",
        observed=brief({"agent": {k: v.get("reason") or "ok" for k, v in out.items()}, "provider": sent}),
        ok=all(out[name].get("reason") == "LLM_INPUT_TOO_LARGE" for name in refused)
        and out["max_messages_empty"]["ok"]
        and out["empty_system_flood"]["ok"]
        and out["quotes_that_fit_escaped"]["ok"]
        and len(sent) == 3
        and all(
            s["messages"] <= MAX_MESSAGES
            and s["chars"] <= cap
            and s["bytes"] <= cap + 25 * s["messages"] + 256
            for s in sent
        ),
    )
    ledger.attack(
        f"cost.innocent_run_during_llm_flood.{provider}",
        expected=INNOCENT_EXPECTED + "; host RSS grows < 256 MiB",
        observed=brief({**bystander.view(), **meter.view()}),
        ok=bystander.ok() and meter.rss_growth < 256 * MiB,
    )


def test_non_finite_numbers_never_cross(lab: Lab, ledger: Ledger) -> None:
    """Finding 8: `1e999` passed the NaN/Infinity ban into tools and `run --json` printed Infinity."""
    lab.agent("non-finite", NON_FINITE, max_runtime_seconds=60)
    lab.agent("non-finite-report", NON_FINITE_REPORT, max_runtime_seconds=60)
    _innocent(lab)
    host = lab.host()
    result, meter, bystander, _ = attack(lab, "non-finite", host=host, long_running=False)
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result
    reported = lab.run("non-finite-report", host=host)
    printed = json.dumps(reported.to_json(), allow_nan=False)  # what `run --json` prints: strict JSON
    reached = [c for c in lab.tool_calls("echo") if "x" in c.get("keys", [])]
    refusals = [out[k] for k in ("1e999", "neg_1e999", "1E400", "nan")]
    ledger.attack(
        "cost.non_finite_numbers",
        expected="1e999, -1e999, 1E400 and NaN tool arguments are INVALID_REQUEST before any schema or tool; "
        "the wrapper refuses to send inf; a reported 1e999 ends the run as result_not_serializable and "
        "`run --json` stays strict JSON",
        observed=brief(
            {
                "agent": out,
                "reported": reported.error_code or "completed",
                "tool_saw": len(reached),
                "infinity_printed": "Infinity" in printed,
            }
        ),
        ok=all(r.get("code") == "INVALID_ARGUMENT" and r.get("reason") == "INVALID_REQUEST" for r in refusals)
        and out["context_inf"] == {"ok": False, "reason": "INVALID_REQUEST"}
        and not reported.success
        and reported.error_code == "result_not_serializable"
        and not reached
        and any("i" in c.get("keys", []) for c in lab.tool_calls("echo"))  # the log saw the innocent's
        and "Infinity" not in printed,
    )
    ledger.attack(
        "cost.innocent_run_during_non_finite",
        expected=INNOCENT_EXPECTED,
        observed=brief({**bystander.view(), **meter.view()}),
        ok=bystander.ok(),
    )


def test_refused_calls_do_not_keep_a_run_alive(lab: Lab, ledger: Ledger) -> None:
    """Finding 9: every call, refused or not, reset the idle clock, so an agent spamming refused calls
    was never killed as idle."""
    _innocent(lab)
    innocent_host = lab.host()  # the default idle limit
    idle = 5
    lab.configure(idle_timeout_seconds=idle)
    lab.agent("idler", IDLER, max_runtime_seconds=60)
    started = time.monotonic()
    result, meter, bystander, ended = attack(
        lab, "idler", host=lab.host(), innocent_host=innocent_host, kwargs={"seconds": 40}
    )
    took = round(ended - started, 1)
    spammed = max((int(n) for n in re.findall(r"refused calls so far: (\d+)", result.logs)), default=0)
    ledger.attack(
        "cost.refused_calls_are_not_activity",
        expected=f"an agent that only makes refused calls is killed as idle after ~{idle} s "
        "(timeout, 'made no accepted call'), long before its 40 s loop ends",
        observed=brief(
            {"code": result.error_code, "error": result.error[:80], "run_s": took, "refused_calls": spammed}
        ),
        ok=result.error_code == "timeout"
        and result.timed_out
        and "no accepted call" in result.error
        and took < 30
        and spammed > 0,
    )
    ledger.attack(
        "cost.innocent_run_during_refusal_spam",
        expected=INNOCENT_EXPECTED,
        observed=brief({**bystander.view(), **meter.view()}),
        ok=bystander.ok(),
    )


def test_a_connection_flood_costs_the_host_bounded_descriptors(lab: Lab, ledger: Ledger) -> None:
    """Bare connections from several processes in the sandbox, 200 at a time each for six seconds: gRPC
    core closes everything past the per-run bound before the HTTP/2 handshake."""
    lab.agent("conn-flooder", CONNECTION_FLOOD, max_runtime_seconds=120)
    _innocent(lab)
    # Under gVisor every guest process also costs host tasks against the 256-pids limit: fewer processes.
    procs = 8 if lab.runtime == "runc" else 3
    result, meter, bystander, ended = attack(
        lab, "conn-flooder", host=lab.host(), kwargs={"seconds": 6, "procs": procs}, watch_socket=True
    )
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result
    flood = out["flood"]
    ledger.attack(
        "cost.connection_flood",
        expected=f"thousands of bare connections: the run's socket holds <= {MAX_CONNECTIONS_PER_RUN} (+ "
        f"{ACCEPT_SLACK} being closed) on the host at once (the rest are closed at once; slots free after "
        f"{HANDSHAKE_TIMEOUT_MS} ms without a "
        f"handshake); host fds grow < 2 x {RUN_FDS} + {MAX_CONNECTIONS_PER_RUN}; the wrapper keeps working",
        observed=brief({**out, "host_run_connections_max": meter.run_connections, **meter.view()}),
        ok=flood["connected"] >= 1000
        and flood["closed_by_host"] >= 0.9 * flood["connected"]
        and 1 <= meter.run_connections <= MAX_CONNECTIONS_PER_RUN + ACCEPT_SLACK
        and meter.fds_growth < 2 * RUN_FDS + MAX_CONNECTIONS_PER_RUN
        and out["after_flood_call_ok"],
    )
    ledger.attack(
        "cost.innocent_run_during_connection_flood",
        expected=INNOCENT_EXPECTED + ", overlapping the flood",
        observed=brief({**bystander.view(), "overlapped": bystander.finished_at < ended}),
        ok=bystander.ok() and bystander.finished_at < ended,
    )

