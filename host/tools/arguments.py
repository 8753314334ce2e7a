"""A tool call's arguments: parsed as strict JSON within their byte bound, then checked against the tool's
input schema (a small subset, written here), before a call is reserved."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from host.core.strictjson import JsonRejected, loads_strict, utf8_exceeds
from host.core.vocab import WireReason
from host.tools.calls import MAX_ARGUMENTS_BYTES, ToolRefusal


def _parse_arguments(arguments_json: str) -> dict[str, Any]:
    """Strict JSON object parse that keeps ints as ints and floats as floats; NaN, ±Infinity and numbers
    that overflow to infinity (1e999) are refused here, so no schema or tool ever sees a non-finite value."""
    if utf8_exceeds(arguments_json, MAX_ARGUMENTS_BYTES):
        raise ToolRefusal(WireReason.TOO_LARGE, f"arguments_json exceeds {MAX_ARGUMENTS_BYTES} bytes")
    try:
        arguments = loads_strict(arguments_json)
    except JsonRejected as exc:
        raise ToolRefusal(WireReason.INVALID_REQUEST, f"arguments_json is not strict JSON ({exc})") from None
    if not isinstance(arguments, dict):
        del arguments  # a refusal's traceback keeps this frame: drop the parsed value now
        raise ToolRefusal(WireReason.INVALID_REQUEST, "arguments_json must be a JSON object")
    return arguments


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers (Python says True == 1), 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_equal, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _bound(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def schema_error(schema: Mapping[str, Any], value: Any, path: str = "$") -> str | None:
    """Why `value` fails a small JSON-schema subset, naming the failing path; None when it passes.

    Supported: type (name or list), properties, required, additionalProperties (false or a schema), enum,
    items, minimum/maximum, minLength/maxLength. An unknown type name fails closed; other malformed
    keywords are ignored. Values are never echoed.
    """
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not all(isinstance(k, str) and k in _JSON_TYPES for k in kinds):
            return f"{path}: the tool's schema uses an unsupported type"
        if not any(_JSON_TYPES[k](value) for k in kinds):
            return f"{path}: expected {' or '.join(kinds)}"
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(_json_equal(value, option) for option in enum):
        return f"{path}: not one of the allowed values"
    if isinstance(value, str):
        low, high = _bound(schema, "minLength"), _bound(schema, "maxLength")
        if low is not None and len(value) < low:
            return f"{path}: shorter than {low} characters"
        if high is not None and len(value) > high:
            return f"{path}: longer than {high} characters"
    if _JSON_TYPES["number"](value):
        low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
        if low is not None and value < low:
            return f"{path}: less than {low}"
        if high is not None and value > high:
            return f"{path}: greater than {high}"
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        for index, item in enumerate(value):
            if error := schema_error(items, item, f"{path}[{index}]"):
                return error
    if isinstance(value, dict):
        return _object_error(schema, value, path)
    return None


def _object_error(schema: Mapping[str, Any], value: dict[str, Any], path: str) -> str | None:
    required = schema.get("required")
    for name in required if isinstance(required, list) else ():
        if isinstance(name, str) and name not in value:
            return f"{path}.{name}: required property missing"
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        child = f"{path}.{key[:40]}"
        sub = properties.get(key)
        if sub is None and extra is False:
            return f"{child}: unexpected property"
        if sub is None and isinstance(extra, Mapping):
            sub = extra
        if isinstance(sub, Mapping) and (error := schema_error(sub, item, child)):
            return error
    return None


def checked_arguments(arguments_json: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The call's arguments, parsed and checked against the tool's input schema (if it declares one)."""
    arguments = _parse_arguments(arguments_json)
    if schema is not None and (error := schema_error(schema, arguments)):
        del arguments  # freed here, inside any parse slot (a refusal's traceback keeps this frame)
        raise ToolRefusal(
            WireReason.TOOL_ARGUMENTS_INVALID, f"arguments do not match the tool's schema: {error}"
        )
    return arguments
