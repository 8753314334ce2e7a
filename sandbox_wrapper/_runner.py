"""The wrapper's one run: fetch the task, call the agent's entrypoint, report exactly one outcome."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import site
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, NoReturn

import grpc

from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._client import MAX_MESSAGE_BYTES, open_channel
from sandbox_wrapper._context import AgentContext
from sandbox_wrapper._egress import open_egress
from sandbox_wrapper._errors import AgentLimitExceeded, AgentTerminated
from sandbox_wrapper._proto.agentnode.sandbox.v1 import session_pb2, session_pb2_grpc
from sandbox_wrapper._strictjson import loads_finite
from sandbox_wrapper._tool_exec import add_compat_path

DEFAULT_SOCKET = "/run/agentnode/sandbox.sock"
DEFAULT_IMPORT_ROOT = "/pack"
REQUIREMENTS_DIR = ".agentnode-site"
"""Under the import root: the pack's Python requirements, unpacked there by the host at install (it is
host/packs/requirements.SITE_DIR; the pack itself may not use the name)."""
FETCH_TIMEOUT_SECONDS = 5.0
MESSAGE_CHARS = 500
EXIT_OK, EXIT_NO_TASK, EXIT_NO_REPORT = 0, 3, 4
SOCKET_WAIT_CEILING_SECONDS = 600.0
"""The most AGENTNODE_SOCKET_WAIT_SECONDS may ask for: a pod's deadline ends it sooner anyway."""
SOCKET_POLL_SECONDS = 0.005
"""A cold run's wrapper may be ready before its host serves the socket (host/runtime/prelaunch.py): each
poll's wait is latency the run pays, and a stat every 5 ms costs nothing measurable."""

# The result must also fit in one message this channel sends, next to the envelope. The host's own cap
# (max_result_bytes, which it always sends) is lower, so this ceiling only binds a host that sends none.
_RESULT_CEILING = MAX_MESSAGE_BYTES - 1024
MAX_RESULT_DEPTH = 64
"""How deep a result may nest: the host refuses deeper JSON, so the wrapper reports it as unserializable."""
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)  # possessive: linear on unclosed strings
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"[\[{][\]}]")


class _Failure(Exception):
    """An outcome decided before or after the agent ran (entrypoint, result encoding)."""

    def __init__(self, code: session_pb2.AgentErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def main(before_pack: Callable[[], None] = lambda: None) -> int:
    """Run the task the host hands out on AGENTNODE_SOCKET and return the process exit code.
    `before_pack` is called once the wrapper's own imports are done, before any of the pack's code."""
    socket_path = os.environ.get("AGENTNODE_SOCKET", DEFAULT_SOCKET)
    if not await_socket(socket_path, socket_wait_seconds(os.environ.get("AGENTNODE_SOCKET_WAIT_SECONDS"))):
        before_pack()
        return _die(EXIT_NO_TASK, f"host socket {socket_path} does not exist")
    channel = open_channel(socket_path)  # not connected yet: the first call connects
    before_pack()
    # The agent's module is imported while the task is still to come: a warm member has its imports
    # done before a run claims it (the host names the module; a failure is reported once the task is here).
    add_import_root(os.environ.get("AGENTNODE_IMPORT_ROOT", DEFAULT_IMPORT_ROOT))
    preloaded = preload(os.environ.get("AGENTNODE_PRELOAD", ""))
    try:
        session = session_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]
        request = session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION)
        try:
            # wait_for_ready rides out a host that is still coming up, bounded by the timeout; unlike
            # channel_ready_future it leaves no connectivity poller behind to slow channel.close().
            # The host sets AGENTNODE_FETCH_TIMEOUT=0 (wait as long as it keeps the container: its
            # deadline and idle limit bound the run); the 5 s default serves a wrapper started by hand.
            wait = float(os.environ.get("AGENTNODE_FETCH_TIMEOUT", FETCH_TIMEOUT_SECONDS)) or None
            task = session.FetchTask(request, timeout=wait, wait_for_ready=True)
        except grpc.RpcError as err:
            return _die(EXIT_NO_TASK, f"FetchTask failed: {err.code().name}: {err.details()}")
        open_egress(socket_path)  # only now: a warm member's egress socket comes with its run
        outcome = execute(AgentContext(channel, task), task, preloaded)
        mark_output(task.output_mark)
        try:
            session.ReportResult(outcome)
        except grpc.RpcError as err:
            return _die(EXIT_NO_REPORT, f"ReportResult failed: {err.code().name}: {err.details()}")
        return EXIT_OK
    finally:
        channel.close()


