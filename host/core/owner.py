"""Which host process owns a run: a token that survives pid reuse, read with `os` alone (a cold run names
its owner before its other imports: host/runtime/headstart.py)."""

from __future__ import annotations

import os


def _process_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Field 22 (starttime) follows the parenthesised command name, which may contain spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def owner_token(pid: int | None = None) -> str:
    """A token naming this host process that survives pid reuse: `pid:starttime`."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_process_start_time(pid) or '0'}"


def owner_alive(token: str) -> bool:
    """Whether the host process named by `token` is still running."""
    pid_text, _, start = token.partition(":")
    if not pid_text.isdigit():
        return False
    return _process_start_time(int(pid_text)) == start


__all__ = ["owner_alive", "owner_token"]
