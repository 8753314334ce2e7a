"""Runs one agent end to end: route, fail closed, serve its socket, watch its deadlines, audit it once."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from host._audit import AuditLog, run_record
from host._broker import LlmBroker, LlmSession
from host._config import HostConfig, load_config, sandbox_enabled
from host._engine import (
    SANDBOX_GID,
    SANDBOX_UID,
    ContainerLimits,
    EngineFacts,
    PidsProbe,
    classify_engine_exception,
    connect,
    container_spec,
    engine_facts,
    owner_token,
    remove_and_verify,
    require_capable,
    sweep_containers,
)
from host._errors import AuditReason, EngineError, PackError, RefusedError, SandboxError
from host._image import verify_pinned_image
from host._manifest import AgentManifest, ToolpackManifest
from host._packs import HOST_TRUST, LockEntry, Lockfile, verify_volume
from host._policy import Route, RunPolicy, resolve_run_policy, route_run
from host._rundir import make_run_dir, sweep_run_dirs
from host._session import RunSession, RunTask, build_run_server
from host._tools import InstalledToolpack, ToolGate, ToolRunner

logger = logging.getLogger("agentnode.sandbox.runner")

LOG_CAP_BYTES = 64 * 1024
"""How much of an agent's stdout/stderr the host keeps; the rest is read and dropped."""

_ENGINE_FACTS_TTL = 30.0
_EXIT_GRACE = 2.0


@dataclass
class RunResult:
    """The outcome of one run, as `run --json` prints it."""

    success: bool
    result: Any = None
    error: str = ""
    error_code: str = ""
    mode_used: str = ""
    run_id: str = ""
    timed_out: bool = False
    duration_ms: int = 0
    hint: str = ""
    logs: str = ""
    stages: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "result": self.result,
            "error": self.error or None,
            "error_code": self.error_code or None,
            "mode_used": self.mode_used,
            "run_id": self.run_id,
            "timed_out": self.timed_out,
            "duration_ms": self.duration_ms,
            "hint": self.hint or None,
            "logs": self.logs,
        }


class _CappedSink:
    """Keeps the first `cap` bytes of a stream and drops the rest, so a flooding agent costs no memory."""

    def __init__(self, cap: int = LOG_CAP_BYTES) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.cap - self.size
        if room > 0:
            self.parts.append(chunk[:room])
            self.size += min(room, len(chunk))
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        out = b"".join(self.parts).decode("utf-8", "replace")
        if self.dropped:
            out += f"\n[agentnode: {self.dropped} more bytes of output dropped]"
        return out


def _drain(chunks: Iterable[bytes], sink: _CappedSink) -> None:
    with contextlib.suppress(Exception):
        for chunk in chunks:
            sink.feed(chunk)


@dataclass
class _Run:
    """Mutable facts of one run, gathered for the result and the single audit record."""

    run_id: str
    slug: str
    started: float
    trust: str | None = None
    source: str = "agent_sandbox"
    sandbox: bool = False
    runtime: str | None = None
    image: str | None = None
    policy: RunPolicy | None = None
    llm: LlmSession | None = None
    gate: ToolGate | None = None
    stages: dict[str, float] = field(default_factory=dict)

    def mark(self, stage: str) -> None:
        self.stages[stage] = round((time.monotonic() - self.started) * 1000, 2)


