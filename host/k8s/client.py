"""`run --backend kubernetes`: submit an AgentRun, follow it to its end, hand back the `run --json` contract.

The cluster runs the agent (docs/kubernetes.md): the controller admits the AgentRun and makes its pod, the
node agent serves it and writes the result into the AgentRun's status. This side only creates the object,
watches it (a dropped or expired watch is watched again, never in a busy loop) and turns its terminal status
into exactly what a local `run --json` prints. A run that outlives its wait, or a Ctrl-C, deletes the
AgentRun (its pod goes with it), so nothing is left behind.

What the cluster sends is input: KubeApi bounds every read, and the status is held to its schema's types and
bounds again (run.run_result) before it becomes a result. Nothing here logs or prints the goal, the kwargs or
the result; progress is the phase names only.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import config as k8s_config

from host.core.errors import AuditReason
from host.core.vocab import Runtime
from host.k8s.api import KubeApi, KubeError, Ref, WatchExpired, unusable_configuration
from host.k8s.objects.agentrun import (
    MAX_AGENTRUN_NAME_CHARS,
    MAX_GOAL_CHARS,
    MAX_KWARGS_JSON_CHARS,
    PHASES,
    RunRequest,
    agentrun,
)
from host.k8s.objects.names import NAMESPACE, is_dns_label
from host.k8s.objects.pod import POD_START_GRACE_SECONDS
from host.k8s.run import RUN_ID, RUN_PATH, TERMINAL_PHASES, run_result
from host.spec.config import DEFAULT_MAX_RUNTIME_SECONDS
from host.spec.manifest.model import SLUG_RE

DEFAULT_NAMESPACE = "default"
"""Where an AgentRun goes when neither --namespace nor the kubeconfig context (or the pod) names one."""
WAIT_MARGIN_SECONDS = 60
DEFAULT_WAIT_SECONDS = DEFAULT_MAX_RUNTIME_SECONDS + POD_START_GRACE_SECONDS + WAIT_MARGIN_SECONDS
"""How long a client waits by default: the longest run a host allows, its pod's start grace, a margin."""
MAX_WAIT_SECONDS = 7 * 24 * 3600
WATCH_SECONDS = 60
"""One watch's server-side timeout; the AgentRun is read again and watched anew after each."""
MIN_WATCH_SECONDS = 1.0
"""A watch that ended sooner than this is followed by a backoff pause before the next (no busy loop)."""
BACKOFF_SECONDS = (0.2, 5.0)
"""The first and the longest pause between watches that end at once or fail."""
MAX_CONSECUTIVE_FAILURES = 6
"""Transient API failures (no answer, 429, 5xx) in a row, with no read of the AgentRun between them, before
the client gives up (and deletes the run)."""
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_HEX_SUFFIX_CHARS = 8


class InvalidAgentRun(ValueError):
    """The request cannot be an AgentRun (nothing was sent); the message names the field and the bound,
    never the value."""


