"""What one run is given: its task, its tool gate over the installed packs and its LLM session."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from host.core.strictjson import dumps_strict
from host.core.vocab import HOST_TRUST, Trust
from host.llm.broker import LlmBroker
from host.llm.session import LlmSession
from host.llm.toolcalls import ToolCatalog, build_catalog
from host.policy.rules import RunPolicy
from host.runtime.session import RunTask
from host.runtime.toolsandbox import ToolSandboxes
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.model import AgentManifest, ToolpackManifest, ToolSpec
from host.tools.calls import InstalledToolpack
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner

logger = logging.getLogger(__name__)


def lookup_toolpack(lockfile: Lockfile, slug: str) -> InstalledToolpack | None:
    """The installed tool pack `slug` as a gate calls it, or None (not installed, or not a tool pack)."""
    return _toolpack(lockfile.get(slug))


def _toolpack(entry: LockEntry | None) -> InstalledToolpack | None:
    if entry is None or entry.package_type != "toolpack":
        return None
    manifest = entry.parsed_manifest()
    assert isinstance(manifest, ToolpackManifest)
    root = Path(entry.host_path or "/nonexistent") / entry.import_subdir
    trust = Trust.parse(entry.trust_level)
    return InstalledToolpack(
        slug=entry.slug,
        version=entry.version,
        trust=trust.value if trust else "",
        root=root,
        manifest=manifest,
        interpreter=entry.host_interpreter(),  # its own environment when it has requirements
    )


def run_task(
    run_id: str, manifest: AgentManifest, policy: RunPolicy, *, goal: str | None, kwargs: Mapping[str, Any]
) -> RunTask:
    """What FetchTask hands the agent: its entrypoint, goal (the caller's or the manifest's), strict-JSON
    kwargs and effective policy, under the run's one id."""
    return RunTask(
        run_id=run_id,
        entrypoint=manifest.entrypoint,
        goal=goal if goal is not None else manifest.goal,
        kwargs_json=dumps_strict(kwargs),
        policy=policy,
        system_prompt=manifest.system_prompt,
    )


def run_services(
    policy: RunPolicy,
    *,
    deadline: float,
    lockfile: Lockfile,
    broker: LlmBroker,
    tool_runner: ToolRunner,
    slug: str | None = None,
    sandboxes: ToolSandboxes | None = None,
) -> tuple[ToolGate, LlmSession]:
    """A fresh gate and LLM session for one run, both bounded by the run's effective policy; `slug` (the
    agent's) picks its provider and model from agent-config.json; community tool packs' calls go to
    `sandboxes` (refused without)."""
    packs: dict[str, InstalledToolpack | None] = {}

    def lookup(slug: str) -> InstalledToolpack | None:
        # One lockfile read per tool pack per run: a run sees one consistent set of installed packs.
        if slug not in packs:
            packs[slug] = lookup_toolpack(lockfile, slug)
        return packs[slug]

    gate = ToolGate(
        allowed_packages=policy.allowed_packages,
        max_tool_calls=policy.max_tool_calls,
        lookup=lookup,
        runner=tool_runner,
        deadline=deadline,
        sandboxes=sandboxes,
    )
    session = broker.session(policy.llm, slug=slug, deadline=deadline)
    session.use_tools(lambda: tool_catalog(policy, lockfile, packs, lookup, community=sandboxes is not None))
    return gate, session


def tool_catalog(
    policy: RunPolicy,
    lockfile: Lockfile,
    packs: dict[str, InstalledToolpack | None],
    lookup: Callable[[str], InstalledToolpack | None],
    *,
    community: bool,
) -> ToolCatalog:
    """The run's tool definitions (ListTools), from the packs its gate sees: every declared tool of every
    installed tool pack on the effective allowlist (None: every installed tool pack, by slug), in allowlist
    order; community packs only when the run has tool sandboxes (else the gate refuses their calls).

    Called once per run, on first use (host/llm/session.LlmSession.tool_catalog). Packs the gate already
    looked up are reused (`packs`, its per-run cache), so both see one set of installed packs; with no
    allowlist, the lockfile is read once and every tool pack it holds joins that cache.
    """
    if policy.allowed_packages is None:
        entries = lockfile.entries()
        for name in sorted(entries):
            if name not in packs and entries[name].package_type == "toolpack":
                try:
                    packs[name] = _toolpack(entries[name])
                except Exception as exc:  # noqa: BLE001  one broken entry leaves only its own tools out
                    _left_out(name, exc)
        seen = packs.copy()  # one step: the gate may add to its cache meanwhile
        slugs: list[str] = sorted(name for name, pack in seen.items() if pack is not None)
    else:
        lockfile.entries()  # a lockfile that cannot be read fails the catalog, not each pack in turn
        slugs = list(dict.fromkeys(policy.allowed_packages))
    usable: list[tuple[str, Sequence[ToolSpec]]] = []
    for name in slugs:
        try:
            pack = lookup(name)
        except Exception as exc:  # noqa: BLE001  a broken allowlisted pack leaves only its own tools out
            _left_out(name, exc)
            continue
        if pack is not None and (community or Trust.parse(pack.trust) in HOST_TRUST):
            usable.append((pack.slug, pack.manifest.tools))
    return build_catalog(usable)


def _left_out(name: str, exc: Exception) -> None:
    """Log a tool pack whose tools a run's catalog leaves out (its calls still fail as they would have)."""
    logger.warning("tool pack %s left out of the tool definitions: %s", ascii(name), type(exc).__name__)


__all__ = ["lookup_toolpack", "run_services", "run_task", "tool_catalog"]