def mark_output(mark: bytes) -> None:
    """Write the host's end-of-output mark once to each output stream, after what the agent wrote: the host
    then knows it holds all of it without waiting for the stream to end (host/runtime/workload.py). One write
    per stream, so the mark is never split by another thread's output; a closed stream is skipped."""
    if not mark:
        return
    _flush_output()
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.write(fd, mark)


def socket_wait_seconds(raw: str | None) -> float:
    """How long to wait for the socket to appear: 0 (it must be there) unless the backend says otherwise;
    on Kubernetes the node agent creates it only after it has seen and verified the pod (docs/kubernetes.md).
    A malformed value waits not at all: the run then fails visibly instead of hanging."""
    try:
        wait = float(raw or 0)
    except ValueError:
        return 0.0
    return min(wait, SOCKET_WAIT_CEILING_SECONDS) if wait > 0 else 0.0


def await_socket(path: str, wait: float) -> bool:
    """Whether `path` exists, polling for up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(SOCKET_POLL_SECONDS)
    return True


def leave(code: int) -> NoReturn:
    """End the process at once with `code`, its output flushed. The outcome is reported (or could not be)
    and the host tears the sandbox down next; the interpreter's own shutdown (gRPC's threads, the agent's
    atexit hooks and leftover threads) took ~25 ms natively, ~65 ms under runc and ~140 ms under runsc,
    which every one-shot run waited for and the host's cores paid."""
    _flush_output()
    os._exit(code)


def _flush_output() -> None:
    """Flush what the agent left in sys.stdout's and sys.stderr's buffers; a closed or broken one is
    skipped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def add_import_root(root: str) -> None:
    """Make the pack importable: its import root first on sys.path, then its requirements (when it has
    any) ahead of everything else, with their .pth files processed as site-packages would (old-style
    namespace packages need them). Nothing is downloaded: the directory was filled at install."""
    sys.path.insert(0, root)
    requirements = os.path.join(root, REQUIREMENTS_DIR)
    if os.path.isdir(requirements):
        sys.path.insert(1, requirements)
        site.addsitedir(requirements)  # already on sys.path: only its .pth files are read
    add_compat_path()  # agentnode_sdk for SDK-written packs, after the pack's own modules


class Preloaded:
    """The agent's module imported before its task: the module, or the failure its import ended in."""

    def __init__(self, name: str, module: ModuleType | None, failure: _Failure | None) -> None:
        self.name, self.module, self.failure = name, module, failure

    def module_named(self, module_name: str) -> ModuleType:
        """`module_name` imported: the preloaded module (or its import's failure, raised) when it is that
        one, else imported now."""
        if module_name != self.name:
            return _import(module_name)
        if self.failure is not None:
            raise self.failure
        assert self.module is not None
        return self.module


NOTHING_PRELOADED = Preloaded("", None, None)


def preload(module_name: str) -> Preloaded:
    """Import the module the host named (its agent's entrypoint module) ahead of the task; "" or a name
    that is no module path imports nothing. Whatever the import raises is kept for the task's outcome."""
    if not _is_module_path(module_name):
        return NOTHING_PRELOADED
    try:
        return Preloaded(module_name, _import(module_name), None)
    except _Failure as failure:
        return Preloaded(module_name, None, failure)


def execute(
    context: AgentContext,
    task: session_pb2.FetchTaskResponse,
    preloaded: Preloaded = NOTHING_PRELOADED,
) -> session_pb2.ReportResultRequest:
    """Call the entrypoint and turn whatever happens into the one ReportResult request."""
    try:
        function = _resolve(task.entrypoint, preloaded)
        value = function(context, **loads_finite(task.kwargs_json or "{}"))
        if isinstance(value, Awaitable):
            value = asyncio.run(_await(value, context))
        return session_pb2.ReportResultRequest(value_json=_encode(value, task.max_result_bytes))
    except _Failure as failure:
        return _failed(failure.code, str(failure))
    except (AgentLimitExceeded, AgentTerminated) as exc:  # the runtime stopped the agent: a limit outcome
        return _failed(session_pb2.AGENT_ERROR_CODE_AGENT_LIMIT, _summary(exc), exc)
    except Exception as exc:  # noqa: BLE001 - any agent exception is an outcome to report
        return _failed(session_pb2.AGENT_ERROR_CODE_AGENT_EXCEPTION, _summary(exc), exc)
    except SystemExit as exc:
        return _failed(session_pb2.AGENT_ERROR_CODE_SYSTEM_EXIT, f"SystemExit: exit code {exc.code!r}", exc)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt & co. are agent outcomes, reported
        return _failed(session_pb2.AGENT_ERROR_CODE_BASE_EXCEPTION, _summary(exc), exc)
    finally:
        context._finish()  # the agent's leftover threads stop waiting to retry


