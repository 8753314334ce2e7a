"""`audit show|verify` (host/cli/audit.py) on a handmade log, an old one and none."""

from __future__ import annotations

from typing import Any

from host.audit.log import AuditLog
from host.audit.records import run_record
from host.spec.config import load_config
from tests.support.cli import cli, json_out
from tests.support.schema import check_schema


def _record(slug: str, run_id: str) -> dict[str, Any]:
    return run_record(
        slug=slug, trust="unverified", run_id=run_id, action="allow", source="agent_sandbox",
        reason="agent_completed", sandbox=True, runtime="runc", image="sha256:" + "b" * 64, duration_ms=12,
        timed_out=False, llm={"enabled": True, "max_calls": 2, "calls": 1, "ok": 1, "model": "m"},
        tool_calls=1, tool_refusals=0,
    )  # fmt: skip


def test_audit_show_and_verify_on_a_handmade_log(env: dict[str, str]) -> None:
    path = load_config(env).paths.audit_file
    log = AuditLog(path)
    for slug, run_id in (("a", "r1"), ("b", "r2"), ("a", "r3")):
        assert log.append(_record(slug, run_id))

    last = json_out(cli(env, "audit", "--json", "--last", "1"))
    check_schema("audit", last)
    assert [r["run_id"] for r in last] == ["r3"]
    only_a = json_out(cli(env, "audit", "show", "--json", "--slug", "a"))
    assert [r["run_id"] for r in only_a] == ["r1", "r3"]
    assert "r2" in cli(env, "audit").stdout

    proc = cli(env, "audit", "verify", "--json")
    assert proc.returncode == 0
    report = json_out(proc)
    check_schema("audit-verify", report)
    assert report["ok"] is True and report["records"] == 3 and report["problems"] == []

    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"duration_ms":12', '"duration_ms":13')
    path.write_text("\n".join(lines) + "\n")
    proc = cli(env, "audit", "verify", "--json")
    assert proc.returncode == 1
    report = json_out(proc)
    check_schema("audit-verify", report)
    assert report["ok"] is False and any("audit.jsonl:3" in p for p in report["problems"])
    human = cli(env, "audit", "verify")
    assert human.returncode == 1 and human.stdout.startswith("FAILED")


def test_audit_shows_the_run_id_of_records_written_before_the_rename(env: dict[str, str]) -> None:
    log = AuditLog(load_config(env).paths.audit_file)
    old = {("request_id" if k == "run_id" else k): v for k, v in _record("a", "old-run").items()}
    assert log.append(old) and log.append(_record("a", "new-run"))
    proc = cli(env, "audit")
    assert proc.returncode == 0, proc.stderr
    assert [line.split(" run=")[1].split()[0] for line in proc.stdout.splitlines()] == ["old-run", "new-run"]


def test_audit_on_empty_state(env: dict[str, str]) -> None:
    assert json_out(cli(env, "audit", "--json")) == []
    proc = cli(env, "audit", "verify", "--json")
    assert proc.returncode == 0 and json_out(proc)["records"] == 0
