"""What the audit tests share: a full run record, a start record, a filled log and line edits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from host.audit.log import AuditLog
from host.audit.records import run_record, start_record
from host.core.errors import AuditReason

FULL_LLM: dict[str, Any] = {
    "enabled": True,
    "max_calls": 5,
    "max_input_chars": 1000,
    "max_output_chars": 2000,
    "allowed_models": frozenset({"gpt-b", "gpt-a"}),
    "requests": 3,
    "calls": 2,
    "ok": 2,
    "refused_disabled": 0,
    "refused_limit": 1,
    "refused_input": 0,
    "refused_output": 0,
    "refused_model": 0,
    "refused_tool": 1,
    "provider_errors": 0,
    "max_input_tokens": 4000,
    "max_output_tokens": None,
    "max_total_tokens": 20_000,
    "max_cost_usd": 0.5,
    "input_tokens": 812,
    "output_tokens": 97,
    "overshoot_tokens": 0,
    "reservations": 2,
    "refused_input_tokens": 0,
    "refused_total_tokens": 1,
    "refused_cost": 0,
    "retries": 3,
    "retries_rate_limited": 2,
    "retries_server_error": 1,
    "retries_connection": 0,
    "cost_usd": 0.0001799,
    "model": "gpt-a",
}


def record(slug: str = "demo-agent", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "slug": slug,
        "trust": "community",
        "run_id": "run-1",
        "action": "allow",
        "source": "agent_sandbox",
        "reason": AuditReason.AGENT_COMPLETED,
        "sandbox": True,
        "runtime": "runsc",
        "image": "sha256:" + "a" * 64,
        "duration_ms": 1234,
        "timed_out": False,
        "llm": FULL_LLM,
        "tool_calls": 3,
        "tool_refusals": 1,
        "llm_tool_calls": 4,
        "llm_tool_calls_refused": 1,
    }
    args.update(overrides)
    return run_record(**args)


def start(run_id: str = "run-1", max_runtime_seconds: int = 60) -> dict[str, Any]:
    return start_record(
        slug="demo-agent",
        trust="unverified",
        run_id=run_id,
        source="agent_sandbox",
        sandbox=True,
        runtime="runc",
        max_runtime_seconds=max_runtime_seconds,
    )


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def write_lines(path: Path, content: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in content))


def filled(tmp_path: Path, count: int = 5) -> Path:
    path = tmp_path / "audit" / "audit.jsonl"
    log = AuditLog(path)
    for i in range(count):
        assert log.append(record(slug=f"agent-{i}"))
    return path


def edit_field(raw: list[bytes]) -> list[bytes]:
    rec = json.loads(raw[2])
    rec["action"] = "deny"
    return [*raw[:2], json.dumps(rec, separators=(",", ":")).encode(), *raw[3:]]
