"""Strict JSON at every trust boundary: finite numbers only, bounded size and depth, never non-JSON out."""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

DEFAULT_MAX_DEPTH = 64
"""Nesting deeper than this is refused before json's recursion (and the host's stack) pays for it."""
DEFAULT_MAX_CONTAINERS = 50_000
"""Arrays and objects one text may hold: each is an object the garbage collector then walks on every full
pass, holding the GIL, so a megabyte of `[],[],...` would slow the whole host long after it was parsed."""


class JsonRejected(ValueError):
    """The text is not strict JSON (non-finite number, too large, too deep, or malformed)."""


def _reject_constant(name: str) -> Any:
    raise JsonRejected(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf: JSON has no infinities
        raise JsonRejected("a number is out of range (not finite)")
    return value


# A JSON string (escapes included), so brackets inside strings never count as nesting. Possessive: an
# unclosed string full of escaped quotes must not make every quote a new start that scans to the end (a
# backtracking pattern takes quadratic time there, holding the GIL); an unclosed string ends the text.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
# Outside strings, valid JSON holds only brackets, separators, numbers, literals and whitespace: delete all
# but the brackets (fast, in C) and fold both kinds into one, since nesting is nesting.
_BRACKETS_ONLY = str.maketrans(
    {"{": "[", "}": "]", **dict.fromkeys(" \t\n\r,:0123456789+-.eE" + "truefalsenull" + "NaNInfinity")}
)
_NOT_BRACKET = re.compile(r"[^\[\]]+")
_DELTA = {"[": 1, "]": -1}
_QUICK_PASSES = 8
MAX_INT_DIGITS = 308
"""An integer longer than this is beyond any finite double: JavaScript and jq read it as Infinity."""


def _bounded_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        raise JsonRejected("a number is out of range (not finite as a double)")
    return int(text)


def _depth_ok(text: str, max_depth: int, max_containers: int) -> bool:
    """Whether brackets outside strings nest at most `max_depth` deep, without recursion or a Python loop
    per character: strings and everything but brackets are cut in C, then up to a few passes strip the
    innermost pairs (each pass takes exactly one level off; shallow JSON, the common case, ends here).
    What is still nested after them is measured exactly in one running sum over the remaining brackets.

    Text that is not JSON may pass here; it fails in json.loads, which then names it as invalid JSON.
    """
    brackets = _STRING.sub("", text).translate(_BRACKETS_ONLY)
    if brackets.count("[") > max_containers:
        raise JsonRejected(f"the JSON text holds more than {max_containers} arrays and objects")
    passes = 0
    while passes < min(max_depth, _QUICK_PASSES):
        stripped = brackets.replace("[]", "")  # one scan, so pairs it exposes wait for the next pass
        if not stripped or stripped == brackets:
            return True
        brackets, passes = stripped, passes + 1
    deepest = max(accumulate(map(_DELTA.__getitem__, _NOT_BRACKET.sub("", brackets))), default=0)
    return deepest + passes <= max_depth


_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
"""One decoder for every call (json.loads builds one per call when given hooks): it holds no state between
calls, and json's own module-level default decoder is shared across threads the same way."""
_UTF8_MAX = 4
"""Most bytes one character takes in UTF-8 (a lone surrogate, passed through, takes 3)."""


def utf8_len(text: str) -> int:
    """How many bytes `text` takes as UTF-8, lone surrogates passed through (3 bytes each): the one exact
    count the LLM budgets and the tool-calling bounds charge."""
    return len(text.encode("utf-8", "surrogatepass"))


def utf8_exceeds(text: str, limit: int) -> bool:
    """Whether `text` takes more than `limit` bytes as UTF-8 (lone surrogates passed through), encoding it
    only when its length alone cannot decide."""
    return len(text) > limit or (
        len(text) * _UTF8_MAX > limit and len(text.encode("utf-8", "surrogatepass")) > limit
    )


def loads_strict(
    text: str | bytes,
    *,
    max_bytes: int | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_containers: int = DEFAULT_MAX_CONTAINERS,
) -> Any:
    """Parse JSON from an untrusted party: size first (before any work), then depth, then finite numbers."""
    if max_bytes is not None:
        if utf8_exceeds(text, max_bytes) if isinstance(text, str) else len(text) > max_bytes:
            raise JsonRejected(f"the JSON text exceeds {max_bytes} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise JsonRejected("the JSON text is not UTF-8") from None
    # A text with no more opening brackets (inside strings or not) than both bounds allow cannot break
    # either: two counts in C decide the common, small case without the full depth walk.
    opening = text.count("[") + text.count("{")
    if opening > min(max_depth, max_containers) and not _depth_ok(text, max_depth, max_containers):
        raise JsonRejected(f"the JSON text nests deeper than {max_depth}")
    if text.startswith("\ufeff"):  # as json.loads: a byte-order mark is not JSON
        raise JsonRejected("the text is not valid JSON")
    # Every number is checked: a float overflows with a long mantissa as well as a big exponent
    # ("1" + 300 zeros + "e9"), so no cheap textual pre-test decides it.
    try:
        return _STRICT.decode(text)
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


_STRICT_OUT = json.JSONEncoder(allow_nan=False)
"""The encoder of dumps_strict without options (json.dumps builds one per call when given any)."""


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """Serialize for the wire or a terminal: never emits NaN/Infinity (json.dumps would, by default)."""
    try:
        return _STRICT_OUT.encode(value) if not kwargs else json.dumps(value, allow_nan=False, **kwargs)
    except ValueError as exc:
        raise JsonRejected(str(exc)) from None


__all__ = [
    "DEFAULT_MAX_DEPTH",
    "JsonRejected",
    "check_finite",
    "dumps_strict",
    "loads_strict",
    "utf8_exceeds",
    "utf8_len",
]
