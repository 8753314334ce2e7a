"""The `agentnode-sandbox` command: one scriptable entry point with a stable exit-code and --json contract.

docs/cli.md is the contract: every command, option, exit code and --json schema. Human output is for a
terminal and carries text agents and packs wrote, so it all leaves through `_say` (host/core/terminal.py
escapes controls, bidi and other invisible characters); --json output is strict JSON (never NaN/Infinity).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from host.core.errors import AuditReason, EngineError, EngineNotFound, PackError, SandboxError
from host.core.strictjson import JsonRejected, check_finite, dumps_strict, loads_strict
from host.core.terminal import safe_block, safe_line, safe_token
from host.core.vocab import Route, Runtime, Trust

if TYPE_CHECKING:
    from host.runtime.headstart import Headstart
    from host.runtime.runner import RunResult

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

REPO_ROOT = Path(__file__).resolve().parents[2]
PROG = "agentnode-sandbox"


def _version() -> str:
    """The installed distribution's version (a bare checkout that was never installed: "unknown")."""
    import importlib.metadata

    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`, with the version looked up only when asked: reading the installed distribution's
    metadata cost every command ~25 ms."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{PROG} {_version()}")
        parser.exit()


class _UsageError(Exception):
    """Bad command-line input (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's error shape: `error: …` and `hint: …` on stderr, exit 2; no
    abbreviated options (`--vi` is not `--via`: what a script says is what runs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        _print_error(message, f"see: {self.prog} --help")
        sys.exit(EXIT_USAGE)


def _say(text: str = "", *, err: bool = False) -> None:
    """Write one block of human output (stdout, or stderr with `err`). Every human line goes through here.

    Why a last escape of the whole block when fields are escaped where they are interpolated: a field an
    interpolation forgot still cannot drive the terminal (it could at most start a line of its own).
    """
    (sys.stderr if err else sys.stdout).write(safe_block(text) + "\n")


def _print_error(message: str, hint: str | None) -> None:
    """The contract's `error:` / `hint:` lines; each is one line even when it quotes an agent's text."""
    _say(f"error: {safe_line(message)}", err=True)
    if hint:
        _say(f"hint: {safe_line(hint)}", err=True)


def _json_line(payload: Any) -> str:
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


def _emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    if args.json:
        sys.stdout.write(_json_line(payload) + "\n")
    else:
        human()


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress lines on stderr: always on a TTY, off a TTY only without --json."""
    if args.json and not sys.stderr.isatty():
        return lambda _line: None

    def show(line: str) -> None:
        _say(f"  {safe_line(line)}", err=True)
        sys.stderr.flush()

    return show


def _pack_payload(entry: Any) -> dict[str, Any]:
    return {k: v for k, v in entry.to_json().items() if k != "manifest"}


# -- run ----------------------------------------------------------------------------------------------


def _parse_args_kv(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise _UsageError(f"--arg expects KEY=JSON with KEY a Python identifier, got {pair!r}")
        try:
            out[key] = loads_strict(raw)
        except JsonRejected as exc:
            raise _UsageError(
                f"--arg {key}: the value is not strict JSON: {exc} (quote strings: {key}='\"text\"')"
            ) from None
    return out


RESULT_DEPTH = 512
"""Deeper results are refused before json.dumps would hit the interpreter's recursion limit."""


def _printable(result: RunResult) -> RunResult:
    """A result that JSON cannot carry (a non-finite number that got past the host) ends as a failed run.

    Why here too: `run` must never print NaN/Infinity, whichever host (this one, or `serve` via --via)
    produced the result.
    """
    try:
        check_finite(result.result, max_depth=RESULT_DEPTH)
    except JsonRejected as exc:
        return dataclasses.replace(
            result,
            success=False,
            result=None,
            error=f"the agent's result cannot be shown as JSON: {exc}",
            error_code="result_not_serializable",
            hint="return only JSON values (finite numbers, strings, lists, objects, true/false/null)",
        )
    return result


FAILURE_LOG_LINES = 10
"""The agent's last output lines a failed run shows in human mode (when they were not followed live)."""

RUN_PATH_LOCAL, RUN_PATH_SERVE, RUN_PATH_KUBERNETES = "local", "serve", "kubernetes"
"""`run --json`'s `path`: run in this process, on a `serve` host (found, or --via), or as an AgentRun."""


def _caller(args: argparse.Namespace) -> Any:
    """The run's caller metadata from --tenant, --request-id and --label KEY=VALUE; a bad value is a usage
    error naming the rule."""
    from host.policy.caller import CallerInfo, InvalidCaller

    labels: dict[str, str] = {}
    for pair in args.label or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise _UsageError(f"--label expects KEY=VALUE, got {safe_line(pair)}")
        labels[key] = value
    try:
        return CallerInfo.parse(args.tenant or "", args.request_id or "", labels)
    except InvalidCaller as exc:
        raise _UsageError(str(exc)) from None


def _limits(args: argparse.Namespace) -> Any:
    """The run's tighter limits from --max-*; None when none was given; a bad value is a usage error."""
    from host.policy.caller import InvalidCaller, RunOverrides

    given = {name: getattr(args, name) for name in RunOverrides.__dataclass_fields__}
    if all(value is None for value in given.values()):
        return None
    try:
        return RunOverrides.parse(**given)
    except InvalidCaller as exc:
        raise _UsageError(str(exc)) from None


def _follow(text: str) -> None:
    """One live line of the agent's output, escaped, on stderr (stdout keeps its one JSON value)."""
    _say(f"| {safe_line(text)}", err=True)


KUBERNETES_REFUSED = (
    ("via", "--via", "it submits to a local `serve` host"),
    ("follow", "--follow", "a cluster run's output stays in its node agent's log"),
    *((name, "--" + name.replace("_", "-"), "an AgentRun carries no limit overrides") for name in (
        "max_runtime_seconds", "max_tool_calls", "max_iterations", "max_llm_calls", "max_total_tokens",
        "max_cost_usd")),
)  # fmt: skip
"""`run` options that have no meaning on a cluster: refused with --backend kubernetes (never dropped)."""
KUBERNETES_ONLY = (("namespace", "--namespace"), ("kubeconfig", "--kubeconfig"), ("context", "--context"),
                   ("wait_seconds", "--wait-seconds"))  # fmt: skip


def _given(value: Any) -> bool:
    """Whether an option was given: its default is None, False (a flag) or [] (a repeatable one)."""
    return value is not None and value is not False and value != []


def _check_backend(args: argparse.Namespace) -> None:
    """Refuse the `run` options the chosen backend cannot honour, naming the first one."""
    if args.backend != "kubernetes":
        for dest, flag in KUBERNETES_ONLY:
            if _given(getattr(args, dest)):
                raise _UsageError(f"{flag} needs --backend kubernetes")
        return
    for dest, flag, why in KUBERNETES_REFUSED:
        if _given(getattr(args, dest)):
            raise _UsageError(f"{flag} cannot be used with --backend kubernetes ({why})")
    if args.runtime not in (None, Runtime.RUNSC.value, Runtime.RUNC.value):
        raise _UsageError(f"--runtime {args.runtime} cannot be used with --backend kubernetes (runsc, runc)")
    if args.wait_seconds is not None:
        from host.k8s.client import MAX_WAIT_SECONDS

        if not 0 < args.wait_seconds <= MAX_WAIT_SECONDS:  # NaN fails this too
            raise _UsageError(f"--wait-seconds must be more than 0 and at most {MAX_WAIT_SECONDS}")


def _run_on_kubernetes(args: argparse.Namespace, kwargs: dict[str, Any], caller: Any) -> RunResult:
    """Submit the run as an AgentRun and wait for its end (host/k8s/client.py); Ctrl-C deletes it and
    raises RunCancelled with the cancelled run's object."""
    from host.k8s.client import (
        DEFAULT_NAMESPACE,
        DEFAULT_WAIT_SECONDS,
        InvalidAgentRun,
        agentrun_body,
        agentrun_name,
        connect,
        is_dns_label,
        submit_and_wait,
    )

    if args.namespace is not None and not is_dns_label(args.namespace):
        raise _UsageError("--namespace must be a DNS label (1-63 of a-z 0-9 -)")
    request: dict[str, Any] = dict(slug=args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime,
                                   caller=caller)  # fmt: skip
    try:  # what the cluster would refuse is a usage error before any connection
        agentrun_body(agentrun_name(args.slug), args.namespace or DEFAULT_NAMESPACE, **request)
    except InvalidAgentRun as exc:
        raise _UsageError(str(exc)) from None
    if not args.debug:  # the client's retries log each attempt; the error line says how it ended
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    kube, default_namespace = connect(kubeconfig=args.kubeconfig, context=args.context)
    progress = _progress(args)
    where = [""]  # the AgentRun's namespace/name once it exists (a DNS label each: safe to show)

    def created(ref: Any) -> None:
        where[0] = f"{ref.namespace}/{ref.name}"

    try:
        payload = submit_and_wait(
            kube, namespace=args.namespace or default_namespace,
            timeout=args.wait_seconds or DEFAULT_WAIT_SECONDS, on_created=created,
            on_phase=lambda phase: progress(f"AgentRun {where[0]}: {phase}"), **request,
        )  # fmt: skip
    finally:
        kube.close()
    return _result_of(payload)


def _result_of(payload: Mapping[str, Any]) -> RunResult:
    """A `run --json` object as the RunResult a local run returns (to_json gives the same object back)."""
    from host.runtime.result import RunResult

    return RunResult(
        success=payload["success"] is True, result=payload["result"], error=payload["error"] or "",
        error_code=payload["error_code"] or "", mode_used=payload["mode_used"], run_id=payload["run_id"],
        timed_out=payload["timed_out"] is True, duration_ms=payload["duration_ms"],
        hint=payload["hint"] or "", logs=payload["logs"],
    )  # fmt: skip


def _serve_socket() -> Path | None:
    """The admin socket of a `serve` host running for this config (`<config dir>/agentnode-admin.sock`),
    or None. Only a socket this user owns, in a directory no one else may write to, and that accepts a
    connection now, counts: a stale socket left by a stopped host is passed over, and a socket someone else
    placed never receives a run's goal. A bare connect (no gRPC import) keeps the local path's cost."""
    import socket
    import stat

    from host.spec.config import config_paths

    path = config_paths().admin_socket
    try:
        found, parent = os.lstat(path), os.stat(path.parent)
    except OSError:
        return None
    uid = os.geteuid()
    ours = found.st_uid == uid and parent.st_uid == uid and not parent.st_mode & 0o022
    if not (stat.S_ISSOCK(found.st_mode) and ours):
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(SERVE_PROBE_SECONDS)
    try:
        probe.connect(str(path))
    except OSError:
        return None
    finally:
        probe.close()
    return path


SERVE_PROBE_SECONDS = 1.0
"""How long `run` waits for a found `serve` host to accept a connection before running here instead."""


def _run_local(
    args: argparse.Namespace, kwargs: dict[str, Any], caller: Any, limits: Any
) -> tuple[RunResult, int]:
    """The run in this process: (its result, how many audit writes failed).

    The run's container is started first, with light modules only (host/runtime/prelaunch.py), while another
    thread imports the rest of the host: those imports then overlap the engine's start of the container
    instead of preceding it. The host adopts the container, or the run takes the usual path."""
    import threading

    from host.core.owner import owner_token
    from host.engine.contract import ContainerLimits
    from host.runtime.prelaunch import prelaunch

    loader = threading.Thread(target=_import_the_host, daemon=True, name="host-imports")
    early = None
    with contextlib.suppress(Exception):  # the usual path meets (and reports) whatever failed here
        early = prelaunch(args.slug, runtime=args.runtime, owner=owner_token(), env=os.environ,
                          limits=ContainerLimits(), starting=loader.start,
                          headstart=getattr(args, "headstart", None))  # fmt: skip
    try:
        if loader.ident is None:  # never started (no container was): import now
            loader.start()
        loader.join()
        from host.runtime.runner import SandboxHost

        host = SandboxHost(metrics=False)
        try:
            host.startup_sweep()
            result = host.run(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime,
                              on_log=_follow if args.follow else None, caller=caller, limits=limits,
                              prelaunched=early)  # fmt: skip
        finally:
            host.close()
    finally:
        if early is not None:
            early.discard()  # a container the run did not adopt (adopted ones went with the run)
    return result, host.audit_failures


def _import_the_host() -> None:
    """Import what a local run needs beyond the prelaunch (gRPC, the session, the broker); a failure is
    raised again, with its traceback, by the import in the main thread."""
    with contextlib.suppress(Exception):
        import host.runtime.runner  # noqa: F401


def _run_on_serve(client: Any, args: argparse.Namespace, kwargs: dict[str, Any], caller: Any,
                  limits: Any) -> RunResult:  # fmt: skip
    """The run on a `serve` host through `client` (a RunnerClient); --follow streams its lines."""
    from host.api.events import RunFinished, RunLog

    if not args.follow:
        result: RunResult = client.submit(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime,
                                          caller=caller, limits=limits)  # fmt: skip
        return result
    finished = None
    events = client.stream(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime, caller=caller,
                           limits=limits)  # fmt: skip
    for event in events:
        if isinstance(event, RunLog):
            _follow(event.text)
        elif isinstance(event, RunFinished):
            finished = event.result
    if finished is None:
        raise EngineError(f"the host at {client.socket_path} ended the run's stream without its result",
                          hint="see the host's log", check="serve")  # fmt: skip
    return finished


def cmd_run(args: argparse.Namespace) -> int:
    _check_backend(args)
    if args.no_serve and args.via:
        raise _UsageError("--no-serve cannot be used with --via (which names the host to run on)")
    kwargs = _parse_args_kv(args.arg or [])
    caller, limits = _caller(args), _limits(args)
    audit_failures = 0
    exit_code = EXIT_OK
    path = args.path_taken = RUN_PATH_LOCAL  # the error object of a failed run names it too
    if args.backend == "kubernetes":
        from host.k8s.client import RunCancelled

        path = args.path_taken = RUN_PATH_KUBERNETES
        try:
            result = _run_on_kubernetes(args, kwargs, caller)
        except RunCancelled as cancelled:
            result, exit_code = _result_of(cancelled.result), EXIT_INTERRUPTED
    else:
        found = None if args.via or args.no_serve else _serve_socket()
        socket_path = args.via or found
        served: RunResult | None = None
        if socket_path is not None:
            from host.api.client import RunnerClient

            with RunnerClient(socket_path, connect_timeout=SERVE_PROBE_SECONDS if found else 5.0) as client:
                try:
                    client.wait_ready()
                except EngineError:
                    if not found:
                        raise
                    # the host found stopped answering before anything was submitted: run here instead
                else:
                    path = args.path_taken = RUN_PATH_SERVE
                    served = _run_on_serve(client, args, kwargs, caller, limits)
        if served is None:
            result, audit_failures = _run_local(args, kwargs, caller, limits)
        else:
            result = served
    result = _printable(result)
    payload = {**result.to_json(), "path": path}
    if audit_failures:
        payload["audit_error"] = "the audit record could not be written"

    def human() -> None:
        if result.success:
            _say(dumps_strict(result.result, indent=2))  # ensure_ascii: every control is a \\u escape
            _say(
                f"ok: {safe_token(args.slug)} ({safe_token(result.mode_used)}, "
                f"run {safe_token(result.run_id[:12])}, {int(result.duration_ms)} ms"
                f"{', on the serve host' if path == RUN_PATH_SERVE else ''})",
                err=True,
            )
        else:
            lines = [] if args.follow else result.logs.splitlines()[-FAILURE_LOG_LINES:]
            if lines:
                _say(f"the agent's last {len(lines)} output line(s):", err=True)
                for line in lines:
                    _follow(line)
            _print_error(f"{safe_line(result.error)} [{safe_token(result.error_code)}]", result.hint)
        if audit_failures:
            _say("warning: the audit record could not be written", err=True)

    _emit(args, payload, human)
    if path != RUN_PATH_KUBERNETES:
        _EXIT.closed = True  # the host closed (container gone, record durable, spans flushed), or the client
    if exit_code == EXIT_INTERRUPTED:
        return exit_code
    return EXIT_OK if result.success else EXIT_FAILED


def cmd_completion(args: argparse.Namespace) -> int:
    from host.cli.completion import bash_script

    script = bash_script(build_parser())
    if args.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    sys.stdout.write(script)
    return EXIT_OK


SERVE_LOCAL_ONLY = (("socket", "--socket"), ("warm", "--warm"), ("drain_seconds", "--drain-seconds"),
                    ("metrics", "--metrics"), ("json", "--json"))  # fmt: skip
"""`serve` options about the local admin socket (and its ready line): refused with --node."""
DEFAULT_DRAIN_SECONDS = 30.0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.node:
        for dest, flag in SERVE_LOCAL_ONLY:
            if _given(getattr(args, dest)):
                raise _UsageError(f"{flag} cannot be used with --node (the node agent has no admin socket)")
        from host.k8s.node import serve_node

        return serve_node(os.environ)

    from host.api.server import parse_address, serve
    from host.spec.config import load_config

    drain_seconds = DEFAULT_DRAIN_SECONDS if args.drain_seconds is None else args.drain_seconds
    if args.metrics is not None:
        try:
            parse_address(args.metrics)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    socket_path = Path(args.socket) if args.socket else load_config().paths.admin_socket

    def ready(path: str) -> None:
        if args.json:
            line = {"socket": path, "warm": args.warm, "metrics": args.metrics}
            sys.stdout.write(_json_line(line) + "\n")
            sys.stdout.flush()
        warm = ", ".join(safe_token(slug) for slug in args.warm) or "none"
        metrics = f", metrics on http://{safe_line(args.metrics)}/metrics" if args.metrics else ""
        _say(f"serving on {safe_line(path)} (warm: {warm}){metrics}; stop with SIGTERM", err=True)

    serve(socket_path, warm=args.warm, ready=ready, drain_seconds=drain_seconds,
          metrics_address=args.metrics)  # fmt: skip
    return EXIT_OK


def cmd_k8s_controller(args: argparse.Namespace) -> int:
    from host.k8s.client import is_dns_label

    namespaces = tuple(dict.fromkeys(args.namespace or ()))
    for namespace in namespaces:
        if not is_dns_label(namespace):
            raise _UsageError("--namespace must be a DNS label (1-63 of a-z 0-9 -)")
    if namespaces and args.all_namespaces:
        raise _UsageError("--namespace and --all-namespaces cannot be used together")
    if args.json:
        raise _UsageError("--json cannot be used with k8s-controller (it prints no JSON: it logs on stderr)")
    from host.k8s.controller import run_controller

    # Neither option: every namespace, as the deployed controller runs it (no options, a ClusterRole).
    return run_controller(os.environ, namespaces=namespaces, clusterwide=not namespaces)


# -- packs --------------------------------------------------------------------------------------------


def _engine() -> tuple[Any, EngineError | None]:
    """The engine client, or None and the reason it is unreachable (installing trusted packs needs none)."""
    from host.engine.sdk import connect

    try:
        return connect(), None
    except EngineError as exc:
        return None, exc


def cmd_install(args: argparse.Namespace) -> int:
    from host.packs.install import install_pack
    from host.packs.requirements import Source
    from host.spec.config import load_config

    cfg = load_config()
    path = Path(args.path)
    if not path.is_dir():
        raise _UsageError(f"{path} is not a directory")
    for links in args.find_links:
        if not Path(links).is_dir():
            raise _UsageError(f"--find-links {links}: not a directory")
    source = Source(offline=args.offline, find_links=tuple(Path(d).resolve() for d in args.find_links))
    client, engine_error = _engine()
    warnings: list[str] = []  # terminal-safe and bounded by install_pack; escaped again when printed
    try:
        entry = install_pack(
            path,
            trust=args.trust,
            paths=cfg.paths,
            client=client,
            image=cfg.agent_sandbox.image,
            warnings=warnings,
            source=source,
            progress=_progress(args),
        )
    except PackError as exc:
        # Without an engine, say why there is none (unavailable vs permission denied), not just "needed".
        if engine_error is not None and exc.reason == AuditReason.ENGINE_UNAVAILABLE:
            raise engine_error from None
        raise
    finally:
        if client is not None:
            client.close()

    def human() -> None:
        for warning in warnings:
            _say(f"warning: {safe_line(warning)}", err=True)
        _say(
            f"installed {safe_token(entry.slug)} {safe_token(entry.version)} "
            f"({safe_token(entry.package_type)}, trust {safe_token(entry.trust_level)})"
            + (f" into volume {safe_token(entry.sandbox_volume)}" if entry.sandbox_volume else "")
        )

    _emit(args, {**_pack_payload(entry), "warnings": [safe_line(w) for w in warnings]}, human)
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    from host.packs.install import uninstall_pack
    from host.spec.config import load_config

    client, _ = _engine()
    leftover: str | None = None
    why = ""
    try:
        entry = uninstall_pack(args.slug, paths=load_config().paths, client=client)
        if client is None:
            leftover, why = entry.sandbox_volume, "the engine is not reachable"
        elif entry.sandbox_volume:
            users = _volume_users(client, entry.sandbox_volume)
            if users is not None:  # the volume is still there: say why, and who will drop it
                leftover = entry.sandbox_volume
                why = (
                    f"it is in use by {users} container(s); a running serve destroys its warm members of "
                    "this pack and then removes the volume, a run removes it when it ends"
                    if users
                    else "the engine refused to remove it"
                )
    finally:
        if client is not None:
            client.close()
    payload = {**_pack_payload(entry), "volume_left_behind": leftover, "left_behind_reason": why or None}

    def human() -> None:
        _say(f"uninstalled {safe_token(entry.slug)} {safe_token(entry.version)}")
        if leftover:
            volume = safe_token(leftover)
            _say(
                f"warning: volume {volume} was kept: {why} (check later: docker volume rm {volume})",
                err=True,
            )

    _emit(args, payload, human)
    return EXIT_OK


def _volume_users(client: Any, name: str) -> int | None:
    """How many containers use the volume `name`: None when it is gone, 0 when that cannot be seen."""
    from host.engine.errors import engine_errors

    try:
        with engine_errors():
            client.volumes.get(name)
            return len(client.api.containers(all=True, filters={"volume": name}))
    except EngineNotFound:
        return None
    except EngineError:
        return 0


def cmd_list(args: argparse.Namespace) -> int:
    from host.spec.config import load_config
    from host.spec.lockfile import Lockfile

    entries = Lockfile(load_config().paths.lockfile).entries()
    rows = [
        {
            "slug": e.slug,
            "version": e.version,
            "package_type": e.package_type,
            "trust_level": e.trust_level,
            "artifact_hash": e.artifact_hash,
            "sandbox_volume": e.sandbox_volume,
        }
        for e in sorted(entries.values(), key=lambda e: e.slug)
    ]

    def human() -> None:
        if not rows:
            _say(f"no packs installed ({PROG} install PATH)")
        for r in rows:
            slug, version, kind, trust = (
                safe_token(r[k]) for k in ("slug", "version", "package_type", "trust_level")
            )
            _say(f"{slug:<32} {version:<12} {kind:<9} {trust}")

    _emit(args, rows, human)
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    from host.packs.scaffold import next_steps, scaffold
    from host.spec.manifest.model import SLUG_RE

    if not SLUG_RE.fullmatch(args.name):
        raise _UsageError(
            f"NAME must be a pack slug ({SLUG_RE.pattern}: lower case, digits, '.', '_', '-'), "
            f"got {args.name!r}"
        )
    parent = Path(args.dir) if args.dir else Path.cwd()
    target, files = scaffold(args.name, kind=args.type, parent=parent)
    _say(f"created {args.type} pack {args.name} in {safe_line(target)}:")
    for f in files:
        _say(f"  {safe_line(f.relative_to(target))}")
    _say("next:")
    for step in next_steps(args.name, args.type, target):
        _say(f"  {safe_line(step)}")
    return EXIT_OK


# -- image --------------------------------------------------------------------------------------------


def cmd_image(args: argparse.Namespace) -> int:
    from host.engine.image import build_image, image_status, pull_image, verify_pinned_image
    from host.engine.sdk import connect
    from host.spec.config import load_config, set_image_pin

    cfg = load_config()
    client = connect()
    try:
        if args.image_cmd == "build":
            res = build_image(client, repo_root=REPO_ROOT, progress=_progress(args), force=args.force)
            set_image_pin(cfg.paths, res.image_id)
            payload = {
                "image_id": res.image_id,
                "tag": res.tag,
                "inputs_hash": res.inputs_hash,
                "built": res.built,
                "pinned_in": str(cfg.paths.config_file),
            }
            _emit(
                args,
                payload,
                lambda: _say(
                    f"{'built' if res.built else 'up to date'}: {safe_token(res.tag)} "
                    f"{safe_token(res.image_id)} (pinned in {safe_line(cfg.paths.config_file)})"
                ),
            )
            return EXIT_OK
        if args.image_cmd == "pull":
            pulled = pull_image(client, args.ref, progress=_progress(args), bars=sys.stderr.isatty())
            set_image_pin(cfg.paths, pulled.pin)
            where = str(cfg.paths.config_file)
            _emit(
                args,
                {"ref": pulled.ref, "image_id": pulled.image_id, "pin": pulled.pin, "pinned_in": where},
                lambda: _say(
                    f"pulled {safe_line(pulled.ref)}: pinned {safe_line(pulled.pin)} in {safe_line(where)}"
                ),
            )
            return EXIT_OK
        st = image_status(client, cfg.agent_sandbox.image, repo_root=REPO_ROOT)
        problem: EngineError | None = None
        try:
            verify_pinned_image(client, cfg.agent_sandbox.image)
        except EngineError as exc:
            if exc.check != "image":
                raise
            problem = exc
        status = {
            **st.__dict__,
            "pin": cfg.agent_sandbox.image,
            "usable": problem is None,
            "problem": problem.message if problem else None,
        }

        def human() -> None:
            _say(
                f"pin: {safe_line(cfg.agent_sandbox.image or '(none)')}\n"
                f"present: {st.present}  matches pin: {st.matches_pin}  "
                f"protocol: {safe_line(st.protocol)}  up to date: {st.up_to_date}"
            )
            if problem is not None:
                _print_error(problem.message, problem.hint)

        _emit(args, status, human)
        return EXIT_OK if problem is None else EXIT_FAILED
    finally:
        client.close()


# -- doctor, policy, audit -----------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from host.cli.doctor import run_doctor

    report = run_doctor(args.slug)

    def human() -> None:
        for c in report.checks:
            _say(f"  {'ok' if c.ok else 'FAIL':<5} {safe_token(c.check):<20} {safe_line(c.detail)}")
            if c.fix:
                _say(f"  {'':<5} {'':<20} fix: {safe_line(c.fix)}")
        failed = sum(1 for c in report.checks if not c.ok)
        _say("ready" if report.ready else f"not ready: {failed} check(s) failed")

    _emit(args, report.to_json(), human)
    return EXIT_OK if report.ready else EXIT_FAILED


def _human_explain(p: Mapping[str, Any]) -> None:
    """Every value is escaped where it is interpolated: package names, models and messages come from packs."""
    req, llm = p["requested"], p["llm"]

    def line(label: str, value: Any) -> None:
        _say(f"  {label + ':':<21} {value}")

    def capped(key: str) -> str:
        lowered = f" (the host ceiling lowered it from {safe_line(req[key])})" if key in p["clamped"] else ""
        return f"{safe_line(p[key])}{lowered}"

    def names(items: Sequence[Any]) -> str:
        return ", ".join(safe_token(item) for item in items)

    _say(f"{safe_token(p['slug'])} {safe_token(p['version'])} (trust {safe_token(p['trust'])})")
    line("route", f"{safe_token(p['route'])}: {safe_line(p['route_message'])}")
    if p["hint"]:
        line("hint", safe_line(p["hint"]))
    if p["runtime"]:
        image = safe_line(p["image"] or "(not pinned)")
        line("sandbox", f"runtime {safe_token(p['runtime'])}, image {image}")
    if p["allowed_packages"] is None:
        line("tools", "any installed tool pack (the manifest declares no tool_access.allowed_packages)")
    else:
        line("tools", names(p["allowed_packages"]) or "(none)")
    line("max_tool_calls", capped("max_tool_calls"))
    idle = safe_line(p["idle_timeout_seconds"])
    line("max_runtime_seconds", f"{capped('max_runtime_seconds')} (idle limit {idle})")
    line("max_iterations", capped("max_iterations"))
    if not llm["enabled"]:
        line("llm", "not granted (llm_access.enabled is not true, or the host disabled it)")
    else:
        if p["route"] == Route.HOST.value:
            line("llm", "host path: llm_access caps do not apply (sanity bounds below)")
        elif llm["granted_by"] == "grant_declared":
            line("llm", "granted by the host's llm.grant_declared (the pack declares it needs an LLM)")
        else:
            line("llm", "granted by the manifest's llm_access")
        for key in ("max_calls", "max_input_chars", "max_output_chars"):
            lowered = f" (lowered from {safe_line(req['llm'][key])})" if key in llm["clamped"] else ""
            line(f"llm {key}", f"{safe_line(llm[key])}{lowered}")
        for key in ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd"):
            if llm.get(key) is None:
                continue  # no such budget: the character caps above still bound every call
            lowered = f" (lowered from {safe_line(req['llm'].get(key))})" if key in llm["clamped"] else ""
            line(f"llm {key}", f"{safe_line(llm[key])}{lowered}")
        price = llm.get("price")
        if price is not None:
            line(
                "llm price",
                f"{safe_line(price.get('input_per_million'))} / "
                f"{safe_line(price.get('output_per_million'))} USD per million input / output tokens",
            )
        elif llm.get("max_cost_usd") is not None:
            line(
                "llm price",
                "none for the host model: max_cost_usd refuses every call (add the model to "
                "agent_sandbox.llm.prices)",
            )
        models = llm["allowed_models"]
        line("llm models", "any host model" if models is None else names(models) or "none")
    provider = safe_line(f"{llm['provider'] or '(none)'} {llm['model'] or ''}".strip())
    line("llm provider", f"{provider} ({'configured' if llm['configured'] else 'not configured'})")
    line("clamped by the host", names(p["clamped"]) or "nothing")


def cmd_policy(args: argparse.Namespace) -> int:
    from host.cli.explain import explain_policy

    payload = explain_policy(args.slug).to_json()
    _emit(args, payload, lambda: _human_explain(payload))
    return EXIT_OK


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
            _say(f"{'ok' if rep.ok else 'FAILED'}: {rep.records} records in {safe_line(path)}")
            for p in rep.problems:
                _say(f"  {safe_line(p)}")
            if rep.open_runs:
                _say(f"  {len(rep.open_runs)} run(s) in progress (started, not ended yet)")

        _emit(args, payload, human)
        return EXIT_OK if rep.ok else EXIT_FAILED
    if args.last <= 0:
        raise _UsageError(f"--last must be a positive number, got {args.last}")
    records = AuditLog(path).tail(args.last, slug=args.slug, events=frozenset({RUN_EVENT}))

    def human_list() -> None:
        if not records:
            _say(f"no audit records in {safe_line(path)}")
        for r in records:
            ts, slug, action, reason, duration = (
                safe_token(r.get(k)) for k in ("ts", "slug", "action", "reason", "duration_ms")
            )
            run = safe_token(str(r.get("run_id", r.get("request_id")))[:12])  # request_id: old records
            _say(f"{ts} {slug} {action} {reason} run={run} {duration}ms")

    _emit(args, records, human_list)
    return EXIT_OK


# -- parser -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Every command takes --json and --debug after its name too; SUPPRESS keeps a global --debug.
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON value on stdout")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p = _Parser(
        prog=PROG,
        description="Run untrusted community agents in hardened, network-less sandboxes.",
        epilog="The contract (options, exit codes, --json schemas): docs/cli.md",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument("--version", action=_VersionAction, nargs=0, help="show program's version number and exit")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="the host's own log lines on stderr: escaped text, or one JSON object per line")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, description=help_, parents=[common])
        c.set_defaults(func=func)
        return c

    r = command("run", cmd_run, "run an installed agent")
    r.add_argument("slug")
    r.add_argument("--goal", help="the goal text (default: the manifest's agent.goal)")
    r.add_argument("--arg", action="append", metavar="KEY=JSON", help="a keyword argument for the entrypoint")
    runtimes = [runtime.value for runtime in Runtime]
    r.add_argument("--runtime", choices=runtimes, help="override agent_sandbox.runtime for this run")
    r.add_argument("--via", metavar="SOCKET", help="submit to a running `serve` host via its admin socket")
    r.add_argument("--no-serve", action="store_true",
                   help="run in this process even when a `serve` host is running for this config (by "
                   "default `run` submits to it: its warm pool, same audit record)")  # fmt: skip
    r.add_argument("--backend", choices=("local", "kubernetes"), default="local",
                   help="local: run it here (or --via a `serve` host); kubernetes: submit it as an AgentRun "
                   "to a cluster and wait for its end (docs/kubernetes.md)")  # fmt: skip
    r.add_argument("--namespace", metavar="NS",
                   help="(kubernetes) the AgentRun's namespace (default: the context's, else default)")
    r.add_argument("--kubeconfig", metavar="PATH",
                   help="(kubernetes) the kubeconfig (default: in a pod its service account, else "
                   "KUBECONFIG or ~/.kube/config)")  # fmt: skip
    r.add_argument("--context", metavar="NAME", help="(kubernetes) the kubeconfig context (default: current)")
    r.add_argument("--wait-seconds", type=float, metavar="N",
                   help="(kubernetes) wait at most this long, then delete the AgentRun (default 3780: the "
                   "longest run a host allows, plus its pod's start and a margin)")  # fmt: skip
    r.add_argument("--follow", action="store_true",
                   help="show the agent's output lines on stderr as it writes them (escaped)")
    r.add_argument("--tenant", help="the caller's tenant, recorded in the audit record")
    r.add_argument("--request-id", help="the caller's request id, recorded in the audit record")
    r.add_argument("--label", action="append", metavar="KEY=VALUE",
                   help="a free label recorded in the audit record (repeatable, at most 16)")
    for flag, kind, what in (
        ("--max-runtime-seconds", int, "wall-clock seconds"), ("--max-tool-calls", int, "tool calls"),
        ("--max-iterations", int, "next_iteration() calls"), ("--max-llm-calls", int, "LLM calls"),
        ("--max-total-tokens", int, "LLM tokens"), ("--max-cost-usd", float, "LLM cost in USD"),
    ):  # fmt: skip
        r.add_argument(flag, type=kind, metavar="N", help=f"at most this many {what} for this run "
                       "(only lowers what the manifest and host allow)")  # fmt: skip

    sv = command("serve", cmd_serve, "run a long-running host with warm pools on an owner-only admin socket")
    sv.add_argument("--socket", help="the admin socket (default: <config dir>/agentnode-admin.sock)")
    sv.add_argument("--warm", action="append", metavar="SLUG", default=[], help="keep a warm pool for SLUG")
    sv.add_argument("--drain-seconds", type=float,
                    help="on SIGTERM, let runs finish this long (default 30)")  # fmt: skip
    sv.add_argument("--metrics", metavar="HOST:PORT",
                    help="serve Prometheus metrics at http://HOST:PORT/metrics (opt-in; :PORT: 127.0.0.1)")
    sv.add_argument("--node", action="store_true",
                    help="run the Kubernetes node agent instead (a DaemonSet's command: docs/kubernetes.md); "
                    "none of the admin socket's options apply")  # fmt: skip

    kc = command("k8s-controller", cmd_k8s_controller,
                 "run the Kubernetes AgentRun controller (a Deployment's command: docs/kubernetes.md)")
    kc.add_argument("--namespace", action="append", metavar="NS",
                    help="watch AgentRuns in NS only (repeatable; default: every namespace)")  # fmt: skip
    kc.add_argument("--all-namespaces", action="store_true", help="watch AgentRuns in every namespace")

    i = command("install", cmd_install, "install an agent pack or toolpack")
    i.add_argument("path")
    levels = [level.value for level in Trust]
    i.add_argument("--trust", default=Trust.UNVERIFIED.value, type=str.lower, choices=levels)
    i.add_argument(
        "--offline", action="store_true", help="resolve Python requirements from --find-links only (no index)"
    )
    i.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory of wheels for the pack's Python requirements (repeatable)",
    )

    u = command("uninstall", cmd_uninstall, "remove an installed pack")
    u.add_argument("slug")
    ls = command("list", cmd_list, "list installed packs")

    n = sub.add_parser("init", help="scaffold a new pack", description="scaffold a new pack")
    n.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    n.add_argument("name", help="the pack's slug, also the directory name")
    n.add_argument("--type", choices=["agent", "toolpack"], default="agent")
    n.add_argument("--dir", help="create NAME inside this directory (default: the current directory)")
    n.set_defaults(func=cmd_init, json=False)

    im = sub.add_parser("image", help="build, pull or inspect the pinned sandbox image")
    ims = im.add_subparsers(dest="image_cmd", required=True, metavar="ACTION")
    b = ims.add_parser("build", help="build the image from docker/ and pin it", parents=[common])
    b.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    ims.add_parser("pull", help="pull REF from a registry and pin it", parents=[common]).add_argument("ref")
    ims.add_parser("status", help="is the pinned image present and current", parents=[common])
    im.set_defaults(func=cmd_image)

    d = command("doctor", cmd_doctor, "check that sandboxed runs (of SLUG) can start; changes nothing")
    d.add_argument("slug", nargs="?")

    po = sub.add_parser("policy", help="explain the effective policy of an agent")
    pos = po.add_subparsers(dest="policy_cmd", required=True, metavar="ACTION")
    pe = pos.add_parser(
        "explain", help="the tools, limits, LLM access and route a run would get", parents=[common]
    )
    pe.add_argument("slug")
    for admin in (i, u, ls, d, pe):
        admin.add_argument("--via", metavar="SOCKET", help="run this command on the `serve` host at SOCKET")
    po.set_defaults(func=cmd_policy)

    co = sub.add_parser("completion", help="print a shell completion script (source it in your shell's rc)",
                        description='print a shell completion script: eval "$(agentnode-sandbox completion '
                        'bash)"')  # fmt: skip
    co.add_argument("shell", choices=("bash", "zsh"))
    co.set_defaults(func=cmd_completion)

    a = command("audit", cmd_audit, "show or verify the audit trail")
    a.add_argument("audit_cmd", nargs="?", choices=["show", "verify"], default="show")
    a.add_argument("--last", type=int, default=20, help="how many records (default 20)")
    a.add_argument("--slug", help="only this agent's records")
    return p


def _error_payload(args: argparse.Namespace, error: str, code: str, hint: str) -> dict[str, Any]:
    """The --json object of a failed command; `run` keeps its full result shape."""
    if args.cmd == "run":
        from host.runtime.result import RunResult

        failed = RunResult(success=False, error=error, error_code=code, hint=hint).to_json()
        return {**failed, "path": getattr(args, "path_taken", RUN_PATH_LOCAL)}
    return {"success": False, "error": error, "error_code": code, "hint": hint or None}


class _SafeFormatter(logging.Formatter):
    """Log lines reach the operator's terminal too, and a logged value may be agent- or pack-written."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_block(super().format(record))


def _show_traceback() -> None:
    """--debug: the traceback, escaped (exception messages quote pack- and agent-written text)."""
    _say(traceback.format_exc().rstrip("\n"), err=True)


def _tolerant_streams() -> None:
    """A character the terminal's encoding lacks is shown as an escape, never a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _forward(args: argparse.Namespace, raw: list[str], via: str) -> int:
    """This command line, run by the `serve` host at `via` (RunAdminCommand); its output is printed as the
    host's CLI printed it (already escaped there). Global options stay here; the command's own go along,
    without --via, and the paths it names are made absolute (the socket means the same machine)."""
    from host.api.client import RunnerClient

    if os.environ.get(ADMIN_CHILD_VARIABLE):
        raise _UsageError("--via cannot be used by a command the host itself runs for its admin socket")
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
    _tolerant_streams()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    args.headstart = headstart
    from host.core.logs import JsonFormatter, RunIdFilter

    handler = logging.StreamHandler()
    handler.addFilter(RunIdFilter())
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_SafeFormatter("%(levelname)s %(name)s [run %(run_id)s]: %(message)s"))
    long_running = args.cmd in ("serve", "k8s-controller")
    level = logging.DEBUG if args.debug else logging.INFO if long_running else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler])
    try:
        if args.cmd in ADMIN_COMMANDS and getattr(args, "via", None):
            return _forward(args, raw, args.via)
        return int(args.func(args))
    except _UsageError as exc:
        _print_error(str(exc), f"see: {PROG} {args.cmd} --help")
        return EXIT_USAGE
    except SandboxError as exc:
        if args.debug:
            _show_traceback()
        if args.json:
            _say(dumps_strict(_error_payload(args, exc.message, exc.reason.value, exc.hint), sort_keys=True))
        _print_error(exc.message, exc.hint)
        return EXIT_FAILED
    except KeyboardInterrupt:
        _print_error("interrupted", None)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (the contract: one error line, no traceback without --debug)
        if args.debug:
            _show_traceback()
        message = f"unexpected {type(exc).__name__}"
        hint = "re-run with --debug for the traceback"
        if args.json:
            payload = _error_payload(args, message, AuditReason.HOST_LOOP_ERROR.value, hint)
            _say(dumps_strict(payload, sort_keys=True))
        _print_error(message, hint)
        return EXIT_FAILED
    finally:
        sys.stdout.flush()


class _EXIT:
    closed = False
    """Set by `run` once all it opened is closed: `entry` may then leave without the interpreter's own
    teardown (finalizing gRPC, the engine client's pools and every module: ~0.1 s a one-shot run would
    otherwise pay after its result is printed)."""


def entry(headstart: Headstart | None = None) -> NoReturn:
    """The CLI's process (host/_entry.py): `main()`, then exit with its code. `headstart` is the container
    started for this command before the CLI was imported (host/runtime/headstart.py): the run takes it, or it
    is removed here."""
    try:
        code = main(headstart=headstart)
    finally:
        if headstart is not None:
            headstart.discard()  # (a no-op once the run took it)
    if _EXIT.closed:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


__all__ = ["build_parser", "entry", "main"]
