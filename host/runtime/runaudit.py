"""One run's facts and audit records: a start before agent code, exactly one end, host_lost after a crash."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from host.audit.log import AuditLog
from host.audit.records import run_record, start_record
from host.core.errors import AuditReason, SandboxError
from host.core.logs import set_run_id
from host.core.vocab import Source
from host.files.run import RunFiles
from host.llm.session import LlmSession
from host.policy.admission import Admission
from host.policy.caller import NO_CALLER, CallerInfo
from host.runtime.egress import RunEgress
from host.tools.calls import MODE_HOST_WORKER, MODE_TOOL_SANDBOX
from host.tools.gate import ToolGate


@dataclass
class RunFacts:
    """What one run gathers for its result and its audit records; the run id is set once, before its task."""

    started: float
    admission: Admission | None = None
    run_id: str = ""
    warm: bool = False
    placed: bool = False
    """A backend took the run (past admission and the host's capacity check)."""
    llm: LlmSession | None = None
    gate: ToolGate | None = None
    egress: RunEgress | None = None
    """The run's egress account (a sandboxed run's), whatever its grant."""
    files: RunFiles | None = None
    """The run's files (host/files/run.py), when its caller handed it any."""
    stages: dict[str, float] = field(default_factory=dict)
    on_stage: Callable[[str], None] | None = None
    on_log: Callable[[str], None] | None = None
    """Each line of the agent's output as it is written (within the log cap)."""
    caller: CallerInfo = NO_CALLER
    after_result: Callable[[], None] | None = None
    """Work the run's result need not wait for (a background teardown): done once the result is fixed."""
    release: Callable[[], None] | None = None
    """Lets a held ReportResult answer go (host/runtime/session.py, `hold_report`): called once the end record
    is written, and again (harmlessly) after the result."""

    def fix_id(self, run_id: str, *, warm: bool = False, placed: bool = True) -> None:
        assert not self.run_id, "a run's id is fixed once"
        self.run_id, self.warm, self.placed = run_id, warm, placed
        set_run_id(run_id)  # the runner's thread works for this run: its log records say so

    def mark(self, stage: str) -> None:
        self.stages[stage] = round((time.monotonic() - self.started) * 1000, 2)
        if self.on_stage is not None:
            with contextlib.suppress(Exception):
                self.on_stage(stage)

    def launched(self, stages: Mapping[str, float], *, sandboxed: bool) -> None:
        """The workload started: its own stages (ms from its launch, `sandbox_` for a container's), then
        the run's `started`."""
        self.stages.update({f"{'sandbox_' if sandboxed else ''}{k}": v for k, v in stages.items()})
        self.mark("started")

    def fetched(self, at: float | None) -> None:
        """When the agent fetched its task (a monotonic time), if it did."""
        if at is not None:
            self.stages["fetched"] = round((at - self.started) * 1000, 2)

    @property
    def source(self) -> Source:
        """The audit source; a run refused before admission decided would have been sandboxed."""
        return self.admission.source if self.admission else Source.AGENT_SANDBOX

    @property
    def sandboxed(self) -> bool:
        return self.admission is not None and self.admission.sandboxed

    def crash_record(self) -> dict[str, object]:
        """What a restarted host needs to audit this run if this host dies first."""
        a = self.admission
        return {
            "run_id": self.run_id,
            "slug": a.slug if a else "",
            "trust": a.recorded_trust if a else None,
            "source": self.source.value,
            "sandbox": self.sandboxed,
            "runtime": a.runtime if a else None,
            "image": a.image if a else None,
            "caller": None if self.caller.empty else self.caller.record(),
        }


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


class RunAudit:
    """Writes a run's records to the host's audit log; a run with no start record never starts, and one
    whose end record cannot be written has its result withheld."""

    def __init__(self, log: AuditLog) -> None:
        self.log = log

    @property
    def hint(self) -> str:
        """What the operator does when the audit log cannot be written (both audit_failed paths)."""
        return (
            f"free disk space or fix the permissions of {self.log.path}, then check: "
            "agentnode-sandbox audit verify"
        )

    def start(self, run: RunFacts) -> None:
        """Record the run's start before any agent code runs; no start record, no run."""
        a = run.admission
        assert a is not None and a.policy is not None
        record = start_record(
            slug=a.slug,
            trust=a.recorded_trust,
            run_id=run.run_id,
            source=a.source.value,
            sandbox=run.sandboxed,
            runtime=a.runtime,
            max_runtime_seconds=a.policy.max_runtime_seconds,
        )
        # Not fsynced: it must survive this process dying (the page cache does), the end record is synced.
        if not self.log.append(record, sync=False):
            raise SandboxError(
                "the audit log cannot be written, so the run was not started",
                reason=AuditReason.AUDIT_FAILED,
                hint=self.hint,
            )

    def end(
        self,
        run: RunFacts,
        *,
        slug: str,
        reason: AuditReason,
        success: bool,
        duration_ms: int,
        timed_out: bool,
    ) -> bool:
        """The run's one end record; False when it could not be written (kept and retried by the log)."""
        a = run.admission
        llm: dict[str, Any] | None = None
        usage = run.llm.usage() if run.llm is not None else {}
        if a is not None and a.policy is not None and run.llm is not None:
            p = a.policy.llm
            llm = {
                "enabled": p.enabled,
                "max_calls": p.max_calls,
                "max_input_chars": p.max_input_chars,
                "max_output_chars": p.max_output_chars,
                "allowed_models": sorted(p.allowed_models) if p.allowed_models is not None else None,
                "max_input_tokens": p.max_input_tokens,
                "max_output_tokens": p.max_output_tokens,
                "max_total_tokens": p.max_total_tokens,
                "max_cost_usd": p.max_cost_usd,
                **run.llm.usage(),
                **run.llm.budget_usage(),
            }
        record = run_record(
            slug=slug,
            trust=a.recorded_trust if a else None,
            run_id=run.run_id,
            action="allow" if success else "deny",
            source=run.source.value,
            reason=reason.value,
            sandbox=run.sandboxed,
            runtime=a.runtime if a and run.placed else None,
            image=a.image if a and run.placed else None,
            duration_ms=duration_ms,
            timed_out=timed_out,
            llm=llm,
            tool_calls=run.gate.calls_made if run.gate else 0,
            tool_refusals=run.gate.refusals if run.gate else 0,
            tool_calls_host_worker=run.gate.calls_in(MODE_HOST_WORKER) if run.gate else 0,
            tool_calls_tool_sandbox=run.gate.calls_in(MODE_TOOL_SANDBOX) if run.gate else 0,
            tool_sandboxes_started=run.gate.sandboxes_started if run.gate else 0,
            llm_tool_calls=int(usage.get("tool_calls", 0)),
            llm_tool_calls_refused=int(usage.get("tool_calls_refused", 0)),
            caller=None if run.caller.empty else run.caller.record(),
            egress=run.egress.ledger.summary() if run.egress is not None and run.egress.routed else None,
            files=run.files.outcome.summary() if run.files is not None else None,
        )
        # durable before the result is returned; the head's own fsync follows it (`settle`)
        return self.log.append(record, head_later=True)

    def settle(self) -> None:
        """Make durable what a run's end left for after its result (the audit head); never raises."""
        with contextlib.suppress(OSError):
            self.log.sync_head()

    def host_lost(self, info: Mapping[str, object]) -> bool:
        """The end record of a run whose host died, from the crash record its run directory kept."""
        record = run_record(
            slug=str(info.get("slug", "")),
            trust=_str_or_none(info.get("trust")),
            run_id=str(info.get("run_id", "")),
            action="deny",
            source=str(info.get("source", Source.AGENT_SANDBOX.value)),
            reason=AuditReason.HOST_LOST.value,
            sandbox=bool(info.get("sandbox")),
            runtime=_str_or_none(info.get("runtime")),
            image=_str_or_none(info.get("image")),
            duration_ms=0,
            timed_out=False,
            llm=None,
            tool_calls=0,
            tool_refusals=0,
            caller=caller if isinstance(caller := info.get("caller"), Mapping) else None,
        )
        return self.log.append(record)


__all__ = ["RunAudit", "RunFacts"]
