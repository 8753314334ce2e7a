"""`doctor`: a read-only readiness report that names, for each refusal a run would hit, the run's own fix.

Every failing row carries the `hint` of the very SandboxError a run raises for the same condition, so the
fix an operator reads here is the one the run would print; nothing is swept, built, pinned or written.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host.cli.output import EXIT_FAILED, EXIT_OK, emit, say
from host.core.errors import AuditReason, ConfigError, EngineError, SandboxError
from host.core.owner import owner_alive
from host.core.terminal import safe_line, safe_token
from host.core.vocab import HOST_TRUST, Route, Trust
from host.engine.engine import open_engine
from host.engine.errors import engine_errors
from host.engine.facts import EngineFacts, engine_facts, require_capable
from host.engine.http import EngineClient
from host.engine.image import image_status, verify_pinned_image
from host.engine.labels import LABEL_OWNER, LABEL_RUN, LABEL_WARM
from host.engine.volumes import verify_volume
from host.policy.admission import (
    decide_route,
    effective_policy,
    host_copy_error,
    installed_agent,
    refusal_error,
)
from host.policy.egress import grant_hint, manifest_grant
from host.policy.rules import RunPolicy, route_run
from host.spec.config import HostConfig, load_config, sandbox_enabled
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.model import AgentManifest, ToolpackManifest
from sandbox_wrapper.protocol import PROTOCOL_VERSION

# verify_pinned_image refuses in this order; each refusal has its own row.
IMAGE_ROWS: tuple[tuple[str, AuditReason], ...] = (
    ("image_pinned", AuditReason.IMAGE_NOT_PINNED),
    ("image_present", AuditReason.IMAGE_MISSING),
    ("image_matches_pin", AuditReason.IMAGE_MISMATCH),
    ("image_protocol", AuditReason.PROTOCOL_MISMATCH),
)
LEFTOVER_FIX = "they are swept on the next run"


@dataclass(frozen=True)
class Check:
    """One row of the report; `fix` is what to do about it ("" when nothing)."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


def _failed(check: str, exc: SandboxError) -> Check:
    return Check(check, False, exc.message, exc.hint)


@dataclass(frozen=True)
class DoctorReport:
    """All rows; ready only when every row is ok."""

    slug: str | None
    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "slug": self.slug,
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }


def describe_engine(facts: EngineFacts) -> str:
    """`docker 20.10.24, cgroup v1` / `podman 4.3.1 rootless, cgroup v2`: what the rows were judged on."""
    mode = " rootless" if facts.rootless else ""
    cgroup = f", cgroup v{facts.cgroup_version}" if facts.cgroup_version else ""
    return f"{facts.kind} {facts.server_version}{mode}{cgroup}"


def capability_checks(client: EngineClient, runtime: str) -> list[Check]:
    """The memory-ceiling and runtime rows, each judged by the runner's own `require_capable`.

    `require_capable` stops at its first refusal, so each condition is probed alone: the other
    condition is assumed met, which keeps both rows and both fixes visible at once.
    """
    try:
        facts = engine_facts(client)
    except EngineError as exc:
        return [_failed("engine", exc)]
    rows: list[Check] = []
    probes = (
        ("memory_limit", dataclasses.replace(facts, runtimes=facts.runtimes | {runtime}),
         f"the engine ({describe_engine(facts)}) enforces memory, swap and pids limits"),
        ("runtime", dataclasses.replace(facts, memory_limit=True, swap_limit=True, pids_limit=True),
         f"runtime {runtime} is registered with the engine"),
    )  # fmt: skip
    for check, probe, detail in probes:
        try:
            require_capable(probe, runtime)
        except EngineError as exc:
            rows.append(_failed(check, exc))
        else:
            rows.append(Check(check, True, detail))
    return rows


def image_checks(client: EngineClient, pin: str | None) -> list[Check]:
    """One row per refusal of `verify_pinned_image`; rows after the first failing one are not judged."""
    passed_detail = {
        "image_pinned": f"agent_sandbox.image = {pin}",
        "image_present": "the pinned image is present in the engine",
        "image_matches_pin": "it is the agentnode-sandbox image the pin names",
        "image_protocol": f"it speaks sandbox protocol {PROTOCOL_VERSION}",
    }
    try:
        verify_pinned_image(client, pin)
    except EngineError as exc:
        names = [name for name, reason in IMAGE_ROWS if reason == exc.reason]
        if not names:  # the engine itself failed mid-check
            return [_failed(exc.check, exc)]
        rows = [Check(name, True, passed_detail[name]) for name, _ in IMAGE_ROWS]
        failed_at = [name for name, _ in IMAGE_ROWS].index(names[0])
        return [*rows[:failed_at], _failed(names[0], exc)]
    status = image_status(client, pin)
    if status.current_inputs_hash is not None and not status.up_to_date:
        passed_detail["image_protocol"] += (
            " (built from older docker/ inputs than this checkout; `agentnode-sandbox image build` "
            "refreshes it and records the new pin)"
        )
    return [Check(name, True, passed_detail[name]) for name, _ in IMAGE_ROWS]


