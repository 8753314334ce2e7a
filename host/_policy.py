"""Pure policy decisions: trust routing, effective tool and LLM limits; the host ceiling always wins."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Route(enum.Enum):
    """Where a run goes."""

    SANDBOX = "sandbox"
    HOST = "host"
    REFUSED = "refused"


@dataclass(frozen=True)
class RouteDecision:
    """A routing decision with its audit reason and operator message."""

    route: Route
    reason: str
    message: str


@dataclass(frozen=True)
class LlmPolicy:
    """The effective llm_access policy of one run."""

    enabled: bool = False
    max_calls: int = 0
    max_input_chars: int = 0
    max_output_chars: int = 0
    allowed_models: frozenset[str] | None = None
    clamped: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPolicy:
    """Every effective limit of one run."""

    allowed_packages: tuple[str, ...]
    max_tool_calls: int
    max_runtime_seconds: int
    max_iterations: int
    llm: LlmPolicy
    clamped: tuple[str, ...]
