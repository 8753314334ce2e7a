"""Hostile-suite fixtures and the ledger: each attack or fault is recorded as expected vs observed.

Why a ledger and not bare asserts: one sandbox run can try many attacks, and the security report
(docs/security-report.md, written when AGENTNODE_SECURITY_REPORT names a path; see scripts/security-report)
must list every one of them with what was seen. A test records each attempt with `ledger.attack(...)` or
`ledger.fault(...)`; any attempt recorded as not contained fails the test after its body ran, so nothing is
softened: the report and the test verdict come from the same facts.

Every row's `ok` is computed from what was observed, never a constant. A probe that broke (raised, printed
nothing, never wrote what it should have) is a failure, not containment: an error counts as a refusal only
when it is the refusal expected (EROFS/EACCES/EPERM, a named wire reason), and where "nothing seen" could
come from a probe that cannot see, the row also requires a positive control (the same probe seeing the thing
where it is permitted, or a sentinel showing the probe ran to its end).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

import host.runtime.wiring
from host.core.owner import owner_token
from host.engine.labels import LABEL_OWNER, LABEL_SLUG
from host.runtime.runner import RunResult, SandboxHost
from host.tools.gate import ToolGate
from tests.conftest import REQUIRE_DOCKER
from tests.support import fake_llm
from tests.support.engine import (
    RUNSC_MISSING,
    TEST_RUNTIMES,
    containers_with,
    docker_client,
    engine_client,
    engine_kind,
    leftover_containers,
    pinned_image,
    runsc_available,
    runtime,
)
from tests.support.fake_llm import FakeLlmServer
from tests.support.host_state import HostState
from tests.support.packs import write_agent
from tests.support.paths import REPO

# fixtures from tests.support.engine
__all__ = ["docker_client", "engine_client", "engine_kind", "pinned_image", "runtime"]

CANARY = "sk-canary-hostile-4c1f9e07d2b8a6"
"""The host's API key in every hostile test: any sighting outside the provider request is a leak."""
PROVIDER_SECRET = fake_llm.SECRET_IN_ERROR_BODY
"""What the fake provider plants in error bodies (tests also add CANARY to them)."""
TOOLPACK = "hostile-tools"
HOST_TOOL_TIMEOUT = 5.0
"""The tool timeout hostile tests give the host (its default is 60 s; the mechanism is the same)."""

_SUITE_STARTED = time.monotonic()
_ENTRIES: list[Entry] = []
_METRICS: Counter[str] = Counter()
_TESTS: list[dict[str, str]] = []
_LEDGER_FAILURE = "not contained / not failed closed"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "soak: long sequential/concurrent run series (part of CI and of scripts/security-report)"
    )


# --- the ledger ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One attack, fault or soak check: what was expected, what was observed, and whether they agree."""

    kind: str  # "attack" | "fault" | "soak"
    id: str
    runtime: str
    expected: str
    observed: str
    ok: bool
    test: str


@dataclass
class Ledger:
    """Per-test recorder; `failures` turn into one assertion error once the test body has run."""

    test: str
    runtime: str
    entries: list[Entry] = field(default_factory=list)

    def _add(self, kind: str, id: str, expected: str, observed: str, ok: bool) -> bool:
        entry = Entry(kind, id, self.runtime, expected, scrub(observed), bool(ok), self.test)
        self.entries.append(entry)
        _ENTRIES.append(entry)
        return entry.ok

    def attack(self, id: str, *, expected: str, observed: str, ok: bool) -> bool:
        """Record an attack; `ok` means it was contained."""
        return self._add("attack", id, expected, observed, ok)

    def fault(self, id: str, *, expected: str, observed: str, ok: bool) -> bool:
        """Record an injected fault; `ok` means the host failed closed as expected."""
        return self._add("fault", id, expected, observed, ok)

    def soak(self, id: str, *, expected: str, observed: str, ok: bool) -> bool:
        """Record one soak property."""
        return self._add("soak", id, expected, observed, ok)

    def count(self, metric: str, n: int) -> None:
        """Add to a suite total (canary_sightings, leftovers)."""
        _METRICS[metric] += n

    @property
    def failures(self) -> list[Entry]:
        return [e for e in self.entries if not e.ok]


