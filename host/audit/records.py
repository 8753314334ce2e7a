"""The audit records of a run (`agent_run_start`, `agent_run`), sanitized by construction: no prompt,
completion, key or agent-authored text can reach the log."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from host.core.errors import AUDIT_REASONS, AuditReason
from host.core.vocab import Source

_ACTIONS = frozenset({"allow", "deny"})
_SOURCES = frozenset(s.value for s in Source)
_LLM_CAP_KEYS = ("max_calls", "max_input_chars", "max_output_chars")
_LLM_BUDGET_KEYS = ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd")
_LLM_COUNTER_KEYS = (
    "requests",
    "calls",
    "ok",
    "refused_disabled",
    "refused_limit",
    "refused_input",
    "refused_output",
    "refused_model",
    "refused_tool",
    "provider_errors",
    # token and cost budgets (host/llm/budget.py) and provider retries: counts, never text
    "input_tokens",
    "output_tokens",
    "overshoot_tokens",
    "reservations",
    "refused_input_tokens",
    "refused_total_tokens",
    "refused_cost",
    "retries",
    "retries_rate_limited",
    "retries_server_error",
    "retries_connection",
)
_LLM_NUMBER_KEYS = frozenset({"max_cost_usd", "cost_usd"})
"""Dollar amounts: finite non-negative numbers, recorded as floats."""
_LLM_KEYS = (
    "enabled", *_LLM_CAP_KEYS, "allowed_models", *_LLM_BUDGET_KEYS, *_LLM_COUNTER_KEYS, "cost_usd", "model",
)  # fmt: skip

RUN_EVENT = "agent_run"
"""The one record that ends a run (its outcome, counters and caps)."""
START_EVENT = "agent_run_start"
"""Written before any agent code runs, so a run without an end is visible."""


def run_record(
    *,
    slug: str,
    trust: str | None,
    run_id: str,
    action: str,
    source: str,
    reason: AuditReason | str,
    sandbox: bool,
    runtime: str | None,
    image: str | None,
    duration_ms: int,
    timed_out: bool,
    llm: Mapping[str, Any] | None,
    tool_calls: int,
    tool_refusals: int,
    tool_calls_host_worker: int = 0,
    tool_calls_tool_sandbox: int = 0,
    tool_sandboxes_started: int = 0,
    llm_tool_calls: int = 0,
    llm_tool_calls_refused: int = 0,
    caller: Mapping[str, Any] | None = None,
    egress: Mapping[str, Any] | None = None,
    files: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the one `agent_run` record of a run; sanitized by construction.

    The tool counters say where calls ran: `tool_calls` of them, `tool_calls_host_worker` in the host's
    worker processes (trusted and curated packs) and `tool_calls_tool_sandbox` in the run's tool sandboxes
    (community packs), of which it started `tool_sandboxes_started`. `llm_tool_calls` counts the tool calls
    completions returned to the agent (the model's requests, whether or not the agent then ran them), of which
    `llm_tool_calls_refused` named no tool the request offered (host/llm/toolcalls.py). `egress` (None when
    no sandbox of the run was granted any) counts its connections per granting rule and its refusals and
    cuts per fixed reason (host/egress/ledger.py `summary`): never a name a sandbox asked for. `files` (None
    when the caller handed the run none) counts what crossed (host/files/run.py `FilesOutcome.summary`):
    entries, bytes, SHA-256 digests and skip reasons per part, never a file's name or content.

    Only these typed fields reach the log. `llm` (effective caps + usage counters, None when no LLM policy
    applied) is filtered to the known keys with the expected types (ints, the `enabled` bool, the host-side
    `model` string, `allowed_models` as a sorted list of strings, `max_cost_usd` and `cost_usd` as finite
    non-negative floats, or None); any other key or value shape is dropped. So no prompt, completion, API
    key, provider error, tool argument/result or agent-authored text can ever be audited. `reason`,
    `action` and `source` outside their fixed sets are programming errors and raise ValueError.
    """
    if reason not in AUDIT_REASONS:
        raise ValueError(f"audit reason {reason!r} is not in AuditReason")
    if action not in _ACTIONS:
        raise ValueError(f"audit action {action!r} is not one of {sorted(_ACTIONS)}")
    head = _record_head(
        RUN_EVENT, slug=slug, source=source, trust=trust, run_id=run_id, sandbox=sandbox, runtime=runtime,
        verdict=(action, str(reason)),
    )  # fmt: skip
    return {
        **head,
        "image": image,
        "duration_ms": int(duration_ms),
        "timed_out": bool(timed_out),
        "llm": None if llm is None else _sanitize_llm(llm),
        "tool_calls": int(tool_calls),
        "tool_refusals": int(tool_refusals),
        "tool_calls_host_worker": int(tool_calls_host_worker),
        "tool_calls_tool_sandbox": int(tool_calls_tool_sandbox),
        "tool_sandboxes_started": int(tool_sandboxes_started),
        "llm_tool_calls": int(llm_tool_calls),
        "llm_tool_calls_refused": int(llm_tool_calls_refused),
        "caller": None if caller is None else _sanitize_caller(caller),
        "egress": None if egress is None else _sanitize_egress(egress),
        "files": None if files is None else _sanitize_files(files),
    }


_RULE_KEY = re.compile(r"(\*\.)?([a-z0-9.-]{1,253}|\[[0-9a-f:.]{2,45}\]):[0-9]{1,5}")
_REASON_KEY = re.compile(r"[a-z_]{1,40}")
_EGRESS_COUNTS = ("attempts", "bytes_out", "bytes_in")
_EGRESS_LIMITS = ("max_connections", "max_concurrent", "max_bytes_out", "max_bytes_in")


