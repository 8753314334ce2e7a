"""The parser's typed primitives as a base class, shared by its agent, toolpack and metadata parts."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

from host.core.errors import ManifestError
from host.core.terminal import safe_line
from host.spec.manifest.model import (
    _HINT,
    JSON_SCHEMA_TYPES,
    MAX_VERSION_CHARS,
    UINT32_MAX,
    VERSION_RE,
    ManifestWarnings,
)


def _describe(value: Any) -> str:
    """Name a value's type for an error message without echoing agent-authored text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"a {value.bit_length()}-bit integer"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _describe_text(value: Any) -> str:
    """Like _describe, with a string's length (for the length rules)."""
    if isinstance(value, str) and value:
        return f"a string of {len(value)} characters"
    return "nothing" if value is None else _describe(value)


class _Reader:
    """The primitives `_Parser` is built on: `source` named in each failure, `form` read by the parts."""

    def __init__(self, source: str, warnings: ManifestWarnings | None = None) -> None:
        self.source = source
        self.warnings = warnings if warnings is not None else ManifestWarnings()
        self.form = ""

    @property
    def published(self) -> bool:
        return bool(self.form)

    def fail(self, key: str, problem: str, hint: str = _HINT) -> ManifestError:
        prefix = f"{self.source}: " if self.source else ""
        return ManifestError(f"{prefix}{key}: {problem}", hint=hint)

    def warn(self, key: str, problem: str) -> None:
        self.warnings.add(f"{key}: {problem}")

    def keys(self, block: Mapping[Any, Any], known: frozenset[str], path: str) -> None:
        """A warning per unknown key of `block` (they are ignored), with the likely intended key."""
        for key in block:
            if isinstance(key, str) and key in known:
                continue
            if self.warnings.full:  # counted only: no difflib over thousands of junk keys
                self.warnings.add("")
                continue
            if not isinstance(key, str):
                self.warn(path or "(top level)", f"a key that is not a string ({_describe(key)}) is ignored")
                continue
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75) if len(key) <= 64 else []
            where = f"{path}.{safe_line(key, limit=64)}" if path else safe_line(key, limit=64)
            self.warn(where, "unknown key, ignored" + (f" (did you mean {close[0]}?)" if close else ""))

    def mapping(self, value: Any, key: str) -> Mapping[str, Any]:
        """An optional mapping; absent or null is empty."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        return value

    def item(self, value: Any, key: str) -> Mapping[str, Any]:
        """A required mapping (a list item)."""
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        return value

    def listing(self, value: Any, key: str) -> list[Any]:
        """An optional list; absent or null is empty."""
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {_describe(value)}")
        return value

    def text(
        self,
        value: Any,
        key: str,
        *,
        default: str | None = None,
        pattern: re.Pattern[str] | None = None,
        expected: str = "a non-empty string",
    ) -> str:
        """A non-empty string (matching `pattern` when given); absent or null is `default` when given."""
        if value is None and default is not None:
            return default
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.fullmatch(value)):
            got = "nothing" if value is None else _describe(value)
            raise self.fail(key, f"expected {expected}, got {got}")
        return value

    def string(self, value: Any, key: str) -> str:
        """Free text that may be empty; absent or null is ""."""
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_describe(value)}")
        return value

    def sized(self, value: Any, key: str, low: int, high: int | None = None) -> str:
        """A string of `low` to `high` characters."""
        if not isinstance(value, str) or len(value) < low or (high is not None and len(value) > high):
            size = f"{low} to {high}" if high is not None else f"at least {low}"
            raise self.fail(key, f"expected a string of {size} characters, got {_describe_text(value)}")
        return value

    def strings(self, value: Any, key: str) -> list[str]:
        """An optional list of strings; absent or null is empty."""
        items = self.listing(value, key)
        if not all(isinstance(v, str) for v in items):
            raise self.fail(key, "expected a list of strings, got a list with an entry that is not a string")
        return items

    def choice(self, value: Any, key: str, allowed: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in allowed:
            got = "nothing" if value is None else _describe(value)
            raise self.fail(key, f"expected one of {', '.join(allowed)}, got {got}")
        return value

    def positive_int(self, value: Any, key: str, default: int) -> int:
        """A positive integer that fits the uint32 wire field it is sent in; absent or null is `default`."""
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, f"expected a positive integer, got {_describe(value)}")
        if value > UINT32_MAX:
            raise self.fail(
                key,
                f"expected a positive integer no larger than {UINT32_MAX} (it is sent as a "
                f"uint32), got {_describe(value)}",
            )
        return value

    def bounded_int(self, value: Any, key: str, bounds: tuple[int, int, int], zero: str = "") -> int:
        """An integer in the format's range (bools are not integers); absent or null is the default."""
        low, high, default = bounds
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            also = f" (or 0: {zero})" if low == 0 else ""
            raise self.fail(
                key, f"expected a positive integer no larger than {high}{also}, got {_describe(value)}"
            )
        return value

    def json_data(self, value: Any, key: str) -> None:
        """Plain JSON data (str-keyed mappings, lists, strings, finite numbers, booleans, null), as stored."""
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    raise self.fail(key, "expected JSON data, got a mapping key that is not a string")
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, float) and not math.isfinite(item):
                raise self.fail(key, f"expected JSON data, got {_describe(item)}")
            elif item is not None and not isinstance(item, str | int | float):  # bool is an int
                raise self.fail(key, f"expected JSON data, got {_describe(item)}")

    def version(self, value: Any) -> str:
        """The agentnode format's semver; anything else (a path, a newline, an escape) is refused."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise self.fail(
                "version",
                f'expected a string, got the number {value!r}; quote a semantic version: version: "1.0.0"',
            )
        if not isinstance(value, str) or len(value) > MAX_VERSION_CHARS or not VERSION_RE.fullmatch(value):
            got = "nothing" if value is None else _describe(value)
            if isinstance(value, str) and len(value) > MAX_VERSION_CHARS:
                got = f"a string of {len(value)} characters"
            raise self.fail(
                "version",
                "expected a semantic version MAJOR.MINOR.PATCH with optional "
                "-prerelease and +build (ASCII letters, digits, dots and hyphens; at most "
                f"{MAX_VERSION_CHARS} characters), got {got}",
            )
        return value

    def names(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, f"expected a list of non-empty strings, got {_describe(value)}")
        return tuple(v.strip() for v in value)

    def optional_text(self, value: Any, key: str, limit: int = 200) -> str:
        """Optional metadata: kept when a string of at most `limit` characters, else warned about."""
        if value is None:
            return ""
        if not isinstance(value, str) or len(value) > limit:
            self.warn(key, f"expected a string of at most {limit} characters, got {_describe_text(value)}; "
                      "ignored")  # fmt: skip
            return ""
        return value

    def schema(self, value: Any, key: str) -> Mapping[str, Any] | None:
        """A tool's input/output schema: a mapping; in 0.1/0.2 the publisher's shallow JSON Schema checks."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_describe(value)}")
        if not self.published:
            return value
        kind = value.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind is not None and not all(isinstance(k, str) and k in JSON_SCHEMA_TYPES for k in kinds):
            allowed = ", ".join(JSON_SCHEMA_TYPES)
            raise self.fail(f"{key}.type", f"expected one of {allowed} or a list of them")
        props = value.get("properties")
        if props is not None and (
            not isinstance(props, dict) or not all(isinstance(p, dict) for p in props.values())
        ):
            raise self.fail(f"{key}.properties", "expected a mapping of property names to schema mappings")
        required = value.get("required")
        if required is not None:
            if not isinstance(required, list):
                raise self.fail(f"{key}.required", f"expected a list, got {_describe(required)}")
            if props and not all(isinstance(r, str) and r in props for r in required):
                raise self.fail(f"{key}.required", "names a property that properties does not define")
        return value


__all__ = [
    "_Reader",
    "_describe",
    "_describe_text",
]
