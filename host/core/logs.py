"""The host's own log lines, as text for a terminal or as one JSON object per line for a log pipeline, each
attributed to the run it concerns.

A run's id is set for the thread doing its work (the runner's thread once the id is fixed, a run server's
thread while it serves that run's call), so every record logged there carries it without every call site
passing it along. JSON lines are ASCII with every control character escaped, like text lines: a logged
value may quote something a pack or an agent wrote.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator

_current = threading.local()


def current_run_id() -> str:
    """The run this thread is working for, "" when none."""
    return str(getattr(_current, "run_id", "") or "")


def set_run_id(run_id: str) -> None:
    """This thread works for `run_id` from now on (the runner's thread, once a run's id is fixed)."""
    _current.run_id = run_id


@contextlib.contextmanager
def run_context(run_id: str) -> Iterator[None]:
    """This thread works for `run_id` for the duration (a run server's thread serving one call)."""
    before = current_run_id()
    _current.run_id = run_id
    try:
        yield
    finally:
        _current.run_id = before


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ms), level, logger, message, run_id (or null), and the
    exception's type name when there is one (never its text or traceback: those quote agent text)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "run_id": _stamped(record) or current_run_id() or None,
        }
        if record.exc_info and record.exc_info[0] is not None:
            line["exception"] = record.exc_info[0].__name__
        return json.dumps(line, ensure_ascii=True, sort_keys=True)


def _stamped(record: logging.LogRecord) -> str:
    """The run id RunIdFilter stamped on the record when it was logged ("" when none)."""
    run_id = getattr(record, "run_id", "")
    return run_id if isinstance(run_id, str) and run_id != "-" else ""


class RunIdFilter(logging.Filter):
    """Stamps `run_id` on each record as it is logged, on the thread that logs it ("-" for none), so a
    formatter running later or elsewhere still knows it; text formats show it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "run_id", None):
            record.run_id = current_run_id() or "-"
        return True


__all__ = ["JsonFormatter", "RunIdFilter", "current_run_id", "run_context", "set_run_id"]
