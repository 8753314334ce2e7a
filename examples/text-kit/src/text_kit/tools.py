"""text-kit's tools: one function per tool, and `run`, the package entrypoint's dispatcher."""

from __future__ import annotations

from typing import Any

import humanize


def humanize_number(value: int) -> str:
    """1234567 -> "1,234,567"."""
    return str(humanize.intcomma(int(value)))


def natural_size(value: int) -> str:
    """3000000 -> "3.0 MB"."""
    return str(humanize.naturalsize(int(value)))


def word_count(text: str) -> int:
    """The number of whitespace-separated words."""
    return len(text.split())


_OPERATIONS = {"humanize_number": humanize_number, "natural_size": natural_size, "word_count": word_count}


def run(operation: str = "word_count", **kwargs: Any) -> Any:
    """Dispatch on `operation`, as agents that call `run_tool("text-kit")` without a tool name expect."""
    if operation not in _OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; one of {sorted(_OPERATIONS)}")
    return _OPERATIONS[operation](**kwargs)