def scrub(text: str) -> str:
    """The report must never carry a secret, even when a test found one."""
    return text.replace(CANARY, "<CANARY>").replace(PROVIDER_SECRET, "<PROVIDER-SECRET>")


def sightings(text: str) -> int:
    """How often a planted secret appears in `text`."""
    return text.count(CANARY) + text.count(PROVIDER_SECRET)


def _runtime_of(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return str(callspec.params.get("runtime", "host")) if callspec is not None else "host"


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> Ledger:
    return Ledger(test=request.node.nodeid, runtime=_runtime_of(request.node))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """After the body ran: every attack not contained and every fault not failed closed fails the test."""
    result = yield
    book = item.funcargs.get("ledger") if hasattr(item, "funcargs") else None
    if isinstance(book, Ledger) and book.failures:
        lines = [f"{e.kind} {e.id}: expected {e.expected!r}; observed {e.observed!r}" for e in book.failures]
        raise AssertionError(f"{_LEDGER_FAILURE}:\n  " + "\n  ".join(lines))
    return result


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.failed or (report.when == "setup" and report.skipped):
        message = ""
        if report.failed or report.skipped:
            text = str(report.longrepr or "")
            lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")] or text.splitlines()[
                -1:
            ]
            message = scrub(" ".join(lines[:4]))[:400]
        _TESTS.append({"test": report.nodeid, "when": report.when, "outcome": report.outcome, "msg": message})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("AGENTNODE_SECURITY_REPORT")
    if target and (_ENTRIES or _TESTS):
        Path(target).write_text(render_report(time.monotonic() - _SUITE_STARTED))


def _setup() -> str:
    """Which kernel, engine and gVisor the report describes."""
    parts = [f"Kernel {os.uname().release}"]
    with contextlib.suppress(Exception):
        client = docker.from_env(timeout=10)
        parts.append(f"Docker {client.version().get('Version', '?')}")
        client.close()
    with contextlib.suppress(OSError, IndexError, subprocess.SubprocessError):
        version = subprocess.run(
            ["runsc", "--version"], capture_output=True, text=True, timeout=10, check=True
        )
        parts.append(version.stdout.splitlines()[0])
    return "; ".join(parts) + "."


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_report(seconds: float) -> str:
    """docs/security-report.md: totals first, then attack/fault → expected → observed per runtime."""
    attacks = [e for e in _ENTRIES if e.kind == "attack"]
    faults = [e for e in _ENTRIES if e.kind == "fault"]
    soaks = [e for e in _ENTRIES if e.kind == "soak"]
    failed_tests = [t for t in _TESTS if t["outcome"] == "failed"]
    passed = sum(1 for t in _TESTS if t["when"] == "call" and t["outcome"] == "passed")
    runtimes = sorted({e.runtime for e in _ENTRIES}, key=lambda r: (r == "host", r))
    out = [
        "# Security report: hostile agents and injected faults",
        "",
        "Generated by `scripts/security-report` (runs `tests/hostile/` under runc and runsc against the real "
        "engine); do not edit by hand. Each attack runs as a real agent pack in a real sandbox container; "
        "each fault is injected on the host side.",
        "",
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}; suite time {seconds / 60:.1f} min "
        f"on {os.cpu_count()} CPUs; tests: {passed} passed, {len(failed_tests)} failed. {_setup()}",
        "",
        "## Totals",
        "",
        "| measure | value |",
        "|---|---|",
        f"| attacks tried (distinct / tries) | {len({e.id for e in attacks})} / {len(attacks)} |",
        f"| attacks contained | {sum(e.ok for e in attacks)} / {len(attacks)} |",
        f"| faults injected (distinct / injections) | {len({e.id for e in faults})} / {len(faults)} |",
        f"| faults failed closed | {sum(e.ok for e in faults)} / {len(faults)} |",
        f"| soak checks passed | {sum(e.ok for e in soaks)} / {len(soaks)} |",
        f"| canary sightings | {_METRICS['canary_sightings']} |",
        f"| leftovers (containers, volumes, run dirs, threads, fds) | {_METRICS['leftovers']} |",
        "",
    ]
    not_ok = [e for e in _ENTRIES if not e.ok]
    if not_ok:
        out += ["## Not contained / not failed closed", ""]
        out += [
            f"- **{e.id}** ({e.runtime}): expected {_cell(e.expected)}; observed {_cell(e.observed)}"
            for e in not_ok
        ]
        out.append("")
    if failed_tests:
        out += ["## Failed tests", ""]
        out += [
            f"- `{t['test']}` ({t['when']})"
            + (" (see above)" if _LEDGER_FAILURE in t["msg"] else f": {_cell(t['msg'])}")
            for t in failed_tests
        ]
        out.append("")
    for rt in runtimes:
        out += [
            f"## Runtime: {rt}",
            "",
            "| kind | attack / fault | expected | observed | verdict |",
            "|---|---|---|---|---|",
        ]
        for e in sorted((e for e in _ENTRIES if e.runtime == rt), key=lambda e: (e.kind, e.id)):
            verdict = (
                ("contained" if e.kind == "attack" else "failed closed" if e.kind == "fault" else "ok")
                if e.ok
                else "**NOT OK**"
            )
            out.append(f"| {e.kind} | {e.id} | {_cell(e.expected)} | {_cell(e.observed)} | {verdict} |")
        out.append("")
    return "\n".join(out)


