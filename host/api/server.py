"""The long-running host: warm pools plus an admin gRPC service on an owner-only local Unix socket."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any, NoReturn

import grpc

from host._proto.agentnode.sandbox.v1 import runner_pb2, runner_pb2_grpc
from host.api.events import files_request
from host.core.errors import SandboxError
from host.core.strictjson import JsonRejected, dumps_strict, loads_strict
from host.core.vocab import Runtime, WireReason
from host.files.run import FilesRequest
from host.policy.caller import CallerInfo, InvalidCaller, RunOverrides
from host.runtime.pool import PoolSettings
from host.runtime.rpcwire import REASON_METADATA_KEY
from host.runtime.runner import RunResult, SandboxHost

logger = logging.getLogger("agentnode.sandbox.serve")

_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


RUNNER_SERVICE = "agentnode.sandbox.v1.RunnerService"
"""The admin service's full name, as grpc.health.v1 checks it."""


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or `:PORT`, meaning 127.0.0.1) as (host, port); ValueError naming the form otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a metrics address is HOST:PORT (port 1-65535), got {text!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def report_from(result: RunResult) -> runner_pb2.RunReport:
    """The wire form of a run's result; a value that is not strict JSON (NaN, ±inf) is never sent as one."""
    success, result_json, error, error_code = result.success, "", result.error, result.error_code
    if success or result.result is not None:  # a failed sequential run carries its steps_completed
        try:
            result_json = dumps_strict(result.result)
        except (JsonRejected, TypeError):
            if success:
                success, error = False, "the run's result is not strict JSON (finite numbers only)"
                error_code = "result_not_serializable"
    return runner_pb2.RunReport(
        success=success,
        result_json=result_json,
        error=error,
        error_code=error_code,
        mode_used=result.mode_used,
        run_id=result.run_id,
        timed_out=result.timed_out,
        duration_ms=max(0, result.duration_ms),
        hint=result.hint,
        logs=result.logs,
        warm=result.warm,
        stages_ms=result.stages,
        files_json=dumps_strict(result.files) if result.files is not None else "",
    )


MAX_LOG_EVENTS = 4096
"""Log events one StreamRun sends (the output cap bounds their bytes; this bounds their count)."""
ADMIN_COMMANDS = {"install": (), "uninstall": (), "list": (), "doctor": (), "policy": ("explain",)}
"""The commands RunAdminCommand runs (with their required subcommand); never run or serve (their own RPCs)
nor init, image or audit (the operator's terminal)."""
ADMIN_COMMAND_SECONDS = 1800.0
"""An install may build a volume and download wheels; nothing an admin command does takes longer."""


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """Stop an admin command and whatever it started (its own session), if it still runs."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)


def admin_command_problem(args: list[str]) -> str:
    """Why `args` is not a command RunAdminCommand runs ("" when it is)."""
    if not args or args[0] not in ADMIN_COMMANDS:
        return f"the admin socket runs only: {', '.join(sorted(ADMIN_COMMANDS))} (and run through SubmitRun)"
    required = ADMIN_COMMANDS[args[0]]
    if required and (len(args) < 2 or args[1] not in required):
        return f"{args[0]} needs one of: {', '.join(required)}"
    if len(args) > 64 or sum(len(a.encode()) for a in args) > 64 * 1024 or any("\0" in a for a in args):
        return "at most 64 arguments, 64 KiB in all, and no NUL characters"
    if "--via" in args or any(a.startswith("--via=") for a in args):
        return "--via names the host; it is not passed on"
    return ""


def _invalid(context: grpc.ServicerContext, message: str) -> NoReturn:
    """Refuse a malformed request in errors.proto's model: INVALID_ARGUMENT, reason INVALID_REQUEST."""
    reason = WireReason.INVALID_REQUEST
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason.value),))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{reason.value}: {message}")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def _kwargs(raw: str, context: grpc.ServicerContext) -> dict[str, Any]:
    """The run's kwargs: a strict JSON object (finite numbers, bounded depth), or the call is refused."""
    if not raw:
        return {}
    try:
        value = loads_strict(raw, max_bytes=_MAX_MESSAGE_BYTES)
    except JsonRejected:
        value = None
    if not isinstance(value, dict):
        _invalid(context, "kwargs_json must be a strict JSON object (finite numbers only)")
    return value


