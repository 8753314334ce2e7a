"""Writing an agent pack (its module and agentnode.yaml) from source text."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_agent(
    parent: Path,
    slug: str,
    source: str,
    *,
    entrypoint: str = "agent:run",
    goal: str = "probe",
    agent: str = "",
) -> Path:
    """Create `parent/slug` holding the entrypoint's module and a manifest; returns the pack directory.

    `source` is dedented; `agent` is YAML placed under the manifest's `agent:` key as given (each line
    indented by two spaces, e.g. "  limits: {max_tool_calls: 4}\\n").
    """
    pack = parent / slug
    pack.mkdir(parents=True)
    module = entrypoint.split(":", maxsplit=1)[0]
    (pack / f"{module}.py").write_text(textwrap.dedent(source))
    (pack / "agentnode.yaml").write_text(
        f'package_id: {slug}\nversion: "1.0.0"\npackage_type: agent\n'
        f'agent:\n  entrypoint: "{entrypoint}"\n  goal: {goal}\n{agent}'
    )
    return pack


def fork_bomb(signature: str = "fork_bomb()", *, forks: int = 5000, hold_s: int = 30) -> str:
    """Module source of a function `signature` that forks up to `forks` children (each sleeping `hold_s`
    seconds) until the kernel refuses; it returns how many it got and what stopped it. One body for the
    agent, tool-sandbox and resource suites that prove a fork bomb is contained."""
    return f"""
def {signature}:
    import os, time
    children = 0
    try:
        for _ in range({forks}):
            pid = os.fork()
            if pid == 0:
                time.sleep({hold_s})
                os._exit(0)
            children += 1
    except OSError as exc:
        return {{"children": children, "stopped_by": type(exc).__name__}}
    return {{"children": children, "stopped_by": None}}
"""
