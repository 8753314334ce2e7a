"""The runner's routing, outcomes and audit-once logic, with no daemon: agents run as local wrapper processes.

Host routes use the real host-process backend; sandbox routes use a stand-in backend that runs the same
wrapper locally (what it launches is not isolated: these tests are about the orchestrator, not isolation).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import AuditReason, EngineError
from host.policy.admission import Admission
from host.runtime.backends.hostproc import HostBackend, HostSpec
from host.runtime.result import RunResult
from host.runtime.runner import SandboxHost
from host.runtime.session import REPORT_HOLD_SECONDS, RunSession
from host.runtime.workload import Teardowns, Workload
from host.spec.config import load_config
from host.spec.lockfile import LockEntry, Lockfile

AGENT = """
import os, shutil, sys, time

def run(context, mode="ok", **kwargs):
    if mode == "ok":
        return {"ok": True, "kwargs": kwargs, "run_id": context.run_id}
    if mode == "boom":
        raise ValueError("agent-authored text")
    if mode == "exit":
        sys.stdout.flush()
        os._exit(3)
    if mode == "sleep":
        time.sleep(60)
    if mode == "lose":  # a host-path agent can reach its own run directory: it removes it
        shutil.rmtree(os.environ["HOME"])
        time.sleep(60)
    return None
"""


def _manifest(slug: str, runtime_s: int = 30) -> dict[str, Any]:
    return {
        "package_id": slug,
        "version": "1.0.0",
        "name": slug,
        "package_type": "agent",
        "agent": {
            "entrypoint": "agent_mod:run",
            "goal": "test",
            "limits": {"max_runtime_seconds": runtime_s},
        },
    }


class LocalSandbox:
    """A sandbox backend stand-in: the wrapper runs locally; claims come from a list of warm members."""

    def __init__(self, owner: str, env: dict[str, str]) -> None:
        self.inner = HostBackend(owner=owner, env=env)
        self.warm: list[Workload] = []
        self.fail_prepare: BaseException | None = None
        self.torn: list[str] = []
        self.launched: list[Any] = []

    def claim(self, admission: Admission) -> Workload | None:
        return self.warm.pop() if self.warm else None

    def prepare(self, admission: Admission) -> HostSpec:
        if self.fail_prepare is not None:
            raise self.fail_prepare
        assert admission.entry is not None and admission.entry.host_path  # the stand-in runs the host copy
        return HostSpec(slug=admission.slug, import_root=admission.entry.host_path)

    def launch(
        self, spec: HostSpec, *, run_id: str, session: RunSession | None = None, run_info: Any = None
    ) -> Workload:
        self.launched.append(self.inner.launch(spec, run_id=run_id, session=session, run_info=run_info))
        return self.launched[-1]  # a HostProcess: its `proc` is the wrapper

    def teardown(self, workload: Workload) -> None:
        self.torn.append(workload.run_id)
        workload.destroy()


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            "PATH": "/usr/bin:/bin",
            "AGENTNODE_CONFIG": str(root / "cfg"),
            "AGENTNODE_RUN_DIR": str(root / "r"),
            "AGENTNODE_AGENT_SANDBOX": "1",
        }
        (root / "cfg").mkdir()
        (root / "cfg" / "config.json").write_text(
            json.dumps({"agent_sandbox": {"image": "agentnode-sandbox:unit", "idle_timeout_seconds": 30}})
        )
        self.lockfile = Lockfile(load_config(self.env).paths.lockfile)

    def install(
        self, slug: str, trust: str, *, host_copy: bool = True, runtime_s: int = 30, kind: str = "agent"
    ) -> None:
        code = self.root / "packs" / slug
        code.mkdir(parents=True)
        (code / "agent_mod.py").write_text(AGENT)
        manifest = _manifest(slug, runtime_s)
        manifest["package_type"] = kind
        self.lockfile.put(
            LockEntry(
                slug=slug,
                version="1.0.0",
                package_type=kind,
                trust_level=trust,
                artifact_hash="a" * 64,
                import_subdir="",
                sandbox_volume=None,
                host_path=str(code) if host_copy else None,
                manifest=manifest,
                installed_at="2026-01-01T00:00:00Z",
            )
        )

    def host(self, *, async_teardown: bool = False) -> tuple[SandboxHost, LocalSandbox]:
        config = load_config(self.env)
        fake = LocalSandbox("unit", self.env)
        host = SandboxHost(config=config, env=self.env, sandbox_backend=fake, client_factory=_no_engine,
                           async_teardown=async_teardown)  # fmt: skip
        fake.inner = HostBackend(owner=host.owner, env=self.env)
        return host, fake

    def records(self) -> list[dict[str, Any]]:
        path = load_config(self.env).paths.audit_file
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def of(self, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(start records, end records) of one run."""
        records = [r for r in self.records() if r.get("run_id") == run_id]
        return [r for r in records if r["event"] == "agent_run_start"], [
            r for r in records if r["event"] == "agent_run"
        ]


def _no_engine() -> Any:
    raise AssertionError("no test here may reach a container engine")