class RunCancelled(KeyboardInterrupt):
    """Ctrl-C while waiting: the AgentRun was deleted (or, if that failed, `result` says so); `result` is the
    run object of a cancelled run (`error_code` "cancelled")."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("cancelled")
        self.result = result


def agentrun_name(slug: str) -> str:
    """A fresh AgentRun name for a run of `slug`: `<slug as a DNS label>-<8 hex>`, at most 63 characters."""
    stem = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", slug.lower())).strip("-")
    stem = stem[: MAX_AGENTRUN_NAME_CHARS - _HEX_SUFFIX_CHARS - 1].rstrip("-") or "run"
    return f"{stem}-{secrets.token_hex(_HEX_SUFFIX_CHARS // 2)}"


def agentrun_body(name: str, namespace: str, request: RunRequest) -> dict[str, Any]:
    """The AgentRun `agentrun(...)` builds, refused with InvalidAgentRun where the CRD would refuse it."""
    if not is_dns_label(namespace):
        raise InvalidAgentRun("the namespace must be a DNS label (1-63 of a-z 0-9 -)")
    if not is_dns_label(name):
        raise InvalidAgentRun(
            f"an AgentRun name must be a DNS label (1-{MAX_AGENTRUN_NAME_CHARS} of a-z 0-9 -)"
        )
    if not SLUG_RE.fullmatch(request.slug):
        raise InvalidAgentRun(f"SLUG must be a pack slug ({SLUG_RE.pattern})")
    if request.runtime is not None and str(request.runtime) not in (Runtime.RUNSC.value, Runtime.RUNC.value):
        raise InvalidAgentRun("a cluster run's runtime is runsc or runc")
    if request.goal is not None and len(request.goal) > MAX_GOAL_CHARS:
        raise InvalidAgentRun(f"the goal is longer than an AgentRun carries ({MAX_GOAL_CHARS} characters)")
    try:
        body = agentrun(name, namespace, request)
    except (TypeError, ValueError):
        raise InvalidAgentRun("the kwargs must be JSON values (finite numbers only)") from None
    if len(body["spec"].get("kwargsJson", "")) > MAX_KWARGS_JSON_CHARS:
        raise InvalidAgentRun(
            f"the kwargs are longer than an AgentRun carries ({MAX_KWARGS_JSON_CHARS} characters of JSON)"
        )
    return body


# -- connecting --------------------------------------------------------------------------------------------


def connect(*, kubeconfig: str | None = None, context: str | None = None) -> tuple[KubeApi, str]:
    """An API client (KubeApi.connect) and the namespace runs go to by default (the context's, the pod's,
    else "default"). Raises KubeError when no configuration works."""
    kube = KubeApi.connect(kubeconfig=kubeconfig, context=context)
    if kube.in_cluster:
        return kube, _pod_namespace()
    try:
        return kube, _context_namespace(kubeconfig, context)
    except Exception as exc:  # noqa: BLE001 (a kubeconfig is user input: any failure is "not usable")
        kube.close()
        raise unusable_configuration(exc) from None


def _pod_namespace() -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            value = f.read(256).strip()
    except OSError:
        return DEFAULT_NAMESPACE
    return value if is_dns_label(value) else DEFAULT_NAMESPACE


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    contexts, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    chosen = active
    if context is not None:
        chosen = next((c for c in contexts or [] if isinstance(c, dict) and c.get("name") == context), None)
    value = ((chosen or {}).get("context") or {}).get("namespace") if isinstance(chosen, dict) else None
    return value if isinstance(value, str) and is_dns_label(value) else DEFAULT_NAMESPACE


# -- following one AgentRun --------------------------------------------------------------------------------


class _Gone(Exception):
    """Our AgentRun is gone (deleted, or its name now holds another object)."""


@dataclass
class _Follower:
    """What has been seen of one AgentRun: its uid (the one we created), its phase and run id."""

    uid: str
    on_phase: Callable[[str], None] | None
    phase: str = ""
    run_id: str = ""

    def see(self, kind: str, obj: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The AgentRun when its phase is terminal, else None (a new phase is reported); raises _Gone."""
        if kind == "BOOKMARK":
            return None
        meta = obj.get("metadata") if obj is not None else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if kind == "DELETED" or obj is None or (self.uid and uid != self.uid):
            raise _Gone
        status = obj.get("status")
        status = status if isinstance(status, dict) else {}
        run_id = status.get("runId")
        if isinstance(run_id, str) and RUN_ID.fullmatch(run_id):
            self.run_id = run_id
        phase = status.get("phase") or "Pending"  # no status yet: not admitted yet
        if phase not in PHASES:
            return None  # a value outside the contract is never repeated, only waited past
        if phase != self.phase:
            self.phase = phase
            if self.on_phase is not None:
                self.on_phase(phase)
        return obj if phase in TERMINAL_PHASES else None


def _transient(exc: KubeError) -> bool:
    return isinstance(exc, WatchExpired) or exc.status in (0, 429) or exc.status >= 500


