"""What a running host counts, in Prometheus form: runs by outcome and reason, stage latencies, warm pools,
tool and LLM calls and refusals, budget exhaustion. `serve --metrics ADDR` exposes it over HTTP.

Every figure comes from the same facts the run's audit record is written from
(host/runtime/runaudit.RunFacts), at the same moment, so a scrape and the audit log agree. Labels are closed
sets (reasons, modes, stages, call kinds) plus the installed agents' slugs on the pool gauges; never a tenant,
a run id, a prompt or anything an agent wrote, so the series count stays bounded whatever callers send.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from host.runtime.pool import WarmPools
    from host.runtime.runaudit import RunFacts

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Histogram buckets from a warm run's milliseconds to the longest runtime a manifest may ask for."""

STAGES = ("routed", "verified", "claimed", "started", "fetched", "agent_done", "done")
"""The stages a run's latency histogram records (ms from the request, as the run's result carries them)."""

LLM_REFUSALS = ("refused_disabled", "refused_limit", "refused_input", "refused_output", "refused_model",
                "refused_tool")  # fmt: skip
"""The LLM usage counters that are refusals, by kind (host/llm/session.LlmSession.usage)."""

BUDGET_CAPS = {"refused_input_tokens": "max_input_tokens", "refused_total_tokens": "max_total_tokens",
               "refused_cost": "max_cost_usd"}  # fmt: skip
"""The budget refusal counters (host/llm/budget.LlmBudget.totals) by the cap they name."""