def leftover_check(client: EngineClient) -> Check:
    """Informational: run containers whose owning host process is gone (the next run sweeps them)."""
    try:
        with engine_errors():
            found = client.containers(labels=[LABEL_RUN, LABEL_OWNER])
    except EngineError as exc:
        return _failed("leftover_containers", exc)
    dead = sum(1 for c in found if not owner_alive((c.get("Labels") or {}).get(LABEL_OWNER, "")))
    warm = sum(1 for c in found if (c.get("Labels") or {}).get(LABEL_WARM) == "1")
    pools = f"; {warm} warm pool member(s) (waiting, or serving their one run)" if warm else ""
    if not dead:
        return Check("leftover_containers", True, f"no run containers of dead host processes{pools}")
    return Check(
        "leftover_containers", True, f"{dead} run container(s) of host processes that are gone", LEFTOVER_FIX
    )


@dataclass
class _Pack:
    """What doctor learned about SLUG; `route` is None when it could not be decided."""

    rows: list[Check]
    entry: LockEntry | None = None
    route: Route | None = None


def _pack_checks(slug: str, cfg: HostConfig, env: Mapping[str, str]) -> _Pack:
    """installed, agent, route, manifest: the run's own steps, in its order, up to the first refusal."""
    try:
        entry = installed_agent(Lockfile(cfg.paths.lockfile), slug)
    except SandboxError as exc:
        return _Pack([_failed("agent" if exc.reason == AuditReason.NOT_AN_AGENT else "installed", exc)])
    pack = _Pack(
        [
            Check("installed", True, f"{slug} {entry.version}, trust {entry.trust_level}"),
            Check("agent", True, f"{slug} is an agent pack"),
        ],
        entry,
    )
    try:
        decision = decide_route(entry, cfg, env)
    except ConfigError:
        return pack  # the feature_flag row names the problem
    pack.route = decision.route
    if decision.route is Route.REFUSED:
        pack.rows.append(_failed("route", refusal_error(decision)))
    else:
        where = "host (a local process, not isolated)" if decision.route is Route.HOST else "sandbox"
        pack.rows.append(Check("route", True, f"{where}: {decision.message}"))
    try:
        manifest, policy = effective_policy(entry, cfg, decision.route)
    except SandboxError as exc:
        pack.rows.append(_failed("manifest", exc))
    else:
        pack.rows.append(
            Check(
                "manifest",
                True,
                f"valid; max_tool_calls {policy.max_tool_calls}, max_runtime_seconds "
                f"{policy.max_runtime_seconds}, llm {'on' if policy.llm.enabled else 'off'} "
                f"(details: agentnode-sandbox policy explain {slug})",
            )
        )
        if decision.route is Route.SANDBOX:
            pack.rows.append(egress_check(entry, manifest, policy, cfg))
    return pack


MAX_EGRESS_TOOLPACKS = 8
"""Tool packs the egress row names one by one (the rest are counted)."""


def _grant_text(manifest: AgentManifest | ToolpackManifest, cfg: HostConfig, slug: str, trust: str) -> str:
    """`NAME:PORT, ...` a pack's sandbox reaches, or why it reaches nothing (its level, or no grant)."""
    network = manifest.permissions.get("network", "none")
    grant = manifest_grant(manifest.permissions, manifest.network_domains, cfg.agent_sandbox.egress,
                           slug=slug, trust=trust)  # fmt: skip
    if not grant.empty:
        return ", ".join(grant.texts())
    if network == "none":
        return "none (permissions.network none)"
    return f"none (permissions.network {network}; agent_sandbox.egress grants it nothing)"


def egress_check(entry: LockEntry, manifest: AgentManifest, policy: RunPolicy, cfg: HostConfig) -> Check:
    """Informational: what the agent's sandbox may reach, and each community tool pack it may call (a tool
    pack's grant is its own declaration within the operator's config, whoever calls it)."""
    parts = [f"{entry.slug}: {_grant_text(manifest, cfg, entry.slug, entry.trust_level)}"]
    try:
        installed = Lockfile(cfg.paths.lockfile).entries()
    except SandboxError as exc:
        return _failed("egress", exc)
    tools = [
        installed[slug] for slug in sorted(installed)
        if installed[slug].package_type == "toolpack" and installed[slug].trust_level not in HOST_TRUST
        and (policy.allowed_packages is None or slug in policy.allowed_packages)
    ]  # fmt: skip
    for tool in tools[:MAX_EGRESS_TOOLPACKS]:
        try:
            text = _grant_text(tool.parsed_manifest(), cfg, tool.slug, tool.trust_level)
        except SandboxError:
            text = "unknown (its lockfile entry does not validate: reinstall it)"
        parts.append(f"tool {tool.slug}: {text}")
    if len(tools) > MAX_EGRESS_TOOLPACKS:
        parts.append(f"and {len(tools) - MAX_EGRESS_TOOLPACKS} more tool pack(s)")
    asks = manifest.permissions.get("network", "none") != "none"
    ungranted = asks and not cfg.agent_sandbox.egress.granted(entry.slug, entry.trust_level)
    fix = grant_hint(entry.slug, entry.trust_level) if ungranted else ""
    return Check("egress", True, "; ".join(parts), fix)


