"""What an AgentRun asks for and what its status says: one reading for the controller, node agent and client.

An AgentRun is written by a cluster user: its spec is re-validated here with the same rules as a local run
(the CRD's schema is a first filter, never the only one), and its status carries a run's `--json` result.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from host.core.errors import AuditReason, ConfigError
from host.core.strictjson import JsonRejected, loads_strict
from host.core.terminal import safe_line
from host.core.vocab import Runtime
from host.k8s.objects.agentrun import (
    API_VERSION,
    KIND,
    MAX_ERROR_CHARS,
    MAX_GOAL_CHARS,
    MAX_HINT_CHARS,
    MAX_KWARGS_JSON_CHARS,
    MAX_RESULT_JSON_CHARS,
    RunRequest,
)
from host.policy.caller import CallerInfo, InvalidCaller
from host.runtime.result import RunResult
from host.spec.manifest.model import SLUG_RE

# The bounds are the CRD's (host/k8s/objects/agentrun.py): an object must fit the API server's ~1.5 MiB, and a
# status patch the schema refuses would lose the whole result.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
RUN_ID = re.compile(r"[0-9a-f]{1,64}")
"""A run id as a status carries it (the CRD's runId pattern)."""
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _invalid(problem: str) -> ConfigError:
    return ConfigError(
        f"the AgentRun's spec is invalid: {problem}",
        reason=AuditReason.CONFIG_INVALID,
        hint="fix the AgentRun's spec (kubectl explain agentrun.spec) and submit it again",
    )


def run_request(agentrun: Mapping[str, Any]) -> RunRequest:
    """The AgentRun's spec as a run request; raises ConfigError naming the first rule broken (never quoting
    the value: it is the requester's text)."""
    spec = agentrun.get("spec")
    if not isinstance(spec, dict):
        raise _invalid("spec must be an object")
    slug = spec.get("slug")
    if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
        raise _invalid("spec.slug must be a pack slug")
    goal = spec.get("goal")
    if goal is not None and (not isinstance(goal, str) or len(goal) > MAX_GOAL_CHARS):
        raise _invalid(f"spec.goal must be text of at most {MAX_GOAL_CHARS} characters")
    raw = spec.get("kwargsJson") or ""
    if not isinstance(raw, str) or len(raw) > MAX_KWARGS_JSON_CHARS:
        raise _invalid(f"spec.kwargsJson must be JSON text of at most {MAX_KWARGS_JSON_CHARS} characters")
    kwargs: Any = {}
    if raw:
        try:
            kwargs = loads_strict(raw, max_bytes=4 * MAX_KWARGS_JSON_CHARS)
        except JsonRejected:
            kwargs = None
        if not isinstance(kwargs, dict):
            raise _invalid("spec.kwargsJson must be a strict JSON object (finite numbers only)")
    runtime = spec.get("runtime")
    if runtime is not None and runtime not in (Runtime.RUNSC.value, Runtime.RUNC.value):
        raise _invalid("spec.runtime must be runsc or runc")
    c = spec.get("caller") or {}
    if not isinstance(c, dict):
        raise _invalid("spec.caller must be an object")
    try:
        caller = CallerInfo.parse(c.get("tenant", ""), c.get("requestId", ""), c.get("labels") or {})
    except InvalidCaller as exc:
        raise _invalid(f"spec.caller: {exc}") from None
    return RunRequest(slug=slug, goal=goal, kwargs=kwargs, runtime=runtime, caller=caller)


def controller_owner(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The AgentRun that controls `obj` (its one controller ownerReference of our kind), or None."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    owners = [
        r for r in refs
        if isinstance(r, dict) and r.get("controller") is True and r.get("kind") == KIND
        and r.get("apiVersion") == API_VERSION
        and isinstance(r.get("name"), str) and isinstance(r.get("uid"), str)
    ]  # fmt: skip
    return owners[0] if len(owners) == 1 else None


def status_for(result: RunResult, *, audit_digest: str) -> dict[str, Any]:
    """The AgentRun status of a finished run: its `--json` result without the logs (they stay in the node
    agent's log), the result bounded."""
    status: dict[str, Any] = {
        "phase": "Succeeded" if result.success else "Failed",
        "runId": result.run_id,
        "success": result.success,
        "errorCode": result.error_code or None,
        # the agent's own failure message can be part of it: no control character reaches kubectl's output
        "error": _clip(safe_line(result.error, limit=None), MAX_ERROR_CHARS),
        "hint": _clip(result.hint, MAX_HINT_CHARS),
        "timedOut": result.timed_out,
        "durationMs": result.duration_ms,
        "modeUsed": result.mode_used or None,
        "auditDigest": audit_digest or None,
        "resultJson": None,
        "resultTruncated": None,
    }
    if result.result is not None:
        text = json.dumps(result.result, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        if len(text) <= MAX_RESULT_JSON_CHARS:
            status["resultJson"] = text
        else:
            status["resultTruncated"] = True
    return status


def _clip(text: str, limit: int) -> str | None:
    """Status text within its schema bound (a longer one would make the whole status patch fail)."""
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def refusal_status(reason: AuditReason, error: str, hint: str) -> dict[str, Any]:
    """The status of a run that never started (fixed wording only)."""
    return {
        "phase": "Failed",
        "success": False,
        "errorCode": reason.value,
        "error": _clip(error, MAX_ERROR_CHARS),
        "hint": _clip(hint, MAX_HINT_CHARS),
    }


RESULT_DEPTH = 512
"""How deep a result read back from a status may nest: as deep as a local run's (cli/run.RESULT_DEPTH)."""


RUN_PATH = "kubernetes"
"""`run --json`'s `path` for a run submitted as an AgentRun."""


def result_json(agentrun: Mapping[str, Any]) -> dict[str, Any]:
    """A finished AgentRun's status as `run --backend kubernetes --json` prints it (its `path` kubernetes);
    a field of the wrong type reads as absent (the status is written by our node agent, but read as input)."""
    status = agentrun.get("status")
    status = status if isinstance(status, dict) else {}
    raw = status.get("resultJson")
    value: Any = None
    if isinstance(raw, str) and raw:
        try:
            value = loads_strict(raw, max_bytes=4 * MAX_RESULT_JSON_CHARS, max_depth=RESULT_DEPTH)
        except JsonRejected:
            value = None
    duration = status.get("durationMs")
    text = {k: status.get(k) if isinstance(status.get(k), str) else None
            for k in ("error", "errorCode", "modeUsed", "runId", "hint")}  # fmt: skip
    return {
        "success": status.get("success") is True,
        "result": value,
        "error": text["error"] or None,
        "error_code": text["errorCode"] or None,
        "mode_used": text["modeUsed"] or "",
        "run_id": text["runId"] or "",
        "timed_out": status.get("timedOut") is True,
        "duration_ms": duration if isinstance(duration, int) and not isinstance(duration, bool) else 0,
        "hint": text["hint"] or None,
        "logs": "",
        "path": RUN_PATH,
    }


def _cut(value: Any, limit: int) -> Any:
    return value[:limit] if isinstance(value, str) else None


def _bounded_status(status: Any) -> dict[str, Any]:
    """The status with every field result_json reads held to the CRD schema's type and bound (the schema is
    the API server's check; a client does not rely on it)."""
    if not isinstance(status, dict):
        return {}
    duration = status.get("durationMs")
    run_id = status.get("runId")
    code = status.get("errorCode")
    mode = status.get("modeUsed")
    result = status.get("resultJson")
    return {
        "success": status.get("success") is True,
        "resultJson": result if isinstance(result, str) and len(result) <= MAX_RESULT_JSON_CHARS else None,
        "error": _cut(status.get("error"), MAX_ERROR_CHARS),
        "errorCode": code if isinstance(code, str) and _CODE.fullmatch(code) else None,
        "hint": _cut(status.get("hint"), MAX_HINT_CHARS),
        "modeUsed": mode if isinstance(mode, str) and _CODE.fullmatch(mode) else None,
        "runId": run_id if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else None,
        "timedOut": status.get("timedOut") is True,
        "durationMs": duration if type(duration) is int and 0 <= duration < 2**63 else 0,
    }


def run_result(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A terminal AgentRun as the `run --json` object: `result_json` of its status, bounded first."""
    return result_json({"status": _bounded_status(obj.get("status"))})


def audit_digest(audit_file: Path, run_id: str, *, window: int = 1024 * 1024) -> str:
    """sha256 of the run's end record as the audit log holds it (the next record's chain link names the
    same digest), looked up in the log's last `window` bytes; "" when it is not there."""
    if not run_id:
        return ""
    try:
        with open(audit_file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - window))
            tail = f.read(window)
    except OSError:
        return ""
    needle = f'"run_id":"{run_id}"'.encode()
    for line in reversed(tail.split(b"\n")):
        if needle in line and b'"event":"agent_run"' in line:
            return hashlib.sha256(line).hexdigest()
    return ""


__all__ = [
    "RUN_ID",
    "TERMINAL_PHASES",
    "audit_digest",
    "controller_owner",
    "refusal_status",
    "result_json",
    "run_request",
    "run_result",
    "status_for",
]