def _resolve(entrypoint: str, preloaded: Preloaded = NOTHING_PRELOADED) -> Callable[..., Any]:
    """Import `module[:function]` (function defaults to `run`) from the pack's import root, unless that
    module was preloaded (then its import's module or failure stands)."""
    module_name, colon, function_name = entrypoint.partition(":")
    function_name = function_name if colon else "run"
    if not (_is_module_path(module_name) and function_name.isidentifier()):
        raise _Failure(
            session_pb2.AGENT_ERROR_CODE_BAD_ENTRYPOINT,
            _clip(f"entrypoint {entrypoint!r} is not 'module' or 'module:function'"),
        )
    module = preloaded.module_named(module_name)
    function: Callable[..., Any] | None = getattr(module, function_name, None)
    if not callable(function):
        missing = "has no" if function is None else "has a non-callable"
        raise _Failure(
            session_pb2.AGENT_ERROR_CODE_ENTRYPOINT_NOT_FOUND,
            _clip(f"module {module_name!r} {missing} {function_name!r}"),
        )
    return function


def _is_module_path(name: str) -> bool:
    """`a` or `a.b.c`: dotted identifiers ("" is none)."""
    return all(part.isidentifier() for part in name.split("."))


def _import(module_name: str) -> ModuleType:
    """Import one module of the pack; whatever its module-level code raises becomes IMPORT_FAILED."""
    try:
        return importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - module-level agent code may raise anything
        traceback.print_exception(exc)
        raise _Failure(
            session_pb2.AGENT_ERROR_CODE_IMPORT_FAILED,
            _clip(f"cannot import {module_name!r}: {_summary(exc)}"),
        ) from None


async def _await(awaitable: Awaitable[Any], context: AgentContext) -> Any:
    """Await any awaitable (asyncio.run accepts only coroutines). When it is done, retry sleeps of calls
    still on worker threads (the awaitable context methods) end at once: asyncio.run waits for those threads
    before it returns."""
    try:
        return await awaitable
    finally:
        context._finish()


def _encode(value: Any, max_result_bytes: int) -> str:
    """The result as JSON text under the host's byte cap (0 = the host set none: the message cap)."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _Failure(
            session_pb2.AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE,
            _clip(f"result is not JSON-serializable: {_summary(exc)}"),
        ) from None
    if not _nests_within(text, MAX_RESULT_DEPTH):
        raise _Failure(
            session_pb2.AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE,
            f"result is not JSON-serializable: it nests deeper than {MAX_RESULT_DEPTH}",
        )
    cap = min(max_result_bytes or _RESULT_CEILING, _RESULT_CEILING)
    if size > cap:
        raise _Failure(
            session_pb2.AGENT_ERROR_CODE_RESULT_TOO_LARGE,
            f"result is {size} bytes of JSON; the cap is {cap} bytes",
        )
    return text


def _nests_within(text: str, max_depth: int) -> bool:
    """Whether JSON text nests at most `max_depth` deep (strings skipped), in C-speed passes, no recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(max_depth):
        stripped = _INNERMOST.sub("", brackets)
        if not stripped or stripped == brackets:
            return True
        brackets = stripped
    return _INNERMOST.search(brackets) is None


def _failed(
    code: session_pb2.AgentErrorCode, message: str, exc: BaseException | None = None
) -> session_pb2.ReportResultRequest:
    """A failure outcome; the agent's traceback goes to stderr, which the host drains and caps."""
    if exc is not None:
        traceback.print_exception(exc)
    failure = session_pb2.AgentFailure(code=code, message=_clip(message))
    return session_pb2.ReportResultRequest(failure=failure)


def _summary(exc: BaseException) -> str:
    """`Type: message`, the operator's one-line view of an exception."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the outcome
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _clip(message: str) -> str:
    """One line of valid UTF-8, at most MESSAGE_CHARS characters."""
    line = " ".join(message.split()).encode("utf-8", "replace").decode("utf-8")
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


def _die(code: int, message: str) -> int:
    """One stderr line naming what failed, then the exit code."""
    print(f"sandbox_wrapper: {message}", file=sys.stderr)
    return code