class HostMetrics:
    """One host's metrics in its own registry (never the process-global one: two hosts in one process,
    as in tests, do not mix)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.runs = Counter("agentnode_runs", "Runs ended, by outcome (success or failure), audit reason "
                            "and mode (agent_sandbox, agent_host, agent_sequential).",
                            ["outcome", "reason", "mode"], registry=r)  # fmt: skip
        self.duration = Histogram("agentnode_run_duration_seconds", "Wall-clock time of a run, request to "
                                  "result.", ["mode"], buckets=_SECONDS, registry=r)  # fmt: skip
        self.stages = Histogram("agentnode_run_stage_seconds", "Time from a run's request to each stage it "
                                "passed.", ["stage"], buckets=_SECONDS, registry=r)  # fmt: skip
        self.tool_calls = Counter("agentnode_tool_calls", "Tool calls that ran, by where (host_worker or "
                                  "tool_sandbox).", ["where"], registry=r)  # fmt: skip
        self.tool_refusals = Counter("agentnode_tool_refusals", "Tool calls the host refused.", registry=r)
        self.llm_calls = Counter("agentnode_llm_calls", "LLM requests that reached a provider call slot.",
                                 registry=r)  # fmt: skip
        self.llm_refusals = Counter("agentnode_llm_refusals", "LLM requests refused before the provider, by "
                                    "kind.", ["kind"], registry=r)  # fmt: skip
        self.llm_provider_errors = Counter("agentnode_llm_provider_errors",
                                           "LLM calls the provider failed.", registry=r)  # fmt: skip
        self.llm_tokens = Counter("agentnode_llm_tokens", "LLM tokens charged, as the provider counted them, "
                                  "by direction (input or output).", ["direction"], registry=r)  # fmt: skip
        self.llm_model_tool_calls = Counter("agentnode_llm_model_tool_calls",
                                            "Tool calls models asked for in completions, and those refused.",
                                            ["refused"], registry=r)  # fmt: skip
        self.budget_refusals = Counter("agentnode_llm_budget_refusals",
                                       "LLM calls refused: a token or cost budget was spent, by the cap.",
                                       ["cap"], registry=r)  # fmt: skip
        self.egress_connections = Counter("agentnode_egress_connections", "Egress connections that reached "
                                          "their origin.", registry=r)  # fmt: skip
        self.egress_refusals = Counter("agentnode_egress_refusals", "Egress connections refused, by fixed "
                                       "reason.", ["reason"], registry=r)  # fmt: skip
        self.egress_cuts = Counter("agentnode_egress_cuts", "Egress connections the host closed, by fixed "
                                   "reason.", ["reason"], registry=r)  # fmt: skip
        self.egress_bytes = Counter("agentnode_egress_bytes", "Bytes through the egress path, by direction "
                                    "(out: to origins, in: back).", ["direction"], registry=r)  # fmt: skip

    def watch(self, active: Callable[[], int], pools: Callable[[], WarmPools[Any, Any] | None]) -> None:
        """Read the live figures (active runs, warm pool members, hits and misses) at each scrape."""
        self.registry.register(_LiveCollector(active, pools))

    def run_ended(self, run: RunFacts, *, reason: str, success: bool, duration_ms: int) -> None:
        """Count one ended run, from the facts its audit record was written from."""
        mode = run.source.value
        self.runs.labels("success" if success else "failure", reason, mode).inc()
        self.duration.labels(mode).observe(max(0, duration_ms) / 1000)
        for stage in STAGES:
            ms = run.stages.get(stage)
            if ms is not None:
                self.stages.labels(stage).observe(max(0.0, ms) / 1000)
        gate = run.gate
        if gate is not None:
            from host.tools.calls import MODE_HOST_WORKER, MODE_TOOL_SANDBOX  # noqa: PLC0415

            self.tool_calls.labels("host_worker").inc(gate.calls_in(MODE_HOST_WORKER))
            self.tool_calls.labels("tool_sandbox").inc(gate.calls_in(MODE_TOOL_SANDBOX))
            self.tool_refusals.inc(gate.refusals)
        if run.llm is not None:
            self._llm(run.llm.usage(), run.llm.budget_usage())
        if run.egress is not None and run.egress.routed:
            self._egress(run.egress.ledger.summary())

    def _egress(self, summary: Mapping[str, Any]) -> None:
        from host.egress.ledger import CUTS, REFUSALS  # noqa: PLC0415

        rules = summary.get("rules") or {}
        self.egress_connections.inc(sum(_count(counts, "connections") for counts in rules.values()))
        for reason in REFUSALS:
            self.egress_refusals.labels(reason).inc(_count(summary.get("refused") or {}, reason))
        for reason in CUTS:
            self.egress_cuts.labels(reason).inc(_count(summary.get("cut") or {}, reason))
        self.egress_bytes.labels("out").inc(_count(summary, "bytes_out"))
        self.egress_bytes.labels("in").inc(_count(summary, "bytes_in"))

    def _llm(self, usage: Mapping[str, Any], budget: Mapping[str, Any]) -> None:
        self.llm_calls.inc(_count(usage, "calls"))
        self.llm_provider_errors.inc(_count(usage, "provider_errors"))
        for kind in LLM_REFUSALS:
            self.llm_refusals.labels(kind.removeprefix("refused_")).inc(_count(usage, kind))
        refused_calls = _count(usage, "tool_calls_refused")
        self.llm_model_tool_calls.labels("false").inc(max(0, _count(usage, "tool_calls") - refused_calls))
        self.llm_model_tool_calls.labels("true").inc(refused_calls)
        self.llm_tokens.labels("input").inc(_count(budget, "input_tokens"))
        self.llm_tokens.labels("output").inc(_count(budget, "output_tokens"))
        for key, cap in BUDGET_CAPS.items():
            self.budget_refusals.labels(cap).inc(_count(budget, key))


def _count(values: Mapping[str, Any], key: str) -> int:
    value = values.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class _LiveCollector(Collector):
    """Figures read when scraped rather than counted as they happen."""

    def __init__(self, active: Callable[[], int], pools: Callable[[], WarmPools[Any, Any] | None]) -> None:
        self._active = active
        self._pools = pools

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: its families depend on the pools present at scrape time

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily("agentnode_active_runs", "Runs in progress.")
        active.add_metric([], self._active())
        yield active
        pools = self._pools()
        members = GaugeMetricFamily("agentnode_warm_pool_members", "Ready or starting warm pool members, by "
                                    "pool (agent slug/version/runtime).", labels=["pool"])  # fmt: skip
        ready = GaugeMetricFamily("agentnode_warm_pool_ready", "Warm pool members connected and waiting for "
                                  "a task (of the members: the rest are starting), by pool.", labels=["pool"])
        hits = CounterMetricFamily("agentnode_warm_pool_hits", "Runs of a pooled agent that got a member.")
        misses = CounterMetricFamily("agentnode_warm_pool_misses", "Runs of a pooled agent that found no "
                                     "member and started cold.")  # fmt: skip
        if pools is not None:
            for pool, count in sorted(pools.counts().items()):
                members.add_metric([pool], count)
            for pool, count in sorted(pools.ready_counts().items()):
                ready.add_metric([pool], count)
            hits.add_metric([], pools.hits)
            misses.add_metric([], pools.misses)
        else:
            hits.add_metric([], 0)
            misses.add_metric([], 0)
        yield members
        yield ready
        yield hits
        yield misses


__all__ = ["BUDGET_CAPS", "LLM_REFUSALS", "STAGES", "HostMetrics"]
