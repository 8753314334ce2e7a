"""The wrapper's one strict JSON (sandbox_wrapper/_strictjson.py): the rule, and that the host's tool worker,
which runs _tool_exec.py as a script without the package, gets this very file."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_wrapper import _strictjson, _tool_exec
from sandbox_wrapper._strictjson import STRICT_ENCODER, loads_finite
from sandbox_wrapper.protocol import tool_worker_script


@pytest.mark.parametrize(
    "text", ["1e999", '{"a": -1e999}', "[NaN]", "Infinity", "-Infinity", '{"a": [1, NaN]}']
)
def test_what_json_has_no_room_for_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not JSON|not finite"):
        loads_finite(text)


def test_strict_json_reads_as_json_does() -> None:
    assert loads_finite('{"a": 1.5, "b": [2, "x", null, true]}') == {"a": 1.5, "b": [2, "x", None, True]}
    assert loads_finite("[1e308]") == [1e308]
    with pytest.raises(json.JSONDecodeError):
        loads_finite("\ufeff{}")  # json.loads' own error for a BOM
    assert loads_finite(b'{"a": 1}') == {"a": 1}  # type: ignore[arg-type]  # bytes, as json.loads reads them
    with pytest.raises(ValueError, match="not finite"):
        loads_finite(b"[1e999]")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON"):
        STRICT_ENCODER.encode({"a": float("nan")})
    assert STRICT_ENCODER.encode({"a": [1, "é"]}) == json.dumps({"a": [1, "é"]})


def test_the_module_imports_the_standard_library_only() -> None:
    tree = ast.parse(Path(_strictjson.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "json", "math", "typing"}


def test_the_tool_exec_module_uses_it_when_imported() -> None:
    assert _tool_exec.loads_finite is loads_finite and _tool_exec.STRICT_ENCODER is STRICT_ENCODER


def test_the_host_worker_script_loads_it_from_its_file_outside_sys_modules(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    root.mkdir()
    (root / "probe.py").write_text(
        "import sys\n\n"
        "def seen():\n"
        "    return sorted(m for m in sys.modules if 'strictjson' in m or m.startswith('sandbox_wrapper'))\n"
    )
    lines = (
        '{"entrypoint": "probe:seen", "fallback": "", "arguments": {}}\n'
        '{"entrypoint": "probe:seen", "fallback": "", "arguments": {"x": 1e999}}\n'
    )
    done = subprocess.run(
        [sys.executable, "-I", "-B", tool_worker_script(), str(root)],
        input=lines, capture_output=True, text=True, cwd=root, timeout=60, check=False,
    )  # fmt: skip
    replies = done.stdout.splitlines()
    assert replies == [json.dumps({"ok": True, "result_json": "[]"})], done.stderr[-2000:]
    assert done.returncode != 0 and "not finite" in done.stderr  # the non-finite request: refused, no reply
