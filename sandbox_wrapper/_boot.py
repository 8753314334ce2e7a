"""The wrapper's boot imports served from one file: under gVisor each module file costs ~1 ms to find and
read (stats and opens through the gofer), and the wrapper imports ~160 of them (gRPC, asyncio, protobuf,
its own) before it can fetch its task.

`python -m sandbox_wrapper._boot OUT` is the image build's one RUN step: the image's own interpreter
imports what the wrapper imports at boot and writes each module's code, compiled from its source, to OUT
(`BUNDLE` beside this package, read-only in the image). The wrapper's first step, `install()`, serves those
modules from it with ordinary file loaders (same `__file__`, `__path__`, resources), and `uninstall()`
takes the finder away again before any of the pack's code is imported. Where no bundle is (a checkout, the
host's own tool workers) or another interpreter wrote it, imports are as usual.
"""

from __future__ import annotations

import marshal
import os
import sys
from importlib.machinery import ModuleSpec, SourceFileLoader

from sandbox_wrapper._defer import WRAPPER_DEFERRED, defer

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs an import at boot, which is what this module saves
    from types import CodeType, ModuleType

BUNDLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot.bundle")
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
"""Far above a real bundle (~3 MiB); a larger file is not one."""
BOOT_MODULES = ("sandbox_wrapper._runner", "sandbox_wrapper._tool_server", "grpc._channel")
"""What the wrapper imports before the pack's code, in either mode (the modules they import come along):
grpc._channel is imported when the run's channel is opened."""


class _BundledLoader(SourceFileLoader):
    """A source file's loader whose code comes from the bundle instead of the file system."""

    def __init__(self, fullname: str, path: str, code: bytes) -> None:
        super().__init__(fullname, path)
        self._code = code

    def get_code(self, fullname: str) -> CodeType:
        code: CodeType = marshal.loads(self._code)  # noqa: S302 (the image's own file, read-only: as a .pyc)
        return code


class _BundleFinder:
    """A meta path finder for the bundle's modules only; every other import goes on as usual."""

    def __init__(self, modules: dict[str, tuple[str, bool, bytes]]) -> None:
        self.modules = modules

    def find_spec(
        self, name: str, path: object = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        entry = self.modules.get(name)
        if entry is None:
            return None
        origin, package, code = entry
        spec = ModuleSpec(name, _BundledLoader(name, origin, code), origin=origin, is_package=package)
        spec.has_location = True
        if package:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        return spec


def install(path: str = BUNDLE) -> _BundleFinder | None:
    """Serve the bundle's modules (first on sys.meta_path) if there is a bundle by this interpreter; its
    finder, or None."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BUNDLE_BYTES + 1)
        if len(data) > MAX_BUNDLE_BYTES:
            return None
        version, modules = marshal.loads(data)  # noqa: S302 (as above)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if version != sys.version or not isinstance(modules, dict):
        return None
    finder = _BundleFinder(modules)
    sys.meta_path.insert(0, finder)
    return finder


def uninstall(finder: _BundleFinder | None) -> None:
    """Stop serving from the bundle: what is imported from here on (the pack's code) is found as usual."""
    if finder is not None:
        finder.modules = {}
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def build(out: str) -> int:
    """Import the boot modules and write the code of every module they brought that has a source file; the
    number of modules written."""
    before = set(sys.modules)
    defer(WRAPPER_DEFERRED)  # as the wrapper boots: what it defers is not part of its boot
    for name in BOOT_MODULES:
        __import__(name)
    modules: dict[str, tuple[str, bool, bytes]] = {}
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        loader = getattr(spec, "loader", None)
        if name in before or spec is None or not isinstance(loader, SourceFileLoader) or not spec.origin:
            continue
        code = compile(loader.get_data(spec.origin), spec.origin, "exec", dont_inherit=True)
        modules[name] = (spec.origin, spec.submodule_search_locations is not None, marshal.dumps(code))
    tmp = f"{out}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(marshal.dumps((sys.version, modules)))
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    return len(modules)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m sandbox_wrapper._boot OUT")
    count = build(sys.argv[1])
    print(f"boot bundle: {count} modules in {sys.argv[1]}")
