"""One tool call, resolved and run the same way wherever it runs: the host's tool worker and a tool sandbox.

Standard library only: the host runs this file as a script (`python -I -B _tool_exec.py <import root>`, JSON
lines on stdin/stdout) for trusted packs, and a tool sandbox imports `handle` for community packs, so both
paths resolve, call, serialize and bound a tool's result with one piece of code. Its strict JSON is the
wrapper's one (sandbox_wrapper/_strictjson.py, standard library only too): imported as usual in a tool
sandbox, loaded from its file beside this one when the host runs this file as a script.

A request is `{"entrypoint": "module:function", "fallback": "<function>" or "", "arguments": {...}}`; the
host's gate has already picked them by the format's rules (agentnode-format §3.3). A reply is
`{"ok": true, "result_json": "..."}` or `{"ok": false, "failure": <kind>, "error_type": <name>}`: failure
kinds and exception type names only, never exception text.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

MAX_RESULT_BYTES = 1 << 20
FALLBACK_REPR_CHARS = 2000
"""A result that is not JSON comes back as the format's `{"__agentnode_fallback_repr__": true, "repr": ...}`
(agentnode-format §3.4), its repr cut to this many characters."""
COMPAT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_compat")
"""Holds the `agentnode_sdk` compatibility package that SDK-written packs import (sandbox_wrapper/_compat)."""


def _strictjson_file() -> Any:
    """sandbox_wrapper/_strictjson.py, loaded from its file beside this one, for the host's tool worker.

    Why: run as a script (`python -I`), this file has neither the package nor its own directory on sys.path,
    and importing the package would be wrong even where it can be found (an editable install): the pack's
    agentnode_sdk takes the wrapper's classes once sandbox_wrapper is loaded, which imports gRPC. The module
    is not put in sys.modules, so the pack's code never sees it.
    """
    import importlib.util  # noqa: PLC0415 - only this mode needs it

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_strictjson.py")
    spec = importlib.util.spec_from_file_location("sandbox_wrapper._strictjson", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING or __name__ != "__main__":  # imported: a tool sandbox, the agent wrapper
    from sandbox_wrapper._strictjson import STRICT_ENCODER, loads_finite
else:  # the host's tool worker: this file run as a script
    _STRICTJSON = _strictjson_file()
    STRICT_ENCODER, loads_finite = _STRICTJSON.STRICT_ENCODER, _STRICTJSON.loads_finite


def _owned(module: Any, value: Any) -> bool:
    """Whether `value` is defined inside the pack that `module` belongs to.

    Why: a requested tool name is looked up as an attribute of the pack's module (§3.3), and a module's
    namespace also holds what it imported (`from os import system`): only the pack's own callables are tools.
    """
    root = module.__name__.partition(".")[0]
    owner = getattr(value, "__module__", None)
    return isinstance(owner, str) and (owner == root or owner.startswith(root + "."))


class MissingFunction(ImportError):
    """The pack's module imported, but has neither the requested function nor the fallback (§3.3's
    ImportError), reported as its own failure kind so the host can name the pack's tools."""


def resolve(request: dict[str, Any]) -> Callable[..., Any]:
    """The function a request names: its entrypoint's function if the pack defines it, else the fallback.

    Raises ImportError (or whatever importing the pack raises) when neither is callable.
    """
    module_name, _, function_name = str(request["entrypoint"]).rpartition(":")
    module = importlib.import_module(module_name)
    function = getattr(module, function_name, None) if function_name.isidentifier() else None
    if callable(function) and (not request.get("fallback") or _owned(module, function)):
        return function  # type: ignore[no-any-return]
    fallback = str(request.get("fallback") or "")
    function = getattr(module, fallback, None) if fallback else None
    if callable(function):
        return function  # type: ignore[no-any-return]
    raise MissingFunction(f"{module_name} has no callable {function_name or fallback}")


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; report only failure kinds and exception type names, never exception text.

    A coroutine function's result is awaited (`asyncio.run`), as the publisher's verification runs such tools.
    """
    try:
        function = resolve(request)
    except MissingFunction:
        return {"ok": False, "failure": "missing", "error_type": "ImportError"}
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the tool's, reported by type
        return {"ok": False, "failure": "load", "error_type": type(exc).__name__}
    try:
        result = function(**request["arguments"])
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
    except Exception as exc:  # noqa: BLE001 - the tool failing is a normal outcome of its call
        return {"ok": False, "failure": "raised", "error_type": type(exc).__name__}
    try:
        result_json = _result_json(result)
    except Exception:  # noqa: BLE001 - a repr that raises is the tool's failure, reported by kind
        return {"ok": False, "failure": "not_serializable"}
    if len(result_json) > MAX_RESULT_BYTES:  # ASCII-only (ensure_ascii), so characters == bytes
        return {"ok": False, "failure": "too_large"}
    return {"ok": True, "result_json": result_json}


def add_compat_path() -> None:
    """Make `import agentnode_sdk` work for pack code: append COMPAT_DIR to sys.path, last, so a pack that
    bundles its own agentnode_sdk (import root or requirements, both earlier on the path) gets that one."""
    if COMPAT_DIR not in sys.path:
        sys.path.append(COMPAT_DIR)


def _result_json(result: Any) -> str:
    """Strict JSON of the result; one that is not JSON (an object, a set, NaN, a cycle) becomes the format's
    fallback repr, still a success, as the runtime's subprocess mode returns it."""
    try:
        return STRICT_ENCODER.encode(result)
    except (TypeError, ValueError):
        shown = repr(result)[:FALLBACK_REPR_CHARS]
        return json.dumps({"__agentnode_fallback_repr__": True, "repr": shown})


def _protocol_streams() -> tuple[TextIO, TextIO]:
    """Keep fds 0/1 for the protocol; the tool's stdin becomes /dev/null and its stdout goes to stderr.

    Why: a tool's print() or input() must never corrupt or consume the request/reply channel.
    """
    proto_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return proto_in, proto_out


def main(argv: list[str]) -> None:
    """The host's tool worker: serve requests for the one import root named on the command line until
    stdin closes."""
    proto_in, proto_out = _protocol_streams()
    sys.path.insert(0, argv[1])
    add_compat_path()
    for line in proto_in:
        proto_out.write(STRICT_ENCODER.encode(handle(loads_finite(line))) + "\n")
        proto_out.flush()


if __name__ == "__main__":
    main(sys.argv)
