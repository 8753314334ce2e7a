"""Picks the sandbox wrapper's class when the wrapper runs this process, else this package's stand-in."""

from __future__ import annotations

import sys
from typing import TypeVar, cast

_T = TypeVar("_T")


def from_wrapper(name: str, standin: _T) -> _T:
    """sandbox_wrapper's `name` when sandbox_wrapper is loaded (an agent or tool sandbox, or the host's agent
    process), else `standin` (the host's tool worker, which never loads the wrapper or its gRPC stack).

    So in an agent, `isinstance(context, AgentContext)` holds and `except AgentLimitExceeded` catches what
    the context raises.
    """
    wrapper = sys.modules.get("sandbox_wrapper")
    if wrapper is None:
        return standin
    return cast(_T, getattr(wrapper, name, standin))
