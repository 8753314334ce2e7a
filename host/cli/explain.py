"""`policy explain`: what a run of an installed agent would get, computed by the functions a run uses
(host/policy/admission.py)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from host.cli.output import EXIT_OK, emit, say
from host.core.terminal import safe_line, safe_token
from host.core.vocab import Route
from host.policy.admission import decide_route, effective_policy, installed_agent, refusal_error
from host.policy.egress import manifest_grant
from host.policy.filesystem import FilesystemRefused, filesystem_grant
from host.policy.rules import RouteDecision, RunPolicy, declares_llm
from host.spec.config import HostConfig, load_config
from host.spec.files import FilesConfig
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
        egress = None  # the host route is outside the egress policy
        if sandboxed and not refused:
            egress = manifest_grant(m.permissions, m.network_domains, cfg.egress, slug=m.slug,
                                    trust=self.entry.trust_level)  # fmt: skip
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
            "egress": {
                "network": m.permissions.get("network", "none"),
                "declared": list(m.network_domains),
                "granted": None if egress is None else list(egress.texts()),
            },
            "filesystem": _filesystem(m, cfg.filesystem, sandboxed and not refused),
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


def _filesystem(m: AgentManifest, config: FilesConfig, sandboxed: bool) -> dict[str, Any]:
    """The effective filesystem grant: the declared level, what a run gets of its workspace, refused when
    `agent_sandbox.filesystem.allow` does not grant it (None for both off the sandbox)."""
    level = str(m.permissions.get("filesystem", "none"))
    workspace, refused = None, None
    if sandboxed:
        try:
            workspace = filesystem_grant(level, config).workspace
        except FilesystemRefused as exc:
            refused = exc.message
    return {"level": level, "workspace": workspace, "refused": refused,
            "limits": dataclasses.asdict(config.limits)}  # fmt: skip


def explain_policy(slug: str, *, env: Mapping[str, str] | None = None) -> Explanation:
    """Resolve an installed agent's route and effective policy without starting or changing anything."""
    environ = dict(os.environ if env is None else env)
    cfg = load_config(environ)
    entry = installed_agent(Lockfile(cfg.paths.lockfile), slug)
    decision = decide_route(entry, cfg, environ)
    manifest, policy = effective_policy(entry, cfg, decision.route)
    from host.llm.broker import LlmBroker  # only the explanation needs it, not every run's admission

    provider = LlmBroker(cfg.agent_sandbox.llm, environ).describe(slug)
    return Explanation(entry, decision, manifest, policy, cfg, provider)


def _human_explain(p: Mapping[str, Any]) -> None:
    """Every value is escaped where it is interpolated: package names, models and messages come from packs."""
    req, llm = p["requested"], p["llm"]

    def line(label: str, value: Any) -> None:
        say(f"  {label + ':':<21} {value}")

    def capped(key: str) -> str:
        lowered = f" (the host ceiling lowered it from {safe_line(req[key])})" if key in p["clamped"] else ""
        return f"{safe_line(p[key])}{lowered}"

    def names(items: Sequence[Any]) -> str:
        return ", ".join(safe_token(item) for item in items)

    say(f"{safe_token(p['slug'])} {safe_token(p['version'])} (trust {safe_token(p['trust'])})")
    line("route", f"{safe_token(p['route'])}: {safe_line(p['route_message'])}")
    if p["hint"]:
        line("hint", safe_line(p["hint"]))
    if p["runtime"]:
        image = safe_line(p["image"] or "(not pinned)")
        line("sandbox", f"runtime {safe_token(p['runtime'])}, image {image}")
    if p["allowed_packages"] is None:
        line("tools", "any installed tool pack (the manifest declares no tool_access.allowed_packages)")
    else:
        line("tools", names(p["allowed_packages"]) or "(none)")
    line("max_tool_calls", capped("max_tool_calls"))
    idle = safe_line(p["idle_timeout_seconds"])
    line("max_runtime_seconds", f"{capped('max_runtime_seconds')} (idle limit {idle})")
    line("max_iterations", capped("max_iterations"))
    if not llm["enabled"]:
        line("llm", "not granted (llm_access.enabled is not true, or the host disabled it)")
    else:
        if p["route"] == Route.HOST.value:
            line("llm", "host path: llm_access caps do not apply (sanity bounds below)")
        elif llm["granted_by"] == "grant_declared":
            line("llm", "granted by the host's llm.grant_declared (the pack declares it needs an LLM)")
        else:
            line("llm", "granted by the manifest's llm_access")
        for key in ("max_calls", "max_input_chars", "max_output_chars"):
            lowered = f" (lowered from {safe_line(req['llm'][key])})" if key in llm["clamped"] else ""
            line(f"llm {key}", f"{safe_line(llm[key])}{lowered}")
        for key in ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd"):
            if llm.get(key) is None:
                continue  # no such budget: the character caps above still bound every call
            lowered = f" (lowered from {safe_line(req['llm'].get(key))})" if key in llm["clamped"] else ""
            line(f"llm {key}", f"{safe_line(llm[key])}{lowered}")
        price = llm.get("price")
        if price is not None:
            line(
                "llm price",
                f"{safe_line(price.get('input_per_million'))} / "
                f"{safe_line(price.get('output_per_million'))} USD per million input / output tokens",
            )
        elif llm.get("max_cost_usd") is not None:
            line(
                "llm price",
                "none for the host model: max_cost_usd refuses every call (add the model to "
                "agent_sandbox.llm.prices)",
            )
        models = llm["allowed_models"]
        line("llm models", "any host model" if models is None else names(models) or "none")
    provider = safe_line(f"{llm['provider'] or '(none)'} {llm['model'] or ''}".strip())
    line("llm provider", f"{provider} ({'configured' if llm['configured'] else 'not configured'})")
    egress = p["egress"]
    if egress["granted"] is None:
        line("egress", "host path: the egress policy does not confine it")
    elif egress["granted"]:
        line("egress", ", ".join(safe_line(rule) for rule in egress["granted"]))  # `*.` needs no quotes
    else:
        network = safe_token(egress["network"])
        line("egress", f"none (permissions.network {network}; agent_sandbox.egress grants it nothing)")
    fs = p["filesystem"]
    if fs["refused"]:
        line("filesystem", f"refused: {safe_line(fs['refused'])}")
    elif fs["workspace"] is None:
        line("filesystem", "host path: no files area (the host's own files)")
    else:
        what = {"none": "no workspace", "read": "the caller's snapshot, read-only at /workspace",
                "write": "its own copy at /workspace, its changes to the caller"}[fs["workspace"]]
        line("filesystem", f"{safe_token(fs['level'])}: {what}; inputs and artifacts for any run")
    line("clamped by the host", names(p["clamped"]) or "nothing")


def cmd_policy(args: argparse.Namespace) -> int:
    payload = explain_policy(args.slug).to_json()
    emit(args, payload, lambda: _human_explain(payload))
    return EXIT_OK


__all__ = ["Explanation", "cmd_policy", "explain_policy"]
