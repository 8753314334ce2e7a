"""Host configuration: where state lives and the operator's ceilings, validated with key paths."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ConfigPaths:
    """Files the host owns, all beside the config file."""

    config_file: Path
    dir: Path
    audit_file: Path
    lockfile: Path
    packs_dir: Path


@dataclass(frozen=True)
class LlmHostConfig:
    """`agent_sandbox.llm`: the host ceiling for brokered LLM access and the provider binding."""

    enabled: bool | None = None
    max_calls: int | None = None
    max_input_chars: int | None = None
    max_output_chars: int | None = None
    allowed_models: tuple[str, ...] | None = None
    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    timeout_seconds: float = 60.0


@dataclass(frozen=True)
class LimitsCeiling:
    """`agent_sandbox.limits`: host ceilings on the manifest's limits."""

    max_tool_calls: int | None = None
    max_runtime_seconds: int | None = None
    max_iterations: int | None = None


@dataclass(frozen=True)
class AgentSandboxConfig:
    """`agent_sandbox`: everything the operator decides about sandboxed runs."""

    enabled: bool = False
    host_trust_policy: str = "default"
    image: str | None = None
    runtime: str = "runc"
    tools_allowed_packages: tuple[str, ...] | None = None
    limits: LimitsCeiling = field(default_factory=LimitsCeiling)
    llm: LlmHostConfig = field(default_factory=LlmHostConfig)
    idle_timeout_seconds: int = 60


@dataclass(frozen=True)
class HostConfig:
    """The loaded host configuration."""

    paths: ConfigPaths
    agent_sandbox: AgentSandboxConfig
    raw: Mapping[str, Any]