class SandboxHost:
    """One host process: config, engine client, LLM broker and tool runner shared by its runs."""

    def __init__(
        self,
        *,
        config: HostConfig | None = None,
        env: Mapping[str, str] | None = None,
        client_factory: Callable[[], docker.DockerClient] | None = None,
        broker: LlmBroker | None = None,
        tool_runner: ToolRunner | None = None,
        limits: ContainerLimits | None = None,
    ) -> None:
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.config = config or load_config(self.env)
        self._client_factory = client_factory or (lambda: connect(self.env))
        self._client: docker.DockerClient | None = None
        self._facts: tuple[float, EngineFacts] | None = None
        self._lock = threading.Lock()
        self.broker = broker or LlmBroker(self.config.agent_sandbox.llm, self.env)
        self.tool_runner = tool_runner or ToolRunner()
        self.limits = limits or ContainerLimits()
        self.audit = AuditLog(self.config.paths.audit_file)
        self.lockfile = Lockfile(self.config.paths.lockfile)
        self.owner = owner_token()
        self.audit_failures = 0

    # -- engine -------------------------------------------------------------------------------------

    def client(self) -> docker.DockerClient:
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def facts(self) -> EngineFacts:
        now = time.monotonic()
        cached = self._facts
        if cached is not None and now - cached[0] < _ENGINE_FACTS_TTL:
            return cached[1]
        facts = engine_facts(self.client())
        self._facts = (now, facts)
        return facts

    def startup_sweep(self) -> list[str]:
        """Remove what a crashed host left behind (our exact labels and run directories only)."""
        removed = sweep_run_dirs(self.env)
        with contextlib.suppress(EngineError):
            removed += sweep_containers(self.client())
        return removed

    def close(self) -> None:
        self.tool_runner.close()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()

    # -- runs ---------------------------------------------------------------------------------------

    def _lookup_toolpack(self, slug: str) -> InstalledToolpack | None:
        entry = self.lockfile.get(slug)
        if entry is None or entry.package_type != "toolpack":
            return None
        manifest = entry.parsed_manifest()
        assert isinstance(manifest, ToolpackManifest)
        root = Path(entry.host_path or "/nonexistent") / entry.import_subdir
        return InstalledToolpack(
            slug=entry.slug, version=entry.version, trust=entry.trust_level, root=root, manifest=manifest
        )

    def run(
        self,
        slug: str,
        *,
        goal: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        runtime: str | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Run an installed agent; every path, refusals included, ends with exactly one audit record."""
        run = _Run(run_id=uuid.uuid4().hex, slug=slug, started=time.monotonic())
        result: RunResult
        try:
            result = self._route_and_run(run, goal, dict(kwargs or {}), runtime)
        except SandboxError as exc:
            result = RunResult(
                success=False,
                error=exc.message,
                error_code=exc.reason.value,
                hint=exc.hint,
                mode_used="agent_sandbox" if run.sandbox else run.source.replace("agent_", ""),
            )
            reason = exc.reason
        except Exception as exc:  # noqa: BLE001 (the host loop fails closed on anything)
            logger.warning("host loop error in run %s: %s", run.run_id, type(exc).__name__)
            result = RunResult(
                success=False,
                error=f"the host failed while running the agent ({type(exc).__name__})",
                error_code=AuditReason.HOST_LOOP_ERROR.value,
                hint="see the host log; check with: agentnode-sandbox doctor",
                mode_used="agent_sandbox" if run.sandbox else "agent_host",
            )
            reason = AuditReason.HOST_LOOP_ERROR
        else:
            reason = (
                AuditReason(result.error_code)
                if result.error_code in AuditReason._value2member_map_
                else (AuditReason.AGENT_COMPLETED if result.success else AuditReason.AGENT_ERROR)
            )
        result.run_id = run.run_id
        result.duration_ms = int((time.monotonic() - run.started) * 1000)
        result.stages = run.stages
        if not self._audit(run, result, reason):
            self.audit_failures += 1
        if on_stage is not None:
            on_stage("done")
        return result

    def _audit(self, run: _Run, result: RunResult, reason: AuditReason) -> bool:
        llm: dict[str, Any] | None = None
        if run.policy is not None and run.llm is not None:
            p = run.policy.llm
            llm = {
                "enabled": p.enabled,
                "max_calls": p.max_calls,
                "max_input_chars": p.max_input_chars,
                "max_output_chars": p.max_output_chars,
                "allowed_models": sorted(p.allowed_models) if p.allowed_models is not None else None,
                **run.llm.usage(),
            }
        record = run_record(
            slug=run.slug,
            trust=run.trust,
            run_id=run.run_id,
            action="allow" if result.success else "deny",
            source=run.source,
            reason=reason.value,
            sandbox=run.sandbox,
            runtime=run.runtime,
            image=run.image,
            duration_ms=result.duration_ms,
            timed_out=result.timed_out,
            llm=llm,
            tool_calls=run.gate.calls_made if run.gate else 0,
            tool_refusals=run.gate.refusals if run.gate else 0,
        )
        return self.audit.append(record)

    def _route_and_run(
        self, run: _Run, goal: str | None, kwargs: dict[str, Any], runtime: str | None
    ) -> RunResult:
        entry = self.lockfile.get(run.slug)
        if entry is None:
            raise PackError(
                f"{run.slug} is not installed",
                reason=AuditReason.NOT_INSTALLED,
                hint="install it: agentnode-sandbox install PATH --trust unverified",
            )
        run.trust = entry.trust_level
        if entry.package_type != "agent":
            raise PackError(
                f"{run.slug} is a {entry.package_type}, not an agent",
                reason=AuditReason.NOT_AN_AGENT,
                hint="run an agent pack; tool packs are called by agents",
            )
        cfg = self.config.agent_sandbox
        decision = route_run(
            entry.trust_level,
            sandbox_enabled=sandbox_enabled(self.config, self.env),
            host_trust_policy=cfg.host_trust_policy,
        )
        if decision.route is Route.REFUSED:
            run.source = (
                "agent_sandbox"
                if entry.trust_level.strip().lower() in ("verified", "unverified")
                else "agent_host"
            )
            hint = (
                "enable the sandbox: export AGENTNODE_AGENT_SANDBOX=1 (or agent_sandbox.enabled: true)"
                if decision.reason == AuditReason.REFUSED_FLAG_OFF
                else "reinstall with --trust curated|trusted|verified|unverified"
            )
            raise RefusedError(decision.message, reason=AuditReason(decision.reason), hint=hint)
        manifest = entry.parsed_manifest()
        assert isinstance(manifest, AgentManifest)
        sandboxed = decision.route is Route.SANDBOX
        run.sandbox = sandboxed
        run.source = "agent_sandbox" if sandboxed else "agent_host"
        run.policy = resolve_run_policy(manifest, cfg, sandboxed=sandboxed)
        task = RunTask(
            run_id=run.run_id,
            entrypoint=manifest.entrypoint,
            goal=goal if goal is not None else manifest.goal,
            kwargs_json=json.dumps(kwargs, allow_nan=False),
            policy=run.policy,
            system_prompt=manifest.system_prompt,
        )
        run.mark("routed")
        if sandboxed:
            return self._run_sandboxed(run, entry, task, runtime or cfg.runtime)
        return self._run_on_host(run, entry, task)

    def _session(self, run: _Run, task: RunTask, deadline: float) -> RunSession:
        assert run.policy is not None
        run.llm = self.broker.session(run.policy.llm)
        run.gate = ToolGate(
            allowed_packages=run.policy.allowed_packages,
            max_tool_calls=run.policy.max_tool_calls,
            lookup=self._lookup_toolpack,
            runner=self.tool_runner,
            deadline=deadline,
        )
        return RunSession(task=task, tools=run.gate, llm=run.llm)

    def _run_sandboxed(self, run: _Run, entry: LockEntry, task: RunTask, runtime: str) -> RunResult:
        run.runtime = runtime
        cfg = self.config.agent_sandbox
        client = self.client()
        require_capable(self.facts(), runtime)
        image = verify_pinned_image(client, cfg.image)
        run.image = cfg.image
        volume = verify_volume(client, entry)
        run.mark("verified")
        assert run.policy is not None
        deadline = run.started + run.policy.max_runtime_seconds
        session = self._session(run, task, deadline)
        rundir = make_run_dir(run.run_id, self.owner, self.env)
        server = build_run_server(session, str(rundir.socket_path))
        name = f"agentnode-run-{run.run_id[:20]}"
        container_id: str | None = None
        try:
            server.start()
            rundir.grant(SANDBOX_UID, SANDBOX_GID)
            run.mark("socket_ready")
            spec = container_spec(
                image=image.id,
                run_id=run.run_id,
                name=name,
                owner=self.owner,
                slug=run.slug,
                runtime=runtime,
                pack_volume=volume,
                import_root="/pack/" + entry.import_subdir if entry.import_subdir else "/pack",
                socket_dir=str(rundir.path),
                limits=self.limits,
            )
            try:
                container = client.containers.create(**spec)
                container_id = container.id
                run.mark("created")
                container.start()
                run.mark("started")
            except docker.errors.APIError as exc:
                raise EngineError(
                    f"the sandbox container could not be started ({exc.status_code})",
                    reason=AuditReason.START_FAILED,
                    hint="check with: agentnode-sandbox doctor",
                    check="start",
                ) from None
            except docker.errors.DockerException as exc:
                raise classify_engine_exception(exc) from None
            sink = _CappedSink()
            exit_info: dict[str, Any] = {}
            cid = container_id

            probe: list[PidsProbe] = []

            def watch_exit() -> None:
                with contextlib.suppress(Exception):
                    probe.append(PidsProbe(int(client.api.inspect_container(cid)["State"]["Pid"])))
                with contextlib.suppress(Exception):
                    exit_info.update(client.api.wait(cid))
                session.reported.set()

            def drain_logs() -> None:
                with contextlib.suppress(Exception):
                    _drain(client.api.logs(cid, stream=True, follow=True, stdout=True, stderr=True), sink)

            threading.Thread(target=watch_exit, daemon=True, name=f"exit-{name}").start()
            threading.Thread(target=drain_logs, daemon=True, name=f"logs-{name}").start()
            outcome = self._watch(
                session, deadline, lambda: bool(exit_info), poll=lambda: [p.poll() for p in probe]
            )
            pids_hits = max((p.poll() for p in probe), default=0)
            run.mark("agent_done")
            result = self._result_from(
                session,
                how=outcome,
                exit_info=exit_info,
                run=run,
                sink=sink,
                client=client,
                cid=cid,
                pids_hits=pids_hits,
            )
            return result
        finally:
            with contextlib.suppress(Exception):
                server.stop(grace=None)
            if container_id is not None:
                try:
                    remove_and_verify(client, container_id, name)
                finally:
                    rundir.remove()
            else:
                rundir.remove()
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    remove_and_verify(client, name, name)
            run.mark("teardown")

    def _watch(
        self,
        session: RunSession,
        deadline: float,
        exited: Callable[[], bool],
        poll: Callable[[], object] | None = None,
    ) -> str:
        """Wait for the result, the sandbox's exit, the wall-clock deadline or the idle limit.

        `poll` (the pids probe: one small file read) runs every 50 ms while the run lasts.
        """
        idle_limit = self.config.agent_sandbox.idle_timeout_seconds
        while True:
            if poll is not None:
                poll()
            # State first, then the event: a wake-up between the two is caught by the next wait.
            if session.outcome is not None:
                return "reported"
            if exited():
                return "exited"
            now = time.monotonic()
            if now >= deadline:
                return "deadline"
            idle = session.idle_since()
            if idle is not None and now >= idle + idle_limit:
                return "idle"
            idle_deadline = idle + idle_limit if idle is not None else now + idle_limit
            wake_at = min(deadline, idle_deadline, now + 0.05 if poll is not None else deadline)
            session.reported.wait(timeout=max(0.0, wake_at - now))
            session.reported.clear()

    def _result_from(
        self,
        session: RunSession,
        *,
        how: str,
        exit_info: Mapping[str, Any],
        run: _Run,
        sink: _CappedSink,
        client: docker.DockerClient | None,
        cid: str | None,
        pids_hits: int = 0,
    ) -> RunResult:
        """Name what ended the run: its result, a deadline, or the sandbox's death and its cause."""
        mode = "agent_sandbox" if run.sandbox else "agent_host"

        def fail(code: AuditReason | str, error: str, hint: str, *, timed_out: bool = False) -> RunResult:
            return RunResult(
                success=False,
                error=error,
                error_code=str(code),
                hint=hint,
                timed_out=timed_out,
                mode_used=mode,
                logs=sink.text(),
            )

        pids_error = (
            f"the agent hit the sandbox's process/thread limit ({self.limits.pids}) "
            f"{pids_hits} time(s), e.g. by forking in a loop"
        )
        pids_hint = "use fewer processes and threads; under gVisor each process also costs a host process"
        outcome = session.outcome
        if outcome is not None:
            if outcome.success:
                assert outcome.value_json is not None
                return RunResult(
                    success=True, result=json.loads(outcome.value_json), mode_used=mode, logs=sink.text()
                )
            return fail(outcome.failure_code, outcome.failure_message or outcome.failure_code, "")
        if how in ("deadline", "idle"):
            assert run.policy is not None
            if pids_hits:
                return fail(
                    AuditReason.PIDS_EXHAUSTED,
                    f"{pids_error}; the run then timed out",
                    pids_hint,
                    timed_out=True,
                )
            what = (
                f"the run exceeded max_runtime_seconds ({run.policy.max_runtime_seconds} s)"
                if how == "deadline"
                else f"the agent made no call for {self.config.agent_sandbox.idle_timeout_seconds} s"
            )
            return fail(
                AuditReason.TIMEOUT,
                f"{what}; the sandbox was killed",
                "raise limits.max_runtime_seconds (within the host ceiling) if the agent needs longer",
                timed_out=True,
            )
        status = int(exit_info.get("StatusCode", -1))
        oom = False
        if client is not None and cid is not None:
            with contextlib.suppress(Exception):
                oom = bool(client.api.inspect_container(cid)["State"].get("OOMKilled"))
        if oom or (status == 137 and run.runtime == "runsc" and not pids_hits):
            return fail(
                AuditReason.OOM_KILLED,
                "the agent exceeded its memory limit and was killed",
                "the sandbox memory ceiling is fixed; reduce the agent's memory use",
            )
        if pids_hits:
            return fail(
                AuditReason.PIDS_EXHAUSTED, f"{pids_error}; the sandbox stopped (exit {status})", pids_hint
            )
        if run.runtime == "runsc" and status not in (0, 1, 3, 4):
            return fail(
                AuditReason.SANDBOX_CRASHED,
                f"the gVisor sandbox stopped (exit {status}) before the agent reported; under gVisor the "
                "usual cause is forking past the pids limit",
                "use fewer processes; see the logs of the run (run --json shows them)",
            )
        return fail(
            AuditReason.EXITED_BEFORE_RESULT,
            f"the agent exited (status {status}) before reporting a result",
            "see the logs of the run (run --json shows them)",
        )

    def _run_on_host(self, run: _Run, entry: LockEntry, task: RunTask) -> RunResult:
        """Trusted/curated agents: the same wrapper and services as a local process. Not isolated."""
        if entry.trust_level not in HOST_TRUST or not entry.host_path:
            raise PackError(
                f"{run.slug} has no host copy",
                reason=AuditReason.NOT_INSTALLED,
                hint=f"reinstall it with --trust trusted: agentnode-sandbox install <path-to-{run.slug}>",
            )
        assert run.policy is not None
        deadline = run.started + run.policy.max_runtime_seconds
        session = self._session(run, task, deadline)
        rundir = make_run_dir(run.run_id, self.owner, self.env)
        server = build_run_server(session, str(rundir.socket_path))
        proc: subprocess.Popen[bytes] | None = None
        try:
            server.start()
            run.mark("socket_ready")
            wrapper_site = str(Path(__file__).resolve().parent.parent)
            env = {
                "PATH": self.env.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "HOME": str(rundir.path),
                "PYTHONPATH": wrapper_site,
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "AGENTNODE_SOCKET": str(rundir.socket_path),
                "AGENTNODE_IMPORT_ROOT": str(Path(entry.host_path) / entry.import_subdir),
            }
            proc = subprocess.Popen(
                [sys.executable, "-s", "-m", "sandbox_wrapper"],
                env=env,
                cwd=rundir.path,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            run.mark("started")
            sink = _CappedSink()
            exit_info: dict[str, Any] = {}
            p = proc
            assert p.stdout is not None
            fd = p.stdout.fileno()
            threading.Thread(
                target=_drain, args=(iter(lambda: os.read(fd, 65536), b""), sink), daemon=True
            ).start()

            def watch_exit() -> None:
                exit_info["StatusCode"] = p.wait()
                session.reported.set()

            threading.Thread(target=watch_exit, daemon=True).start()
            how = self._watch(session, deadline, lambda: bool(exit_info))
            run.mark("agent_done")
            return self._result_from(
                session, how=how, exit_info=exit_info, run=run, sink=sink, client=None, cid=None
            )
        finally:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(Exception):
                server.stop(grace=None)
            rundir.remove()
            run.mark("teardown")


__all__ = ["LOG_CAP_BYTES", "RunResult", "SandboxHost"]
