"""The host's tool gate and runner: every tool call an agent asks for is checked here and run out of process.

ToolGate (one per run) owns the run's decisions: allowlist, call cap, argument limits and schema, trust and
the time budget; nothing in a request can change how, where or how long a tool runs. ToolRunner (one per
host) executes allowed calls in persistent worker processes (sandbox_wrapper/_tool_exec.py run as a script,
the same executor a tool sandbox uses), one pack per worker, with a minimal environment that holds no API
keys, so a failing, hanging or crashing tool fails only its call.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from host.core.calltrace import CallTrace
from host.core.errors import CallRefusal
from host.core.strictjson import JsonRejected, dumps_strict, loads_strict, utf8_exceeds
from host.core.vocab import HOST_TRUST, WireReason
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from sandbox_wrapper.protocol import MAX_RESULT_BYTES, tool_worker_script

logger = logging.getLogger(__name__)

MAX_ARGUMENTS_BYTES = 1 << 20
PARSE_SLOTS = 2
"""Arguments one run's gate parses at once: a parse allocates up to ~25x its bytes (1 MiB of `[]`s is
~25 MB of lists), so concurrent calls of one run wait for a slot instead of multiplying that."""
RESOLVED_PER_RUN = 64
"""Tool names a run's gate remembers how to resolve (ToolGate._resolve)."""
PARSE_SLOT_MIN_CHARS = 4096
"""Arguments up to this long are parsed without a slot: what they can allocate (~100 KB) costs less than
waiting for one."""
MAX_REQUEST_BYTES = MAX_ARGUMENTS_BYTES + 4096
"""The most a tool request may take encoded: its arguments plus slug, tool name and framing. The RPC layer
refuses anything larger as TOO_LARGE before decoding it."""
DEFAULT_TOOL_TIMEOUT = 60.0
MODE_HOST_WORKER = "host_worker"
MODE_TOOL_SANDBOX = "tool_sandbox"
"""ToolOutcome.mode_used of a community pack's call, run in one of the run's tool sandboxes."""

_SLUG = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,79}")
_MAX_MESSAGE = 200
_WORKER_SCRIPT = Path(tool_worker_script())
# A reply line is result_json escaped once more; anything longer is not our worker speaking.
_MAX_REPLY_LINE = 4 * MAX_RESULT_BYTES


@dataclass(frozen=True)
class InstalledToolpack:
    """A toolpack installed on this host, as the gate needs it (`root` is the import root; `interpreter`
    the python of the pack's own environment when it has requirements, else None: the host's)."""

    slug: str
    version: str
    trust: str
    root: Path
    manifest: ToolpackManifest
    interpreter: Path | None = None


ToolpackLookup = Callable[[str], InstalledToolpack | None]


class ToolRefusal(CallRefusal):
    """The gate refused a call before anything ran; the message is capped."""

    def __init__(self, reason: WireReason, message: str) -> None:
        super().__init__(reason, message[:_MAX_MESSAGE])

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class ToolOutcome:
    """The outcome of a call that was allowed to run; `error` is short and host-written."""

    success: bool
    result: Any
    error: str
    mode_used: str = MODE_HOST_WORKER
    result_json: str | None = None
    """`result` as the strict JSON text it was checked as, when the runner has it (so the RPC layer sends
    it on without serializing the value again); None: serialize `result`."""


def _failed(error: str) -> ToolOutcome:
    return ToolOutcome(success=False, result=None, error=error)


# --- arguments ---------------------------------------------------------------------------------------


