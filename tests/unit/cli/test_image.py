"""`image build|pull|status` (host/cli/image.py) without an engine."""

from __future__ import annotations

import pytest

from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.schema import check_schema
from tests.unit.cli._support import engine_error


@pytest.mark.parametrize("args", [("build",), ("status",), ("pull", "registry.example/agentnode-sandbox:1")])
def test_image_commands_without_an_engine_fail_with_the_engine_fix(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    proc = cli(env, "image", *args, "--json")
    assert_error_lines(proc, 1)
    out = json_out(proc)
    check_schema("error", out)
    assert out["error_code"] == "engine_unavailable" and out["hint"] == engine_error().hint
