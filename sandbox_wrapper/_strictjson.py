"""Strict JSON for the wrapper's side of every boundary (the context, the runner, the LLM mapping, the tool
sandbox and the host's tool worker): no NaN, no ±Infinity, no number that overflows, as the host's own rule.

Standard library only, and nothing of sandbox_wrapper: the host's tool worker runs `_tool_exec.py` as a
script, without the package, and loads this file by its path (see `_tool_exec._strictjson_file`).
"""

from __future__ import annotations

import json
import math
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number is out of range (not finite)")
    return value


_FINITE = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
"""One decoder for every call (json.loads builds one per call when given hooks); it keeps no state between
calls, as json's own shared default decoder does not."""
STRICT_ENCODER = json.JSONEncoder(allow_nan=False)
"""json.dumps(..., allow_nan=False) as one encoder for every call (it keeps no state between calls either)."""


def loads_finite(text: str) -> Any:
    """json.loads that refuses what JSON has no room for: NaN, ±Infinity and numbers that overflow (1e999).

    The host applies the same rule at its own boundary; this side never turns such text into a value.
    """
    if not isinstance(text, str) or text.startswith("\ufeff"):  # json.loads' own checks and errors
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    return _FINITE.decode(text)
