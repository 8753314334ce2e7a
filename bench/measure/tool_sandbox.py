"""The tool_sandbox section: one no-op tool as a trusted pack and as a community (sandboxed) one."""

from __future__ import annotations

from typing import Any

from bench._state import BenchState
from bench._stats import med, ratio, summary
from bench.measure.shared import succeeded
from bench.report.tool_sandbox import TOOL_SANDBOX_STAGES
from host.runtime.runner import SandboxHost


def tool_sandbox(state: BenchState, runtime: str, n: int, warmup: int) -> dict[str, Any]:
    """The same no-op tool as a trusted pack (host worker) and a community pack (tool sandbox), called
    interleaved by one sandboxed agent, timed inside it; the community pack's first call (which starts its
    tool sandbox) apart, with the host's per-stage view of that start."""
    n, warmup = min(n, 200), min(warmup, 20)  # 2 calls a round within the agent's max_tool_calls (500)
    host = SandboxHost(env=state.env)
    try:
        result = succeeded(host.run(state.toolbox_caller, runtime=runtime, kwargs={
            "trusted": state.tools, "community": state.community_tools, "n": n, "warmup": warmup}))
    finally:
        host.close()
    r = result.result
    if r["modes"] != ["host_worker", "tool_sandbox"] or not r["first_ok"]:
        raise RuntimeError(f"the calls did not run where expected: {r['modes']}")
    trusted, community = summary(r["trusted_ms"]), summary(r["community_ms"])
    return {
        "trusted_ms": trusted,
        "community_ms": community,
        "ratio": ratio(med(community), med(trusted)),
        "first_call_ms": round(r["first_ms"], 2),
        "first_start_ms": {k: result.stages.get(f"tool_sandbox_{k}") for k in TOOL_SANDBOX_STAGES},
    }


__all__ = ["tool_sandbox"]
