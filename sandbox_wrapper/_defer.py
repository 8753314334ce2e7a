"""Modules imported at start but used by few runs, given as placeholders that import the real module on first
use: every process pays for them otherwise, and a one-shot run's start waits for it.

- `grpc.aio`: grpc's `__init__` imports its asyncio API (~10 ms in the sandbox) for every synchronous
  client and server; the wrapper and the host's CLI use the synchronous ones.
- `google.protobuf.internal.python_message`: protobuf's pure-Python message classes, with text_format and
  its decoders (~6 ms); descriptor_pool imports them unconditionally, but the upb backend (the image's and
  the host's) never calls them.
- `asyncio` (the wrapper only, `WRAPPER_DEFERRED`): gRPC's extension module and the wrapper import it
  (~12 ms in the sandbox, with ssl and concurrent.futures) for agents whose `run` is a coroutine.

A placeholder is what the import system returns for the name (and sets on the parent package), so
`import grpc.aio` and `from grpc import aio` still succeed without running it; the first attribute read
from it imports the real module, and a placeholder kept by earlier code forwards every read to it. Once the
placeholder is settled (see `_DeferringFinder`), importing the name or a submodule of it imports the real
module as usual. Only the entry points defer (`python -m sandbox_wrapper`, the `agentnode-sandbox` console
script): the library, imported into someone else's process, never changes what its imports mean.
"""

from __future__ import annotations

import _thread
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

DEFERRED = ("grpc.aio", "google.protobuf.internal.python_message")
"""What the entry points defer; each is imported, on first use, as it would have been."""
WRAPPER_DEFERRED = (*DEFERRED, "asyncio")
"""What the wrapper defers: it settles before the pack's code (`settle`), the host's CLI never does."""

_swap = _thread.allocate_lock()
_placeholders: dict[str, _Placeholder] = {}


class _Placeholder(ModuleType):
    """Stands for a deferred module until something reads from it.

    Its `__path__` is read as a use once it is settled (out of `sys.modules`) only: the import system
    probes for it while making the placeholder, and reading it for a submodule's import before it is
    settled would import the real package and then the submodule a second time (see `_DeferringFinder`);
    that import fails instead, loudly, as "not a package".
    """

    def __getattr__(self, attr: str) -> object:
        if attr == "__path__" and (not self.__dict__.get("_ready") or sys.modules.get(self.__name__) is self):
            raise AttributeError(attr)
        return getattr(_real(self), attr)


def _real(placeholder: _Placeholder) -> ModuleType:
    """The module `placeholder` stands for, imported now unless it is already (or is being, by another
    thread: the import waits for it)."""
    _unlist(placeholder)
    __import__(placeholder.__name__)
    return sys.modules[placeholder.__name__]


def _unlist(placeholder: _Placeholder) -> None:
    """Take `placeholder` out of `sys.modules` if it is still there (not the real module meanwhile)."""
    with _swap:  # only the swap: an import that follows may read another placeholder
        if sys.modules.get(placeholder.__name__) is placeholder:
            del sys.modules[placeholder.__name__]


class _DeferringFinder:
    """Answers the first import of each deferred name with a placeholder, and settles placeholders: takes
    them out of `sys.modules` (a submodule's stays its parent package's attribute).

    Out of `sys.modules`, an import of the name or of a submodule imports the real module first, as it
    would have; inside, a submodule's import would find the placeholder as its parent (not a package) or,
    once the real one was imported for it, run the submodule a second time. Until then the placeholder is
    what every import of the name gets: the parent's own `__init__` needs it there (grpc's puts its `aio`
    back itself). A submodule's placeholder is settled on the next import once its parent is imported (so
    before any code but the parent's own runs); a top-level one only by `settle()`, which the wrapper calls
    before the pack's code: a later import of it by gRPC or the wrapper would otherwise run it.

    A top-level module is found when it is settled, and its first real import gets that spec: the pack's
    import root goes first on `sys.path` afterwards, and the standard library's asyncio must stay the one
    imported, as it was when the wrapper imported it at boot (a pack may ship or require an `asyncio`:
    PyPI's 2014 backport still appears in old requirement lists).
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self.pending = set(names)
        self.placed: list[_Placeholder] = []
        self.pinned: dict[str, ModuleSpec] = {}

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        self.settle(top_level=False)
        if name in self.pinned:
            spec = self.pinned.pop(name)
            self._leave_when_done()
            return spec
        if name not in self.pending:
            return None
        self.pending.discard(name)
        return ModuleSpec(name, self)  # type: ignore[arg-type]  # a Loader by protocol (importlib.abc costs typing)

    def _real_spec(self, name: str) -> ModuleSpec | None:
        """What the other finders would import for top-level `name` now (found, not run)."""
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(name, None, None)
            if spec is not None:
                return spec
        return None

    def _leave_when_done(self) -> None:
        if not self.pending and not self.placed and not self.pinned and self in sys.meta_path:
            sys.meta_path.remove(self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        placeholder = _Placeholder(spec.name)
        self.placed.append(placeholder)
        _placeholders[spec.name] = placeholder
        return placeholder

    def exec_module(self, module: ModuleType) -> None:
        """Nothing runs until the module is used."""
        module.__dict__["_ready"] = True

    def settle(self, *, top_level: bool) -> None:
        """Take out of `sys.modules` each placeholder whose parent package is imported (and top-level ones if
        `top_level`); leave `sys.meta_path` once every name was placed and settled."""
        for placeholder in list(self.placed):
            name = placeholder.__name__
            parent_name = name.rpartition(".")[0]
            if parent_name:
                parent = sys.modules.get(parent_name)
                if parent is None or getattr(getattr(parent, "__spec__", None), "_initializing", False):
                    continue  # its parent's own __init__ still needs it in sys.modules
            elif top_level:
                spec = self._real_spec(name)
                if spec is not None:
                    self.pinned[name] = spec
            else:
                continue
            _unlist(placeholder)
            self.placed.remove(placeholder)
        self._leave_when_done()


def defer(names: tuple[str, ...] = DEFERRED) -> None:
    """Defer `names` (those not imported yet) in this process, ahead of every other finder."""
    pending = tuple(name for name in names if name not in sys.modules)
    if pending:
        sys.meta_path.insert(0, _DeferringFinder(pending))


def settle() -> None:
    """Settle every placeholder now, top-level ones included (see `_DeferringFinder`): the wrapper's step
    before the pack's code."""
    for finder in list(sys.meta_path):
        if isinstance(finder, _DeferringFinder):
            finder.settle(top_level=True)


def is_deferred(name: str) -> bool:
    """Whether a placeholder stands for `name` and its real module has not been imported."""
    return name in _placeholders and sys.modules.get(name) in (None, _placeholders[name])
