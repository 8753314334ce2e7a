"""OpenTelemetry spans for each run: the run, its stages, its tool and LLM calls, exported over OTLP.

Spans are made once the run is over, from the facts its audit record is written from (the stage times) and
the calls' own timings (host/core/calltrace.py), with their real start and end times: nothing on a run's hot
path touches a tracer, and no tracing context crosses into the threads that serve the agent. Attributes
are host facts (ids, fixed reason codes, counts, the lockfile's names, the caller's validated metadata):
never a prompt, a tool argument, a completion or anything an agent wrote.

Tracing is on when the standard OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set and the
`tracing` extra is installed (else a warning names the extra); tests hand in their own span exporter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from host.runtime.runaudit import RunFacts

logger = logging.getLogger("agentnode.sandbox.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "agentnode-sandbox"

STAGE_SPANS = (
    ("agentnode.admission", None, "routed"),
    ("agentnode.prepare", "routed", ("claimed", "verified")),
    ("agentnode.start", ("claimed", "verified"), "started"),
    ("agentnode.agent", "started", "agent_done"),
    ("agentnode.finish", "agent_done", "done"),
)
"""Each stage span: its name, the stage it starts at (None: the request) and the stage it ends at (a tuple:
the first of them the run passed). A stage the run never reached leaves its span out."""


class RunTracer:
    """Turns ended runs into spans; a tracer without a provider does nothing and costs nothing."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("agentnode.sandbox") if provider is not None else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunTracer:
        """On when an OTLP endpoint is set in `env` and the tracing extra is installed."""
        if not any(env.get(v) for v in ENDPOINT_VARIABLES):
            return cls()
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )
        except ImportError:
            logger.warning(
                "an OTLP endpoint is set but tracing is not installed: "
                "pip install 'agentnode-sandbox[tracing]'"
            )
            return cls()
        return cls.exporting(OTLPSpanExporter(), batch=True)

    @classmethod
    def exporting(cls, exporter: Any, *, batch: bool = False) -> RunTracer:
        """A tracer whose spans go to `exporter` (an OpenTelemetry SpanExporter)."""
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor  # noqa: PLC0415

        provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def run_ended(self, run: RunFacts, *, reason: str, success: bool, duration_ms: int) -> None:
        """The run's span tree, back-dated to when each part happened."""
        if self._tracer is None:
            return
        try:
            self._emit(run, reason=reason, success=success, duration_ms=duration_ms)
        except Exception as exc:  # noqa: BLE001  a tracing fault never touches a run's result
            logger.warning("could not record the run's trace: %s", type(exc).__name__)

    def _emit(self, run: RunFacts, *, reason: str, success: bool, duration_ms: int) -> None:
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        assert self._tracer is not None
        # Monotonic times to wall-clock nanoseconds, through one reading of each clock.
        offset_ns = time.time_ns() - int(time.monotonic() * 1e9)

        def wall(monotonic: float) -> int:
            return int(monotonic * 1e9) + offset_ns

        start = wall(run.started)
        end = start + max(0, duration_ms) * 1_000_000
        a = run.admission
        attributes: dict[str, Any] = {
            "agentnode.run_id": run.run_id,
            "agentnode.slug": a.slug if a is not None else "",
            "agentnode.mode": run.source.value,
            "agentnode.reason": reason,
            "agentnode.success": success,
            "agentnode.warm": run.warm,
        }
        if a is not None and run.placed and a.runtime:
            attributes["agentnode.runtime"] = a.runtime
        if not run.caller.empty:
            attributes["agentnode.caller.tenant"] = run.caller.tenant
            attributes["agentnode.caller.request_id"] = run.caller.request_id
        root = self._tracer.start_span("agentnode.run", start_time=start, attributes=attributes)
        if not success:
            root.set_status(Status(StatusCode.ERROR, reason))
        context = trace.set_span_in_context(root)
        stages = run.stages

        def at(stage: str | tuple[str, ...] | None) -> int | None:
            if stage is None:
                return start
            for name in (stage,) if isinstance(stage, str) else stage:
                if name in stages:
                    return start + int(stages[name] * 1e6)
            return None

        for name, begin, finish in STAGE_SPANS:
            t0, t1 = at(begin), at(finish)
            if t0 is not None and t1 is not None and t1 >= t0:
                self._tracer.start_span(name, context=context, start_time=t0).end(end_time=t1)
        egress = run.egress.ledger if run.egress is not None else None
        for kind, owner in (("tool", run.gate), ("llm", run.llm), ("egress", egress)):
            calls = getattr(owner, "trace", None)
            if calls is None:
                continue
            for call in calls.spans():
                span = self._tracer.start_span(call.name, context=context, start_time=wall(call.start),
                                               attributes=dict(call.attributes))  # fmt: skip
                span.end(end_time=wall(call.end))
            if calls.dropped:
                root.set_attribute(f"agentnode.{kind}_calls_untraced", calls.dropped)
        root.end(end_time=end)

    def shutdown(self) -> None:
        """Flush and stop the exporter (a host that closes sends what it has)."""
        if self._provider is not None:
            self._provider.shutdown()


__all__ = ["ENDPOINT_VARIABLES", "STAGE_SPANS", "RunTracer"]
