"""`policy explain`: what a run of an installed agent would get, computed by the functions a run uses
(host/policy/admission.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from host.core.vocab import Route
from host.policy.admission import decide_route, effective_policy, installed_agent, refusal_error
from host.policy.rules import RouteDecision, RunPolicy, declares_llm
from host.spec.config import HostConfig, load_config
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.model import LLM_CAP_KEYS, LLM_COST_CAP_KEY, LLM_TOKEN_CAP_KEYS, AgentManifest


@dataclass(frozen=True)
class Explanation:
    """Everything `policy explain` reports about one agent."""

    entry: LockEntry
    decision: RouteDecision
    manifest: AgentManifest
    policy: RunPolicy
    config: HostConfig
    llm_provider: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The documented `policy explain --json` object (docs/cli.md)."""
        p, m, cfg = self.policy, self.manifest, self.config.agent_sandbox
        sandboxed = self.decision.route is not Route.HOST
        refused = self.decision.route is Route.REFUSED
        requested_llm = {
            key: m.llm_access.get(key) for key in (*LLM_CAP_KEYS, *LLM_TOKEN_CAP_KEYS, LLM_COST_CAP_KEY)
        }
        models = m.llm_access.get("allowed_models")
        model = self.llm_provider.get("model")
        price = cfg.llm.prices.get(model) if isinstance(model, str) else None
        return {
            "slug": self.entry.slug,
            "version": self.entry.version,
            "trust": self.entry.trust_level,
            "route": self.decision.route.value,
            "route_reason": self.decision.reason or None,
            "route_message": self.decision.message,
            "hint": refusal_error(self.decision).hint if refused else None,
            "runtime": cfg.runtime if sandboxed else None,
            "image": cfg.image if sandboxed else None,
            "allowed_packages": None if p.allowed_packages is None else list(p.allowed_packages),
            "max_tool_calls": p.max_tool_calls,
            "max_runtime_seconds": p.max_runtime_seconds,
            "max_iterations": p.max_iterations,
            "idle_timeout_seconds": cfg.idle_timeout_seconds,
            "llm": {
                "enabled": p.llm.enabled,
                "granted_by": p.llm.granted_by or None,
                "max_calls": p.llm.max_calls,
                "max_input_chars": p.llm.max_input_chars,
                "max_output_chars": p.llm.max_output_chars,
                "allowed_models": None if p.llm.allowed_models is None else sorted(p.llm.allowed_models),
                "max_input_tokens": p.llm.max_input_tokens,
                "max_output_tokens": p.llm.max_output_tokens,
                "max_total_tokens": p.llm.max_total_tokens,
                "max_cost_usd": p.llm.max_cost_usd,
                "price": None if price is None else {
                    "input_per_million": price.input_per_million,
                    "output_per_million": price.output_per_million,
                },
                "clamped": list(p.llm.clamped),
                "provider": self.llm_provider.get("provider"),
                "model": self.llm_provider.get("model"),
                "configured": bool(self.llm_provider.get("configured")),
                "provider_source": self.llm_provider.get("provider_source"),
                "key_variable": self.llm_provider.get("key_variable"),
                "key_source": self.llm_provider.get("key_source"),
                "unavailable": self.llm_provider.get("unavailable"),
            },
            "clamped": list(p.clamped),
            "requested": {
                "allowed_packages": None if m.allowed_packages is None else list(m.allowed_packages),
                "max_tool_calls": m.max_tool_calls,
                "max_runtime_seconds": m.max_runtime_seconds,
                "max_iterations": m.max_iterations,
                "llm": {
                    "enabled": m.llm_access.get("enabled") is True,
                    "declared": declares_llm(m),
                    **requested_llm,
                    "allowed_models": None if models is None else [str(x).strip() for x in models],
                },
            },
        }


def explain_policy(slug: str, *, env: Mapping[str, str] | None = None) -> Explanation:
    """Resolve an installed agent's route and effective policy without starting or changing anything."""
    environ = dict(os.environ if env is None else env)
    cfg = load_config(environ)
    entry = installed_agent(Lockfile(cfg.paths.lockfile), slug)
    decision = decide_route(entry, cfg, environ)
    manifest, policy = effective_policy(entry, cfg, decision.route)
    from host.llm.broker import LlmBroker  # noqa: PLC0415  only the explanation needs it, not every run's admission

    provider = LlmBroker(cfg.agent_sandbox.llm, environ).describe(slug)
    return Explanation(entry, decision, manifest, policy, cfg, provider)


__all__ = ["Explanation", "explain_policy"]
