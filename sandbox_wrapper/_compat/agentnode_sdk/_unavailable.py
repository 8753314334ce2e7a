"""Stand-ins for the SDK's runtime entry points, which only the sandbox host provides (via the context)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn


def message(name: str, instead: str) -> str:
    """Why `name` cannot be used here, and what to use instead."""
    return (
        f"{name} is not available under agentnode-sandbox: the sandbox host is the agentnode runtime and "
        f"provides it through the agent's context; use {instead}"
    )


def unavailable(name: str, instead: str) -> Callable[..., NoReturn]:
    """A callable named like the SDK's `name` that raises NotImplementedError whenever it is called."""

    def stub(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(message(name, instead))

    stub.__name__ = stub.__qualname__ = name.rpartition(".")[2]
    return stub
