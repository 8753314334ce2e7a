"""Reading an operator-chosen config section the same way everywhere: its keys checked before its values, and
bounded numbers read with their range in the error, so a typo fails loudly instead of loosening a cap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Fail = Callable[[str, str, Any], Exception]
"""How the config reader reports a bad key: (key path, what was expected, the value) -> the error to raise."""


def section(value: Any, key: str, allowed: tuple[str, ...], fail: Fail) -> Mapping[str, Any]:
    """`value` as an object holding only `allowed` keys (absent or null: empty)."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise fail(key, "expected an object", value)
    unknown = [name for name in value if name not in allowed]
    if unknown:
        raise fail(key, f"expected only the keys {', '.join(allowed)}", unknown[0])
    return value


def numbers(
    value: Any, key: str, ranges: Mapping[str, tuple[float, float]], fail: Fail
) -> dict[str, int | float]:
    """The numbers of a limits section, each within its range: a key ending in `seconds` may be fractional,
    every other is a whole number."""
    found: dict[str, int | float] = {}
    for name, number in section(value, key, tuple(ranges), fail).items():
        low, high = ranges[name]
        if isinstance(number, bool) or not isinstance(number, int | float) or not low <= number <= high:
            raise fail(f"{key}.{name}", f"expected a number from {low} to {high}", number)
        if name.endswith("seconds"):
            found[name] = float(number)
        elif isinstance(number, float) and not number.is_integer():
            raise fail(f"{key}.{name}", "expected a whole number", number)
        else:
            found[name] = int(number)
    return found


__all__ = ["Fail", "numbers", "section"]