_RunRequest = runner_pb2.SubmitRunRequest | runner_pb2.StreamRunRequest


class RunnerServicer(runner_pb2_grpc.RunnerServiceServicer):
    """Admin RPCs onto one SandboxHost; a client that goes away cancels its run."""

    def __init__(self, host: SandboxHost) -> None:
        self.host = host

    @staticmethod
    def _validated(
        request: _RunRequest, context: grpc.ServicerContext
    ) -> tuple[dict[str, Any], CallerInfo, RunOverrides, FilesRequest | None]:
        """The request's kwargs, caller and limits once the request is valid; else the RPC is refused (on
        the handler's own thread: `context.abort` raises there, before any run starts or any event is
        sent)."""
        if request.runtime not in ("", *Runtime):
            _invalid(context, "runtime must be runc or runsc")
        c = request.caller
        try:
            caller = CallerInfo.parse(c.tenant, c.request_id, dict(c.labels))
        except InvalidCaller as exc:
            _invalid(context, f"caller: {exc}")
        given = request.limits
        try:
            names = [name for name in RunOverrides.__dataclass_fields__ if given.HasField(name)]
            found = {name: getattr(given, name) for name in names}
            if "egress" in found:
                found["egress"] = tuple(given.egress.allow)
            limits = RunOverrides.parse(**found)
        except InvalidCaller as exc:
            _invalid(context, f"limits: {exc}")
        files = files_request(request.files) if request.HasField("files") else None
        if files is not None:
            try:
                files.check()  # its shape; the host checks it again under its own bounds
            except SandboxError as exc:
                _invalid(context, f"files: {exc.message}")
        return _kwargs(request.kwargs_json, context), caller, limits, files

    def _run(
        self,
        request: _RunRequest,
        kwargs: dict[str, Any],
        caller: CallerInfo,
        limits: RunOverrides,
        context: grpc.ServicerContext,
        *,
        files: FilesRequest | None = None,
        on_stage: Callable[[str], None] | None = None,
        on_start: Callable[[str], None] | None = None,
        on_log: Callable[[str], None] | None = None,
    ) -> RunResult:
        run_ids: list[str] = []

        def started(run_id: str) -> None:
            run_ids.append(run_id)
            if on_start is not None:
                on_start(run_id)
            if not context.is_active():  # the caller left before the run had an id to cancel by
                self.host.cancel(run_id)

        def cancel_on_disconnect() -> None:
            for run_id in run_ids:
                self.host.cancel(run_id)

        def after_the_answer(work: Callable[[], None]) -> None:
            # The run's follow-up (a pool refill, a teardown: engine-heavy) waits until the answer has left,
            # so it does not compete with the caller receiving it; at once if the call is already over.
            if not context.add_callback(work):
                work()

        context.add_callback(cancel_on_disconnect)
        return self.host.run(
            request.slug,
            goal=request.goal if request.HasField("goal") else None,
            kwargs=kwargs,
            runtime=request.runtime or None,
            on_stage=on_stage,
            on_start=started,
            on_log=on_log,
            caller=caller,
            limits=None if limits.empty else limits,
            defer=after_the_answer,
            files=files,
        )

    def SubmitRun(
        self, request: runner_pb2.SubmitRunRequest, context: grpc.ServicerContext
    ) -> runner_pb2.SubmitRunResponse:
        kwargs, caller, limits, files = self._validated(request, context)
        result = self._run(request, kwargs, caller, limits, context, files=files)
        return runner_pb2.SubmitRunResponse(report=report_from(result))

    def StreamRun(
        self, request: runner_pb2.StreamRunRequest, context: grpc.ServicerContext
    ) -> Iterator[runner_pb2.StreamRunResponse]:
        kwargs, caller, limits, files = self._validated(request, context)
        events: queue.Queue[runner_pb2.StreamRunResponse | None] = queue.Queue()
        run_id: list[str] = []
        early: list[str] = []  # lines written before the run's id was announced: sent right after it
        lock = threading.Lock()
        sent = [0]

        def put_line(text: str) -> None:
            sent[0] += 1
            if sent[0] <= MAX_LOG_EVENTS:
                line = runner_pb2.LogLine(run_id=run_id[0], text=text)
                events.put(runner_pb2.StreamRunResponse(log=line))
            elif sent[0] == MAX_LOG_EVENTS + 1:
                note = f"[agentnode: more than {MAX_LOG_EVENTS} lines; the rest are in the report's logs]"
                events.put(runner_pb2.StreamRunResponse(log=runner_pb2.LogLine(run_id=run_id[0], text=note)))

        def started(rid: str) -> None:
            with lock:
                run_id.append(rid)
                events.put(runner_pb2.StreamRunResponse(started_run_id=rid))
                for text in early:
                    put_line(text)
                early.clear()

        def log(text: str) -> None:
            with lock:
                if run_id:
                    put_line(text)
                else:
                    early.append(text)

        def work() -> None:
            try:
                result = self._run(
                    request,
                    kwargs,
                    caller,
                    limits,
                    context,
                    files=files,
                    on_stage=lambda s: events.put(runner_pb2.StreamRunResponse(stage=s)),
                    on_start=started,
                    on_log=log,
                )
                events.put(runner_pb2.StreamRunResponse(report=report_from(result)))
            finally:
                events.put(None)

        threading.Thread(target=work, daemon=True, name="agentnode-stream-run").start()
        while (event := events.get()) is not None:
            yield event

    def CancelRun(
        self, request: runner_pb2.CancelRunRequest, context: grpc.ServicerContext
    ) -> runner_pb2.CancelRunResponse:
        return runner_pb2.CancelRunResponse(cancelled=self.host.cancel(request.run_id))

    def RunAdminCommand(
        self, request: runner_pb2.RunAdminCommandRequest, context: grpc.ServicerContext
    ) -> runner_pb2.RunAdminCommandResponse:
        """The CLI command in a child process of the host, with the host's environment and config: the
        command behaves, prints and exits exactly as it would on the host's own terminal."""
        args = list(request.args)
        problem = admin_command_problem(args)
        if problem:
            _invalid(context, problem)
        # This very package (-P: never a `host` from the working directory), run from the host's own
        # config directory, marked as the host's child so it can never forward to a socket again.
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**self.host.env, "PYTHONPATH": package_root, "AGENTNODE_ADMIN_CHILD": "1"}
        child = subprocess.Popen(
            [sys.executable, "-P", "-m", "host", *args], env=env, cwd=self.host.config.paths.dir,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        context.add_callback(lambda: _kill_group(child))  # the caller went away (or the host is stopping)
        try:
            out, err = child.communicate(timeout=ADMIN_COMMAND_SECONDS)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            child.communicate()
            return runner_pb2.RunAdminCommandResponse(
                exit_code=1, stderr=f"error: the command took longer than {ADMIN_COMMAND_SECONDS} s\n"
            )
        cap = _MAX_MESSAGE_BYTES // 4
        return runner_pb2.RunAdminCommandResponse(
            exit_code=child.returncode,
            stdout=out[:cap].decode("utf-8", "replace"),
            stderr=err[:cap].decode("utf-8", "replace"),
        )


def build_admin_server(
    host: SandboxHost, socket_path: Path, *, max_workers: int = 32, health: Any = None
) -> grpc.Server:
    """Build (not start) the admin server on `socket_path`; its directory is made owner-only first. With
    `health` (grpc_health's HealthServicer) it also serves the standard grpc.health.v1 service."""
    socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(socket_path.parent, 0o700)
    socket_path.unlink(missing_ok=True)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentnode-admin"),
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ],
    )
    register: Callable[[Any, grpc.Server], None] = runner_pb2_grpc.add_RunnerServiceServicer_to_server
    register(RunnerServicer(host), server)
    if health is not None:
        from grpc_health.v1 import health_pb2_grpc  # noqa: PLC0415  (serve only)

        health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if server.add_insecure_port(f"unix:{socket_path}") == 0:
        raise SandboxError(
            f"could not bind the admin socket {socket_path}",
            hint="is another `serve` using it? stop it, or pass another path with --socket",
        )
    return server


