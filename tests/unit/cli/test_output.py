"""What leaves the CLI (host/cli/output.py): strict JSON or a clean error object, escaped log lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.schema import check_schema
from tests.unit.cli._support import HOSTILE, assert_terminal_safe, strict_json


def test_any_other_value_json_cannot_carry_is_a_clean_error_object(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    class Explained:
        def to_json(self) -> dict[str, Any]:
            return {"slug": "x", "max_tool_calls": float("nan")}

    monkeypatch.setattr("host.cli.explain.explain_policy", lambda slug: Explained())
    assert main(["policy", "explain", "x", "--json"]) == 1
    out, err = capsys.readouterr()
    payload = strict_json(out)
    check_schema("error", payload)
    assert payload["error_code"] == "host_loop_error" and "cannot be printed as JSON" in payload["error"]
    assert err.startswith("error: the output cannot be printed as JSON")


def test_log_lines_are_escaped_too() -> None:
    import logging

    from host.cli.output import SafeFormatter

    record = logging.LogRecord("host.x", logging.WARNING, __file__, 1, "seen: %s", (HOSTILE,), None)
    line = SafeFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line.startswith("WARNING host.x: seen: ")
    assert_terminal_safe(line)
