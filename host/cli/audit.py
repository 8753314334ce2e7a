"""`audit show|verify`: the hash-chained audit trail, read or checked."""

from __future__ import annotations

import argparse

from host.cli.output import EXIT_FAILED, EXIT_OK, UsageError, emit, say
from host.core.terminal import safe_line, safe_token


def cmd_audit(args: argparse.Namespace) -> int:
    from host.audit.log import AuditLog
    from host.audit.records import RUN_EVENT
    from host.audit.verify import verify_audit
    from host.spec.config import load_config

    path = load_config().paths.audit_file
    if args.audit_cmd == "verify":
        rep = verify_audit(path)
        payload = {
            "ok": rep.ok,
            "records": rep.records,
            "problems": rep.problems,
            "open_runs": rep.open_runs,
            "path": str(path),
        }

        def human() -> None:
            say(f"{'ok' if rep.ok else 'FAILED'}: {rep.records} records in {safe_line(path)}")
            for p in rep.problems:
                say(f"  {safe_line(p)}")
            if rep.open_runs:
                say(f"  {len(rep.open_runs)} run(s) in progress (started, not ended yet)")

        emit(args, payload, human)
        return EXIT_OK if rep.ok else EXIT_FAILED
    if args.last <= 0:
        raise UsageError(f"--last must be a positive number, got {args.last}")
    records = AuditLog(path).tail(args.last, slug=args.slug, events=frozenset({RUN_EVENT}))

    def human_list() -> None:
        if not records:
            say(f"no audit records in {safe_line(path)}")
        for r in records:
            ts, slug, action, reason, duration = (
                safe_token(r.get(k)) for k in ("ts", "slug", "action", "reason", "duration_ms")
            )
            run = safe_token(str(r.get("run_id", r.get("request_id")))[:12])  # request_id: old records
            say(f"{ts} {slug} {action} {reason} run={run} {duration}ms")

    emit(args, records, human_list)
    return EXIT_OK
