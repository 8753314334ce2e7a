"""The tamper-evident audit trail: one sanitized, hash-chained record per run, written and verified here."""
