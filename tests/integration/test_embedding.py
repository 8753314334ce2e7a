"""docs/embedding.md's complete asyncio example, run as it stands against a real `serve`."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_serve import Served
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker


def example() -> str:
    doc = (REPO / "docs" / "embedding.md").read_text()
    section = doc.split("## A complete example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "docs/embedding.md lost its example"
    return match.group(1)


def test_the_embedding_example_runs_agents_follows_their_lines_and_tags_the_audit(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    host_state.install(make_agent("greeter", """
        def run(context, **kwargs):
            print("thinking about", context.goal, flush=True)
            return {"greeting": "hello, " + context.goal.split()[-1]}
    """))  # fmt: skip
    host_state.write_config({"pool": {"size": 1, "idle_ttl_seconds": 60}})
    served = Served(host_state, ["greeter"])
    try:
        script = tmp_path / "embed.py"
        script.write_text(example())
        env = {**host_state.env, "AGENTNODE_ADMIN_SOCKET": str(served.socket), "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, str(script), "greeter", "ada", "grace"],
            env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        )  # fmt: skip
    finally:
        served.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[ada] | thinking about greet ada" in proc.stdout
    assert "'status': 'ok'" in proc.stdout and "'greeting': 'hello, grace'" in proc.stdout
    audit = host_state.audit()
    assert sorted(a["caller"]["request_id"] for a in audit) == ["req-ada", "req-grace"]
    assert all(a["caller"]["labels"]["user"] in ("ada", "grace") for a in audit)
