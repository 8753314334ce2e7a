"""The controller: an AgentRun is admitted exactly as `run` admits a request, then gets one hardened pod."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import kopf

from host.audit.log import AuditLog
from host.core.errors import AuditReason, EngineError, SandboxError
from host.core.logs import set_run_id
from host.core.terminal import safe_line
from host.k8s.api import KubeApi, KubeError, Ref
from host.k8s.node import HostRoutesRefused
from host.k8s.objects.agentrun import GROUP, MAX_ERROR_CHARS, MAX_HINT_CHARS, PLURAL, VERSION, RunRequest
from host.k8s.objects.names import LABEL_ROLE, ROLE_AGENT_RUN
from host.k8s.objects.pod import owner_reference, pod_for, pod_mismatches, pod_name
from host.k8s.run import (
    TERMINAL_PHASES,
    audit_digest,
    controller_owner,
    refusal_status,
    run_request,
)
from host.policy.admission import Admission, admit
from host.policy.caller import NO_CALLER
from host.runtime.runaudit import RunAudit, RunFacts
from host.spec.config import HostConfig, load_config, sandbox_enabled
from host.spec.lockfile import Lockfile
from host.spec.manifest.model import SLUG_RE

logger = logging.getLogger("agentnode.sandbox.controller")

NOTHING: Final = "nothing"
SCHEDULED: Final = "scheduled"
REFUSED: Final = "refused"
LOST: Final = "lost"
"""What `reconcile` and `pod_changed` did (for tests and logs)."""

POD_SELECTOR = f"{LABEL_ROLE}={ROLE_AGENT_RUN}"
HANDLER_BACKOFF = 2.0
"""Seconds before kopf retries a reconcile the API server failed (the handler retries without limit)."""
POD_EVENT_ATTEMPTS = 3
POD_EVENT_RETRY_SECONDS = 1.0
LOST_ERROR = "the run pod ended before its run started (evicted, deleted, or its node failed)"
LOST_RUNNING_ERROR = "the run pod ended while its run was in progress (evicted, deleted, or its node failed)"
LOST_HINT = "submit the AgentRun again"
_REMEMBERED = 4096
"""Run ids whose audit record this process wrote (an audit-once check that does not read the log)."""
_RUN_IDS = uuid.uuid5(uuid.NAMESPACE_URL, f"https://{GROUP}/controller/run-id")


def controller_run_id(agentrun_uid: str) -> str:
    """The run id of the one audit record the controller may write for an AgentRun (a refusal, or a pod lost
    before its run started): derived from the AgentRun's uid, so a retried handler or a restarted controller
    finds the record it already wrote instead of writing a second one."""
    return uuid.uuid5(_RUN_IDS, agentrun_uid).hex


def _meta(obj: Mapping[str, Any], key: str) -> str:
    value = (obj.get("metadata") or {}).get(key)
    return value if isinstance(value, str) else ""


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _ref(obj: Mapping[str, Any]) -> Ref:
    return Ref(_meta(obj, "namespace"), _meta(obj, "name"))


def _transient(exc: KubeError) -> bool:
    """An API failure worth retrying (no answer, overload, a conflict); any other 4xx is a refusal."""
    return exc.status == 0 or exc.status >= 500 or exc.status in (409, 429)


def _spec_slug(agentrun: Mapping[str, Any]) -> str:
    """The slug for the audit record of a spec that did not validate: only when it is a slug at all."""
    spec = agentrun.get("spec")
    slug = spec.get("slug") if isinstance(spec, Mapping) else None
    return slug if isinstance(slug, str) and SLUG_RE.fullmatch(slug) else ""


class Controller:
    """Admission, pod creation and the controller's audit records; plain sync methods (kopf calls them from
    its thread pool, see `build_registry`), safe to call from several threads at once."""

    def __init__(
        self,
        kube: KubeApi,
        config: HostConfig,
        *,
        env: Mapping[str, str],
        lockfile: Lockfile | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.env: Mapping[str, str] = dict(env)
        self.lockfile = lockfile or Lockfile(config.paths.lockfile)
        self.audit = audit or AuditLog(config.paths.audit_file)
        self.records = RunAudit(self.audit)
        self.audit_failures = 0
        self._mutex = threading.Lock()
        self._audited: OrderedDict[str, None] = OrderedDict()
        self._created: dict[str, str] = {}
        """AgentRun uid -> the uid of the pod this process created for it, until its status records it."""
        self._refusals: dict[str, dict[str, Any]] = {}
        """AgentRun uid -> a refusal audited but not yet in its status (a retry patches the same one)."""

    def close(self) -> None:
        self.audit.close()

    # -- AgentRuns ----------------------------------------------------------------------------------------

    def reconcile(self, agentrun: Mapping[str, Any]) -> str:
        """Admit one AgentRun and make its pod, or refuse it; idempotent (a duplicate event, a retry or a
        restarted controller never makes a second pod or a second audit record). Raises KubeError when the
        API server failed in a way worth retrying."""
        started = time.monotonic()
        current = self.kube.get_agentrun(_ref(agentrun))
        if current is None or not _meta(current, "uid") or _meta(current, "uid") != _meta(agentrun, "uid"):
            with self._mutex:  # deleted (or replaced by another of that name, which has its own events)
                self._refusals.pop(_meta(agentrun, "uid"), None)
                self._created.pop(_meta(agentrun, "uid"), None)
            return NOTHING
        if _meta(current, "deletionTimestamp"):
            return NOTHING
        agentrun, uid, status = current, _meta(current, "uid"), _status(current)
        if status.get("phase") in TERMINAL_PHASES:
            return NOTHING
        if status.get("podUid"):
            return self._check_pod(agentrun)  # its pod may have gone while no controller watched
        with self._mutex:
            decided = self._refusals.get(uid)
        if decided is not None:  # audited by an earlier attempt whose status patch failed
            return self._patch_refusal(agentrun, decided)

        request: RunRequest | None = None
        admission: Admission | None = None
        try:
            request = run_request(agentrun)
            if not SLUG_RE.fullmatch(request.slug):
                raise SandboxError(
                    "the AgentRun's spec is invalid: spec.slug must be a pack slug",
                    reason=AuditReason.CONFIG_INVALID,
                    hint="fix the AgentRun's spec (kubectl explain agentrun.spec) and submit it again",
                )
            admission = admit(
                request.slug,
                lockfile=self.lockfile,
                config=self.config,
                env=self.env,
                runtime=request.runtime,
            )
            if admission.refusal is not None:
                raise admission.refusal
            if not admission.sandboxed:
                _refuse_host_route(admission)
            pod = pod_for(admission, agentrun, self.config)
        except SandboxError as exc:
            return self._refuse(agentrun, exc, started, request, admission)
        except Exception as exc:  # noqa: BLE001 (a host fault fails the run closed, as `run` does)
            logger.warning("AgentRun %s/%s: host loop error (%s)", _meta(agentrun, "namespace"),
                           _meta(agentrun, "name"), type(exc).__name__)  # fmt: skip
            fault = SandboxError(
                f"the host failed while admitting the run ({type(exc).__name__})",
                reason=AuditReason.HOST_LOOP_ERROR,
                hint="see the controller's log; check its config with: agentnode-sandbox doctor",
            )
            return self._refuse(agentrun, fault, started, request, admission)

        try:
            live, created = self.kube.create_pod(pod)
        except KubeError as exc:
            if _transient(exc):
                raise
            # The API server refused the pod itself (the admission policy, a quota, RBAC): fail closed.
            return self._refuse(agentrun, exc, started, request, admission)
        live_uid = _meta(live, "uid")
        with self._mutex:
            ours = self._created.get(uid)
            if created:
                self._created[uid] = live_uid
        if not created:  # a previous attempt's pod, or somebody else's of that name
            problems = pod_mismatches(pod, live)
            if problems or not live_uid or (ours is not None and ours != live_uid):
                logger.warning("AgentRun %s/%s: pod %s refused: it is not the one the controller builds (%s)",
                               _meta(agentrun, "namespace"), _meta(agentrun, "name"), _meta(pod, "name"),
                               ", ".join(problems[:8]) or "another pod of that name")  # fmt: skip
                if live_uid:
                    self.kube.delete_pod(_ref(pod), uid=live_uid)  # that one only, never a later one
                refused = EngineError(
                    "a pod of the run's name existed and was not the one the controller builds (deleted)",
                    reason=AuditReason.POD_REFUSED,
                    hint="run pods are made by the controller only; find who created it, then submit the "
                    "AgentRun again",
                    check="kubernetes",
                )
                return self._refuse(agentrun, refused, started, request, admission)
            # Equal to what we build: adopted (a pod we made before a restart; anyone's identical pod is
            # the same pod, and the node agent checks it again before serving it).
        scheduled = {"phase": "Scheduled", "podName": _meta(live, "name"), "podUid": live_uid,
                     **_observed(agentrun)}  # fmt: skip
        if not self._patch(agentrun, scheduled):
            return NOTHING
        with self._mutex:
            self._created.pop(uid, None)
        logger.info("AgentRun %s/%s: pod %s scheduled", _meta(agentrun, "namespace"), _meta(agentrun, "name"),
                    _meta(live, "name"))  # fmt: skip
        # The pod may have ended between its creation and this status (no pod event names the run then).
        fresh = self.kube.get_agentrun(_ref(agentrun))
        if fresh is not None and _meta(fresh, "uid") == uid:
            if self._check_pod(fresh) == LOST:
                return LOST
        return SCHEDULED

    # -- pods ---------------------------------------------------------------------------------------------

    def pod_changed(self, event_type: str, pod: Mapping[str, Any]) -> str:
        """One run pod's event: a pod that ended before its run did fails its AgentRun (`host_lost`).

        A transient API failure is retried a few times here (kopf does not retry event handlers)."""
        for attempt in range(1, POD_EVENT_ATTEMPTS + 1):
            try:
                return self._pod_changed(event_type, pod)
            except KubeError as exc:
                if attempt == POD_EVENT_ATTEMPTS or not _transient(exc):
                    logger.warning("run pod %s/%s: the API server failed (%s)", _meta(pod, "namespace"),
                                   _meta(pod, "name"), exc.status)  # fmt: skip
                    return NOTHING
                time.sleep(POD_EVENT_RETRY_SECONDS)
        return NOTHING

    def _pod_changed(self, event_type: str, pod: Mapping[str, Any]) -> str:
        if event_type != "DELETED" and _status(pod).get("phase") != "Failed":
            return NOTHING
        owner = controller_owner(pod)
        if owner is None or not _meta(pod, "uid"):
            return NOTHING
        agentrun = self.kube.get_agentrun(Ref(_meta(pod, "namespace"), owner["name"]))
        # An AgentRun deleted mid-run: Kubernetes' garbage collector deletes its pod (ownerReferences), and
        # the node agent, seeing the pod go, ends the run and writes its record. Nothing is left to do here.
        if agentrun is None or _meta(agentrun, "uid") != owner["uid"] or _meta(agentrun, "deletionTimestamp"):
            return NOTHING
        status = _status(agentrun)
        if status.get("podUid") != _meta(pod, "uid"):
            return NOTHING  # not the run's pod (one refused before the run was scheduled)
        phase = status.get("phase")
        if phase == "Scheduled":
            # The node agent never started the run, so no audit record exists: this is its one record.
            return self._lost(agentrun, started=False)
        if phase == "Running":
            # The node agent owns this run's record and reports host_lost itself when it comes back; the
            # status says so now, in case its node is gone for good.
            return self._lost(agentrun, started=True)
        return NOTHING

    def _check_pod(self, agentrun: Mapping[str, Any]) -> str:
        """Whether the pod an AgentRun's status names is still there (`_pod_changed` when it is not)."""
        status = _status(agentrun)
        pod_uid = status.get("podUid")
        if status.get("phase") not in ("Scheduled", "Running") or not isinstance(pod_uid, str):
            return NOTHING
        namespace, name, uid = _meta(agentrun, "namespace"), _meta(agentrun, "name"), _meta(agentrun, "uid")
        live = self.kube.get_pod(Ref(namespace, pod_name(uid)))
        if live is not None and _meta(live, "uid") == pod_uid:
            return self._pod_changed("MODIFIED", live)
        gone = {"metadata": {"name": pod_name(uid), "namespace": namespace, "uid": pod_uid,
                             "ownerReferences": [owner_reference(name, uid)]}}  # fmt: skip
        return self._pod_changed("DELETED", gone)

    def _lost(self, agentrun: Mapping[str, Any], *, started: bool) -> str:
        state = "its run in progress" if started else "its run not started"
        logger.warning("AgentRun %s/%s: its run pod ended (%s)", _meta(agentrun, "namespace"),
                       _meta(agentrun, "name"), state)  # fmt: skip
        if started:
            self._patch(agentrun, refusal_status(AuditReason.HOST_LOST, LOST_RUNNING_ERROR, LOST_HINT))
            return LOST
        run_id = controller_run_id(_meta(agentrun, "uid"))
        request, admission = _readmit(self, agentrun)
        slug, caller = _slug(agentrun, request), request.caller if request is not None else NO_CALLER

        def write() -> bool:
            run = RunFacts(started=time.monotonic(), admission=admission, caller=caller)
            run.fix_id(run_id)
            try:
                return self.records.host_lost({**run.crash_record(), "slug": slug})
            finally:
                set_run_id("")

        digest = self._audit_once(run_id, write)
        status = {**refusal_status(AuditReason.HOST_LOST, LOST_ERROR, LOST_HINT), "runId": run_id,
                  "auditDigest": digest or None}  # fmt: skip
        self._patch(agentrun, status)
        return LOST

    # -- refusals and audit -------------------------------------------------------------------------------

    def _refuse(
        self,
        agentrun: Mapping[str, Any],
        error: SandboxError,
        started: float,
        request: RunRequest | None,
        admission: Admission | None,
    ) -> str:
        """Fail the run before it started: its one audit record (as `run` writes a refusal's), then its
        status. Fixed wording only: the spec's text is never quoted."""
        uid = _meta(agentrun, "uid")
        run_id = controller_run_id(uid)
        slug, caller = _slug(agentrun, request), request.caller if request is not None else NO_CALLER

        def write() -> bool:
            run = RunFacts(started=started, admission=admission, caller=caller)
            run.fix_id(run_id, placed=False)
            try:
                return self.records.end(
                    run, slug=slug, reason=error.reason, success=False,
                    duration_ms=int((time.monotonic() - started) * 1000), timed_out=False,
                )  # fmt: skip
            finally:
                set_run_id("")

        logger.warning("AgentRun %s/%s refused: %s", _meta(agentrun, "namespace"), _meta(agentrun, "name"),
                       error.reason.value)  # fmt: skip
        digest = self._audit_once(run_id, write)
        status = {
            **refusal_status(error.reason, error.message[:MAX_ERROR_CHARS], error.hint[:MAX_HINT_CHARS]),
            "runId": run_id,
            "auditDigest": digest or None,
            **_observed(agentrun),
        }
        with self._mutex:
            self._refusals[uid] = status
            self._created.pop(uid, None)
        return self._patch_refusal(agentrun, status)

    def _patch_refusal(self, agentrun: Mapping[str, Any], status: Mapping[str, Any]) -> str:
        self._patch(agentrun, status)
        with self._mutex:
            self._refusals.pop(_meta(agentrun, "uid"), None)
        return REFUSED

    def _audit_once(self, run_id: str, write: Callable[[], bool]) -> str:
        """Write a run's record unless this process or the log already has it; the digest of its line ("" if
        it is not in the log's tail, e.g. still pending because the log cannot be written)."""
        path = self.audit.path
        with self._mutex:
            if run_id not in self._audited and not audit_digest(path, run_id):
                if not write():
                    self.audit_failures += 1
                    logger.warning(
                        "the audit log cannot be written (run %s); the record is kept pending", run_id
                    )
                self._audited[run_id] = None
                while len(self._audited) > _REMEMBERED:
                    self._audited.popitem(last=False)
            return audit_digest(path, run_id)

    def _patch(self, agentrun: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """Patch the AgentRun's status; False when it is gone (nothing is left to report to)."""
        try:
            self.kube.patch_agentrun_status(_ref(agentrun), status)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _slug(agentrun: Mapping[str, Any], request: RunRequest | None) -> str:
    """The slug an audit record names: the request's when it is a slug at all, else the spec's (or "")."""
    if request is not None and SLUG_RE.fullmatch(request.slug):
        return request.slug
    return _spec_slug(agentrun)


def _observed(agentrun: Mapping[str, Any]) -> dict[str, Any]:
    generation = (agentrun.get("metadata") or {}).get("generation")
    return {"observedGeneration": generation} if isinstance(generation, int) and generation >= 0 else {}


def _refuse_host_route(admission: Admission) -> None:
    """A route that is not sandboxed (a trusted pack, or a sequential orchestration, which runs on the host):
    refused with the node agent's own refusal, since a cluster serves sandboxed runs only."""
    HostRoutesRefused().prepare(admission)
    raise AssertionError("HostRoutesRefused.prepare always raises")  # pragma: no cover


def _readmit(
    controller: Controller, agentrun: Mapping[str, Any]
) -> tuple[RunRequest | None, Admission | None]:
    """The request and admission of a run lost before it started, for its audit record (best effort)."""
    try:
        request = run_request(agentrun)
    except SandboxError:
        return None, None
    try:
        admission = admit(request.slug, lockfile=controller.lockfile, config=controller.config,
                          env=controller.env, runtime=request.runtime)  # fmt: skip
    except Exception:  # noqa: BLE001 (the record is written without what admission would have added)
        admission = None
    return request, admission


# --- kopf ------------------------------------------------------------------------------------------------


def operator_settings() -> kopf.OperatorSettings:
    """kopf's settings for the controller: one controller (standalone), no Events, no copy of the spec in
    kopf's annotations (its size would count twice against the object's limit), run pods selected by the API
    server, short retries."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.posting.enabled = False
    # kopf keeps "what it last handled" to tell a new AgentRun from a resumed one; the spec is immutable, so
    # nothing of it is needed there (and a goal or kwargs must never be copied anywhere).
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(ignored_fields=["spec"])
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()  # status is our contract only
    settings.watching.label_selectors["v1", "pods"] = POD_SELECTOR
    settings.watching.server_timeout = 300
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    settings.networking.error_backoffs = (1, 2, 5, 10)
    settings.execution.default_backoff = HANDLER_BACKOFF
    settings.queueing.error_delays = (1, 2, 5, 10, 30)
    return settings


def quiet_kopf_logging() -> None:
    """kopf's DEBUG lines quote whole objects (an AgentRun's goal and kwargs among them): its loggers stop at
    INFO, whatever the host's own log level."""
    kopf_logger = logging.getLogger("kopf")
    if kopf_logger.level < logging.INFO:
        kopf_logger.setLevel(logging.INFO)


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return {key: body[key] for key in body}


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    """kopf's handlers, wired to the controller's sync methods (no login handler: the caller adds one)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="admit", registry=registry, backoff=HANDLER_BACKOFF,
                    errors=kopf.ErrorsMode.TEMPORARY)  # fmt: skip
    @kopf.on.create(GROUP, VERSION, PLURAL, id="admit", registry=registry, backoff=HANDLER_BACKOFF,
                    errors=kopf.ErrorsMode.TEMPORARY)  # fmt: skip
    def agentrun_seen(body: kopf.Body, **_: Any) -> None:
        try:
            controller.reconcile(_plain(body))
        except KubeError as exc:
            raise kopf.TemporaryError(
                f"the API server failed ({exc.status}); retrying", delay=HANDLER_BACKOFF
            ) from None

    @kopf.on.event("", "v1", "pods", id="run-pod", labels={LABEL_ROLE: ROLE_AGENT_RUN}, registry=registry)
    def run_pod_seen(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        kind = event.get("type") if isinstance(event, Mapping) else None
        controller.pod_changed(kind if isinstance(kind, str) else "ADDED", _plain(body))

    return registry


def _fail(message: str, hint: str, code: int = 1) -> int:
    sys.stderr.write(f"error: {safe_line(message)} (next: {safe_line(hint)})\n")
    sys.stderr.flush()
    return code


def run_controller(
    env: Mapping[str, str],
    *,
    namespaces: Sequence[str] = (),
    clusterwide: bool = False,
    stop: threading.Event | None = None,
    kube: KubeApi | None = None,
    login: Callable[..., kopf.ConnectionInfo | None] | None = None,
) -> int:
    """Run the controller until `stop` is set (or SIGINT/SIGTERM in the main thread); 0 on a clean stop.

    Fails closed before watching anything: an unusable config, lockfile, audit log, cluster or login is one
    line on stderr (the problem and the next step) and a non-zero exit. `login` is kopf's login handler
    (default: kopf's own, in-cluster or kubeconfig); `kube` the controller's client (default: the same)."""
    if not namespaces and not clusterwide:
        return _fail(
            "no namespace to serve", "name them (--namespace NS, repeatable) or pass --all-namespaces", 2
        )
    try:
        config = load_config(env)
        sandbox_enabled(config, env)  # a malformed flag fails here, not once per run
        lockfile = Lockfile(config.paths.lockfile)
        lockfile.entries()
    except SandboxError as exc:
        return _fail(exc.message, exc.hint)
    audit = AuditLog(config.paths.audit_file)
    own_kube = kube is None
    try:
        try:
            audit.open()
        except OSError as exc:
            return _fail(f"the audit log {config.paths.audit_file} cannot be written ({type(exc).__name__})",
                         RunAudit(audit).hint)  # fmt: skip
        try:
            if kube is None:
                kube = KubeApi.connect()
            kube.list_pods(
                label_selector=POD_SELECTOR, field_selector="metadata.name=agentnode-controller-probe"
            )
        except KubeError as exc:
            return _fail(exc.message, exc.hint)
        settings = operator_settings()
        sign_in = login or kopf.login_via_client
        try:  # kopf retries a failing login for ever: try it once here first
            credentials = sign_in(
                logger=logging.getLogger("kopf.activities.authentication"), settings=settings
            )
        except Exception:  # noqa: BLE001 (any failure to log in is the same refusal to start)
            credentials = None
        if credentials is None:
            return _fail("the controller cannot log in to the cluster",
                         "run it with its service account (deploy/) or a working KUBECONFIG")  # fmt: skip

        quiet_kopf_logging()
        controller = Controller(kube, config, env=env, lockfile=lockfile, audit=audit)
        registry = build_registry(controller)
        kopf.on.login(registry=registry)(sign_in)
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry, settings=settings, standalone=True, clusterwide=clusterwide,
                    namespaces=list(namespaces), stop_flag=stop if stop is not None else threading.Event(),
                )
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 (one line, never a traceback: the operator cannot go on)
            return _fail(
                f"the controller stopped: {type(exc).__name__}",
                "check the cluster (kubectl get --raw /readyz) and the controller's RBAC (deploy/)",
            )
        return 0
    finally:
        audit.close()
        if own_kube and kube is not None:
            kube.close()


__all__ = [
    "LOST",
    "LOST_ERROR",
    "LOST_HINT",
    "LOST_RUNNING_ERROR",
    "NOTHING",
    "POD_SELECTOR",
    "REFUSED",
    "SCHEDULED",
    "Controller",
    "build_registry",
    "controller_run_id",
    "operator_settings",
    "quiet_kopf_logging",
    "run_controller",
]