STOP_POLL_SECONDS = 0.2
"""How often serve's main thread looks up from waiting, so a SIGTERM or SIGINT is acted on."""


def serve(
    socket_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    warm: list[str] | None = None,
    ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    drain_seconds: float = 30.0,
    metrics_address: str | None = None,
) -> None:
    """Run the long-running host until SIGTERM/SIGINT (or `stop`), then drain, cancel and clean up.

    The admin socket also serves grpc.health.v1 (SERVING while runs are taken, NOT_SERVING from the drain
    on). `metrics_address` (`HOST:PORT`, opt-in) serves the host's Prometheus metrics over HTTP at /metrics.
    """
    from grpc_health.v1 import health, health_pb2  # noqa: PLC0415  (serve only)

    where = parse_address(metrics_address) if metrics_address is not None else None
    probe = SandboxHost(env=env)
    pool_cfg = probe.config.agent_sandbox.pool
    probe.close()
    host = SandboxHost(
        env=env,
        pool=PoolSettings(
            size=pool_cfg.size,
            idle_ttl_seconds=float(pool_cfg.idle_ttl_seconds),
            memory_budget_bytes=pool_cfg.memory_budget_mb * 1024 * 1024,
        ),
        async_teardown=True,
    )
    stop = stop or threading.Event()
    server: grpc.Server | None = None
    exporter: Any = None
    checks = health.HealthServicer()
    try:
        host.startup_sweep()
        for slug in warm or []:
            host.prewarm(slug)
        server = build_admin_server(host, socket_path, health=checks)
        if where is not None and host.metrics is not None:
            from prometheus_client import start_http_server  # noqa: PLC0415

            try:
                exporter, _thread = start_http_server(where[1], addr=where[0], registry=host.metrics.registry)
            except OSError as exc:
                raise SandboxError(
                    f"could not serve metrics on {where[0]}:{where[1]} ({exc.strerror or exc})",
                    hint="pick a free address with --metrics HOST:PORT",
                ) from None
        server.start()
        for service in ("", RUNNER_SERVICE):
            checks.set(service, health_pb2.HealthCheckResponse.SERVING)
        os.chmod(socket_path, 0o600)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        if ready is not None:
            ready(str(socket_path))
        # Waited for in slices: the kernel may deliver SIGTERM to any of the process's threads (gRPC's
        # and the engine client's among them), and Python runs the handler only when the main thread
        # comes back to the interpreter, which an untimed wait never does: serve then ignored SIGTERM.
        while not stop.wait(STOP_POLL_SECONDS):
            pass
    finally:
        checks.enter_graceful_shutdown()  # health says NOT_SERVING from here on
        if server is not None:
            # Stop taking new runs; runs in flight get `drain_seconds` to finish, then their RPCs are
            # cancelled, which cancels the runs (their sandboxes are killed).
            server.stop(grace=drain_seconds).wait()
        if exporter is not None:
            exporter.shutdown()
            exporter.server_close()
        host.close()
        socket_path.unlink(missing_ok=True)


__all__ = [
    "RUNNER_SERVICE",
    "RunnerServicer",
    "build_admin_server",
    "parse_address",
    "report_from",
    "serve",
]