@pytest.fixture
def lab() -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))  # short: socket paths must fit in 108 bytes
    try:
        yield Lab(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _once(lab: Lab, result: RunResult, *, started: bool) -> dict[str, Any]:
    """Exactly one end record, with the result's reason; a start record exactly when the run started."""
    starts, ends = lab.of(result.run_id)
    assert len(ends) == 1, ends
    assert len(starts) == (1 if started else 0), starts
    assert result.reason is not None and ends[0]["reason"] == result.reason.value
    return ends[0]


@pytest.mark.parametrize(
    ("trust", "source", "sandbox"),
    [
        ("trusted", "agent_host", False),
        ("curated", "agent_host", False),
        ("verified", "agent_sandbox", True),
        ("unverified", "agent_sandbox", True),
    ],
)
def test_routes_by_trust_and_audits_once(lab: Lab, trust: str, source: str, sandbox: bool) -> None:
    lab.install("a", trust)
    host, fake = lab.host()
    try:
        r = host.run("a", kwargs={"mode": "ok", "x": 1})
    finally:
        host.close()
    assert r.success and r.result["kwargs"] == {"x": 1}, r
    assert r.result["run_id"] == r.run_id  # the agent saw the id the audit records
    end = _once(lab, r, started=True)
    assert (end["source"], end["sandbox"], end["reason"], r.mode_used) == (
        source,
        sandbox,
        "agent_completed",
        source,
    )
    assert (end["runtime"], end["image"]) == (("runc", "agentnode-sandbox:unit") if sandbox else (None, None))
    assert fake.torn == ([r.run_id] if sandbox else [])


@pytest.mark.parametrize(
    ("setup", "reason", "source"),
    [
        ({"trust": "bogus"}, AuditReason.REFUSED_TRUST, "agent_host"),
        ({"trust": "trusted", "host_copy": False}, AuditReason.NOT_INSTALLED, "agent_host"),
        ({"trust": "verified", "kind": "toolpack"}, AuditReason.NOT_AN_AGENT, "agent_sandbox"),
        ({}, AuditReason.NOT_INSTALLED, "agent_sandbox"),
    ],
)
def test_refusals_never_start_and_are_audited_once(
    lab: Lab, setup: dict[str, Any], reason: AuditReason, source: str
) -> None:
    if setup:
        lab.install("a", **setup)
    host, fake = lab.host()
    try:
        r = host.run("a")
    finally:
        host.close()
    assert not r.success and r.reason is reason and r.error_code == reason.value and r.hint, r
    end = _once(lab, r, started=False)
    assert (end["source"], end["action"]) == (source, "deny")
    assert fake.torn == [] and "started" not in r.stages


def test_sandbox_off_refuses_community_agents(lab: Lab) -> None:
    lab.install("a", "unverified")
    lab.env["AGENTNODE_AGENT_SANDBOX"] = "0"
    host, _ = lab.host()
    try:
        r = host.run("a")
    finally:
        host.close()
    assert r.reason is AuditReason.REFUSED_FLAG_OFF and "AGENTNODE_AGENT_SANDBOX=1" in r.hint
    assert _once(lab, r, started=False)["source"] == "agent_sandbox"


@pytest.mark.parametrize(
    ("mode", "reason", "code", "timed_out"),
    [
        ("boom", AuditReason.AGENT_ERROR, "agent_exception", False),
        ("exit", AuditReason.EXITED_BEFORE_RESULT, "exited_before_result", False),
        ("sleep", AuditReason.TIMEOUT, "timeout", True),
        ("lose", AuditReason.SOCKET_LOST, "socket_lost", False),
    ],
)
def test_each_ending_is_named_and_audited_once(
    lab: Lab, mode: str, reason: AuditReason, code: str, timed_out: bool
) -> None:
    lab.install("a", "trusted", runtime_s=3)
    host, _ = lab.host()
    try:
        r = host.run("a", kwargs={"mode": mode})
    finally:
        host.close()
    assert (r.success, r.reason, r.error_code, r.timed_out) == (False, reason, code, timed_out), r
    end = _once(lab, r, started=True)
    assert "agent-authored" not in json.dumps(end)  # an agent's own text never reaches the audit log


def test_cancel_kills_the_run_and_says_so(lab: Lab) -> None:
    lab.install("a", "verified")
    host, fake = lab.host()
    started = threading.Event()
    ids: list[str] = []

    def on_start(run_id: str) -> None:
        ids.append(run_id)
        started.set()

    try:
        threading.Timer(0.5, lambda: started.wait(10) and host.cancel(ids[0])).start()
        r = host.run("a", kwargs={"mode": "sleep"}, on_start=on_start)
    finally:
        host.close()
    assert r.reason is AuditReason.CANCELLED and ids == [r.run_id] and fake.torn == [r.run_id]
    _once(lab, r, started=True)
    assert host.active_runs() == [] and not host.cancel(r.run_id)


def test_a_warm_member_brings_its_run_id(lab: Lab) -> None:
    lab.install("a", "verified")
    host, fake = lab.host()
    spec = HostSpec(slug="a", import_root=str(lab.root / "packs" / "a"))
    member = fake.inner.launch(spec, run_id="f" * 32)  # no session: it waits for its task
    fake.warm.append(member)
    try:
        r = host.run("a", kwargs={"mode": "ok"})
    finally:
        host.close()
    assert r.success and r.warm and r.run_id == "f" * 32 and r.result["run_id"] == "f" * 32
    assert "claimed" in r.stages and "verified" not in r.stages
    _once(lab, r, started=True)
    assert fake.torn == ["f" * 32]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            EngineError("no engine", reason=AuditReason.ENGINE_UNAVAILABLE, hint="start it"),
            AuditReason.ENGINE_UNAVAILABLE,
        ),
        (RuntimeError("secret text"), AuditReason.HOST_LOOP_ERROR),
    ],
)
def test_a_failure_before_start_fails_closed(lab: Lab, error: BaseException, reason: AuditReason) -> None:
    lab.install("a", "verified")
    host, fake = lab.host()
    fake.fail_prepare = error
    try:
        r = host.run("a")
    finally:
        host.close()
    assert not r.success and r.reason is reason and "secret text" not in r.error, r
    _once(lab, r, started=False)
    assert fake.torn == []


