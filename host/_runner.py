"""Runs one agent end to end: route, fail closed, serve its socket, watch its deadlines, audit it once."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from host._audit import AuditLog, run_record, start_record
from host._broker import LlmBroker, LlmSession
from host._config import HostConfig, load_config
from host._engine import (
    ContainerLimits,
    EngineFacts,
    connect,
    engine_facts,
    owner_token,
    require_capable,
    sweep_containers,
)
from host._errors import AuditReason, EngineError, SandboxError
from host._explain import decide_route, effective_policy, host_copy_error, installed_agent, refusal_error
from host._fdbudget import PER_RUN_OVERHEAD_FDS, RESERVED_FDS, FdBudget
from host._image import verify_pinned_image
from host._json import dumps_strict, loads_strict
from host._manifest import ToolpackManifest
from host._packs import HOST_TRUST, LockEntry, Lockfile, verify_volume
from host._policy import RunPolicy
from host._pool import PoolSettings, WarmPools
from host._rundir import make_run_dir, orphaned_runs, sweep_run_dirs
from host._sandbox import CappedSink, Sandbox, SandboxSpec, drain, pool_key
from host._session import MAX_CONNECTIONS_PER_RUN, RunSession, RunTask, build_run_server
from host._tools import InstalledToolpack, ToolGate, ToolRunner
from host._vocab import Route

logger = logging.getLogger("agentnode.sandbox.runner")

_ENGINE_FACTS_TTL = 30.0
_LOG_SETTLE_SECONDS = 0.5
_GVISOR_CRASH_STATUS = 2
"""What runsc exits with when the sandbox kernel itself stops; an agent's own exit status passes through."""


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
    warm: bool = False
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
    warm: bool = False
    stages: dict[str, float] = field(default_factory=dict)
    on_stage: Callable[[str], None] | None = None

    def mark(self, stage: str) -> None:
        self.stages[stage] = round((time.monotonic() - self.started) * 1000, 2)
        if self.on_stage is not None:
            with contextlib.suppress(Exception):
                self.on_stage(stage)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _record(run: _Run) -> dict[str, object]:
    """What a restarted host needs to audit this run if this host dies first."""
    return {
        "run_id": run.run_id,
        "slug": run.slug,
        "trust": run.trust,
        "source": run.source,
        "sandbox": run.sandbox,
        "runtime": run.runtime,
        "image": run.image,
    }


def _trust(entry: LockEntry) -> str:
    """The entry's trust level as routing compares it: trimmed, lower case, "" when missing."""
    return (entry.trust_level or "").strip().lower()