def _flag_check(cfg: HostConfig, env: Mapping[str, str], route: Route | None, slug: str | None) -> Check:
    """Off is a failure unless SLUG runs on the host, where the flag does not matter."""
    try:
        enabled = sandbox_enabled(cfg, env)
    except ConfigError as exc:
        return _failed("feature_flag", exc)
    if enabled:
        on = "on: verified and unverified agents run sandboxed, and tool packs in tool sandboxes"
        return Check("feature_flag", True, on)
    if route is Route.HOST:
        unneeded = f"off, and not needed: {slug} runs on the host (community tool packs are refused)"
        return Check("feature_flag", True, unneeded)
    policy = cfg.agent_sandbox.host_trust_policy
    off = route_run(Trust.UNVERIFIED, sandbox_enabled=False, host_trust_policy=policy)
    return Check(
        "feature_flag", False, "off: verified and unverified agents and tool packs are refused",
        refusal_error(off).hint,
    )


def run_doctor(
    slug: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    client_factory: Callable[[], EngineClient] | None = None,
) -> DoctorReport:
    """Check config, flag, engine, memory ceiling, runtime, image and (with `slug`) that agent's run path."""
    environ = dict(os.environ if env is None else env)
    try:
        cfg = load_config(environ)
    except ConfigError as exc:
        return DoctorReport(slug, (_failed("config", exc),))
    exists = "" if cfg.paths.config_file.exists() else " (no file: defaults)"
    rows = [Check("config", True, f"{cfg.paths.config_file}{exists}")]
    pack = _pack_checks(slug, cfg, environ) if slug else _Pack([])
    rows.append(_flag_check(cfg, environ, pack.route, slug))
    if pack.route is Route.HOST:
        assert pack.entry is not None
        host_path = pack.entry.host_path
        if pack.entry.trust_level in HOST_TRUST and host_path and Path(host_path).is_dir():
            pack.rows.append(Check("host_copy", True, host_path))
        else:
            pack.rows.append(_failed("host_copy", host_copy_error(pack.entry.slug)))
        return DoctorReport(slug, (*rows, *pack.rows))
    try:
        client = (client_factory or (lambda: open_engine(environ)))()
    except SandboxError as exc:
        return DoctorReport(slug, (*rows, _failed("engine", exc), *pack.rows))
    try:
        rows += _engine_rows(client, cfg, environ, pack)
    finally:
        if client_factory is None:
            client.close()
    return DoctorReport(slug, tuple(rows))


def _engine_rows(
    client: EngineClient, cfg: HostConfig, env: Mapping[str, str], pack: _Pack
) -> list[Check]:
    """Everything judged through an engine that answers, in the documented row order."""
    rows = [Check("engine", True, f"the engine answers at {env.get('DOCKER_HOST') or 'the default socket'}")]
    rows += capability_checks(client, cfg.agent_sandbox.runtime)
    rows += image_checks(client, cfg.agent_sandbox.image)
    rows += pack.rows
    if pack.entry is not None:
        try:
            rows.append(Check("volume", True, verify_volume(client, pack.entry)))
        except SandboxError as exc:
            rows.append(_failed("volume", exc))
    rows.append(leftover_check(client))
    return rows


def cmd_doctor(args: argparse.Namespace) -> int:
    report = run_doctor(args.slug)

    def human() -> None:
        for c in report.checks:
            say(f"  {'ok' if c.ok else 'FAIL':<5} {safe_token(c.check):<20} {safe_line(c.detail)}")
            if c.fix:
                say(f"  {'':<5} {'':<20} fix: {safe_line(c.fix)}")
        failed = sum(1 for c in report.checks if not c.ok)
        say("ready" if report.ready else f"not ready: {failed} check(s) failed")

    emit(args, report.to_json(), human)
    return EXIT_OK if report.ready else EXIT_FAILED


__all__ = ["Check", "DoctorReport", "capability_checks", "cmd_doctor", "image_checks", "leftover_check",
           "run_doctor"]  # fmt: skip
