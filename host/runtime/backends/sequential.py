"""Sequential orchestration agents (format §5.5): a pipeline of tool calls the host makes, no agent code.

`run_pipeline` is the format's semantics as a pure function over the steps, the run's kwargs, a step
executor and a clock, so every rule is unit-tested without a daemon. `SequentialBackend` is the run path's
third backend: its workload runs the pipeline on a host thread, each step a call through the run's
ToolGate (allowlist, cap, trust, schema, per-call timeout), and reports the outcome to the run's session as
the wrapper's ReportResult would, so the watch loop, the outcome's name and the one audit record are those
of every other run. Step names, tool errors and results go into the run's result, never into the audit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from host.core.errors import CallRefusal
from host.core.strictjson import JsonRejected, dumps_strict, loads_strict
from host.core.vocab import WireReason
from host.policy.admission import Admission
from host.runtime.rundir import make_run_dir
from host.runtime.session import RunOutcome, RunSession
from host.runtime.workload import UnpooledBackend, Workload
from host.spec.manifest.model import OrchestrationStep
from host.tools.calls import MAX_ARGUMENTS_BYTES, ToolRefusal
from host.tools.gate import ToolGate
from sandbox_wrapper.protocol import PROTOCOL_VERSION

logger = logging.getLogger("agentnode.sandbox.sequential")

CONSUMED_KWARGS = frozenset({"goal", "llm", "timeout"})
"""Run arguments the agentnode runtime consumes itself (`run_agent`'s own parameters): never `$input`."""
MAX_KEPT_RESULTS_BYTES = 16 * 1024 * 1024
"""Step results a pipeline keeps for later steps (`$steps.<name>`, `when`, the final result), in JSON
bytes; each result is at most the tool worker's cap (1 MiB). A step whose result would pass it fails."""
MAX_ERROR_CHARS = 2000
"""A failed run's error text, as for an agent's own failure message."""
DEADLINE_GRACE_SECONDS = 5.0
"""How long the watch loop waits past the deadline for the pipeline's own timeout report: a call in flight
is cut at the deadline by the gate's per-call timeout, and the report follows at once."""

StepExecutor = Callable[[str, str, dict[str, Any]], tuple[bool, Any, str]]
"""Runs one step: (package slug, tool name or "", arguments) -> (success, result, error)."""


class MappingError(ValueError):
    """A `$reference` in an input_mapping that cannot be resolved (the format's ValueError)."""


_UNRESOLVABLE = object()


@dataclass(frozen=True)
class PipelineOutcome:
    """What a pipeline ended with, in the format's shape (§5.5 "Result")."""

    success: bool
    result: Any = None
    error: str = ""
    timed_out: bool = False


def initial_input(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`$input`: the run's kwargs without those the runtime consumes (so `$input.goal` is unresolvable)."""
    return {key: value for key, value in kwargs.items() if key not in CONSUMED_KWARGS}


def step_name(step: OrchestrationStep, index: int) -> str:
    """A step's name: as declared, else `step_<i>` (0-based)."""
    return step.name if step.name is not None else f"step_{index}"


def split_tool(ref: str) -> tuple[str, str]:
    """`slug` or `slug:tool`, split on the first colon; "" when no tool is named (the gate then picks the
    pack's only tool)."""
    slug, _, tool = ref.partition(":")
    return slug, tool


def resolve_value(value: Any, inputs: Mapping[str, Any], results: Mapping[str, Any]) -> Any:
    """One input_mapping value: `$input.<key>` (a top-level kwarg), `$steps.<name>` (a step's whole
    result; `$steps.a.b` names the step `a.b`), any other `$...` an error; everything else as it is."""
    if not isinstance(value, str) or not value.startswith("$"):
        return value
    if value.startswith("$input."):
        key = value[len("$input.") :]
        if key not in inputs:
            raise MappingError(f"Input key '{key}' not found in kwargs")
        return inputs[key]
    if value.startswith("$steps."):
        name = value[len("$steps.") :]
        if name not in results:
            raise MappingError(f"Step '{name}' not found or not yet executed")
        return results[name]
    raise MappingError(f"Unknown variable reference: {value}")


def resolve_mapping(
    mapping: Mapping[str, Any], inputs: Mapping[str, Any], results: Mapping[str, Any]
) -> dict[str, Any]:
    """A step's arguments: each top-level value resolved (nested values are not looked into)."""
    return {key: resolve_value(value, inputs, results) for key, value in mapping.items()}


def parse_literal(text: str) -> Any:
    """The right side of a `when`: null, true, false, a quoted string, an int, a float, else the text."""
    if text == "null":
        return None
    if text == "true":
        return True
    if text == "false":
        return False
    if (text.startswith('"') and text.endswith('"')) or (text.startswith("'") and text.endswith("'")):
        return text[1:-1]
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _condition(expr: str) -> tuple[str, str, str] | None:
    """(reference, operator, literal text) of a `when`, or None for syntax the format does not know."""
    expr = expr.strip()
    for suffix in (" is not null", " is null"):
        if expr.endswith(suffix):
            return expr[: -len(suffix)].strip(), suffix.strip(), ""
    for op in ("!=", "=="):
        if f" {op} " in expr:
            ref, literal = expr.split(f" {op} ", 1)
            return ref.strip(), op, literal.strip()
    return None


def evaluate_when(expr: str, inputs: Mapping[str, Any], results: Mapping[str, Any]) -> bool:
    """A step's `when`. An unresolvable reference makes ==/!= false and `is null` true; `is not null` is true
    whenever the reference resolves, even to null; unknown syntax is false."""
    parts = _condition(expr)
    if parts is None:
        return False
    ref, op, literal = parts
    try:
        value = resolve_value(ref, inputs, results)
    except MappingError:
        value = _UNRESOLVABLE
    if op == "is not null":
        return value is not _UNRESOLVABLE
    if op == "is null":
        return value is _UNRESOLVABLE or value is None
    if value is _UNRESOLVABLE:
        return False
    equal = bool(value == parse_literal(literal))
    return equal if op == "==" else not equal


def kept_step_names(steps: Sequence[OrchestrationStep]) -> frozenset[str]:
    """The steps whose results the pipeline needs later: those a mapping or `when` names, and the last."""
    names = {step_name(steps[-1], len(steps) - 1)} if steps else set()
    for step in steps:
        refs = [value for value in step.input_mapping.values() if isinstance(value, str)]
        condition = _condition(step.when) if step.when is not None else None
        if condition is not None:
            refs.append(condition[0])
        names.update(ref[len("$steps.") :] for ref in refs if ref.startswith("$steps."))
    return frozenset(names)


def _failed(error: str, steps: list[dict[str, Any]], *, timed_out: bool = False) -> PipelineOutcome:
    return PipelineOutcome(False, {"steps_completed": steps}, error[:MAX_ERROR_CHARS], timed_out)


def _timed_out(done: int, total: int, limit: float, steps: list[dict[str, Any]]) -> PipelineOutcome:
    error = f"Sequential orchestration timed out after {done}/{total} steps ({limit:g}s limit)"
    return _failed(error, steps, timed_out=True)


def run_pipeline(
    steps: Sequence[OrchestrationStep],
    kwargs: Mapping[str, Any],
    execute: StepExecutor,
    *,
    deadline: float,
    limit_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    stopped: Callable[[], bool] = lambda: False,
    max_kept_bytes: int = MAX_KEPT_RESULTS_BYTES,
) -> PipelineOutcome | None:
    """Run the steps in order (§5.5); None when `stopped()` said the run was ended from outside.

    The deadline is checked between steps only; a step cut or refused by the deadline also ends the run
    as timed out (the host's deadline bounds every call, which the format's runtime does not do).
    """
    inputs = initial_input(kwargs)
    kept = kept_step_names(steps)
    results: dict[str, Any] = {}
    kept_bytes = 0
    done: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        if stopped():
            return None
        if clock() >= deadline:
            return _timed_out(index, len(steps), limit_seconds, done)
        name = step_name(step, index)
        if step.when is not None and not evaluate_when(step.when, inputs, results):
            skipped = {"name": name, "tool": step.tool, "success": True, "skipped": True, "duration_ms": 0.0}
            done.append(skipped)
            continue
        slug, tool = split_tool(step.tool)
        try:
            arguments = resolve_mapping(step.input_mapping, inputs, results)
        except MappingError as exc:
            return _failed(f"Step '{name}' input mapping error: {exc}", done)
        started = clock()
        success, result, error = execute(slug, tool, arguments)
        del arguments
        entry = {"name": name, "tool": step.tool, "success": success,
                 "duration_ms": round((clock() - started) * 1000, 1), "skipped": False}  # fmt: skip
        done.append(entry)
        if not success:
            if stopped():
                return None
            if clock() >= deadline:
                return _timed_out(index, len(steps), limit_seconds, done)
            return _failed(f"Step '{name}' failed: {error}", done)
        if name in kept:
            kept_bytes += _json_size(result)
            if kept_bytes > max_kept_bytes:
                entry["success"] = False
                return _failed(
                    f"Step '{name}' failed: the step results later steps use exceed {max_kept_bytes} bytes",
                    done,
                )
            results[name] = result
    return PipelineOutcome(True, results.get(step_name(steps[-1], len(steps) - 1)) if steps else None)


def _json_size(value: Any) -> int:
    try:
        return len(dumps_strict(value))
    except (JsonRejected, TypeError, ValueError, RecursionError):
        return 0  # not JSON: the run's report refuses it; nothing is kept beyond what the runner returned


def json_exceeds(value: Any, limit: int) -> bool:
    """Whether `value`'s JSON text is surely longer than `limit`: a lower bound, walked only until it passes
    the limit, so arguments that repeat a large result many times are refused before they are serialized."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + 2 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            total += 2 + len(item)
            stack.extend(item)
        else:
            total += 1
        if total > limit:
            return True
    return False


# --- the backend ---------------------------------------------------------------------------------------


class _Cancelled(Exception):
    """The run was ended from outside before a reserved call started its tool."""


def gate_executor(gate: ToolGate, session: RunSession) -> StepExecutor:
    """Each step is one call through the run's gate; a refusal is a failed step (its reason and message)."""

    def check_open() -> None:
        if session.cancelled:
            raise _Cancelled

    def execute(slug: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any, str]:
        try:
            if json_exceeds(arguments, MAX_ARGUMENTS_BYTES):
                too_large = f"arguments_json exceeds {MAX_ARGUMENTS_BYTES} bytes"
                raise gate.refused(ToolRefusal(WireReason.TOO_LARGE, too_large))
            try:
                arguments_json = dumps_strict(arguments)
            except (JsonRejected, TypeError, ValueError):
                not_json = "arguments are not strict JSON"
                raise gate.refused(ToolRefusal(WireReason.INVALID_REQUEST, not_json)) from None
            outcome = gate.call(slug, tool, arguments_json, on_admit=check_open)
        except ToolRefusal as refusal:
            return False, None, str(refusal)
        except _Cancelled:
            return False, None, "the run was cancelled"
        return outcome.success, outcome.result, outcome.error

    return execute


def pipeline_report(outcome: PipelineOutcome, max_result_bytes: int) -> RunOutcome:
    """The session report of a pipeline's outcome, bounded like an agent's (strict JSON, size cap)."""
    try:
        text = dumps_strict(outcome.result)
    except (JsonRejected, TypeError, ValueError, RecursionError):
        not_json = "the result is not strict JSON"
        return RunOutcome(failure_code="result_not_serializable", failure_message=not_json)
    if len(text) > max_result_bytes:  # ASCII (escaped), so characters are bytes
        return RunOutcome(
            failure_code="result_too_large", failure_message=f"the result exceeds {max_result_bytes} bytes"
        )
    if outcome.success:
        return RunOutcome(value_json=text)
    return RunOutcome(
        failure_code="timeout" if outcome.timed_out else "step_failed",
        failure_message=outcome.error,
        failure_value_json=text,
        timed_out=outcome.timed_out,
    )


@dataclass(frozen=True)
class SequentialSpec:
    """What a sequential run needs: its steps and its runtime limit (for the timeout's message)."""

    slug: str
    steps: tuple[OrchestrationStep, ...]
    max_runtime_seconds: int


@dataclass(kw_only=True)
class SequentialRun(Workload):
    """A pipeline on a host thread: no process, no socket. Cancelling the session stops it before its next
    step; a call in flight ends within the gate's per-call timeout (at most the run's deadline)."""

    deadline_grace: ClassVar[float] = DEADLINE_GRACE_SECONDS
    thread: threading.Thread | None = None
    fault: Exception | None = None
    """A host fault in the pipeline's thread; the watch loop's next poll raises it (a host_loop_error)."""

    def run_steps(self, spec: SequentialSpec) -> None:
        session = self.session
        session.begin_call()  # the pipeline is the run's activity: a run is never idle while it works
        try:
            task = session.fetch(PROTOCOL_VERSION)
            gate = session.tools
            assert gate is not None
            outcome = run_pipeline(
                spec.steps,
                loads_strict(task.kwargs_json),
                gate_executor(gate, session),
                deadline=gate.deadline,
                limit_seconds=spec.max_runtime_seconds,
                stopped=lambda: session.cancelled,
            )
            if outcome is not None:
                session.report(pipeline_report(outcome, task.max_result_bytes))
        except CallRefusal:
            pass  # ended from outside (cancelled, or the deadline's backstop): the runner named the ending
        except Exception as exc:  # noqa: BLE001 (a host fault: raised in the runner, never lost)
            logger.warning("sequential run %s failed in the host: %s", self.run_id[:12], type(exc).__name__)
            self.fault = exc
            session.reported.set()
        finally:
            session.end_call()

    def poll(self) -> None:
        if self.fault is not None:
            raise self.fault

    def lost(self) -> bool:
        """No socket to lose: the run directory only holds the crash record."""
        return False

    def _kill(self) -> None:
        """Nothing to kill: the cancelled session stops the thread before its next step."""


class SequentialBackend(UnpooledBackend):
    """Runs sequential orchestration agents on the host: they run no pack code, whatever their trust; none
    is kept warm (a pipeline starts in microseconds)."""

    def prepare(self, admission: Admission) -> SequentialSpec:
        manifest, policy = admission.manifest, admission.policy
        assert manifest is not None and manifest.orchestration is not None and policy is not None
        return SequentialSpec(admission.slug, manifest.orchestration, policy.max_runtime_seconds)

    def launch(
        self,
        spec: SequentialSpec,
        *,
        run_id: str,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
    ) -> SequentialRun:
        if session is None:
            raise ValueError("a sequential run has no warm members: launch it with its session")
        rundir = make_run_dir(run_id, self.owner, self.env)  # its crash record: a host death is audited
        try:
            if run_info is not None:
                rundir.record_run(run_info)
            name = f"agentnode-seq-{run_id[:20]}"
            work = SequentialRun(run_id=run_id, name=name, session=session, rundir=rundir, server=None)
            work.thread = threading.Thread(
                target=work.run_steps, args=(spec,), daemon=True, name=f"sequential-{run_id[:12]}"
            )
            work.thread.start()
        except BaseException:
            rundir.remove()
            raise
        return work

    def teardown(self, workload: Workload) -> None:
        workload.destroy()


__all__ = [
    "CONSUMED_KWARGS",
    "DEADLINE_GRACE_SECONDS",
    "MAX_KEPT_RESULTS_BYTES",
    "MappingError",
    "PipelineOutcome",
    "SequentialBackend",
    "SequentialRun",
    "SequentialSpec",
    "StepExecutor",
    "evaluate_when",
    "gate_executor",
    "initial_input",
    "json_exceeds",
    "kept_step_names",
    "parse_literal",
    "pipeline_report",
    "resolve_mapping",
    "resolve_value",
    "run_pipeline",
    "split_tool",
    "step_name",
]
