"""The --json schemas documented in docs/cli.md, and the check that a value has exactly that shape."""

from __future__ import annotations

from typing import Any

from tests.support.paths import CLI_DOC

_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
    "object": dict,
    "array": list,
}


def schema_names() -> list[str]:
    """Every schema docs/cli.md documents (`<!-- schema: name -->` markers), in document order."""
    return [line[len("<!-- schema: ") : -len(" -->")] for line in CLI_DOC.read_text().splitlines()
            if line.startswith("<!-- schema: ")]  # fmt: skip


def documented_schema(name: str) -> dict[str, tuple[frozenset[str], bool]]:
    """`path -> (types, optional)` from the table after `<!-- schema: name -->` in docs/cli.md."""
    lines = CLI_DOC.read_text().splitlines()
    start = lines.index(f"<!-- schema: {name} -->") + 3  # skip the marker, the header and the rule
    schema: dict[str, tuple[frozenset[str], bool]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        field, typ = (cell.strip() for cell in line.strip("|").split("|")[:2])
        optional = typ.endswith(", optional")
        types = frozenset(t.strip() for t in typ.removesuffix(", optional").split(" or "))
        assert types <= {*_TYPES, "any"}, f"{name}: {field}: unknown type {typ!r}"
        schema[field.strip("`")] = (types, optional)
    assert schema, f"no schema table for {name}"
    return schema


def _type_ok(value: Any, types: frozenset[str]) -> bool:
    if "any" in types:
        return True
    if isinstance(value, bool):
        return "boolean" in types
    return any(isinstance(value, _TYPES[t]) for t in types if t != "boolean")


def check_schema(name: str, value: Any) -> None:
    """Fail unless `value` has exactly the documented keys (optional ones aside) with the documented types."""
    schema = documented_schema(name)

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, prefix + "[]")
            return
        if not isinstance(node, dict):
            return
        children = {}
        for path, spec in schema.items():
            parent, _, key = path.rpartition(".")
            if parent == prefix:
                children[key] = spec
        if not children:
            return  # a free-form object
        where = f"{name}: {prefix or '(top)'}"
        assert set(node) <= set(children), f"{where}: undocumented keys {set(node) - set(children)}"
        required = {k for k, (_, optional) in children.items() if not optional}
        assert required <= set(node), f"{where}: missing keys {required - set(node)}"
        for key, item in node.items():
            path = f"{prefix}.{key}" if prefix else key
            types = children[key][0]
            assert _type_ok(item, types), f"{name}: {path}: {item!r} is not {sorted(types)}"
            walk(item, path)

    walk(value, "")
