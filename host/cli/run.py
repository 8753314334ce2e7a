"""`run`: an installed agent's run, in this process, on a `serve` host, or as an AgentRun on a cluster."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host.cli.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ExitState,
    UsageError,
    emit,
    print_error,
    progress,
    say,
)
from host.cli.parser import option_given
from host.core.errors import EngineError
from host.core.strictjson import JsonRejected, check_finite, dumps_strict, loads_strict
from host.core.terminal import safe_line, safe_token
from host.core.vocab import Runtime

if TYPE_CHECKING:
    from host.runtime.runner import RunResult


def _parse_args_kv(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--arg expects KEY=JSON with KEY a Python identifier, got {pair!r}")
        try:
            out[key] = loads_strict(raw)
        except JsonRejected as exc:
            raise UsageError(
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
            raise UsageError(f"--label expects KEY=VALUE, got {safe_line(pair)}")
        labels[key] = value
    try:
        return CallerInfo.parse(args.tenant or "", args.request_id or "", labels)
    except InvalidCaller as exc:
        raise UsageError(str(exc)) from None


def _limits(args: argparse.Namespace) -> Any:
    """The run's tighter limits from --max-*; None when none was given; a bad value is a usage error."""
    from host.policy.caller import InvalidCaller, RunOverrides

    given = {name: getattr(args, name) for name in RunOverrides.__dataclass_fields__}
    if all(value is None for value in given.values()):
        return None
    try:
        return RunOverrides.parse(**given)
    except InvalidCaller as exc:
        raise UsageError(str(exc)) from None


def _follow(text: str) -> None:
    """One live line of the agent's output, escaped, on stderr (stdout keeps its one JSON value)."""
    say(f"| {safe_line(text)}", err=True)


KUBERNETES_REFUSED = (
    ("via", "--via", "it submits to a local `serve` host"),
    ("follow", "--follow", "a cluster run's output stays in its node agent's log"),
    *((name, "--" + name.replace("_", "-"), "an AgentRun carries no limit overrides") for name in (
        "max_runtime_seconds", "max_tool_calls", "max_iterations", "max_llm_calls", "max_total_tokens",
        "max_cost_usd")),
    ("egress", "--allow-egress/--no-egress", "a cluster run's pod has no egress path"),
    *((name, "--" + name.replace("_", "-"), "a cluster run takes no files yet (docs/kubernetes.md)")
      for name in ("workspace", "apply", "export_tar", "export_patch", "inputs", "output_dir")),
)  # fmt: skip
"""`run` options that have no meaning on a cluster: refused with --backend kubernetes (never dropped)."""
KUBERNETES_ONLY = (("namespace", "--namespace"), ("kubeconfig", "--kubeconfig"), ("context", "--context"),
                   ("wait_seconds", "--wait-seconds"))  # fmt: skip