class SandboxHost:
    """One host process: config, engine client, LLM broker, tool runner and warm pools shared by its runs."""

    def __init__(
        self,
        *,
        config: HostConfig | None = None,
        env: Mapping[str, str] | None = None,
        client_factory: Callable[[], docker.DockerClient] | None = None,
        broker: LlmBroker | None = None,
        tool_runner: ToolRunner | None = None,
        limits: ContainerLimits | None = None,
        pool: PoolSettings | None = None,
        async_teardown: bool = False,
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
        with contextlib.suppress(OSError):  # held from now on; an append retries the open if this failed
            self.audit.open()
        # Warm members hold their sockets before any run claims them: their share is kept in reserve.
        members = pool.max_members(self.limits.memory_bytes) if pool is not None and pool.size > 0 else 0
        self.fds = FdBudget(
            per_run=MAX_CONNECTIONS_PER_RUN + PER_RUN_OVERHEAD_FDS,
            reserve=RESERVED_FDS + members * (PER_RUN_OVERHEAD_FDS + 1),
        )
        self.lockfile = Lockfile(self.config.paths.lockfile)
        self.owner = owner_token()
        self.audit_failures = 0
        self.teardown_failures = 0
        self.pools = (
            WarmPools(self._launch_member, pool, is_current=self._pool_current, retired=self._pool_retired)
            if pool is not None and pool.size > 0
            else None
        )
        self._retired_volumes: set[str] = set()
        self._volumes_lock = threading.Lock()
        self._active: dict[str, RunSession] = {}
        self._reaper = (
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="agentnode-teardown")
            if async_teardown
            else None
        )

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
        """Remove what a crashed host left behind (our exact labels and run directories only).

        Runs that were in progress when their host died get their one audit record now (`host_lost`).
        """
        for info in orphaned_runs(self.env):
            record = run_record(
                slug=str(info.get("slug", "")),
                trust=_str_or_none(info.get("trust")),
                run_id=str(info.get("run_id", "")),
                action="deny",
                source=str(info.get("source", "agent_sandbox")),
                reason=AuditReason.HOST_LOST.value,
                sandbox=bool(info.get("sandbox")),
                runtime=_str_or_none(info.get("runtime")),
                image=_str_or_none(info.get("image")),
                duration_ms=0,
                timed_out=False,
                llm=None,
                tool_calls=0,
                tool_refusals=0,
            )
            if not self.audit.append(record):
                self.audit_failures += 1
        removed = sweep_run_dirs(self.env)
        with contextlib.suppress(EngineError):
            removed += sweep_containers(self.client())
        return removed

    def cancel(self, run_id: str) -> bool:
        """Cancel a run in progress: its sandbox is killed and its result says `cancelled`."""
        session = self._active.get(run_id)
        if session is None:
            return False
        session.cancel()
        return True

    def active_runs(self) -> list[str]:
        return list(self._active)

    def close(self) -> None:
        """Cancel what still runs, destroy the warm pools, finish teardowns; nothing is left behind."""
        for session in list(self._active.values()):
            session.cancel()
        if self.pools is not None:
            self.pools.close()
        if self._reaper is not None:
            self._reaper.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self._drop_retired_volumes()
        self.tool_runner.close()
        self.audit.close()
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
            slug=entry.slug, version=entry.version, trust=_trust(entry), root=root, manifest=manifest
        )

    def run(
        self,
        slug: str,
        *,
        goal: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        runtime: str | None = None,
        on_stage: Callable[[str], None] | None = None,
        on_start: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Run an installed agent; every path, refusals included, ends with exactly one audit record.

        `on_start(run_id)` is called once the run id is final (a warm member brings its own);
        `on_stage(name)` is called as the run passes each stage.
        """
        run = _Run(run_id=uuid.uuid4().hex, slug=slug, started=time.monotonic(), on_stage=on_stage)
        result: RunResult
        try:
            result = self._route_and_run(run, goal, dict(kwargs or {}), runtime, on_start)
        except SandboxError as exc:
            result = RunResult(
                success=False,
                error=exc.message,
                error_code=exc.reason.value,
                hint=exc.hint,
                mode_used=run.source,
            )
            reason = exc.reason
        except Exception as exc:  # noqa: BLE001 (the host loop fails closed on anything)
            logger.warning("host loop error in run %s: %s", run.run_id, type(exc).__name__)
            result = RunResult(
                success=False,
                error=f"the host failed while running the agent ({type(exc).__name__})",
                error_code=AuditReason.HOST_LOOP_ERROR.value,
                hint="see the host log; check with: agentnode-sandbox doctor",
                mode_used=run.source,
            )
            reason = AuditReason.HOST_LOOP_ERROR
        else:
            reason = (
                AuditReason(result.error_code)
                if result.error_code in AuditReason._value2member_map_
                else (AuditReason.AGENT_COMPLETED if result.success else AuditReason.AGENT_ERROR)
            )
        result.run_id = run.run_id
        result.warm = run.warm
        result.duration_ms = int((time.monotonic() - run.started) * 1000)
        result.stages = run.stages
        if not self._audit(run, result, reason):
            self.audit_failures += 1
            result = self._withheld(result, reason)
        run.mark("done")
        return result

    def _withheld(self, result: RunResult, reason: AuditReason) -> RunResult:
        """A run whose end record could not be written fails loudly: its result is not handed out."""
        return RunResult(
            success=False,
            error=f"the audit record of this run could not be written (it ended as {reason.value}), so "
            "its result is withheld",
            error_code=AuditReason.AUDIT_FAILED.value,
            hint=self._audit_hint(),
            mode_used=result.mode_used,
            run_id=result.run_id,
            timed_out=result.timed_out,
            duration_ms=result.duration_ms,
            logs=result.logs,
            warm=result.warm,
            stages=result.stages,
        )

    def _audit_hint(self) -> str:
        """What the operator does when the audit log cannot be written (both audit_failed paths)."""
        return (
            f"free disk space or fix the permissions of {self.audit.path}, then check: "
            "agentnode-sandbox audit verify"
        )

    def _audit_start(self, run: _Run) -> None:
        """Record the run's start before any agent code runs; no start record, no run."""
        assert run.policy is not None
        record = start_record(
            slug=run.slug,
            trust=run.trust,
            run_id=run.run_id,
            source=run.source,
            sandbox=run.sandbox,
            runtime=run.runtime,
            max_runtime_seconds=run.policy.max_runtime_seconds,
        )
        # Not fsynced: it must survive this process dying (the page cache does), the end record is synced.
        if not self.audit.append(record, sync=False):
            raise SandboxError(
                "the audit log cannot be written, so the run was not started",
                reason=AuditReason.AUDIT_FAILED,
                hint=self._audit_hint(),
            )

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
        self,
        run: _Run,
        goal: str | None,
        kwargs: dict[str, Any],
        runtime: str | None,
        on_start: Callable[[str], None] | None,
    ) -> RunResult:
        entry = installed_agent(self.lockfile, run.slug)
        trust = _trust(entry)
        run.trust = entry.trust_level  # as recorded; routing compares the normalized form
        decision = decide_route(entry, self.config, self.env)
        if decision.route is Route.REFUSED:
            # Refused for want of the sandbox, it would have been a sandboxed run; else by trust level.
            would_sandbox = decision.reason == AuditReason.REFUSED_FLAG_OFF or trust in (
                "verified",
                "unverified",
            )
            run.source = "agent_sandbox" if would_sandbox else "agent_host"
            raise refusal_error(decision)
        sandboxed = decision.route is Route.SANDBOX
        run.sandbox = sandboxed
        run.source = "agent_sandbox" if sandboxed else "agent_host"
        manifest, run.policy = effective_policy(entry, self.config, decision.route)
        cfg = self.config.agent_sandbox
        run.mark("routed")

        def task() -> RunTask:
            assert run.policy is not None
            return RunTask(
                run_id=run.run_id,
                entrypoint=manifest.entrypoint,
                goal=goal if goal is not None else manifest.goal,
                kwargs_json=dumps_strict(kwargs),
                policy=run.policy,
                system_prompt=manifest.system_prompt,
            )

        with self.fds.hold():  # before anything is built: a full host refuses cleanly
            if sandboxed:
                return self._run_sandboxed(run, entry, task, runtime or cfg.runtime, on_start)
            if on_start is not None:
                on_start(run.run_id)
            return self._run_on_host(run, entry, task())

    def _gate_and_llm(self, run: _Run, deadline: float) -> tuple[ToolGate, LlmSession]:
        assert run.policy is not None
        run.llm = self.broker.session(run.policy.llm)
        packs: dict[str, InstalledToolpack | None] = {}

        def lookup(slug: str) -> InstalledToolpack | None:
            # One lockfile read per tool pack per run: a run sees one consistent set of installed packs.
            if slug not in packs:
                packs[slug] = self._lookup_toolpack(slug)
            return packs[slug]

        run.gate = ToolGate(
            allowed_packages=run.policy.allowed_packages,
            max_tool_calls=run.policy.max_tool_calls,
            lookup=lookup,
            runner=self.tool_runner,
            deadline=deadline,
        )
        return run.gate, run.llm

    def sandbox_spec(self, entry: LockEntry, runtime: str) -> SandboxSpec:
        """Verify everything a sandbox stands on (engine, runtime, image pin, pack volume); fail closed."""
        client = self.client()
        require_capable(self.facts(), runtime)
        image = verify_pinned_image(client, self.config.agent_sandbox.image)
        volume = verify_volume(client, entry)
        return SandboxSpec(
            slug=entry.slug,
            artifact_hash=entry.artifact_hash,
            runtime=runtime,
            pin=self.config.agent_sandbox.image or "",
            image_id=image.id,
            volume=volume,
            import_root="/pack/" + entry.import_subdir if entry.import_subdir else "/pack",
            limits=self.limits,
        )

    def _pool_current(self, spec: SandboxSpec) -> bool:
        """Is this pool's pack version still the installed one (same artifact, same volume)?"""
        entry = self.lockfile.get(spec.slug)
        return (
            entry is not None
            and entry.package_type == "agent"
            and entry.artifact_hash == spec.artifact_hash
            and entry.sandbox_volume == spec.volume
        )

    def _pool_retired(self, spec: SandboxSpec) -> None:
        """An uninstalled or replaced pack's pool is gone: drop its volume too, unless a run still uses it."""
        self._retire_volume(spec.volume)

    def _retire_volume(self, volume: str) -> None:
        """Offer a pack volume for removal: it goes only if no lockfile entry names it (after a run, that
        is when its pack was uninstalled or replaced meanwhile: nothing else would drop it)."""
        if volume:
            with self._volumes_lock:
                self._retired_volumes.add(volume)
        self._drop_retired_volumes()

    def _drop_retired_volumes(self) -> None:
        """Remove retired pack volumes no lockfile entry names; one still in use is retried after a run."""
        if not self._retired_volumes:
            return
        with self._volumes_lock:
            self._drop_retired_volumes_locked()

    def _drop_retired_volumes_locked(self) -> None:
        used = {e.sandbox_volume for e in self.lockfile.entries().values()}
        for name in list(self._retired_volumes):
            if name in used:
                self._retired_volumes.discard(name)
                continue
            try:
                self.client().volumes.get(name).remove()
            except docker.errors.NotFound:
                pass
            except (OSError, docker.errors.DockerException):
                continue  # in use by a run still going: its teardown retries
            self._retired_volumes.discard(name)

    def _launch_member(self, spec: SandboxSpec) -> Sandbox:
        self.fds.check()  # a refill must not eat into the reserve either
        return Sandbox.launch(self.client(), spec, run_id=uuid.uuid4().hex, owner=self.owner, env=self.env)

    def prewarm(self, slug: str, runtime: str | None = None) -> None:
        """Start a warm pool for an installed community agent (no-op without pools)."""
        entry = self.lockfile.get(slug)
        if self.pools is None or entry is None or entry.package_type != "agent":
            return
        self.pools.want(self.sandbox_spec(entry, runtime or self.config.agent_sandbox.runtime))

    def _run_sandboxed(
        self,
        run: _Run,
        entry: LockEntry,
        task: Callable[[], RunTask],
        runtime: str,
        on_start: Callable[[str], None] | None,
    ) -> RunResult:
        run.runtime = runtime
        run.image = self.config.agent_sandbox.image
        assert run.policy is not None
        deadline = run.started + run.policy.max_runtime_seconds
        box: Sandbox | None = None
        if self.pools is not None and run.image:
            box = self.pools.claim(pool_key(entry.slug, entry.artifact_hash, runtime, run.image))
        try:
            if box is not None:
                run.run_id = box.run_id
                run.warm = True
                run.mark("claimed")
                self._audit_start(run)
                self._active[run.run_id] = box.session
                box.session.assign(task(), *self._gate_and_llm(run, deadline))
            else:
                spec = self.sandbox_spec(entry, runtime)
                run.mark("verified")
                if self.pools is not None:
                    self.pools.want(spec)
                # The task goes in before the container starts: its first FetchTask never waits on us.
                gate, llm = self._gate_and_llm(run, deadline)
                session = RunSession(task=task(), tools=gate, llm=llm)
                self._audit_start(run)
                self._active[run.run_id] = session
                box = Sandbox.launch(
                    self.client(),
                    spec,
                    run_id=run.run_id,
                    owner=self.owner,
                    env=self.env,
                    session=session,
                    run_info=_record(run),
                )
                run.stages.update({f"sandbox_{k}": v for k, v in box.stages.items()})
                run.mark("started")
            if run.warm:
                box.rundir.record_run(_record(run))
            if on_start is not None:
                on_start(run.run_id)
            rundir = box.rundir.path
            how = self._watch(
                box.session,
                deadline,
                lambda: box.exited,
                poll=box.poll,
                lost=lambda: not rundir.exists(),
            )
            run.mark("agent_done")
            if box.session.fetched_at is not None:
                run.stages["fetched"] = round((box.session.fetched_at - run.started) * 1000, 2)
            if self._reaper is None:  # a one-shot run can afford to wait for the last log lines
                box.settle_logs(_LOG_SETTLE_SECONDS)
            status = box.exit_info.get("StatusCode") if box.exited else None
            return self._result_from(
                box.session,
                how=how,
                run=run,
                sink=box.sink,
                exit_status=status,
                oom=box.oom_killed,
                pids_hits=box.pids_hits(),
            )
        finally:
            self._active.pop(run.run_id, None)
            if box is not None:
                self._teardown(box, run)

    def _teardown(self, box: Sandbox, run: _Run) -> None:
        """Destroy a used sandbox; a long-running host does it just after the result is returned."""
        if self._reaper is None:
            box.destroy()
            run.mark("teardown")
            self._retire_volume(box.spec.volume)
            return

        def destroy() -> None:
            # Let the caller's result leave first: teardown is engine-heavy and competes for the GIL.
            time.sleep(0.02)
            try:
                box.destroy()
                self._retire_volume(box.spec.volume)
            except Exception as exc:  # noqa: BLE001 (counted and logged; the startup sweep is the backstop)
                self.teardown_failures += 1
                logger.warning("teardown of %s failed: %s", box.name, type(exc).__name__)

        self._reaper.submit(destroy)

    def _watch(
        self,
        session: RunSession,
        deadline: float,
        exited: Callable[[], bool],
        poll: Callable[[], object] | None = None,
        lost: Callable[[], bool] | None = None,
    ) -> str:
        """Wait for the result, the sandbox's exit, cancellation, the wall-clock deadline or the idle limit.

        `poll` (the cgroup probes: small file reads) and `lost` (is the run's socket directory still
        there?) run every 50 ms while the run lasts.
        """
        idle_limit = self.config.agent_sandbox.idle_timeout_seconds
        while True:
            if poll is not None:
                poll()
            # State first, then the event: a wake-up between the two is caught by the next wait.
            if session.outcome is not None:
                return "reported"
            if session.cancelled:
                return "cancelled"
            if exited():
                return "exited"
            if lost is not None and lost():
                return "lost"
            now = time.monotonic()
            if now >= deadline:
                return "deadline"
            idle = session.idle_since()
            if idle is not None and now >= idle + idle_limit:
                return "idle"
            idle_deadline = idle + idle_limit if idle is not None else now + idle_limit
            tick = now + 0.05 if poll is not None or lost is not None else deadline
            wake_at = min(deadline, idle_deadline, tick)
            session.reported.wait(timeout=max(0.0, wake_at - now))
            session.reported.clear()

    def _result_from(
        self,
        session: RunSession,
        *,
        how: str,
        run: _Run,
        sink: CappedSink,
        exit_status: int | None,
        oom: Callable[[], bool],
        pids_hits: int = 0,
    ) -> RunResult:
        """Name what ended the run: its result, a deadline, cancellation, or the sandbox's death and cause."""
        mode = run.source

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
                    success=True, result=loads_strict(outcome.value_json), mode_used=mode, logs=sink.text()
                )
            return fail(outcome.failure_code, outcome.failure_message or outcome.failure_code, "")
        if how == "lost":
            return fail(
                AuditReason.SOCKET_LOST,
                "the run's socket directory disappeared from the host; the run was stopped",
                "something removed entries under the host's run directory (a tmp cleaner?); "
                "keep it away from /run/agentnode-sandbox",
            )
        if how == "cancelled":
            return fail(AuditReason.CANCELLED, "the run was cancelled; its sandbox was killed", "")
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
                else f"the agent made no accepted call for {self.config.agent_sandbox.idle_timeout_seconds} s"
            )
            return fail(
                AuditReason.TIMEOUT,
                f"{what}; the sandbox was killed",
                "raise limits.max_runtime_seconds (within the host ceiling) if the agent needs longer",
                timed_out=True,
            )
        status = -1 if exit_status is None else int(exit_status)
        if oom():
            return fail(
                AuditReason.OOM_KILLED,
                "the agent exceeded its memory limit and was killed",
                "the sandbox memory ceiling is fixed; reduce the agent's memory use",
            )
        if pids_hits:
            return fail(
                AuditReason.PIDS_EXHAUSTED, f"{pids_error}; the sandbox stopped (exit {status})", pids_hint
            )
        if run.runtime == "runsc" and status == _GVISOR_CRASH_STATUS:
            return fail(
                AuditReason.SANDBOX_CRASHED,
                f"the gVisor sandbox stopped (exit {status}) before the agent reported; under gVisor the "
                "usual cause is forking past the pids limit (or the agent itself exited with that status)",
                "use fewer processes; see the logs of the run (run --json shows them)",
            )
        return fail(
            AuditReason.EXITED_BEFORE_RESULT,
            f"the agent exited (status {status}) before reporting a result",
            "see the logs of the run (run --json shows them)",
        )

    def _run_on_host(self, run: _Run, entry: LockEntry, task: RunTask) -> RunResult:
        """Trusted/curated agents: the same wrapper and services as a local process. Not isolated."""
        if _trust(entry) not in HOST_TRUST or not entry.host_path:
            raise host_copy_error(run.slug)
        assert run.policy is not None
        deadline = run.started + run.policy.max_runtime_seconds
        gate, llm = self._gate_and_llm(run, deadline)
        session = RunSession(task=task, tools=gate, llm=llm)
        self._audit_start(run)
        rundir = make_run_dir(run.run_id, self.owner, self.env)
        rundir.record_run(_record(run))
        server = build_run_server(session, str(rundir.socket_path))
        proc: subprocess.Popen[bytes] | None = None
        drainer: threading.Thread | None = None
        try:
            server.start()
            run.mark("socket_ready")
            env = {
                "PATH": self.env.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "HOME": str(rundir.path),
                "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
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
            sink = CappedSink()
            exit_info: dict[str, int] = {}
            p = proc
            assert p.stdout is not None
            fd = p.stdout.fileno()
            drainer = threading.Thread(
                target=drain, args=(iter(lambda: os.read(fd, 65536), b""), sink), daemon=True
            )
            drainer.start()

            def watch_exit() -> None:
                exit_info["StatusCode"] = p.wait()
                session.reported.set()

            threading.Thread(target=watch_exit, daemon=True).start()
            self._active[run.run_id] = session
            how = self._watch(
                session,
                deadline,
                lambda: bool(exit_info),
                lost=lambda: not rundir.path.exists(),
            )
            run.mark("agent_done")
            if how == "reported":  # the wrapper exits right after reporting: keep its last log lines
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=_LOG_SETTLE_SECONDS)
                drainer.join(timeout=_LOG_SETTLE_SECONDS)
            return self._result_from(
                session,
                how=how,
                run=run,
                sink=sink,
                exit_status=exit_info.get("StatusCode"),
                oom=lambda: False,
            )
        finally:
            self._active.pop(run.run_id, None)
            if proc is not None:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if drainer is not None:
                    drainer.join(timeout=5)
                if proc.stdout is not None:
                    proc.stdout.close()
            with contextlib.suppress(Exception):
                server.stop(grace=None)
            rundir.remove()
            run.mark("teardown")


__all__ = ["RunResult", "SandboxHost"]
