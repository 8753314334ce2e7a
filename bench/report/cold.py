"""The cold section's report: cold runs against the floor, per stage, boot probe, teardown steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import at, mp, show, table

STAGE_ROWS = (
    # (key, what it covers, the floor's matching step)
    ("route", "lockfile, manifest, trust routing, policy", ""),
    ("verify", "engine facts (cached), image pin, pack volume", ""),
    ("socket", "run dir + gRPC server listening", ""),
    ("create", "docker create", "create"),
    ("start", "docker start (+ watcher threads)", "start"),
    ("boot", "started -> agent entered: python, imports, connect, FetchTask", "run"),
    ("python", "(in container) python process start -> agent entered", ""),
    ("report", "agent returned -> host has the result (agent_done)", ""),
    ("teardown", "agent done -> container gone, run dir removed (sync teardown)", "remove"),
    ("audit", "audit record + result", ""),
    ("total", "request -> result, container gone (server side)", "total"),
)

_STEP_KEYS = ("exit_wait", "server_stop", "remove_verify", "rundir", "total")

_COLD = (
    "Trivial agent, `SandboxHost.run` with synchronous teardown (API call -> result returned, container "
    "gone), against the floor `docker run --rm --network none --runtime R <pinned image> python3 -c "
    "'import grpc'` timed interleaved in the same run, through the docker SDK step by step (create, "
    "start, wait, remove: `containers.run(..., remove=True)` without its log fetch; entrypoint "
    "overridden) and through the docker CLI; the floor is the faster of the two. median / p95 in ms."
)


def tables(results: Mapping[str, Any]) -> list[str]:
    """The cold section's tables, from the combined results."""
    out: list[str] = []
    cold: Mapping[str, Any] = results.get("cold", {})
    out += table("Cold start", _COLD,
                 ("runtime", "floor: SDK", "floor: CLI", "agentnode cold run", "ratio to floor"),
                 [(rt, mp(c.get("floor_sdk_ms")), mp(c.get("floor_cli_ms")), mp(c.get("run_ms")),
                   show(c.get("ratio"), "x")) for rt, c in cold.items()])
    out += table("", "Per stage (median ms); the floor's own steps (SDK) beside each runtime:",
                 ("stage", "what", *(f"{rt} {kind}" for rt in cold for kind in ("run", "floor"))),
                 [(key, what, *(cell for c in cold.values() for cell in (
                     show(at(c, "stages_ms", key)),
                     show(at(c, "floor_stages_ms", floor)) if floor else "")))
                  for key, what, floor in STAGE_ROWS])
    out += table("", "Boot probe (median ms, a container hardened like a run's): interpreter start-up "
                 "(process age at its first line, 10 ms resolution), `import grpc`, then the wrapper's "
                 "own imports (`sandbox_wrapper._runner`: generated stubs, asyncio, ...).",
                 ("runtime", "interpreter", "import grpc", "wrapper imports"),
                 [(rt, *(show(at(c, "boot_probe_ms", k))
                         for k in ("interpreter", "import_grpc", "import_wrapper")))
                  for rt, c in cold.items()])
    out += table("", "Teardown of a real sandbox after the trivial agent reported: Sandbox.destroy's "
                 "steps timed one by one (median ms), at once or after waiting for the wrapper to exit "
                 "by itself.",
                 ("runtime", "destroy", "wait for exit", "server stop", "remove + verify", "run dir",
                  "total"),
                 [(rt, mode, *(show(v.get(k)) for k in _STEP_KEYS))
                  for rt, c in cold.items() for mode, v in (c.get("teardown_steps_ms") or {}).items()])
    return out


__all__ = ["STAGE_ROWS", "tables"]
