"""examples/text-kit, a published-format multi-tool pack with a PyPI requirement, installed as shipped and
called from a sandboxed agent on both tool paths: trusted (host worker, the pack's own venv) and community
(a tool sandbox, the requirement as wheels in the pack's volume)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

TEXT_KIT = REPO / "examples" / "text-kit"

CALLER = """
def run(context, **kwargs):
    out = {}
    r = context.run_tool("text-kit", operation="natural_size", value=3000000)  # the dispatcher
    out["dispatch"] = [r.success, r.result, r.mode_used]
    r = context.run_tool("text-kit", "humanize_number", value=1234567)
    out["named"] = [r.success, r.result]
    r = context.run_tool("text-kit", "word_count", text="one two three")
    out["count"] = [r.success, r.result]
    r = context.run_tool("text-kit", "humanize_number", value="not a number")
    out["schema"] = [r.success, r.error.split(":")[0]]
    return out
"""


@pytest.mark.parametrize(("trust", "mode"), [("trusted", "host_worker"), ("unverified", "tool_sandbox")])
def test_text_kit_installs_and_runs_as_shipped(
    host_state: HostState, make_agent: Callable[..., Path], trust: str, mode: str
) -> None:
    entry = host_state.install(TEXT_KIT, trust=trust)
    assert entry.requirements is not None and entry.requirements["declared"] == ["humanize<5,>=4.9"]
    host_state.install(make_agent("text-kit-caller", CALLER))
    host = host_state.host()
    try:
        result = host.run("text-kit-caller")
    finally:
        host.close()
    assert result.success, (result.error_code, result.error, result.logs)
    assert result.result == {
        "dispatch": [True, "3.0 MB", mode],
        "named": [True, "1,234,567"],
        "count": [True, 3],
        "schema": [False, "TOOL_ARGUMENTS_INVALID"],
    }
