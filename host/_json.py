"""Strict JSON at every trust boundary: finite numbers only, bounded size and depth, never non-JSON out."""

from __future__ import annotations

import json
import math
from typing import Any

DEFAULT_MAX_DEPTH = 64
"""Nesting deeper than this is refused before json's recursion (and the host's stack) pays for it."""


class JsonRejected(ValueError):
    """The text is not strict JSON (non-finite number, too large, too deep, or malformed)."""


def _reject_constant(name: str) -> Any:
    raise JsonRejected(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf: JSON has no infinities
        raise JsonRejected("a number is out of range (not finite)")
    return value


def _depth_ok(text: str, max_depth: int) -> bool:
    """A linear scan of bracket nesting outside strings, so a 100,000-deep array costs no recursion."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads_strict(
    text: str | bytes, *, max_bytes: int | None = None, max_depth: int = DEFAULT_MAX_DEPTH
) -> Any:
    """Parse JSON from an untrusted party: size first (before any work), then depth, then finite numbers."""
    if max_bytes is not None:
        size = len(text) if isinstance(text, bytes) else len(text)
        if size > max_bytes or (
            isinstance(text, str) and len(text.encode("utf-8", "surrogatepass")) > max_bytes
        ):
            raise JsonRejected(f"the JSON text exceeds {max_bytes} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise JsonRejected("the JSON text is not UTF-8") from None
    if not _depth_ok(text, max_depth):
        raise JsonRejected(f"the JSON text nests deeper than {max_depth}")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except JsonRejected:
        raise
    except (ValueError, RecursionError):
        raise JsonRejected("the text is not valid JSON") from None


def check_finite(value: Any, *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Refuse a Python value that would not serialize as strict JSON (NaN, ±inf, too deep)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise JsonRejected(f"the value nests deeper than {max_depth}")
        if isinstance(item, float) and not math.isfinite(item):
            raise JsonRejected("a number is not finite")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """Serialize for the wire or a terminal: never emits NaN/Infinity (json.dumps would, by default)."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError as exc:
        raise JsonRejected(str(exc)) from None


__all__ = ["DEFAULT_MAX_DEPTH", "JsonRejected", "check_finite", "dumps_strict", "loads_strict"]