def _close(events: Iterator[Any]) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()


def _follow(
    kube: KubeApi, ref: Ref, follower: _Follower, deadline: float, sleep: Callable[[float], None]
) -> Mapping[str, Any] | None:
    """The terminal AgentRun, or None when `deadline` (monotonic) passed first; raises _Gone, KubeError."""
    failures = 0
    backoff = BACKOFF_SECONDS[0]
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        started = time.monotonic()
        failed = False
        try:
            events = kube.watch_agentrun(
                ref, timeout_seconds=min(WATCH_SECONDS, max(1, math.ceil(remaining)))
            )
            try:
                for kind, obj in events:
                    failures = 0
                    done = follower.see(kind, obj)
                    if done is not None:
                        return done
                    if time.monotonic() >= deadline:
                        return None
            finally:
                _close(events)
        except KubeError as exc:  # WatchExpired (410) included: read it again, watch anew
            if not _transient(exc):
                raise
            failures, failed = failures + 1, True
            if failures >= MAX_CONSECUTIVE_FAILURES:
                raise
        # The watch ended (its timeout, a dropped stream, an expired or broken watch): read it again.
        try:
            current = kube.get_agentrun(ref)
        except KubeError as exc:
            if not _transient(exc):
                raise
            failures, failed = failures + 1, True
            if failures >= MAX_CONSECUTIVE_FAILURES:
                raise
        else:
            failures = 0  # it answers: watches that keep breaking become polling, backed off
            done = follower.see("MODIFIED", current)
            if done is not None:
                return done
        if failed or time.monotonic() - started < MIN_WATCH_SECONDS:
            sleep(max(0.0, min(backoff, deadline - time.monotonic())))
            backoff = min(backoff * 2, BACKOFF_SECONDS[1])
        else:
            backoff = BACKOFF_SECONDS[0]


def _last_look(kube: KubeApi, ref: Ref, follower: _Follower) -> Mapping[str, Any] | None:
    """The AgentRun if it is terminal by now (read once more before it is deleted), else None."""
    try:
        return follower.see("MODIFIED", kube.get_agentrun(ref))
    except (KubeError, _Gone):
        return None


def _delete(kube: KubeApi, ref: Ref) -> bool:
    """Delete the AgentRun (its pod goes with it); True when it is gone. A second Ctrl-C during the call
    is taken as urgency, not as leave to skip it: the call is made once more."""
    for attempt in range(2):
        try:
            kube.delete_agentrun(ref)
            return True
        except KubeError:
            return False
        except KeyboardInterrupt:
            if attempt:
                return False
    return False


# -- results -----------------------------------------------------------------------------------------------


def _failure(error: str, code: AuditReason, hint: str, *, run_id: str, started: float,
             timed_out: bool = False) -> dict[str, Any]:  # fmt: skip
    return {
        "success": False,
        "result": None,
        "error": error,
        "error_code": code.value,
        "mode_used": "",
        "run_id": run_id,
        "timed_out": timed_out,
        "duration_ms": int((time.monotonic() - started) * 1000),
        "hint": hint,
        "logs": "",
        "path": RUN_PATH,
    }


def _left_behind(ref: Ref) -> str:
    return f"delete it: kubectl -n {ref.namespace} delete agentrun {ref.name}"


# -- the client --------------------------------------------------------------------------------------------


