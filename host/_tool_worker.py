"""Tool worker process: runs one trusted toolpack's functions outside the host interpreter, over JSON lines.

Started by host._tools.ToolRunner as `python -I -B <this file> <import root>`: it imports only the standard
library, so it never pulls in the host package, and `-I` keeps the host's cwd, PYTHONPATH and user site out
of sys.path. Protocol: one request line `{"entrypoint": "module:function", "arguments": {...}}` on stdin,
one reply line on stdout: `{"ok": true, "result_json": "..."}` or `{"ok": false, "failure": <kind>, ...}`.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from typing import Any, TextIO

MAX_RESULT_BYTES = 1 << 20


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number is not finite")
    return value


def loads_finite(text: str) -> Any:
    """json.loads that refuses NaN, ±Infinity and overflowing numbers (1e999), like the host's boundary.

    This process imports only the standard library, so it keeps its own copy of the rule.
    """
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


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


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; report only failure kinds and exception type names, never exception text."""
    module_name, _, function_name = str(request["entrypoint"]).partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name or "run")
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the tool's, reported by type
        return {"ok": False, "failure": "load", "error_type": type(exc).__name__}
    try:
        result = function(**request["arguments"])
    except Exception as exc:  # noqa: BLE001 - the tool failing is a normal outcome of its call
        return {"ok": False, "failure": "raised", "error_type": type(exc).__name__}
    try:
        result_json = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return {"ok": False, "failure": "not_serializable"}
    if len(result_json) > MAX_RESULT_BYTES:  # ASCII-only (ensure_ascii), so characters == bytes
        return {"ok": False, "failure": "too_large"}
    return {"ok": True, "result_json": result_json}


def main(argv: list[str]) -> None:
    """Serve requests for the one import root named on the command line until stdin closes."""
    proto_in, proto_out = _protocol_streams()
    sys.path.insert(0, argv[1])
    for line in proto_in:
        proto_out.write(json.dumps(handle(loads_finite(line)), allow_nan=False) + "\n")
        proto_out.flush()


if __name__ == "__main__":
    main(sys.argv)
