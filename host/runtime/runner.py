"""The orchestrator: admission, a backend's workload, the session, the outcome, one audit record per run."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from host.audit.log import AuditLog
from host.core.errors import AuditReason, EngineError, SandboxError
from host.core.logs import set_run_id
from host.core.owner import owner_token
from host.engine.contract import SANDBOX_GID, SANDBOX_UID, ContainerLimits, FilesMounts
from host.engine.engine import open_engine, sweep_containers
from host.engine.http import EngineClient
from host.files.run import FilesRequest
from host.llm.broker import LlmBroker
from host.policy.admission import Admission, admit
from host.policy.caller import NO_CALLER, CallerInfo, RunOverrides
from host.policy.filesystem import FilesystemGrant
from host.runtime.backends.container import DockerBackend
from host.runtime.backends.hostproc import HostBackend
from host.runtime.backends.sequential import SequentialBackend
from host.runtime.egress import RunEgress, caller_grant, egress_fds
from host.runtime.fdbudget import FdBudget
from host.runtime.outcome import Ending, conclude, watch
from host.runtime.pool import PoolSettings, WarmPools
from host.runtime.result import RunResult, from_error, from_outcome, host_fault, withheld
from host.runtime.runaudit import RunAudit, RunFacts
from host.runtime.rundir import orphaned_runs, sweep_run_dirs
from host.runtime.runfiles import files_for, member_fits, prepare_files, read_back, release_files
from host.runtime.runserver import MAX_CONNECTIONS_PER_RUN
from host.runtime.session import RunSession
from host.runtime.telemetry.tracing import RunTracer
from host.runtime.toolsandbox import ToolSandboxLauncher
from host.runtime.wiring import run_services, run_task
from host.runtime.workload import Backend, Teardowns, Workload
from host.spec.config import HostConfig, load_config
from host.spec.egress import Rule
from host.spec.lockfile import Lockfile
from host.tools.workers import ToolRunner

if TYPE_CHECKING:
    from host.runtime.prelaunch import Prelaunched
    from host.runtime.telemetry.metrics import HostMetrics

logger = logging.getLogger("agentnode.sandbox.runner")

_LOG_SETTLE_SECONDS = 0.5
"""How long the last lines of a run that neither reported nor exited are awaited (it may still be running)."""
_LOG_SETTLE_ENDED_SECONDS = 5.0
"""The same for a run whose wrapper reported (its output is in when the wrapper's marks arrive: at once on
Docker, 0.3-0.5 s later on a quiet Podman, seconds later on a loaded one) or exited (when its stream ends);
this bounds an engine that never delivers either."""


class SandboxHost:
    """One host process: config, backends, LLM broker, tool runner and warm pools shared by its runs."""

    def __init__(
        self,
        *,
        config: HostConfig | None = None,
        env: Mapping[str, str] | None = None,
        client_factory: Callable[[], EngineClient] | None = None,
        broker: LlmBroker | None = None,
        tool_runner: ToolRunner | None = None,
        limits: ContainerLimits | None = None,
        pool: PoolSettings | None = None,
        async_teardown: bool = False,
        sandbox_backend: Backend[Any] | None = None,
        host_backend: Backend[Any] | None = None,
        tracer: RunTracer | None = None,
        metrics: bool = True,
    ) -> None:
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.config = config or load_config(self.env)
        self.broker = broker or LlmBroker(self.config.agent_sandbox.llm, self.env)
        self.tool_runner = tool_runner or ToolRunner()
        self.limits = limits or ContainerLimits()
        self.audit = AuditLog(self.config.paths.audit_file)
        with contextlib.suppress(OSError):  # held from now on; an append retries the open if this failed
            self.audit.open()
        self.records = RunAudit(self.audit)
        members = pool.max_members(self.limits.memory_bytes) if pool is not None and pool.size > 0 else 0
        per_run = MAX_CONNECTIONS_PER_RUN + egress_fds(self.config.agent_sandbox.egress)
        self.fds = FdBudget.for_host(connections_per_run=per_run, warm_members=members)
        self.lockfile = Lockfile(self.config.paths.lockfile)
        self.owner = owner_token()
        self.docker = DockerBackend(
            client_factory or (lambda: open_engine(self.env)),
            owner=self.owner,
            env=self.env,
            lockfile=self.lockfile,
            image_pin=self.config.agent_sandbox.image,
            limits=self.limits,
            pool=pool,
            before_member=self.fds.check,
            files=self.config.agent_sandbox.filesystem,
        )
        self.sandbox: Backend[Any] = sandbox_backend or self.docker  # where sandboxed routes run
        # where host routes run (trusted packs); a node agent refuses them (host/k8s/node.HostRoutesRefused)
        self.host_process: Backend[Any] = host_backend or HostBackend(owner=self.owner, env=self.env)
        self.sequential = SequentialBackend(owner=self.owner, env=self.env)  # no pack code: any route
        self.audit_failures = 0
        self.teardowns = Teardowns(background=async_teardown)
        self.tool_sandboxes = ToolSandboxLauncher(self.docker, self.teardowns, self.config, self.env)
        self._active: dict[str, RunSession] = {}
        self.metrics = _host_metrics(lambda: len(self._active), lambda: self.pools) if metrics else None
        self.tracer = tracer or RunTracer.from_env(self.env)  # spans when an OTLP endpoint is set

    @property
    def pools(self) -> WarmPools[Any, Any] | None:
        return self.docker.pools

    def client(self) -> EngineClient:
        return self.docker.client()

    def startup_sweep(self) -> list[str]:
        """Remove what a crashed host left behind (our exact labels and run directories only).

        Runs that were in progress when their host died get their one audit record now (`host_lost`).
        """
        for info in orphaned_runs(self.env):
            if not self.records.host_lost(info):
                self.audit_failures += 1
        removed = sweep_run_dirs(self.env)
        with contextlib.suppress(EngineError):
            removed += sweep_containers(self.client())
        return removed

    def cancel(self, run_id: str) -> bool:
        """Cancel a run in progress: its workload is killed and its result says `cancelled`."""
        session = self._active.get(run_id)
        if session is not None:
            session.cancel()
        return session is not None

    def active_runs(self) -> list[str]:
        return list(self._active)

    def close(self) -> None:
        """Cancel what still runs, destroy the warm pools, finish teardowns; nothing is left behind."""
        for session in list(self._active.values()):
            session.cancel()
        if self.pools is not None:
            self.pools.close()  # before the teardowns finish: no refill starts meanwhile
        self.teardowns.close()
        self.docker.close()
        self.tool_runner.close()
        self.audit.close()
        self.tracer.shutdown()

    def prewarm(self, slug: str, runtime: str | None = None) -> None:
        """Start a warm pool for an installed community agent (no-op without pools)."""
        entry = self.lockfile.get(slug)
        if entry is not None:
            self.docker.prewarm(entry, runtime or self.config.agent_sandbox.runtime)

    # -- runs ---------------------------------------------------------------------------------------

    def run(
        self,
        slug: str,
        *,
        goal: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        runtime: str | None = None,
        on_stage: Callable[[str], None] | None = None,
        on_start: Callable[[str], None] | None = None,
        on_log: Callable[[str], None] | None = None,
        caller: CallerInfo | None = None,
        limits: RunOverrides | None = None,
        defer: Callable[[Callable[[], None]], None] | None = None,
        prelaunched: Prelaunched | None = None,
        files: FilesRequest | None = None,
    ) -> RunResult:
        """Run an installed agent; every path, refusals included, ends with exactly one audit record.

        `on_start(run_id)` is called once the workload serves the run; `on_stage(name)` as it passes
        each stage; `on_log(line)` for each line of the agent's output as it is written (within the log
        cap). `caller` (host/policy/caller, validated) goes into the audit record; `limits` can only tighten
        the run's effective policy. `defer(work)` takes the engine-heavy work that follows the result (a warm
        member's replacement may start, a background teardown is queued) to run once the result has reached
        its caller; by default it runs as the result is returned. `prelaunched` is a container a one-shot
        `run` started for this run before the host was built (host/runtime/prelaunch.py): adopted if it is the
        sandbox this run would start, else left for the caller to discard. `files` is what the caller hands
        the run (a workspace, inputs) and wants back (host/files/run.py); the result's `files` says what
        crossed.
        """
        # a prelaunched container began the run (host/runtime/prelaunch.py): its time counts, and the
        # deadline's
        started = time.monotonic() if prelaunched is None else min(time.monotonic(), prelaunched.launched_at)
        run = RunFacts(started=started, on_stage=on_stage, on_log=on_log,
                       caller=caller or NO_CALLER)  # fmt: skip
        try:
            early = None if prelaunched is None else prelaunched.admitted_for(
                slug, runtime, config=self.config, env=self.env, lockfile=self.lockfile
            )  # a cold run was admitted once, before its container started: re-checked here, not redone
            run.admission = early or admit(
                slug, lockfile=self.lockfile, config=self.config, env=self.env, runtime=runtime
            )
            if run.admission.refusal is not None:
                raise run.admission.refusal
            run.admission, per_run = _with_caller_limits(run.admission, limits, self.config)
            wanted = files_for(run.admission, files, self.config, local=self.sandbox is self.docker)
            if wanted is not None:
                prelaunched = None  # its container has no files area mounted: the caller discards it
            run.mark("routed")
            with self.fds.hold():  # before anything is built: a full host refuses cleanly
                result = self._execute(run, run.admission, goal, dict(kwargs or {}), on_start,
                                       prelaunched=prelaunched, egress=per_run, files=wanted)  # fmt: skip
        except SandboxError as exc:
            result = from_error(exc)
        except Exception as exc:  # noqa: BLE001 (the host loop fails closed on anything)
            logger.warning("host loop error in run %s: %s", run.run_id or "-", type(exc).__name__)
            result = host_fault(exc)
        if not run.run_id:  # refused before a backend took the run
            run.fix_id(uuid.uuid4().hex, placed=False)
        result.run_id, result.warm, result.stages = run.run_id, run.warm, run.stages
        result.mode_used = run.source.value
        result.duration_ms = int((time.monotonic() - run.started) * 1000)
        reason = result.reason or AuditReason.HOST_LOOP_ERROR
        try:  # whatever happens from here on, the wrapper is released and the workload torn down
            try:
                if not self.records.end(run, reason=reason, success=result.success,
                                        duration_ms=result.duration_ms, timed_out=result.timed_out,
                                        slug=slug):  # fmt: skip
                    self.audit_failures += 1
                    result = withheld(result, self.records.hint)
            finally:
                if run.release is not None:
                    run.release()  # the end record is written (or failed): the wrapper may exit now
            run.mark("done")
            for observer in (self.metrics, self.tracer):  # neither may touch the result fixed and audited
                if observer is None:
                    continue
                with contextlib.suppress(Exception):
                    observer.run_ended(run, reason=reason, success=result.success,
                                       duration_ms=result.duration_ms)  # fmt: skip
        finally:
            after = functools.partial(_after_result, self, run)
            if defer is None:
                after()
            else:
                defer(after)
            set_run_id("")  # this thread's work for the run is over
        return result

    def _execute(
        self,
        run: RunFacts,
        a: Admission,
        goal: str | None,
        kwargs: dict[str, Any],
        on_start: Callable[[str], None] | None,
        *,
        prelaunched: Prelaunched | None = None,
        egress: tuple[Rule, ...] | None = None,
        files: tuple[FilesRequest, FilesystemGrant] | None = None,
    ) -> RunResult:
        """One admitted run on its backend: workload, session, watch, outcome; always torn down. `egress`
        is the caller's grant for this run (None: the standing grants); `files` what its caller hands it
        (checked by host/runtime/runfiles.py `files_for`: only this host's engine mounts a files area)."""
        assert a.entry is not None and a.manifest is not None and a.policy is not None
        backend: Backend[Any] = self.sequential if a.sequential else (
            self.sandbox if a.sandboxed else self.host_process
        )
        box = backend.claim(a) if files is None or member_fits(backend, self.docker, a) else None
        early = prelaunched if box is None and backend is self.docker and prelaunched is not None else None
        if early is not None and not early.serves(a, pin=self.docker.image_pin, limits=self.limits):
            early = None
        run.fix_id(box.run_id if box is not None else early.run_id if early is not None else uuid.uuid4().hex,
                   warm=box is not None)  # fmt: skip
        work: Workload | None = box
        try:
            # a prelaunched sandbox was verified moments ago, by this process, on the same inputs
            spec = None if box is not None or early is not None else backend.prepare(a)
            if a.sandboxed:
                run.mark("claimed" if box is not None else "verified")
            deadline = run.started + a.policy.max_runtime_seconds
            run.egress = RunEgress(self.config.agent_sandbox.egress, per_run=egress)
            agent_route = run.egress.route_for_entry(a.entry) if backend is self.docker else None
            mounts = None if files is None else prepare_files(run, files, self.config, self.env,
                                                                   owner=self.owner, claimed=box)
            run.gate, run.llm = run_services(
                a.policy, deadline=deadline, lockfile=self.lockfile, broker=self.broker, slug=a.slug,
                tool_runner=self.tool_runner,
                sandboxes=self.tool_sandboxes.for_run(run.run_id, a.runtime, run.stages, run.egress,
                                                      files=run.files),
            )  # fmt: skip
            task = run_task(run.run_id, a.manifest, a.policy, goal=goal, kwargs=kwargs)
            self.records.start(run)
            # Torn down after the result: the wrapper's answer waits for the end record (its exit competes
            # with the audit's fsync); a workload torn down before the result is released by its teardown.
            # A run with files is read back before its end record: its wrapper is never held.
            hold = self.teardowns.background and a.sandboxed and run.files is None
            if box is not None:
                self._active[run.run_id] = box.session
                box.session.hold_report = hold
                run.release = box.session.release
                box.session.listen_logs(run.on_log)
                box.open_egress(agent_route, SANDBOX_UID, SANDBOX_GID)  # before its task: then it looks
                box.session.assign(task, run.gate, run.llm)
                box.record_run(run.crash_record())
            else:
                # The task goes in before the workload starts: its first FetchTask never waits on us.
                session = RunSession(task=task, tools=run.gate, llm=run.llm, egress=agent_route,
                                     hold_report=hold)  # fmt: skip
                run.release = session.release
                session.listen_logs(run.on_log)
                self._active[run.run_id] = session
                info = run.crash_record()
                work = _start_cold(self, backend, spec, early, mounts, run_id=run.run_id, session=session,
                                   info=info)  # fmt: skip
                run.launched(work.stages, sandboxed=a.sandboxed)
            assert work is not None
            if on_start is not None:
                on_start(run.run_id)
            idle_limit = self.config.agent_sandbox.idle_timeout_seconds
            ending = watch(work.session, work, deadline=deadline + work.deadline_grace, idle_limit=idle_limit)
            run.mark("agent_done")
            run.fetched(work.session.fetched_at)
            _wind_down(work, ending, run, self.teardowns, sandboxed=a.sandboxed)
            outcome = conclude(
                ending,
                work,
                runtime=a.runtime,
                max_runtime_seconds=a.policy.max_runtime_seconds,
                idle_limit=idle_limit,
                pids_limit=self.limits.pids,
            )
            result = from_outcome(outcome, work.sink.text())
            if run.files is not None:  # read back once no sandbox of the run is left to write
                result, work = read_back(run, result, work, lambda w: self.teardowns.submit(
                    backend, w, lambda: run.mark("teardown"), inline=True))  # fmt: skip
            return result
        finally:
            self._active.pop(run.run_id, None)
            if run.egress is not None:
                run.egress.end()  # no connection more, from any of its sandboxes
            if run.gate is not None:
                run.gate.close()  # the run's tool sandboxes go with it, whatever ended it
            if work is not None:
                # A host process dies at once, and must never outlive a serve that is shutting down.
                teardown = functools.partial(
                    self.teardowns.submit, backend, work, lambda: run.mark("teardown"), inline=not a.sandboxed
                )
                if self.teardowns.background and a.sandboxed:
                    run.after_result = teardown  # it would compete with the audit for the host's cores
                else:
                    teardown()
            if run.files is not None:  # the area goes after the result (a container still going keeps
                release_files(run)  # its detached view)


def _after_result(host: SandboxHost, run: RunFacts) -> None:
    """What follows a run's result; never raises (it may run on a gRPC thread after the answer left)."""
    if run.release is not None:
        run.release()
    host.records.settle()  # the audit head's fsync, which the result did not wait for
    with contextlib.suppress(Exception):
        host.fds.refresh()  # the descriptor count the next admission would otherwise take
    if run.warm and host.pools is not None:
        host.pools.settled(run.run_id)  # its pool may refill now (host/runtime/pool.py)
    if run.after_result is not None:
        try:
            run.after_result()  # inline once the host closes: a failure keeps the result
        except Exception as exc:  # noqa: BLE001 (counted and logged; the startup sweep is the backstop)
            host.teardowns.failures += 1
            logger.warning("teardown of run %s failed: %s", run.run_id, type(exc).__name__)


def _start_cold(
    host: SandboxHost, backend: Backend[Any], spec: Any, early: Prelaunched | None,
    mounts: FilesMounts | None, *, run_id: str, session: RunSession, info: dict[str, object],
) -> Workload:  # fmt: skip
    """A cold run's workload: the prelaunched container adopted, or one started (with its files area
    mounted when it has one: only this host's engine mounts one)."""
    if early is not None:
        return host.docker.adopt(early, session=session, run_info=info)
    if mounts is not None:
        return host.docker.launch(spec, run_id=run_id, session=session, run_info=info, files=mounts)
    return backend.launch(spec, run_id=run_id, session=session, run_info=info)


def _with_caller_limits(
    a: Admission, limits: RunOverrides | None, config: HostConfig
) -> tuple[Admission, tuple[Rule, ...] | None]:
    """The admission with the caller's tighter caps applied, and the caller's egress grant for the run
    (None: the standing grants), refused with InvalidRequest where it reaches beyond the operator's."""
    if limits is None:
        return a, None
    if a.policy is not None:
        a = dataclasses.replace(a, policy=limits.tighten(a.policy))
    if limits.egress is None or a.entry is None:
        return a, None
    return a, caller_grant(limits.egress, config.agent_sandbox.egress, slug=a.slug,
                           trust=a.entry.trust_level)  # fmt: skip


def _host_metrics(
    active: Callable[[], int], pools: Callable[[], WarmPools[Any, Any] | None]
) -> HostMetrics:
    """The host's Prometheus metrics, counted at each run's end from its audit facts
    (host/runtime/telemetry/metrics.py). A one-shot `run` process has no one to report to and builds none:
    prometheus-client is then never imported."""
    from host.runtime.telemetry.metrics import HostMetrics  # noqa: PLC0415

    found = HostMetrics()
    found.watch(active, pools)
    return found


def _wind_down(
    work: Workload, ending: Ending, run: RunFacts, teardowns: Teardowns, *, sandboxed: bool
) -> None:
    """Close a watched run's session to its agent: cancelled unless it reported, its last lines awaited (for
    the result and a follower), then no line more to the follower.

    An agent that returned has its output in once the wrapper's marks arrive (host/runtime/workload.py), an
    exited one once its stream ends. A run that was stopped has no marks; a background teardown (serve) on
    Docker, whose stream carries output as it is written, answers without waiting for the container's end
    unless someone follows.
    """
    if ending is not Ending.REPORTED:
        work.session.cancel()  # the outcome is fixed now: nothing the agent sends later counts
    if ending in (Ending.REPORTED, Ending.EXITED):
        work.settle_logs(_LOG_SETTLE_ENDED_SECONDS)
    elif not (teardowns.background and sandboxed) or run.on_log is not None or work.logs_lag:
        work.settle_logs(_LOG_SETTLE_SECONDS)
    work.session.listen_logs(None)  # a line later than that is in the logs only


__all__ = ["RunResult", "SandboxHost"]