def submit_and_wait(
    kube: KubeApi,
    request: RunRequest,
    *,
    namespace: str,
    name: str | None = None,
    timeout: float,
    on_phase: Callable[[str], None] | None = None,
    on_created: Callable[[Ref], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Create an AgentRun for `request`, wait for its end and return the `run --json` object of a local run.

    `name` defaults to `agentrun_name(request.slug)` (a Ctrl-C during the create deletes only such a name: a
    given one may be someone else's). `on_created` hears the AgentRun's address once it exists; `on_phase`
    each new phase (Pending, Scheduled, Running, Succeeded, Failed), nothing else. When `timeout` seconds pass
    first, the AgentRun is deleted and the result is a failed run with `error_code` "timeout"; a Ctrl-C
    deletes it too and raises RunCancelled (a KeyboardInterrupt) holding the cancelled run's object.
    Raises InvalidAgentRun before sending anything when the request cannot be an AgentRun, and KubeError
    when the API refuses or stops answering (the AgentRun, once created, is deleted then; the error names
    it if that failed too).
    """
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_WAIT_SECONDS):
        raise InvalidAgentRun(f"the wait must be more than 0 and at most {MAX_WAIT_SECONDS} seconds")
    generated = name is None
    name = name if name is not None else agentrun_name(request.slug)
    body = agentrun_body(name, namespace, request)
    ref = Ref(namespace, name)
    started = time.monotonic()
    try:
        created = kube.create_agentrun(body)
    except KeyboardInterrupt:
        # The request may have reached the server. A name made here is ours alone, so it can be deleted; a
        # given one may name someone else's AgentRun (the create would have failed), so it is left alone.
        gone = generated and _delete(kube, ref)
        raise RunCancelled(
            _failure(
                "the run was cancelled (interrupted) while its AgentRun was being created"
                + ("; it was deleted" if gone else ""),
                AuditReason.CANCELLED,
                "nothing is left on the cluster; run it again when wanted"
                if gone
                else f"check whether it exists: kubectl -n {ref.namespace} get agentrun {ref.name}",
                run_id="",
                started=started,
            )
        ) from None
    uid = (created.get("metadata") or {}).get("uid")
    follower = _Follower(uid if isinstance(uid, str) else "", on_phase)
    try:
        if on_created is not None:
            on_created(ref)
        follower.see("ADDED", created)
        done = _follow(kube, ref, follower, started + timeout, sleep)
    except _Gone:
        return _failure(
            "the AgentRun was deleted on the cluster before its run finished",
            AuditReason.CANCELLED,
            "someone (or a namespace deletion) removed it; submit the run again",
            run_id=follower.run_id,
            started=started,
        )
    except KeyboardInterrupt:
        gone = _delete(kube, ref)
        raise RunCancelled(
            _failure(
                "the run was cancelled (interrupted); its AgentRun was deleted, and its pod with it"
                if gone
                else "the run was cancelled (interrupted), but its AgentRun could not be deleted",
                AuditReason.CANCELLED,
                "nothing is left on the cluster; run it again when wanted" if gone else _left_behind(ref),
                run_id=follower.run_id,
                started=started,
            )
        ) from None
    except KubeError as exc:
        if _delete(kube, ref):
            exc.message = f"{exc.message}; the AgentRun was deleted"
        else:
            exc.message = f"{exc.message}; the AgentRun {ref.namespace}/{ref.name} may be left behind"
            exc.hint = f"{exc.hint}; then {_left_behind(ref)}"
        exc.args = (exc.message,)
        raise
    except BaseException:
        _delete(kube, ref)
        raise
    if done is not None:
        return run_result(done)
    last = _last_look(kube, ref, follower)
    if last is not None:
        return run_result(last)  # it ended just as the wait did
    gone = _delete(kube, ref)
    wait = f"{timeout:g}"
    return _failure(
        f"the run did not finish within {wait} s of waiting; its AgentRun was deleted, and its pod with it"
        if gone
        else f"the run did not finish within {wait} s of waiting, and its AgentRun could not be deleted",
        AuditReason.TIMEOUT,
        (
            "wait longer (run --wait-seconds), or check that the controller and node agent run: "
            f"kubectl -n {NAMESPACE} get pods"
        )
        if gone
        else _left_behind(ref),
        run_id=follower.run_id,
        started=started,
        timed_out=True,
    )


__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_WAIT_SECONDS",
    "MAX_WAIT_SECONDS",
    "InvalidAgentRun",
    "RunCancelled",
    "agentrun_body",
    "agentrun_name",
    "connect",
    "is_dns_label",
    "submit_and_wait",
]
