"""What a command prints and how it ends: escaped human lines, strict --json, error lines, exit codes.

Human output is for a terminal and carries text agents and packs wrote, so it all leaves through `say`
(host/core/terminal.py escapes controls, bidi and other invisible characters); --json output is strict JSON
(never NaN/Infinity). docs/cli.md is the contract.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

from host.core.errors import AuditReason, SandboxError
from host.core.strictjson import JsonRejected, dumps_strict
from host.core.terminal import safe_block, safe_line

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


def say(text: str = "", *, err: bool = False) -> None:
    """Write one block of human output (stdout, or stderr with `err`). Every human line goes through here.

    Why a last escape of the whole block when fields are escaped where they are interpolated: a field an
    interpolation forgot still cannot drive the terminal (it could at most start a line of its own).
    """
    (sys.stderr if err else sys.stdout).write(safe_block(text) + "\n")


def print_error(message: str, hint: str | None) -> None:
    """The contract's `error:` / `hint:` lines; each is one line even when it quotes an agent's text."""
    say(f"error: {safe_line(message)}", err=True)
    if hint:
        say(f"hint: {safe_line(hint)}", err=True)


def json_line(payload: Any) -> str:
    """Strict JSON (ESC and friends come out as \\u001b); a value JSON cannot carry is a clean error."""
    try:
        return dumps_strict(payload, sort_keys=True, default=str)
    except (JsonRejected, RecursionError) as exc:
        problem = str(exc) if isinstance(exc, JsonRejected) else "it nests too deeply"
        raise SandboxError(
            f"the output cannot be printed as JSON ({problem})",
            reason=AuditReason.HOST_LOOP_ERROR,
            hint="re-run with --debug for the traceback",
        ) from None


def emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    if args.json:
        sys.stdout.write(json_line(payload) + "\n")
    else:
        human()


def progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress lines on stderr: always on a TTY, off a TTY only without --json."""
    if args.json and not sys.stderr.isatty():
        return lambda _line: None

    def show(line: str) -> None:
        say(f"  {safe_line(line)}", err=True)
        sys.stderr.flush()

    return show


class SafeFormatter(logging.Formatter):
    """Log lines reach the operator's terminal too, and a logged value may be agent- or pack-written."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_block(super().format(record))


def show_traceback() -> None:
    """--debug: the traceback, escaped (exception messages quote pack- and agent-written text)."""
    say(traceback.format_exc().rstrip("\n"), err=True)


def tolerant_streams() -> None:
    """A character the terminal's encoding lacks is shown as an escape, never a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


class ExitState:
    closed = False
    """Set by `run` once all it opened is closed: `entry` may then leave without the interpreter's own
    teardown (finalizing gRPC, the engine client's pools and every module: ~0.1 s a one-shot run would
    otherwise pay after its result is printed)."""
