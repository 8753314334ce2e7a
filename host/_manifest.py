"""agentnode.yaml parsing for agent packs and toolpacks, validated with key paths."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgentManifest:
    """An agent pack's manifest (`package_type: agent`)."""

    slug: str
    version: str
    name: str
    entrypoint: str
    goal: str
    system_prompt: str
    allowed_packages: tuple[str, ...] | None
    max_tool_calls: int
    max_runtime_seconds: int
    max_iterations: int
    llm_access: Mapping[str, Any]
    dependencies: tuple[str, ...]


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a toolpack."""

    name: str
    entrypoint: str
    description: str
    input_schema: Mapping[str, Any] | None


@dataclass(frozen=True)
class ToolpackManifest:
    """A toolpack's manifest (`package_type: toolpack`)."""

    slug: str
    version: str
    name: str
    entrypoint: str
    tools: tuple[ToolSpec, ...]
    dependencies: tuple[str, ...]