def _counts(value: Any, keys: tuple[str, ...]) -> dict[str, int]:
    found = value if isinstance(value, Mapping) else {}
    return {key: int(found[key]) for key in keys if isinstance(found.get(key), int)}


def _sanitize_egress(egress: Mapping[str, Any]) -> dict[str, Any]:
    """The egress section: integer counts, rule texts of the grant's shape, reason words; nothing else."""
    rules = egress.get("rules")
    out: dict[str, Any] = _counts(egress, _EGRESS_COUNTS)
    out["rules"] = {
        str(rule): _counts(counts, ("connections", "bytes_out", "bytes_in"))
        for rule, counts in (rules.items() if isinstance(rules, Mapping) else ())
        if isinstance(rule, str) and _RULE_KEY.fullmatch(rule)
    }
    for part in ("refused", "cut"):
        found = egress.get(part)
        out[part] = {
            str(reason): int(count)
            for reason, count in (found.items() if isinstance(found, Mapping) else ())
            if isinstance(reason, str) and _REASON_KEY.fullmatch(reason) and isinstance(count, int)
        }
    out["limits"] = _counts(egress.get("limits"), _EGRESS_LIMITS)
    return out


_FILES_PARTS = ("workspace", "inputs", "changes", "applied", "artifacts")
_FILES_COUNTS = ("files", "dirs", "links", "bytes", "added", "modified", "deleted", "applied", "conflicts",
                 "mismatched")  # fmt: skip
_DIGEST = re.compile(r"[0-9a-f]{64}")
_EXPORTS = ("tar", "patch")


def _sanitize_files(files: Mapping[str, Any]) -> dict[str, Any]:
    """The files section: per part, integer counts, a SHA-256 hex digest and skip reason words; the export's
    kind. Nothing else (no name, no content) can pass."""
    out: dict[str, Any] = {}
    for part in _FILES_PARTS:
        found = files.get(part)
        if not isinstance(found, Mapping):
            continue
        section: dict[str, Any] = _counts(found, _FILES_COUNTS)
        digest = found.get("digest")
        if isinstance(digest, str) and _DIGEST.fullmatch(digest):
            section["digest"] = digest
        skipped = found.get("skipped")
        section["skipped"] = {
            str(reason): int(count)
            for reason, count in (skipped.items() if isinstance(skipped, Mapping) else ())
            if isinstance(reason, str) and _REASON_KEY.fullmatch(reason) and isinstance(count, int)
        }
        out[part] = section
    if files.get("exported") in _EXPORTS:
        out["exported"] = files["exported"]
    return out


def _sanitize_caller(caller: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's metadata (host/policy/caller.py validated it): its three fields as strings only."""
    labels = caller.get("labels")
    return {
        "tenant": str(caller.get("tenant") or ""),
        "request_id": str(caller.get("request_id") or ""),
        "labels": {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
    }


def start_record(
    *,
    slug: str,
    trust: str | None,
    run_id: str,
    source: str,
    sandbox: bool,
    runtime: str | None,
    max_runtime_seconds: int,
) -> dict[str, Any]:
    """The `agent_run_start` record written before any agent code runs.

    With it a run whose end record never arrives (host killed, append lost) is visible to `verify_audit`:
    a start older than its own runtime bound plus `END_GRACE_SECONDS` with no matching `agent_run` is a
    problem. A restarted host closes such runs with `host_lost`.
    """
    head = _record_head(
        START_EVENT, slug=slug, source=source, trust=trust, run_id=run_id, sandbox=sandbox, runtime=runtime
    )
    return {**head, "max_runtime_seconds": int(max_runtime_seconds)}


def _record_head(
    event: str,
    *,
    slug: str,
    source: str,
    trust: str | None,
    run_id: str,
    sandbox: bool,
    runtime: str | None,
    verdict: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The fields both records of a run start with, in the order the log has always had them: an end
    record's verdict (`action`, `reason`) sits among them, after `slug` and after `source`. A `source`
    outside its fixed set is a programming error and raises ValueError."""
    if source not in _SOURCES:
        raise ValueError(f"audit source {source!r} is not one of {sorted(_SOURCES)}")
    action, reason = verdict if verdict is not None else ("", "")
    head: dict[str, Any] = {
        "event": event,
        "slug": slug,
        "action": action,
        "source": source,
        "reason": reason,
        "trust": trust,
        "run_id": run_id,
        "sandbox": bool(sandbox),
        "runtime": runtime,
    }
    if verdict is None:
        del head["action"], head["reason"]
    return head


def _sanitize_llm(llm: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only known keys whose values have the expected scalar shape."""
    out: dict[str, Any] = {}
    for key in _LLM_KEYS:
        if key not in llm:
            continue
        value = llm[key]
        if value is None:
            out[key] = None
        elif key == "enabled":
            if isinstance(value, bool):
                out[key] = value
        elif key == "model":
            if isinstance(value, str):
                out[key] = value
        elif key == "allowed_models":
            if isinstance(value, list | tuple | set | frozenset) and all(isinstance(m, str) for m in value):
                out[key] = sorted(value)
        elif key in _LLM_NUMBER_KEYS:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value) and value >= 0:
                out[key] = float(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


__all__ = [
    "RUN_EVENT",
    "START_EVENT",
    "run_record",
    "start_record",
]
