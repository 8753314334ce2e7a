"""The `agentnode-sandbox` command: one scriptable entry point with a stable exit-code and --json contract.

docs/cli.md is the contract: every command, option, exit code and --json schema. Here: the process (logging,
the dispatch to a command, the exit code of each way a command can fail); what a command prints leaves
through host/cli/output.py, its options are host/cli/parser.py's, and each command is a module of its own,
imported only when that command runs (`COMMANDS`): `--help` and the light commands start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from host.cli.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    ExitState,
    SafeFormatter,
    UsageError,
    print_error,
    say,
    show_traceback,
    tolerant_streams,
)
from host.cli.parser import PROG, build_parser
from host.core.errors import AuditReason, SandboxError
from host.core.strictjson import dumps_strict

if TYPE_CHECKING:
    from host.runtime.headstart import Headstart

COMMANDS: Mapping[str, tuple[str, str]] = {
    "run": ("host.cli.run", "cmd_run"),
    "serve": ("host.cli.serve", "cmd_serve"),
    "k8s-controller": ("host.cli.serve", "cmd_k8s_controller"),
    "install": ("host.cli.packs", "cmd_install"),
    "uninstall": ("host.cli.packs", "cmd_uninstall"),
    "list": ("host.cli.packs", "cmd_list"),
    "init": ("host.cli.packs", "cmd_init"),
    "image": ("host.cli.image", "cmd_image"),
    "doctor": ("host.cli.doctor", "cmd_doctor"),
    "policy": ("host.cli.explain", "cmd_policy"),
    "completion": ("host.cli.completion", "cmd_completion"),
    "audit": ("host.cli.audit", "cmd_audit"),
}
"""Each command's module and function. A module is imported only when its command runs: what `--help`,
`list` or `audit` import is then what they use (tests/unit/cli/test_cold_imports.py)."""


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function of the command `name`, its module imported now."""
    module, function = COMMANDS[name]
    func: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
    return func


def _error_payload(args: argparse.Namespace, error: str, code: str, hint: str) -> dict[str, Any]:
    """The --json object of a failed command; `run` keeps its full result shape."""
    if args.cmd == "run":
        from host.runtime.result import RunResult

        failed = RunResult(success=False, error=error, error_code=code, hint=hint).to_json()
        from host.cli.run import RUN_PATH_LOCAL

        return {**failed, "path": getattr(args, "path_taken", RUN_PATH_LOCAL)}
    return {"success": False, "error": error, "error_code": code, "hint": hint or None}


def _forward(args: argparse.Namespace, raw: list[str], via: str) -> int:
    """This command line, run by the `serve` host at `via` (RunAdminCommand); its output is printed as the
    host's CLI printed it (already escaped there). Global options stay here; the command's own go along,
    without --via, and the paths it names are made absolute (the socket means the same machine)."""
    from host.api.client import RunnerClient

    if os.environ.get(ADMIN_CHILD_VARIABLE):
        raise UsageError("--via cannot be used by a command the host itself runs for its admin socket")
    forwarded: list[str] = []
    skip = False
    for word in raw[raw.index(args.cmd):]:
        if skip:
            skip = False
        elif word == "--via":
            skip = True
        elif not word.startswith("--via="):
            forwarded.append(word)
    if args.cmd == "install":
        forwarded = [str(Path(w).absolute()) if w in (args.path, *args.find_links) else w for w in forwarded]
    with RunnerClient(via) as client:
        code, out, err = client.admin(forwarded)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


ADMIN_COMMANDS = frozenset({"install", "uninstall", "list", "doctor", "policy"})
"""Commands that `--via SOCKET` runs on a `serve` host (host/api/server.py's RunAdminCommand)."""
ADMIN_CHILD_VARIABLE = "AGENTNODE_ADMIN_CHILD"
"""Set in the environment of a command the host runs for its admin socket: such a command never forwards."""


def main(argv: Sequence[str] | None = None, *, headstart: Headstart | None = None) -> int:
    tolerant_streams()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    args.headstart = headstart
    from host.core.logs import JsonFormatter, RunIdFilter

    handler = logging.StreamHandler()
    handler.addFilter(RunIdFilter())
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(SafeFormatter("%(levelname)s %(name)s [run %(run_id)s]: %(message)s"))
    long_running = args.cmd in ("serve", "k8s-controller")
    level = logging.DEBUG if args.debug else logging.INFO if long_running else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler])
    try:
        if args.cmd in ADMIN_COMMANDS and getattr(args, "via", None):
            return _forward(args, raw, args.via)
        return int(command(args.cmd)(args))
    except UsageError as exc:
        print_error(str(exc), f"see: {PROG} {args.cmd} --help")
        return EXIT_USAGE
    except SandboxError as exc:
        if args.debug:
            show_traceback()
        if args.json:
            say(dumps_strict(_error_payload(args, exc.message, exc.reason.value, exc.hint), sort_keys=True))
        print_error(exc.message, exc.hint)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print_error("interrupted", None)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (the contract: one error line, no traceback without --debug)
        if args.debug:
            show_traceback()
        message = f"unexpected {type(exc).__name__}"
        hint = "re-run with --debug for the traceback"
        if args.json:
            payload = _error_payload(args, message, AuditReason.HOST_LOOP_ERROR.value, hint)
            say(dumps_strict(payload, sort_keys=True))
        print_error(message, hint)
        return EXIT_FAILED
    finally:
        sys.stdout.flush()


def entry(headstart: Headstart | None = None) -> NoReturn:
    """The CLI's process (host/_entry.py): `main()`, then exit with its code. `headstart` is the container
    started for this command before the CLI was imported (host/runtime/headstart.py): the run takes it, or it
    is removed here."""
    try:
        code = main(headstart=headstart)
    finally:
        if headstart is not None:
            headstart.discard()  # (a no-op once the run took it)
    if ExitState.closed:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


__all__ = ["COMMANDS", "command", "entry", "main"]