def _check_backend(args: argparse.Namespace) -> None:
    """Refuse the `run` options the chosen backend cannot honour, naming the first one."""
    if args.backend != "kubernetes":
        for dest, flag in KUBERNETES_ONLY:
            if option_given(getattr(args, dest)):
                raise UsageError(f"{flag} needs --backend kubernetes")
        return
    for dest, flag, why in KUBERNETES_REFUSED:
        if option_given(getattr(args, dest)):
            raise UsageError(f"{flag} cannot be used with --backend kubernetes ({why})")
    if args.runtime not in (None, Runtime.RUNSC.value, Runtime.RUNC.value):
        raise UsageError(f"--runtime {args.runtime} cannot be used with --backend kubernetes (runsc, runc)")
    if args.wait_seconds is not None:
        from host.k8s.client import MAX_WAIT_SECONDS

        if not 0 < args.wait_seconds <= MAX_WAIT_SECONDS:  # NaN fails this too
            raise UsageError(f"--wait-seconds must be more than 0 and at most {MAX_WAIT_SECONDS}")


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
    from host.k8s.objects.agentrun import RunRequest

    if args.namespace is not None and not is_dns_label(args.namespace):
        raise UsageError("--namespace must be a DNS label (1-63 of a-z 0-9 -)")
    request = RunRequest(slug=args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime, caller=caller)
    try:  # what the cluster would refuse is a usage error before any connection
        agentrun_body(agentrun_name(args.slug), args.namespace or DEFAULT_NAMESPACE, request)
    except InvalidAgentRun as exc:
        raise UsageError(str(exc)) from None
    if not args.debug:  # the client's retries log each attempt; the error line says how it ended
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    kube, default_namespace = connect(kubeconfig=args.kubeconfig, context=args.context)
    phases = progress(args)
    where = [""]  # the AgentRun's namespace/name once it exists (a DNS label each: safe to show)

    def created(ref: Any) -> None:
        where[0] = f"{ref.namespace}/{ref.name}"

    try:
        payload = submit_and_wait(
            kube, request, namespace=args.namespace or default_namespace,
            timeout=args.wait_seconds or DEFAULT_WAIT_SECONDS, on_created=created,
            on_phase=lambda phase: phases(f"AgentRun {where[0]}: {phase}"),
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


def _files(args: argparse.Namespace) -> Any:
    """The run's FilesRequest from its options (None when it hands no files), checked before anything
    starts: a bad NAME=PATH or a path that cannot be right is a usage error naming the option."""
    from pathlib import Path

    from host.core.errors import SandboxError
    from host.files.run import FilesRequest

    def path(text: str | None) -> Path | None:  # absolute: a serve host's working directory is not ours
        return Path(os.path.abspath(text)) if text else None

    inputs: list[tuple[str, Path | bytes]] = []
    for item in args.inputs or []:
        name, sep, given = item.partition("=")
        if not sep or not name or not given:
            raise UsageError("--input takes NAME=PATH")
        inputs.append((name, Path(os.path.abspath(given))))
    request = FilesRequest(
        workspace=path(args.workspace), apply=bool(args.apply), export_tar=path(args.export_tar),
        export_patch=path(args.export_patch), inputs=tuple(inputs), output_dir=path(args.output_dir),
    )
    if request.empty:
        if args.apply or args.export_tar or args.export_patch:
            raise UsageError("--apply and --export-* need --workspace DIR")
        return None
    try:
        request.check()  # names and shape; the host checks it again under its own bounds
    except SandboxError as exc:
        raise UsageError(f"{exc.message} ({exc.hint})") from None
    return request


def _files_summary(files: dict[str, Any], output_dir: str | None) -> None:
    """What crossed the boundary, on stderr: counts, and the paths of conflicts (escaped)."""
    parts = []
    ws = files.get("workspace")
    if ws:
        skipped = sum(ws.get("skipped", {}).values())
        left = f", {skipped} left out" if skipped else ""
        parts.append(f"workspace {ws.get('files', 0)} file(s) in{left}")
    if files.get("inputs"):
        parts.append(f"{files['inputs'].get('files', 0)} input(s)")
    ch = files.get("changes")
    if ch:
        parts.append(f"{ch.get('added', 0)} added, {ch.get('modified', 0)} modified, "
                     f"{ch.get('deleted', 0)} deleted")  # fmt: skip
    ap = files.get("applied")
    if ap:
        parts.append(f"applied {ap.get('applied', 0)}, {ap.get('conflicts', 0)} conflict(s)")
    if files.get("exported"):
        parts.append(f"exported as a {files['exported']}")
    art = files.get("artifacts")
    if art and art.get("added"):
        where = f" in {safe_line(output_dir)}" if output_dir else " (not written: no --output-dir)"
        parts.append(f"{art['added']} artifact(s){where}")
    if parts:
        say("files: " + "; ".join(parts), err=True)
    for path in (ap or {}).get("conflicts_paths", [])[:20]:
        say(f"  not applied (changed in the workspace since the snapshot): {safe_line(path)}", err=True)


def _run_local(
    args: argparse.Namespace, kwargs: dict[str, Any], caller: Any, limits: Any, files: Any = None
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
        if files is not None:  # a run with files mounts its area: no container starts before the host
            raise LookupError
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
                              prelaunched=early, files=files)  # fmt: skip
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
                  limits: Any, *, files: Any = None) -> RunResult:  # fmt: skip
    """The run on a `serve` host through `client` (a RunnerClient); --follow streams its lines."""
    from host.api.events import RunFinished, RunLog

    if not args.follow:
        result: RunResult = client.submit(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime,
                                          caller=caller, limits=limits, files=files)  # fmt: skip
        return result
    finished = None
    events = client.stream(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime, caller=caller,
                           limits=limits, files=files)  # fmt: skip
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
        raise UsageError("--no-serve cannot be used with --via (which names the host to run on)")
    kwargs = _parse_args_kv(args.arg or [])
    caller, limits = _caller(args), _limits(args)
    files = _files(args) if args.backend != "kubernetes" else None
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
                    served = _run_on_serve(client, args, kwargs, caller, limits, files=files)
        if served is None:
            result, audit_failures = _run_local(args, kwargs, caller, limits, files)
        else:
            result = served
    result = _printable(result)
    payload = {**result.to_json(), "path": path}
    if audit_failures:
        payload["audit_error"] = "the audit record could not be written"

    def human() -> None:
        if result.success:
            say(dumps_strict(result.result, indent=2))  # ensure_ascii: every control is a \\u escape
            say(
                f"ok: {safe_token(args.slug)} ({safe_token(result.mode_used)}, "
                f"run {safe_token(result.run_id[:12])}, {int(result.duration_ms)} ms"
                f"{', on the serve host' if path == RUN_PATH_SERVE else ''})",
                err=True,
            )
        else:
            lines = [] if args.follow else result.logs.splitlines()[-FAILURE_LOG_LINES:]
            if lines:
                say(f"the agent's last {len(lines)} output line(s):", err=True)
                for line in lines:
                    _follow(line)
            print_error(f"{safe_line(result.error)} [{safe_token(result.error_code)}]", result.hint)
        if result.files is not None:
            _files_summary(result.files, args.output_dir)
        if audit_failures:
            say("warning: the audit record could not be written", err=True)

    emit(args, payload, human)
    if path != RUN_PATH_KUBERNETES:
        # the host closed (container gone, record durable, spans flushed), or the client
        ExitState.closed = True
    if exit_code == EXIT_INTERRUPTED:
        return exit_code
    conflicts = (result.files or {}).get("applied", {}).get("conflicts", 0)
    return EXIT_OK if result.success and not conflicts else EXIT_FAILED
