"""No giant files: every module of host/ and sandbox_wrapper/ (generated code aside) and of bench/ stays
within 600 lines and every class within 300, so a newcomer can read one responsibility at a time."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
PACKAGES = ("host", "sandbox_wrapper", "bench")


def _modules() -> list[Path]:
    found = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    return [p for p in found if "_proto" not in p.parts and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


def oversized(path: Path) -> list[str]:
    """What in `path` is over the limits, as "file: what (lines)"."""
    source = path.read_text()
    name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    problems = []
    if (lines := source.count("\n")) > MAX_MODULE_LINES:
        problems.append(f"{name}: module ({lines} lines)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            if (length := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                problems.append(f"{name}: class {node.name} ({length} lines)")
    return problems


def test_no_module_or_class_is_over_the_limits() -> None:
    modules = _modules()
    assert len(modules) > 100
    assert [problem for path in modules for problem in oversized(path)] == []


def test_the_check_sees_a_long_module_and_a_long_class(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    padding = "\n" * (MAX_MODULE_LINES - MAX_CLASS_LINES)
    (big := tmp_path / "big.py").write_text(f"class Big:\n{body}\n{padding}")
    assert oversized(big) == [
        f"big.py: module ({MAX_MODULE_LINES + 1} lines)",
        f"big.py: class Big ({MAX_CLASS_LINES + 1} lines)",
    ]
    (small := tmp_path / "small.py").write_text("class Small:\n    pass\n")
    assert oversized(small) == []
