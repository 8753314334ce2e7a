"""Picks the sandbox wrapper's class when the wrapper runs this process, else this package's stand-in (or,
for the wrapper's plain value types, the wrapper's class from its file)."""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any, TypeVar, cast

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


def from_wrapper_types(name: str) -> Any:
    """sandbox_wrapper's `name`, one of its value types (ToolContext, RetryConfig): the loaded wrapper's, else
    the same class from the wrapper's file, so the SDK's name never has a copy of its own.

    Where the wrapper is not loaded (the host's tool worker) the file is loaded once as this package's
    `_wrapper_types`, never as sandbox_wrapper: importing the package would make every other name here the
    wrapper's (see from_wrapper), and its AgentContext brings gRPC.
    """
    wrapper = sys.modules.get("sandbox_wrapper")
    value = None if wrapper is None else getattr(wrapper, name, None)
    return value if value is not None else getattr(_wrapper_types(), name)


def _wrapper_types() -> ModuleType:
    name = f"{__package__}._wrapper_types"
    module = sys.modules.get(name)
    if module is None:
        import importlib.util  # noqa: PLC0415 - only a process without the wrapper needs it

        wrapper_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.path.join(wrapper_dir, "_types.py")  # sandbox_wrapper/_types.py, beside _compat/
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs, as for any import: dataclasses look up their module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module
