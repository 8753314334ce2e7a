"""Running the installed `agentnode-sandbox` command as a subprocess and reading what it printed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.paths import BIN


def cli(env: dict[str, str], *args: str | Path, cwd: Path | None = None, timeout: float = 180) -> Any:
    """Run the installed console script; returns the CompletedProcess."""
    return subprocess.run(
        [str(BIN), *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def json_out(proc: Any) -> Any:
    """The one JSON value on stdout (and nothing else there)."""
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    return json.loads(lines[0])


def assert_error_lines(proc: Any, code: int) -> None:
    """The contract's error shape: `error: …` then `hint: …` on stderr, no traceback."""
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    err = [line for line in proc.stderr.splitlines() if not line.startswith("WARNING ")]
    assert err[0].startswith("error: ") and err[1].startswith("hint: "), proc.stderr
    assert "Traceback" not in proc.stderr