STUBS = r"""
import json, os, socket, threading
from collections import Counter
import grpc
from sandbox_wrapper.protocol import (
    llm_pb2, llm_pb2_grpc, session_pb2, session_pb2_grpc, tools_pb2, tools_pb2_grpc)

PATH = os.environ["AGENTNODE_SOCKET"]

def channel():
    big = 64 << 20
    return grpc.insecure_channel("unix:" + PATH, options=[
        ("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big)])

def status(call):
    try:
        call()
        return {"ok": True}
    except grpc.RpcError as err:
        reason = next((v for k, v in (err.trailing_metadata() or ()) if k == "agentnode-reason"), "")
        return {"ok": False, "code": err.code().name, "reason": reason}

def tool(stub, arguments_json, slug="hostile-tools", name="count"):
    request = tools_pb2.RunToolRequest(package_slug=slug, tool_name=name, arguments_json=arguments_json)
    return lambda: stub.RunTool(request, timeout=30)
"""
"""Agent-side prelude for agents that open their own channel with the generated stubs."""


# --- the lab: an isolated host with a canary key, a spy toolpack and a fake provider ----------------------

TOOLPACK_SOURCE = '''
"""hostile-tools: host-side tools that log every call, so tests see exactly what reached the host."""
import json, os, signal, time

LOG = __TOOL_LOG__


def _note(tool, **extra):
    with open(LOG, "a") as fh:
        fh.write(json.dumps({"tool": tool, "pid": os.getpid(), "t": time.time(), **extra}) + "\\n")


def echo(**kwargs):
    _note("echo", keys=sorted(kwargs))
    return {"kwargs": kwargs}


def count(**kwargs):
    _note("count")
    time.sleep(0.2)
    return {"counted": True}


def nap(seconds=1.0, **kwargs):
    _note("nap", seconds=seconds)
    time.sleep(float(seconds))
    _note("nap_done")
    return {"slept": seconds}


def boom(**kwargs):
    _note("boom")
    raise ValueError("tool failure text: " + os.environ.get("OPENAI_API_KEY", "no key in the tool env"))


def crash(**kwargs):
    _note("crash")
    os.kill(os.getpid(), signal.SIGKILL)


def environ(**kwargs):
    _note("environ")
    return dict(os.environ)
'''

TOOLPACK_MANIFEST = f"""
package_id: {TOOLPACK}
version: "1.0.0"
package_type: toolpack
entrypoint: hostile_tools
capabilities:
  tools:
""" + "".join(
    f'    - {{name: {name}, entrypoint: "hostile_tools:{name}", description: "{name}"}}\n'
    for name in ("echo", "count", "nap", "boom", "crash", "environ")
)


def write_toolpack(parent: Path, tool_log: Path) -> Path:
    """The spy toolpack under `parent`, logging every call to `tool_log`; returns its directory."""
    pack = parent / TOOLPACK
    pack.mkdir(parents=True)
    (pack / "hostile_tools.py").write_text(TOOLPACK_SOURCE.replace("__TOOL_LOG__", repr(str(tool_log))))
    (pack / "agentnode.yaml").write_text(TOOLPACK_MANIFEST)
    return pack


