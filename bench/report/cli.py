"""The cli section's report: process to process against `docker run`, its target and table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import TargetRows, at_most, mid, mp, show, table

CLI_RATIO = 1.15
"""Issue 19: a process-to-process cold `run` within this factor of the bare `docker run`."""

_CLI = (
    "A one-shot run as a script meets it: `agentnode-sandbox run SLUG --json` of the trivial agent (a new "
    "process: interpreter start, imports, the run with its synchronous teardown, exit; invoked as "
    "`python -m host`), against `docker run --rm --network none --runtime R --entrypoint python3 <pinned "
    "image> -c 'import grpc'`, interleaved. median / p95 in ms; ratio = ours / docker's, per repetition. "
    "The run's own duration_ms (from its JSON) and a new interpreter doing only the command's imports say "
    "where the process's time goes (the run's duration counts from its container's head start or "
    "prelaunch, and only the imports made before that container is asked for precede the engine's work: "
    "the rest overlap it; every run after the section's first starts from the command's record, "
    "host/runtime/headstart.py); a new interpreter importing only gRPC is the floor of any host of this "
    "design written in Python. Then the "
    "same command while `serve` runs for the same config with a pool of one for the agent (`run` finds its "
    "default socket and submits there; `path` serve), interleaved with docker run again."
)


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cli section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, c in results.get("cli", {}).items():
        row("process to process: run --json / docker run", rt, c.get("ratio"), goal=f"<= {CLI_RATIO:g}x",
            ok=at_most(CLI_RATIO), unit="x",
            floor=f"docker run {mid(c, 'docker_cli_ms')} ms, ours {mid(c, 'process_ms')} ms: the run "
                  f"{mid(c, 'run_duration_ms')} ms, imports alone {mid(c, 'imports_ms')} ms (before the "
                  f"container is asked for: {mid(c, 'prelaunch_imports_ms')} ms), a new interpreter "
                  f"importing only gRPC {mid(c, 'library_imports_ms')} ms")
        if c.get("served_ratio") is not None:
            row("process to process, a serve host running: run --json / docker run", rt,
                c.get("served_ratio"), goal=f"<= {CLI_RATIO:g}x", ok=at_most(CLI_RATIO), unit="x",
                floor=f"docker run {mid(c, 'served_docker_cli_ms')} ms, ours "
                      f"{mid(c, 'served_process_ms')} ms")
    return row.rows


def tables(results: Mapping[str, Any]) -> list[str]:
    """The cli section's tables, from the combined results."""
    out: list[str] = []
    out += table("Process to process", _CLI,
                 ("runtime", "docker run (CLI)", "agentnode-sandbox run --json", "ratio",
                  "of it: the run (duration_ms)", "imports alone (new interpreter)",
                  "of them, before the container is asked for", "gRPC import alone",
                  "a serve host running: run --json",
                  "its docker run", "its ratio"),
                 [(rt, mp(c.get("docker_cli_ms")), mp(c.get("process_ms")), show(c.get("ratio"), "x"),
                   mp(c.get("run_duration_ms")), mp(c.get("imports_ms")),
                   mp(c.get("prelaunch_imports_ms")), mp(c.get("library_imports_ms")),
                   mp(c.get("served_process_ms")),
                   mp(c.get("served_docker_cli_ms")), show(c.get("served_ratio"), "x"))
                  for rt, c in results.get("cli", {}).items()])
    return out


__all__ = ["CLI_RATIO", "tables", "targets"]