def _parse_arguments(arguments_json: str) -> dict[str, Any]:
    """Strict JSON object parse that keeps ints as ints and floats as floats; NaN, ±Infinity and numbers
    that overflow to infinity (1e999) are refused here, so no schema or tool ever sees a non-finite value."""
    if utf8_exceeds(arguments_json, MAX_ARGUMENTS_BYTES):
        raise ToolRefusal(WireReason.TOO_LARGE, f"arguments_json exceeds {MAX_ARGUMENTS_BYTES} bytes")
    try:
        arguments = loads_strict(arguments_json)
    except JsonRejected as exc:
        raise ToolRefusal(WireReason.INVALID_REQUEST, f"arguments_json is not strict JSON ({exc})") from None
    if not isinstance(arguments, dict):
        del arguments  # a refusal's traceback keeps this frame: drop the parsed value now
        raise ToolRefusal(WireReason.INVALID_REQUEST, "arguments_json must be a JSON object")
    return arguments


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers (Python says True == 1), 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_equal, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _bound(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def schema_error(schema: Mapping[str, Any], value: Any, path: str = "$") -> str | None:
    """Why `value` fails a small JSON-schema subset, naming the failing path; None when it passes.

    Supported: type (name or list), properties, required, additionalProperties (false or a schema), enum,
    items, minimum/maximum, minLength/maxLength. An unknown type name fails closed; other malformed
    keywords are ignored. Values are never echoed.
    """
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not all(isinstance(k, str) and k in _JSON_TYPES for k in kinds):
            return f"{path}: the tool's schema uses an unsupported type"
        if not any(_JSON_TYPES[k](value) for k in kinds):
            return f"{path}: expected {' or '.join(kinds)}"
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(_json_equal(value, option) for option in enum):
        return f"{path}: not one of the allowed values"
    if isinstance(value, str):
        low, high = _bound(schema, "minLength"), _bound(schema, "maxLength")
        if low is not None and len(value) < low:
            return f"{path}: shorter than {low} characters"
        if high is not None and len(value) > high:
            return f"{path}: longer than {high} characters"
    if _JSON_TYPES["number"](value):
        low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
        if low is not None and value < low:
            return f"{path}: less than {low}"
        if high is not None and value > high:
            return f"{path}: greater than {high}"
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        for index, item in enumerate(value):
            if error := schema_error(items, item, f"{path}[{index}]"):
                return error
    if isinstance(value, dict):
        return _object_error(schema, value, path)
    return None


def _object_error(schema: Mapping[str, Any], value: dict[str, Any], path: str) -> str | None:
    required = schema.get("required")
    for name in required if isinstance(required, list) else ():
        if isinstance(name, str) and name not in value:
            return f"{path}.{name}: required property missing"
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        child = f"{path}.{key[:40]}"
        sub = properties.get(key)
        if sub is None and extra is False:
            return f"{child}: unexpected property"
        if sub is None and isinstance(extra, Mapping):
            sub = extra
        if isinstance(sub, Mapping) and (error := schema_error(sub, item, child)):
            return error
    return None


# --- the gate ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedTool:
    """What one call runs: the function to import (`module:function`), the function to fall back to when the
    pack does not define that one ("" for none), and the declared tool whose input schema applies (if any)."""

    entrypoint: str
    fallback: str = ""
    spec: ToolSpec | None = None


def _default_function(pack_entrypoint: str) -> tuple[str, str]:
    """A package entrypoint as (module, function): `module` means `module.run`, `module:fn` means `fn`."""
    module, sep, function = pack_entrypoint.rpartition(":")
    return (module, function) if sep else (pack_entrypoint, "run")


def resolve_tool(slug: str, manifest: ToolpackManifest, tool_name: str) -> ResolvedTool:
    """Pick the function a call runs, as agentnode-format §3.3 does (`tool_name` "" is the format's None).

    No name: the package entrypoint's default function; there is no fallback to a first tool. A name: the
    declared tool of exactly that name with its own entrypoint; else the package module's function of that
    name, falling back to the default function (the format's 0.5.1 rule: an unknown name runs `run`); else
    TOOL_NOT_FOUND. Packs in this host's own manifest form (no manifest_version) keep one convenience: with
    no name, a pack without a package entrypoint runs its only tool.
    """
    declared = next((tool for tool in manifest.tools if tool.name == tool_name), None) if tool_name else None
    if declared is not None and declared.entrypoint:
        return ResolvedTool(declared.entrypoint, spec=declared)
    if manifest.entrypoint:
        module, default = _default_function(manifest.entrypoint)
        if not tool_name:
            return ResolvedTool(f"{module}:{default}")
        # Only a public Python name can be a module's function; anything else runs the default (§3.3).
        public = tool_name.isidentifier() and not tool_name.startswith("_")
        return ResolvedTool(f"{module}:{tool_name if public else default}", fallback=default, spec=declared)
    names = ", ".join(tool.name for tool in manifest.tools) or "(none)"
    if not tool_name:
        only = manifest.tools[0] if len(manifest.tools) == 1 else None
        if only is not None and not manifest.manifest_version and only.entrypoint:
            return ResolvedTool(only.entrypoint, spec=only)
        raise ToolRefusal(
            WireReason.TOOL_NOT_FOUND,
            f"package '{slug}' has no package entrypoint to run without a tool name; name one of: {names}",
        )
    raise ToolRefusal(WireReason.TOOL_NOT_FOUND, f"package '{slug}' has no such tool; available: {names}")


class SandboxRunner(Protocol):
    """What the gate needs of a run's tool sandboxes (host/runtime/toolsandbox.ToolSandboxes, one layer up):
    community packs' calls go there, and the gate owns neither their containers nor their engine."""

    started: int
    """Tool sandboxes started in this run (replacements included)."""

    def run(
        self, pack: InstalledToolpack, tool: ResolvedTool, arguments: dict[str, Any], *, timeout: float
    ) -> ToolOutcome:
        """Run one admitted call in the pack's sandbox; every failure is a failed outcome of this call."""
        ...

    def close(self) -> None:
        """The run ended: destroy every tool sandbox."""
        ...


class ToolGate:
    """One run's tool gate: decides every call, then hands allowed ones to the host's ToolRunner.

    Every refusal happens before a call is reserved, so refusals never use up the cap; the cap check and
    the reservation are one atomic step, so concurrent calls can never run more tools than the cap.
    A call that was reserved counts even when the tool then fails. Checks run cheapest first: whatever
    needs no arguments (allowlist, cap, pack, trust, tool, time) before the arguments are parsed, and the
    schema last, so a refused call costs at most one bounded parse.
    """

    def __init__(
        self,
        *,
        allowed_packages: Iterable[str] | None,
        max_tool_calls: int,
        lookup: ToolpackLookup,
        runner: ToolRunner,
        deadline: float,
        tool_timeout: float = DEFAULT_TOOL_TIMEOUT,
        sandboxes: SandboxRunner | None = None,
    ) -> None:
        self._allowed = None if allowed_packages is None else frozenset(allowed_packages)
        self._max_tool_calls = max_tool_calls
        self._lookup = lookup
        self._runner = runner
        self._sandboxes = sandboxes  # community packs' calls; None: refused (the host's sandbox is off)
        self._placed: dict[str, int] = {}
        self._deadline = deadline
        self._tool_timeout = tool_timeout
        self._lock = threading.Lock()
        # each decided call's timing, for the run's trace (host/runtime/telemetry/tracing.py)
        self.trace = CallTrace()
        self._parsing = threading.BoundedSemaphore(PARSE_SLOTS)
        self._resolved: dict[tuple[str, str], tuple[InstalledToolpack, ResolvedTool]] = {}
        self._calls_made = 0
        self._refusals = 0

    @property
    def calls_made(self) -> int:
        """Calls reserved (and run) so far."""
        return self._calls_made

    @property
    def refusals(self) -> int:
        """Calls refused so far."""
        return self._refusals

    @property
    def remaining(self) -> int:
        """Calls the run may still make."""
        return max(0, self._max_tool_calls - self._calls_made)

    @property
    def deadline(self) -> float:
        """The run's deadline (time.monotonic) that bounds every call."""
        return self._deadline

    def calls_in(self, mode: str) -> int:
        """Calls run (or running) in `mode` (MODE_HOST_WORKER, MODE_TOOL_SANDBOX), failed ones included."""
        return self._placed.get(mode, 0)

    @property
    def sandboxes_started(self) -> int:
        """Tool sandboxes this run started."""
        return self._sandboxes.started if self._sandboxes is not None else 0

    def close(self) -> None:
        """The run ended: its tool sandboxes are destroyed (host workers are the host's, and stay)."""
        if self._sandboxes is not None:
            self._sandboxes.close()

    def refused(self, refusal: ToolRefusal) -> ToolRefusal:
        """Count a refusal decided outside `call` (the RPC layer's checks on the raw request)."""
        with self._lock:
            self._refusals += 1
        return refusal

    def screen(self, request_bytes: int) -> None:
        """The checks that need no request at all, run by the RPC layer before it decodes one: a run with
        no allowlist or no calls left, or a request larger than MAX_REQUEST_BYTES, is refused (counted)."""
        if self._allowed is not None and not self._allowed:
            raise self.refused(ToolRefusal(WireReason.TOOL_NOT_ALLOWED, "this run's tool allowlist is empty"))
        if self.remaining == 0:
            raise self.refused(_call_limit())
        if request_bytes > MAX_REQUEST_BYTES:
            too_large = f"the request exceeds {MAX_REQUEST_BYTES} bytes"
            raise self.refused(ToolRefusal(WireReason.TOO_LARGE, too_large))

    def call(
        self,
        slug: str,
        tool_name: str,
        arguments_json: str,
        *,
        on_admit: Callable[[], None] | None = None,
    ) -> ToolOutcome:
        """Decide one call and run it if allowed; raises ToolRefusal (counted) when refused.

        `on_admit` runs once the call passed every check and was reserved, before the tool runs.
        """
        start = time.monotonic()
        try:
            pack, tool, arguments, timeout = self._admit(slug, tool_name, arguments_json)
        except ToolRefusal as refusal:
            self.trace.add("agentnode.tool_call", start, {"agentnode.outcome": str(refusal.reason)})
            raise self.refused(refusal) from None
        if on_admit is not None:
            on_admit()
        runner: ToolRunner | SandboxRunner = self._runner
        mode = MODE_HOST_WORKER
        if pack.trust not in HOST_TRUST:
            assert self._sandboxes is not None  # else refused in _admit
            runner, mode = self._sandboxes, MODE_TOOL_SANDBOX
        with self._lock:  # counted where it runs as it starts, like the reservation itself
            self._placed[mode] = self._placed.get(mode, 0) + 1
        outcome = runner.run(pack, tool, arguments, timeout=timeout)
        if outcome.error == _MISSING:  # name what the agent can call instead (§3.3's ImportError)
            names = ", ".join(t.name for t in pack.manifest.tools) or "(none)"
            error = f"tool not found: package '{slug}' defines no function for this call; its tools: {names}"
            outcome = ToolOutcome(False, None, error[:_MAX_MESSAGE], outcome.mode_used)
        self.trace.add("agentnode.tool_call", start, {
            "agentnode.outcome": "ok" if outcome.success else "failed",
            "agentnode.tool.package": pack.slug,  # a slug that passed its pattern and the lookup
            "agentnode.tool.name": tool.spec.name if tool.spec is not None else "",  # the lockfile's
            "agentnode.tool.mode": mode,
        })  # fmt: skip
        return outcome

    def _admit(
        self, slug: str, tool_name: str, arguments_json: str
    ) -> tuple[InstalledToolpack, ResolvedTool, dict[str, Any], float]:
        if not _SLUG.fullmatch(slug):
            raise ToolRefusal(WireReason.INVALID_REQUEST, "package_slug is empty or not a package slug")
        if self._allowed is not None and slug not in self._allowed:
            raise ToolRefusal(
                WireReason.TOOL_NOT_ALLOWED, f"package '{slug}' is not on this run's tool allowlist"
            )
        if self.remaining == 0:
            raise _call_limit()
        pack = self._lookup(slug)
        if pack is None:
            raise ToolRefusal(WireReason.TOOL_NOT_FOUND, f"package '{slug}' is not installed on this host")
        if pack.trust not in HOST_TRUST and self._sandboxes is None:
            raise ToolRefusal(
                WireReason.TOOL_PACK_UNTRUSTED,
                "community tool packs run only in tool sandboxes, and this host's sandbox is off "
                "(AGENTNODE_AGENT_SANDBOX=1 turns it on)",
            )
        tool = self._resolve(pack, tool_name)
        if self._deadline - time.monotonic() <= 0:
            raise ToolRefusal(WireReason.RUN_DEADLINE, "the run's time budget is spent")
        schema = tool.spec.input_schema if tool.spec is not None else None
        if len(arguments_json) <= PARSE_SLOT_MIN_CHARS:
            arguments = _checked_arguments(arguments_json, schema)
        else:
            with self._parsing:  # the first step whose cost grows with the request
                arguments = _checked_arguments(arguments_json, schema)
        timeout = min(self._tool_timeout, self._deadline - time.monotonic())
        if timeout <= 0:
            raise ToolRefusal(WireReason.RUN_DEADLINE, "the run's time budget is spent")
        with self._lock:
            if self._calls_made >= self._max_tool_calls:
                raise _call_limit()
            self._calls_made += 1
        return pack, tool, arguments, timeout

    def _resolve(self, pack: InstalledToolpack, tool_name: str) -> ResolvedTool:
        """resolve_tool, remembered per (pack, name) for the run: a loop calling one tool resolves it once.
        At most RESOLVED_PER_RUN names are kept (an agent chooses them); others are resolved every time."""
        key = (pack.slug, tool_name)
        known = self._resolved.get(key)
        if known is not None and known[0] is pack:
            return known[1]
        tool = resolve_tool(pack.slug, pack.manifest, tool_name)
        if len(self._resolved) < RESOLVED_PER_RUN:
            self._resolved[key] = (pack, tool)
        return tool


def _checked_arguments(arguments_json: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The call's arguments, parsed and checked against the tool's input schema (if it declares one)."""
    arguments = _parse_arguments(arguments_json)
    if schema is not None and (error := schema_error(schema, arguments)):
        del arguments  # freed here, inside any parse slot (a refusal's traceback keeps this frame)
        raise ToolRefusal(
            WireReason.TOOL_ARGUMENTS_INVALID, f"arguments do not match the tool's schema: {error}"
        )
    return arguments


def _call_limit() -> ToolRefusal:
    return ToolRefusal(WireReason.TOOL_CALL_LIMIT, "this run's tool-call cap is used up")


# --- the runner --------------------------------------------------------------------------------------


class _WorkerGone(Exception):
    """The worker died or broke the protocol."""


class _WorkerTimeout(Exception):
    """The worker did not reply in time."""


def _worker_env() -> dict[str, str]:
    """Only what an interpreter needs: no API keys, no PYTHON* variables (ignored under -I anyway)."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


class _Worker:
    """One worker process serving one pack's import root, in its own process group.

    `interpreter` is the pack's own virtual environment's python (its requirements; -I keeps that
    environment's site-packages, which pyvenv.cfg names, and drops the host's); None runs the host's.
    """

    def __init__(self, root: Path, interpreter: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(interpreter or sys.executable), "-I", "-B", str(_WORKER_SCRIPT), str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the tool's own output: discarded, so it can never block
            env=_worker_env(),
            cwd=root,
            start_new_session=True,
        )
        self._kill_lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, request: bytes, timeout: float) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        deadline = time.monotonic() + timeout
        try:
            stdin.write(request)
            stdin.flush()
        except OSError:
            raise _WorkerGone from None
        try:
            reply = loads_strict(self._read_line(stdout.fileno(), deadline), max_depth=4)
        except JsonRejected:
            raise _WorkerGone from None
        if not isinstance(reply, dict):
            raise _WorkerGone
        return reply

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    @staticmethod
    def _read_line(fd: int, deadline: float) -> bytes:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        buffer = bytearray()
        while not buffer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _WorkerTimeout
            if not poller.poll(remaining * 1000):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk or len(buffer) + len(chunk) > _MAX_REPLY_LINE:
                raise _WorkerGone
            buffer += chunk
        return bytes(buffer)

    def kill(self) -> None:
        """Kill the whole process group (tools may have started children); safe from any thread."""
        with self._kill_lock:
            if self.proc.returncode is None:  # not reaped yet, so the pid cannot have been reused
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def dispose(self) -> None:
        """Kill and close the pipes; only the thread that owns the worker calls this."""
        self.kill()
        for pipe in self._pipes():
            with contextlib.suppress(OSError):
                pipe.close()


_PoolKey = tuple[str, str, Path, Path | None]


class ToolRunner:
    """Host-wide tool executor with a small pool of persistent workers, keyed by (slug, version, root,
    interpreter).

    A worker only ever serves one pack, so packs never share an interpreter; a worker that timed out,
    crashed or broke the protocol is killed and never reused. Calls of one pack share module state
    across runs through reused workers (the pack is trusted or curated).
    """

    def __init__(self, *, max_idle_per_pack: int = 2) -> None:
        self._max_idle_per_pack = max_idle_per_pack
        self._lock = threading.Lock()
        self._idle: dict[_PoolKey, list[_Worker]] = {}
        self._busy: set[_Worker] = set()
        self._closed = False
        atexit.register(self.close)

    def run(
        self, pack: InstalledToolpack, tool: ResolvedTool, arguments: dict[str, Any], *, timeout: float
    ) -> ToolOutcome:
        """Run one tool call; every failure is an unsuccessful outcome for this call only."""
        key: _PoolKey = (pack.slug, pack.version, pack.root, pack.interpreter)
        try:  # before a worker is taken: a refusal here must not keep it busy for good
            line = dumps_strict(
                {"entrypoint": tool.entrypoint, "fallback": tool.fallback, "arguments": arguments}
            )
        except (JsonRejected, TypeError):
            return _failed("tool arguments are not strict JSON")
        request = (line + "\n").encode()
        try:
            worker = self._acquire(key)
        except OSError as exc:
            logger.warning("tool worker failed to start: %s", type(exc).__name__)
            return _failed("tool worker failed to start")
        if worker is None:
            return _failed("tool runner is closed")
        try:
            reply = worker.call(request, timeout)
        except _WorkerTimeout:
            self._discard(worker)
            return _failed(f"tool timed out after {timeout:.1f} s")
        except _WorkerGone:
            self._discard(worker)
            return _failed("tool worker crashed")
        self._release(key, worker)
        return _outcome(reply)

    def close(self) -> None:
        """Kill every worker; calls in flight fail as crashed. Idempotent."""
        with self._lock:
            self._closed = True
            idle = [worker for workers in self._idle.values() for worker in workers]
            busy = list(self._busy)
            self._idle.clear()
        for worker in idle:
            worker.dispose()
        for worker in busy:
            worker.kill()  # its owner sees the pipe close and disposes it

    def _acquire(self, key: _PoolKey) -> _Worker | None:
        with self._lock:
            if self._closed:
                return None
            # A call of a pack version retires idle workers of its other versions (a reinstall): they
            # run code from a host copy that is gone and are never asked again.
            stale = [k for k in self._idle if k[0] == key[0] and k != key]
            replaced = [worker for k in stale for worker in self._idle.pop(k)]
            reused: _Worker | None = None
            idle = self._idle.get(key, [])
            while idle and reused is None:
                candidate = idle.pop()
                if candidate.alive():
                    self._busy.add(candidate)
                    reused = candidate
                else:
                    replaced.append(candidate)
        for old in replaced:
            old.dispose()
        if reused is not None:
            return reused
        worker = _Worker(key[2], key[3])
        with self._lock:
            if not self._closed:
                self._busy.add(worker)
                return worker
        worker.dispose()
        return None

    def _release(self, key: _PoolKey, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            idle = self._idle.setdefault(key, [])
            keep = not self._closed and len(idle) < self._max_idle_per_pack
            if keep:
                idle.append(worker)
        if not keep:
            worker.dispose()

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
        worker.dispose()


_MISSING = "tool not found (ImportError)"


def _outcome(reply: dict[str, Any]) -> ToolOutcome:
    """Turn a worker reply into an outcome with a host-written error; exception text never crosses."""
    if reply.get("ok") is True:
        # The worker is trusted code running a trusted tool, but its result goes back into the sandbox and
        # into `run --json`: only strict JSON (finite numbers, bounded size and depth) gets through.
        text = str(reply.get("result_json", ""))
        try:
            result = loads_strict(text, max_bytes=MAX_RESULT_BYTES)
        except JsonRejected:
            return _failed("tool result is not JSON-serializable")
        return ToolOutcome(success=True, result=result, error="", result_json=text)
    failure = reply.get("failure")
    error_type = str(reply.get("error_type", ""))
    error_type = error_type if _TYPE_NAME.fullmatch(error_type) else "an exception"
    if failure == "raised":
        logger.info("tool raised %s", error_type)
        return _failed(f"tool raised {error_type}")
    if failure == "load":
        return _failed(f"tool entrypoint could not be loaded ({error_type})")
    if failure == "too_large":
        return _failed("tool result too large")
    if failure == "missing":
        return _failed(_MISSING)
    return _failed("tool result is not JSON-serializable")


__all__ = [
    "DEFAULT_TOOL_TIMEOUT",
    "MAX_ARGUMENTS_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_RESULT_BYTES",
    "MODE_HOST_WORKER",
    "MODE_TOOL_SANDBOX",
    "PARSE_SLOTS",
    "InstalledToolpack",
    "ResolvedTool",
    "SandboxRunner",
    "ToolGate",
    "ToolOutcome",
    "ToolRefusal",
    "ToolRunner",
    "ToolpackLookup",
    "resolve_tool",
    "schema_error",
]