class Lab:
    """One isolated host (config, lockfile, audit, run-dir root) with the canary key in its environment."""

    def __init__(
        self, root: Path, image: str, client: docker.DockerClient, runtime: str, llm: FakeLlmServer
    ) -> None:
        root.mkdir(parents=True)
        self.root = root
        self.client = client
        self.runtime = runtime
        self.llm = llm
        self.state = HostState(root, image, client)
        # Short and private: a Unix socket path must fit in 108 bytes, and leftovers must be ours alone.
        self.run_root = Path(tempfile.mkdtemp(prefix="anh-", dir="/tmp"))
        self.tool_log = root / "tool-calls.jsonl"
        self.tool_log.touch()
        self.state.env.update(
            AGENTNODE_RUN_DIR=str(self.run_root), OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=llm.base_url_openai
        )
        self.config: dict[str, Any] = {"llm": {"timeout_seconds": 2}}
        self.state.write_config(self.config)
        self.volumes: set[str] = set()
        self.hosts: list[SandboxHost] = []
        self.sightings = 0
        self._install_toolpack()

    def _install_toolpack(self) -> None:
        self.state.install(write_toolpack(self.root / "packs", self.tool_log), trust="trusted")

    def configure(self, **agent_sandbox: Any) -> None:
        """Merge keys into agent_sandbox of the host config (hosts created afterwards read it)."""
        self.config.update(agent_sandbox)
        self.state.write_config(self.config)

    def agent(
        self,
        slug: str,
        source: str,
        *,
        max_runtime_seconds: int = 60,
        max_tool_calls: int = 40,
        llm_calls: int | None = None,
        stop_on_consecutive_errors: int | None = None,
    ) -> str:
        """Install an agent pack (unverified: always sandboxed) whose `agent.run` is `source`."""
        llm = (
            f"  llm_access: {{enabled: true, max_calls: {llm_calls}, max_input_chars: 20000, "
            "max_output_chars: 20000}\n"
            if llm_calls
            else ""
        )
        agent = (
            f"  tool_access: {{allowed_packages: [{TOOLPACK}]}}\n"
            f"  limits: {{max_tool_calls: {max_tool_calls}, max_runtime_seconds: {max_runtime_seconds}}}\n"
            + llm
            + (
                f"  termination: {{stop_on_consecutive_errors: {stop_on_consecutive_errors}}}\n"
                if stop_on_consecutive_errors
                else ""
            )
        )
        pack = write_agent(self.root / "packs", slug, source, goal="hostile", agent=agent)
        entry = self.state.install(pack)
        if entry.sandbox_volume:
            self.volumes.add(entry.sandbox_volume)
        return slug

    def host(self, **kwargs: Any) -> SandboxHost:
        host = self.state.host(**kwargs)
        self.hosts.append(host)
        return host

    def run(self, slug: str, *, host: SandboxHost | None = None, **kwargs: Any) -> RunResult:
        """One run under this lab's runtime; every result is searched for the planted secrets."""
        result = (host or self.host()).run(slug, runtime=self.runtime, **kwargs)
        self.sightings += sightings(json.dumps(result.to_json(), default=str))
        return result

    def tool_calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        lines = self.tool_log.read_text().splitlines()
        calls = [json.loads(line) for line in lines if line.strip()]
        return [c for c in calls if tool is None or c["tool"] == tool]

    def wait_for_tool(self, tool: str, timeout: float = 60.0) -> None:
        """Block until the host-side tool `tool` has started (the agent is mid-call)."""
        deadline = time.monotonic() + timeout
        while not self.tool_calls(tool):
            if time.monotonic() > deadline:
                raise AssertionError(f"the agent never called {tool}")
            time.sleep(0.05)

    def audit(self) -> list[dict[str, Any]]:
        return self.state.audit()

    def run_dirs(self) -> list[str]:
        """Everything under this lab's run-dir root (directories and any owner records beside them)."""
        return sorted(p.name for p in self.run_root.iterdir()) if self.run_root.exists() else []

    def live_run_dirs(self) -> list[Path]:
        """The run directories (one per live run) under this lab's root."""
        return sorted(p for p in self.run_root.iterdir() if p.is_dir()) if self.run_root.exists() else []

    def containers(self, slug: str, *, all_owners: bool = False) -> list[Any]:
        labels = [f"{LABEL_SLUG}={slug}"] + ([] if all_owners else [f"{LABEL_OWNER}={owner_token()}"])
        return containers_with(self.client, labels)

    def wait_for_container(self, slug: str, timeout: float = 60.0, *, all_owners: bool = False) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [c for c in self.containers(slug, all_owners=all_owners) if c.status == "running"]
            if running:
                return running[0]
            time.sleep(0.05)
        raise AssertionError(f"no running container for {slug}")

    def close(self) -> tuple[int, list[str]]:
        """Close hosts and count secrets in the audit and tool logs; returns (sightings, leftovers)."""
        for each in self.hosts:
            each.close()
        audit_file = self.state.dir / "audit.jsonl"
        texts = [self.tool_log.read_text()]
        if audit_file.is_file():
            texts.append(audit_file.read_text())
        self.sightings += sum(sightings(t) for t in texts)
        leftovers = [f"run dir {name}" for name in self.run_dirs()]
        shutil.rmtree(self.run_root, ignore_errors=True)
        for name in self.volumes:
            with contextlib.suppress(docker.errors.APIError):
                self.client.volumes.get(name).remove()
        self.state.remove_volumes()  # those installed another way (the CLI) as well
        self.state.engine.close()
        return self.sightings, leftovers


