"""When each tool and LLM call of a run started and ended, for the run's trace: a bounded list of timings.

The gate and the LLM session record here as calls end; host/runtime/telemetry/tracing.py turns the list into
child spans of the run's span once the run is over, so no tracing context has to cross into the run's server
threads. Attributes are host facts only (a pack slug that passed its pattern, a tool name from the lockfile,
fixed reason codes, counts): never an argument, a prompt, a completion or a name an agent made up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

MAX_CALL_SPANS = 256
"""Calls recorded per run and kind of call; later ones are only counted (`dropped`)."""

Attribute = str | int | bool


@dataclass(frozen=True)
class CallSpan:
    """One call: its span name, its monotonic start and end, its attributes."""

    name: str
    start: float
    end: float
    attributes: Mapping[str, Attribute]


class CallTrace:
    """A run's call timings; thread-safe, bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[CallSpan] = []
        self.dropped = 0

    def add(self, name: str, start: float, attributes: Mapping[str, Attribute]) -> None:
        """Record a call that started at `start` (time.monotonic) and ends now."""
        end = time.monotonic()
        with self._lock:
            if len(self._spans) >= MAX_CALL_SPANS:
                self.dropped += 1
                return
            self._spans.append(CallSpan(name, start, end, dict(attributes)))

    def spans(self) -> list[CallSpan]:
        with self._lock:
            return list(self._spans)


__all__ = ["MAX_CALL_SPANS", "CallSpan", "CallTrace"]
