"""What one run is given: its task, its tool gate over the installed packs and its LLM session."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from host._broker import LlmBroker, LlmSession
from host._json import dumps_strict
from host._manifest import AgentManifest, ToolpackManifest
from host._packs import Lockfile
from host._policy import RunPolicy
from host._session import RunTask
from host._tools import InstalledToolpack, ToolGate, ToolRunner
from host._toolsandbox import ToolSandboxes
from host._vocab import Trust


def lookup_toolpack(lockfile: Lockfile, slug: str) -> InstalledToolpack | None:
    """The installed tool pack `slug` as a gate calls it, or None (not installed, or not a tool pack)."""
    entry = lockfile.get(slug)
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
    return gate, broker.session(policy.llm, slug=slug)


__all__ = ["lookup_toolpack", "run_services", "run_task"]