@pytest.fixture
def llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


@pytest.fixture
def make_lab(
    *,
    tmp_path: Path,
    pinned_image: str,
    docker_client: docker.DockerClient,
    llm: FakeLlmServer,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[str], Lab]]:
    """Labs with the canary key in HostState.env and os.environ; teardown counts sightings and leftovers."""
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    labs: list[Lab] = []

    def make(runtime: str) -> Lab:
        labs.append(Lab(tmp_path / f"lab{len(labs)}", pinned_image, docker_client, runtime, llm))
        return labs[-1]

    yield make
    found, leftovers = 0, list[str]()
    for the_lab in labs:
        n, left = the_lab.close()
        found, leftovers = found + n, leftovers + left
    ledger.count("canary_sightings", found)
    ledger.count("leftovers", len(leftovers))
    assert found == 0, f"{found} sighting(s) of a planted secret in results, logs, audit or tool log"
    assert not leftovers, f"left behind: {leftovers}"


@pytest.fixture
def lab(make_lab: Callable[[str], Lab], runtime: str) -> Lab:
    """The usual hostile-test host, under the parametrized runtime."""
    return make_lab(runtime)


@pytest.fixture
def runtime_pair(docker_client: docker.DockerClient) -> tuple[str, ...]:
    """Both runtimes where runsc is registered (it must be where Docker tests are required); on an engine
    whose pass names its runtimes (AGENTNODE_TEST_RUNTIMES, Podman's), those."""
    if "runsc" not in TEST_RUNTIMES:
        return TEST_RUNTIMES
    if runsc_available(docker_client):
        return ("runc", "runsc")
    if REQUIRE_DOCKER:
        pytest.fail(RUNSC_MISSING)
    return ("runc",)


@pytest.fixture
def short_tool_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    """Give hosts created afterwards a HOST_TOOL_TIMEOUT tool timeout instead of the 60 s default."""
    timed = functools.partial(ToolGate, tool_timeout=HOST_TOOL_TIMEOUT)
    monkeypatch.setattr(host.runtime.wiring, "ToolGate", timed)
    return HOST_TOOL_TIMEOUT


@pytest.fixture(autouse=True)
def _no_leftover_containers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Containers this process created are gone after each test; a leftover fails the test and is counted."""
    yield
    leftovers = leftover_containers(request)
    _METRICS["leftovers"] += len(leftovers)
    assert not leftovers, f"containers left behind: {leftovers}"


# --- small helpers shared by the test modules ------------------------------------------------------------


class HostListener:
    """A TCP listener on the host's loopback that counts connections (an agent must never reach it)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def rss_bytes() -> int:
    """This process's resident set size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def host_subprocess(code: str, *args: str) -> subprocess.Popen[str]:
    """A separate host process (a real SandboxHost in its own interpreter), for killing mid-run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "python"), "-c", code, *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def brief(value: Any, limit: int = 240) -> str:
    """A compact one-line rendering of an observation for the report."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
