"""The optional extras the test suite needs (pyproject's `dev` extra): checked once when pytest starts, so
a plain `pip install -e .` gets one error naming what is missing and the fix, not hundreds of failures."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

NEEDED = {
    "openai": "llm",
    "anthropic": "llm",
    "opentelemetry.sdk": "tracing",
    "opentelemetry.exporter.otlp.proto.grpc": "tracing",
    "kopf": "kubernetes",
    "kubernetes": "kubernetes",
    "kubernetes_validate": "dev",
    "kmock": "dev",
}
"""Import name -> the extra that brings it (every one is in `dev`, which scripts/bootstrap installs)."""


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def missing(importable: Callable[[str], bool] = _importable) -> list[str]:
    """The needed modules that cannot be imported here, as "module (extra)"."""
    return [f"{name} ({extra})" for name, extra in NEEDED.items() if not importable(name)]


def problem(importable: Callable[[str], bool] = _importable) -> str | None:
    """What to tell the user when the environment lacks an extra the tests need; None when it has all."""
    absent = missing(importable)
    if not absent:
        return None
    return (
        f"the tests need the 'dev' extra; missing: {', '.join(absent)}. Run scripts/test (it installs the "
        "lock into .venv), or: pip install -e '.[dev]'"
    )