def test_no_start_record_no_run(lab: Lab) -> None:
    lab.install("a", "trusted")
    host, _ = lab.host()
    host.audit.close()
    audit_file = load_config(lab.env).paths.audit_file
    audit_file.unlink(missing_ok=True)
    audit_file.mkdir()  # nothing can be appended now
    try:
        r = host.run("a", kwargs={"mode": "ok"})
    finally:
        host.close()
    assert not r.success and r.reason is AuditReason.AUDIT_FAILED and "audit verify" in r.hint
    assert "started" not in r.stages and host.audit_failures == 1


def test_a_background_teardown_follows_the_audited_result_and_cannot_undo_it(lab: Lab) -> None:
    lab.install("a", "unverified")
    host, fake = lab.host(async_teardown=True)
    seen: list[int] = []
    real_submit = host.teardowns.submit

    def submit(*args: Any, **kwargs: Any) -> None:
        seen.append(len(lab.records()))  # what the audit held when the teardown was handed over
        real_submit(*args, **kwargs)
        raise RuntimeError("the engine went away")

    host.teardowns.submit = submit  # type: ignore[method-assign]
    try:
        r = host.run("a", kwargs={"mode": "ok"})
    finally:
        host.close()
    assert r.success, r
    end = _once(lab, r, started=True)
    assert end["reason"] == "agent_completed"
    assert seen == [2]  # start and end records were written before the teardown was submitted
    assert host.teardowns.failures == 1 and fake.torn == [r.run_id]


def test_a_long_lived_host_answers_the_report_once_the_end_record_is_written(lab: Lab) -> None:
    lab.install("a", "unverified")
    host, fake = lab.host(async_teardown=True)
    alive_at_end: list[bool] = []
    real_end = host.records.end

    def end(*args: Any, **kwargs: Any) -> bool:
        time.sleep(1.0)  # the wrapper reported before this: answered, it would have exited by now
        alive_at_end.append(fake.launched[0].proc.poll() is None)
        return real_end(*args, **kwargs)

    host.records.end = end  # type: ignore[method-assign]
    try:
        r = host.run("a", kwargs={"mode": "ok"})
        assert r.success, r
        assert fake.launched[0].proc.wait(timeout=10) is not None  # released: it exits (or is torn down)
    finally:
        host.close()
    assert alive_at_end == [True]
    _once(lab, r, started=True)


def test_a_held_report_is_released_even_when_the_end_record_raises(lab: Lab) -> None:
    lab.install("a", "unverified")
    host, fake = lab.host(async_teardown=True)
    def end(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("a host bug while writing the end record")

    host.records.end = end  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError):
            host.run("a", kwargs={"mode": "ok"})
        started = time.monotonic()
        fake.launched[0].proc.wait(timeout=10)
        assert time.monotonic() - started < REPORT_HOLD_SECONDS - 2  # answered, not timed out
    finally:
        host.close()


class _Recorder:
    def __init__(self) -> None:
        self.torn: list[str] = []
        self.gate = threading.Event()

    def teardown(self, workload: Any) -> None:
        self.gate.wait(10)
        self.torn.append(workload.name)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_teardowns_run_in_the_background_until_closed_then_inline() -> None:
    rec, done = _Recorder(), []
    teardowns = Teardowns(background=True)
    teardowns.submit(rec, _Named("bg"), lambda: done.append("bg"), inline=False)  # type: ignore[arg-type]
    assert rec.torn == [] and done == []  # the caller did not wait for it
    rec.gate.set()
    teardowns.submit(rec, _Named("now"), lambda: done.append("now"), inline=True)  # type: ignore[arg-type]
    assert "now" in rec.torn and done == ["now"]  # inline: torn down before submit returned
    teardowns.close()
    assert sorted(rec.torn) == ["bg", "now"]  # close waited for the background one
    teardowns.submit(rec, _Named("late"), lambda: done.append("late"), inline=False)  # type: ignore[arg-type]
    assert rec.torn[-1] == "late" and done[-1] == "late"  # after close nothing is dropped: inline
