"""Manifests and helpers shared by the manifest tests: the host form's examples and the published format's
builders."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from host.core.errors import AuditReason, ManifestError
from host.spec.manifest.load import parse_manifest
from host.spec.manifest.model import (
    DEFAULT_PERMISSIONS,
    AgentManifest,
    ManifestWarnings,
    ToolpackManifest,
)

AGENT_YAML = """\
package_id: research-agent
version: "1.2.0"
name: Research Agent
package_type: agent
publisher: someone          # catalogue metadata: not kept in this host's own form
agent:
  entrypoint: research_agent.main:run
  goal: Find things
  system_prompt: |
    Be helpful.
  tier: llm_only
  tool_access:
    allowed_packages: [web-search, " calc "]
  limits:
    max_tool_calls: 12
    max_runtime_seconds: 90
    max_iterations: 4
  llm_access:
    enabled: true
    max_calls: 5
    allowed_models: [gpt-4o-mini]
"""

TOOLPACK_YAML = """\
package_id: web-search
version: "0.3.0"
package_type: toolpack
entrypoint: web_search.tool
capabilities:
  tools:
    - name: search
      description: Search the web
      entrypoint: web_search.tool:search
      input_schema: {type: object, properties: {q: {type: string}}}
    - name: fetch
    - name: summarize
      entrypoint: web_search.summary
"""

MINIMAL_AGENT: dict[str, Any] = {
    "package_id": "a",
    "version": "1.0.0",
    "package_type": "agent",
    "agent": {"entrypoint": "a"},
}


def _agent(**agent: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL_AGENT)
    data["agent"].update(agent)
    return data


def _error(data: Any) -> str:
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, source="pack/agentnode.yaml")
    assert info.value.reason == AuditReason.MANIFEST_INVALID
    assert info.value.hint
    message = str(info.value)
    assert message.startswith("pack/agentnode.yaml: ")
    return message.removeprefix("pack/agentnode.yaml: ")



def _toolpack(**extra: Any) -> dict[str, Any]:
    return {"package_id": "t", "version": "1.0.0", "package_type": "toolpack", **extra}




PUBLISHED_AGENT_YAML = """\
manifest_version: "0.2"
package_id: research-agent
package_type: agent
name: Research Agent
publisher: someone
version: "1.2.0"
summary: Researches a topic and summarizes what it found.
description: A longer description.
tags: [research]
dependencies:
  - package_id: web-search
    role: search
    is_required: true
  - package_slug: summarizer
    required: false
    min_version: "0.2.0"
capabilities:
  tools:
    - name: research
      capability_id: research
      entrypoint: research_agent.main:run
      input_schema: {type: object, properties: {goal: {type: string}}, required: [goal]}
agent:
  entrypoint: research_agent.main:run
  goal: Research the topic and summarize it
  system_prompt: You are a careful researcher who cites sources.
  tier: llm_plus_tools
  llm: {required: true, provider: openai}
  tool_access:
    allowed_packages: [web-search, summarizer]
  limits:
    max_iterations: 8
    max_tool_calls: 0
    max_runtime_seconds: 3600
  termination:
    stop_on_final_answer: true
    stop_on_consecutive_errors: 10
  state: {persistence: session}
  isolation: thread
  error_handling: {retry: {max_retries: 2}}
  verification:
    cases:
      - name: basic
        goal: Research the history of the Python language
        expected: {required_keys: [summary, done], done: true, min_lengths: {summary: 50}}
"""

SUMMARY = "A pack that does one useful thing well."


def _published(**top: Any) -> dict[str, Any]:
    """A minimal 0.2 agent; `top` replaces (or, as None-valued `_drop`, removes) top-level keys."""
    data: dict[str, Any] = {
        "manifest_version": "0.2",
        "package_id": "pub-agent",
        "package_type": "agent",
        "name": "Pub Agent",
        "publisher": "someone",
        "version": "1.0.0",
        "summary": SUMMARY,
        "agent": {"entrypoint": "pub_agent.main:run", "goal": "Do the thing"},
    }
    data.update(top)
    return {k: v for k, v in data.items() if v is not _DROP}


_DROP = object()


def _pub_agent(**agent: Any) -> dict[str, Any]:
    data = _published()
    data["agent"].update(agent)
    return data


def _pub_toolpack(**top: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "package_type": "toolpack",
        "package_id": "pub-tools",
        "entrypoint": "pub_tools.tool",
        "capabilities": {"tools": [{"name": "echo", "capability_id": "echo"}]},
        "agent": _DROP,
    }
    return _published(**{**base, **top})


def _v01(data: dict[str, Any]) -> dict[str, Any]:
    """The same manifest as 0.1, with everything 0.1 requires spelled out."""
    perms = {name: {"level": level} for name, level in DEFAULT_PERMISSIONS.items() if name != "user_approval"}
    perms["user_approval"] = {"required": "never"}
    return {
        **data,
        "manifest_version": "0.1",
        "runtime": "python",
        "install_mode": "package",
        "hosting_type": "agentnode_hosted",
        "permissions": perms,
    }


def _parsed(data: Any) -> AgentManifest | ToolpackManifest:
    return parse_manifest(data, source="x")


def _agent_of(data: Any) -> AgentManifest:
    manifest = _parsed(data)
    assert isinstance(manifest, AgentManifest)
    return manifest


def _toolpack_of(data: Any) -> ToolpackManifest:
    manifest = _parsed(data)
    assert isinstance(manifest, ToolpackManifest)
    return manifest


def _warnings(data: Any) -> list[str]:
    sink = ManifestWarnings()
    parse_manifest(data, source="x", warnings=sink)
    return sink.lines()



SEQUENTIAL = {
    "mode": "sequential",
    "steps": [
        {"name": "search", "tool": "web-search:search", "input_mapping": {"q": "$input.topic"}},
        {"tool": "summarizer", "input_mapping": {"text": "$steps.search", "n": 3, "deep": {"a": [1]}},
         "when": "$steps.search is not null"},
        {"name": "", "tool": "notify", "when": "$input.mode == 'loud'"},
    ],
}  # fmt: skip

HEADER = 'package_id: a\nversion: "1.0.0"\npackage_type: agent\n'
