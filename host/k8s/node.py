"""The node agent: serves each run pod on its node over the pod's own socket, with the same gate, broker and
caps as a single host, and trusts nothing the pod, its labels or its annotations claim.

A run pod is served only when the AgentRun that controls it exists, names this very pod (its uid, recorded
by the controller) and the pod is exactly what the controller would build from that AgentRun under this
node's own config and lockfile (`pod_mismatches`); anything else is deleted unserved. The run itself goes
through `SandboxHost.run` (admission, policy, audit), with `PodBackend` as its sandbox backend.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from host.core.errors import AuditReason, EngineError, SandboxError
from host.core.owner import owner_token
from host.engine.contract import SANDBOX_GID, SANDBOX_UID
from host.k8s.api import KubeApi, KubeError, Ref, WatchExpired
from host.k8s.objects.names import LABEL_ROLE, PACK_HOST_DIR, ROLE_AGENT_RUN, RUN_DIR_PREFIX, RUN_HOST_DIR
from host.k8s.objects.pod import pod_for, pod_mismatches
from host.k8s.run import (
    TERMINAL_PHASES,
    audit_digest,
    controller_owner,
    refusal_status,
    run_request,
    status_for,
)
from host.packs.files import SKIP_DIRS, SKIP_SUFFIXES, artifact_hash
from host.policy.admission import Admission
from host.runtime.result import RunResult
from host.runtime.rundir import RunDir, run_root
from host.runtime.runner import SandboxHost
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession
from host.runtime.workload import Workload
from host.spec.config import HostConfig, load_config
from host.spec.lockfile import LockEntry

logger = logging.getLogger("agentnode.sandbox.node")

_placement: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("agentnode_pod", default=None)
WATCH_SECONDS = 60
MAX_PODS_IN_FLIGHT = 64
"""Run pods a node agent verifies and serves at once (one thread each); more wait their turn."""
RECORD_WAIT_SECONDS = 10.0
"""How long a pod whose AgentRun has not recorded it yet is waited for (the controller records it right after
it creates it)."""
RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class Placement:
    """The pod a run is being served in, and the AgentRun that asked for it (both as read from the API)."""

    pod: Mapping[str, Any]
    agentrun: Mapping[str, Any]

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def ref(self) -> Ref:
        return Ref(str(self.pod["metadata"]["namespace"]), str(self.pod["metadata"]["name"]))


@contextlib.contextmanager
def placed(placement: Placement) -> Iterator[None]:
    """Serve the runs started in this block (on this thread) in `placement`'s pod."""
    token = _placement.set(placement)
    try:
        yield
    finally:
        _placement.reset(token)


class PackStore:
    """Packs as the node holds them: `<PACK_HOST_DIR>/<digest>/`, verified by hash before a pod may use them
    (a tree that changed since it was verified is verified again; one that fails stays unused)."""

    def __init__(self, root: Path = Path(PACK_HOST_DIR)) -> None:
        self.root = root
        self._verified: dict[str, str] = {}
        self._lock = threading.Lock()

    def verify(self, entry: LockEntry) -> None:
        digest = entry.volume_digest.removeprefix("sha256:")
        if entry.requirements:
            raise EngineError(
                "packs with Python requirements are not placed on Kubernetes nodes yet",
                reason=AuditReason.VOLUME_MISSING,
                hint="run this pack on a single host (agentnode-sandbox run) for now; see docs/kubernetes.md",
                check="packs",
            )
        path = self.root / digest
        try:
            stamp = _tree_stamp(path)
            with self._lock:
                if self._verified.get(digest) == stamp:
                    return
            ok = stamp != "" and artifact_hash(path) == entry.artifact_hash and _tree_stamp(path) == stamp
        except (OSError, SandboxError):
            ok = False
        if not ok:
            raise EngineError(
                f"the pack {entry.slug} is not on this node, or its files do not match the lockfile",
                reason=AuditReason.VOLUME_STALE if path.exists() else AuditReason.VOLUME_MISSING,
                hint=f"place the pack's files in {path} on every node (docs/kubernetes.md, Packs)",
                check="packs",
            )
        with self._lock:
            self._verified[digest] = stamp


def _tree_stamp(root: Path) -> str:
    """A fingerprint of every entry under `root` (path, inode, mode, size, times), or "" when the tree holds
    what its hash does not cover (unhashed debris, links, devices) or what others could change (an entry
    not root's, or writable by group or others). Verification is redone whenever it changes."""
    paths = [str(root)]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        paths += [os.path.join(dirpath, name) for name in sorted([*dirnames, *filenames])]
    h = hashlib.sha256()
    for full in paths:
        st = os.lstat(full)
        name = os.path.basename(full)
        # what the hash passes over would be mounted into the pod unverified (a .pyc runs): refused here
        debris = name in SKIP_DIRS or name.endswith((*SKIP_SUFFIXES, ".egg-info"))
        unhashed = full != str(root) and debris
        plain = stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
        if unhashed or not plain or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return ""
        line = f"{os.path.relpath(full, root)}\0{st.st_ino}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}"
        h.update(f"{line}\0{st.st_ctime_ns}\n".encode(errors="surrogateescape"))
    return h.hexdigest()


@dataclass(kw_only=True)
class PodWorkload(Workload):
    """A run pod wired to its socket; the node agent's pod watch tells it when its container ends."""

    kube: KubeApi
    ref: Ref
    pod_uid: str
    terminated: dict[str, Any] = field(default_factory=dict)
    deadline_grace: ClassVar[float] = 5.0

    def pod_changed(self, kind: str, pod: Mapping[str, Any]) -> None:
        """A watch event for this pod: a terminated container, a finished or deleted pod end the workload."""
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            terminated = ((cs or {}).get("state") or {}).get("terminated")
            if isinstance(terminated, dict) and (cs or {}).get("name") == "agent":
                self.terminated = terminated
                code = terminated.get("exitCode")
                self.exited_with(code if isinstance(code, int) else -1)
                return
        if kind == "DELETED" or status.get("phase") in ("Succeeded", "Failed"):
            self.exited_with(-1)

    def oom_killed(self) -> bool:
        return self.terminated.get("reason") == "OOMKilled"

    def _kill(self) -> None:
        """Delete the pod (this uid only: never a later pod of the same name)."""
        self.kube.delete_pod(self.ref, uid=self.pod_uid)


class PodBackend:
    """The sandbox backend of a node agent: the workload is the pod the controller made; this backend
    verifies it and its pack, and serves its socket in the pod's host directory."""

    def __init__(
        self, kube: KubeApi, config: HostConfig, *, env: Mapping[str, str], packs: PackStore
    ) -> None:
        self.kube, self.config, self.env, self.packs = kube, config, env, packs
        self.owner = owner_token()
        self.live: dict[str, PodWorkload] = {}
        self._lock = threading.Lock()

    def claim(self, admission: Admission) -> Workload | None:
        return None  # a pod is made per run by the controller: nothing is kept warm on a node

    def prepare(self, admission: Admission) -> Placement:
        placement = _placement.get()
        if placement is None:
            raise EngineError(
                "this host serves runs only in the pods the controller makes",
                reason=AuditReason.HOST_LOOP_ERROR,
                hint="submit an AgentRun (agentnode-sandbox run --backend kubernetes)",
                check="kubernetes",
            )
        assert admission.entry is not None
        self.packs.verify(admission.entry)
        problems = pod_mismatches(pod_for(admission, placement.agentrun, self.config), placement.pod)
        if problems:
            logger.warning("run pod %s refused: it differs from what the controller builds in %s",
                           placement.ref.name, ", ".join(problems[:8]))  # fmt: skip
            raise EngineError(
                "the run pod is not the one the controller would build for this AgentRun",
                reason=AuditReason.POD_REFUSED,
                hint="run pods are made by the controller only; check the admission policy (deploy/)",
                check="kubernetes",
            )
        return placement

    def launch(
        self,
        spec: Placement,
        *,
        run_id: str,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
    ) -> PodWorkload:
        """Make the pod's socket (its directory is the pod's subPathExpr mount) and serve the session."""
        assert session is not None
        t0 = time.monotonic()
        rundir = RunDir(run_root(self.env) / f"{RUN_DIR_PREFIX}{spec.uid}")
        rundir.path.mkdir(mode=0o700, exist_ok=True)  # the kubelet may have made it already (root, empty)
        for stale in rundir.path.iterdir():  # nothing but our socket belongs there
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        rundir.owner_file.write_text(self.owner)
        if run_info is not None:
            rundir.record_run(run_info)
        server = build_run_server(session, str(rundir.socket_path))
        work = PodWorkload(
            run_id=run_id, name=spec.ref.name, session=session, rundir=rundir, server=server,
            launched_at=t0, kube=self.kube, ref=spec.ref, pod_uid=spec.uid,
        )  # fmt: skip
        try:
            server.start()
            rundir.grant(SANDBOX_UID, SANDBOX_GID)
            work.mark("socket_ready")
        except BaseException:
            work.destroy()
            raise
        with self._lock:
            self.live[spec.uid] = work
        # From here the watch's events reach the workload; one that came before (an eviction while the
        # run was being admitted) did not, so the pod is read once now: it may have ended meanwhile.
        current: Mapping[str, Any] | None
        try:
            current = self.kube.get_pod(spec.ref)
        except KubeError:
            current = spec.pod  # the API is down: the watch (once back) or the deadline ends the run
        if current is None or _meta(current, "uid") != spec.uid:
            work.pod_changed("DELETED", spec.pod)
        else:
            work.pod_changed("MODIFIED", current)
        return work

    def teardown(self, workload: Workload) -> None:
        with self._lock:
            for uid, work in list(self.live.items()):
                if work is workload:
                    del self.live[uid]
        workload.destroy()

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        with self._lock:
            work = self.live.get(str((pod.get("metadata") or {}).get("uid") or ""))
        if work is not None:
            work.pod_changed(kind, pod)


class HostRoutesRefused:
    """A node agent's host-route backend: a trusted pack would run as a process of the node agent itself
    (root, with the node's directories), so on a cluster every run is sandboxed or refused."""

    def claim(self, admission: Admission) -> Workload | None:
        return None

    def prepare(self, admission: Admission) -> None:
        raise EngineError(
            "only sandboxed runs are served on Kubernetes; this pack's route runs it on the host",
            reason=AuditReason.REFUSED_TRUST,
            hint="run trusted packs on a single host (agentnode-sandbox run), or install it as community",
            check="kubernetes",
        )

    def launch(self, spec: None, *, run_id: str, session: RunSession | None = None,
               run_info: Mapping[str, object] | None = None) -> Workload:  # fmt: skip
        raise AssertionError("prepare always refuses")

    def teardown(self, workload: Workload) -> None:
        workload.destroy()


def _meta(obj: Mapping[str, Any], key: str) -> str:
    value = (obj.get("metadata") or {}).get(key)
    return value if isinstance(value, str) else ""


class NodeAgent:
    """Watches the run pods scheduled to one node and serves each once, on its own thread."""

    def __init__(self, host: SandboxHost, kube: KubeApi, backend: PodBackend, node: str) -> None:
        self.host, self.kube, self.backend, self.node = host, kube, backend, node
        self.handled: set[str] = set()
        self.threads: list[threading.Thread] = []
        self.slots = threading.BoundedSemaphore(MAX_PODS_IN_FLIGHT)
        self._lock = threading.Lock()
        self.selector = f"{LABEL_ROLE}={ROLE_AGENT_RUN}"
        self.field_selector = f"spec.nodeName={node}"

    def run(self, stop: threading.Event) -> None:
        """Recover, then list and watch until `stop`; a broken or expired watch lists again."""
        done = threading.Event()

        def abort_on_stop() -> None:
            # Until this loop has returned: a watch opened just after `stop` (the loop was listing when it
            # came) is aborted too, instead of being waited out for WATCH_SECONDS.
            stop.wait()
            while not done.is_set():
                self.kube.abort_watches()
                done.wait(0.2)

        threading.Thread(target=abort_on_stop, daemon=True, name="node-agent-stop").start()
        try:
            self._watch_until(stop)
        finally:
            done.set()

    def _watch_until(self, stop: threading.Event) -> None:
        self.recover()
        version = ""
        while not stop.is_set():
            try:
                if not version:
                    pods, version = self.kube.list_pods(label_selector=self.selector,
                                                        field_selector=self.field_selector)  # fmt: skip
                    for pod in pods:
                        self.seen("ADDED", pod)
                for kind, pod in self.kube.watch_pods(label_selector=self.selector,
                                                      field_selector=self.field_selector,
                                                      resource_version=version,
                                                      timeout_seconds=WATCH_SECONDS):  # fmt: skip
                    version = _meta(pod, "resourceVersion") or version
                    if kind != "BOOKMARK":
                        self.seen(kind, pod)
                    if stop.is_set():
                        break
            except WatchExpired:
                version = ""
            except KubeError as exc:
                if stop.is_set():
                    break
                logger.warning("pod watch on %s failed (%s); listing again", self.node, exc.status)
                version = ""
                stop.wait(RETRY_SECONDS)

    def recover(self) -> None:
        """A node agent that restarts has lost the sessions of the runs it was serving: each of those pods
        (its socket directory is still there) fails as `host_lost`, audited once by the startup sweep."""
        pods, _ = self.kube.list_pods(label_selector=self.selector, field_selector=self.field_selector)
        root = run_root(self.backend.env)
        # The kubelet makes every started pod's directory; one holding our owner record was being served.
        lost = [p for p in pods if _meta(p, "uid")
                and RunDir(root / f"{RUN_DIR_PREFIX}{_meta(p, 'uid')}").owner_file.exists()]  # fmt: skip
        self.host.startup_sweep()  # audits the runs whose owner died and removes their directories
        for pod in lost:
            with self._lock:
                self.handled.add(_meta(pod, "uid"))
            self._finish_refused(
                pod, AuditReason.HOST_LOST, "the node agent restarted while the run was in progress",
                "submit the AgentRun again",
            )  # fmt: skip

    def seen(self, kind: str, pod: Mapping[str, Any]) -> None:
        """One pod event: a new, live pod of this node starts being served; the others go to its workload."""
        uid = _meta(pod, "uid")
        if not uid or (pod.get("spec") or {}).get("nodeName") != self.node:
            return  # another node's pod is that node's agent's
        with self._lock:
            known = uid in self.handled
            if (
                not known
                and kind != "DELETED"
                and not _meta(pod, "deletionTimestamp")
                and ((pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
            ):
                self.handled.add(uid)
                thread = threading.Thread(target=self._serve_in_slot, args=(pod,), daemon=True,
                                          name=f"pod-{uid[:8]}")  # fmt: skip
                self.threads = [t for t in self.threads if t.is_alive()]
                self.threads.append(thread)
                thread.start()
                return
        self.backend.pod_event(kind, pod)

    def _serve_in_slot(self, pod: Mapping[str, Any]) -> None:
        with self.slots:  # at most MAX_PODS_IN_FLIGHT at once: a flood of pods waits, it does not pile up
            self.serve(pod)

    def serve(self, pod: Mapping[str, Any]) -> None:
        """Verify who made the pod, run its AgentRun's request in it, report the result, delete the pod."""
        ref = Ref(_meta(pod, "namespace"), _meta(pod, "name"))
        try:
            agentrun = self._recorded_run(pod, ref)
            if agentrun is None:
                logger.warning("pod %s/%s refused: no AgentRun of ours made it", ref.namespace, ref.name)
                self.kube.delete_pod(ref, uid=_meta(pod, "uid"))
                return
            run_ref = Ref(ref.namespace, _meta(agentrun, "name"))
            if (agentrun.get("status") or {}).get("phase") in TERMINAL_PHASES:
                self.kube.delete_pod(ref, uid=_meta(pod, "uid"))  # already reported (a duplicate event)
                return
            # Running before the run's start record: from here its audit record is this node agent's, so
            # the controller never writes a second one for a pod lost from now on.
            self.kube.patch_agentrun_status(run_ref, {"phase": "Running"})
            result = self._run(Placement(pod, agentrun), run_ref)
            status = status_for(
                result, audit_digest=audit_digest(self.host.config.paths.audit_file, result.run_id)
            )
            self.kube.patch_agentrun_status(run_ref, status)
        except KubeError as exc:
            logger.warning("run pod %s/%s: the API server failed (%s)", ref.namespace, ref.name, exc.status)
        except Exception as exc:  # noqa: BLE001 (one pod's failure never stops the node agent)
            logger.warning("run pod %s/%s: %s", ref.namespace, ref.name, type(exc).__name__)
        finally:
            with contextlib.suppress(KubeError):
                self.kube.delete_pod(ref, uid=_meta(pod, "uid"))

    def _recorded_run(self, pod: Mapping[str, Any], ref: Ref) -> dict[str, Any] | None:
        """The AgentRun that controls `pod` and records it as its pod (status.podUid), or None. The
        controller creates the pod before it records its uid, so a pod seen in between is waited for
        (RECORD_WAIT_SECONDS) rather than refused; a different uid recorded is a refusal at once."""
        owner = controller_owner(pod)
        if owner is None:
            return None
        deadline = time.monotonic() + RECORD_WAIT_SECONDS
        while True:
            agentrun = self.kube.get_agentrun(Ref(ref.namespace, owner["name"]))
            if agentrun is None or _meta(agentrun, "uid") != owner["uid"]:
                return None
            status = agentrun.get("status") or {}
            recorded = status.get("podUid")
            if recorded == _meta(pod, "uid"):
                return agentrun
            if recorded or status.get("phase") not in (None, "Pending") or time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _run(self, placement: Placement, run_ref: Ref) -> RunResult:
        try:
            request = run_request(placement.agentrun)
        except SandboxError as exc:
            self.kube.patch_agentrun_status(run_ref, refusal_status(exc.reason, exc.message, exc.hint))
            raise

        def started(run_id: str) -> None:
            with contextlib.suppress(KubeError):
                self.kube.patch_agentrun_status(run_ref, {"phase": "Running", "runId": run_id})

        with placed(placement):
            result: RunResult = self.host.run(
                request.slug, goal=request.goal, kwargs=request.kwargs, runtime=request.runtime,
                caller=request.caller, on_start=started,
            )  # fmt: skip
        return result

    def _finish_refused(self, pod: Mapping[str, Any], reason: AuditReason, error: str, hint: str) -> None:
        ref = Ref(_meta(pod, "namespace"), _meta(pod, "name"))
        owner = controller_owner(pod)
        with contextlib.suppress(KubeError):
            if owner is not None:
                agentrun = self.kube.get_agentrun(Ref(ref.namespace, owner["name"]))
                phase = ((agentrun or {}).get("status") or {}).get("phase")
                ours = agentrun is not None and _meta(agentrun, "uid") == owner["uid"]
                if ours and phase not in TERMINAL_PHASES:
                    self.kube.patch_agentrun_status(
                        Ref(ref.namespace, owner["name"]), refusal_status(reason, error, hint)
                    )
            self.kube.delete_pod(ref, uid=_meta(pod, "uid"))

    def join(self, timeout: float | None = None) -> None:
        for thread in list(self.threads):
            thread.join(timeout)


def serve_node(
    env: Mapping[str, str],
    *,
    stop: threading.Event | None = None,
    kube: KubeApi | None = None,
    packs: PackStore | None = None,
) -> int:
    """`serve --node`: the node agent until SIGTERM/SIGINT (or `stop`); 0 on a clean stop, 1 (one line on
    stderr naming the next step) when the config, the node name or the cluster is unusable."""
    env = {"AGENTNODE_RUN_DIR": RUN_HOST_DIR, **env}
    stop = stop or threading.Event()
    try:
        node = node_name(env)
        config = load_config(env)
        config.paths.audit_file.parent.mkdir(parents=True, exist_ok=True)
        kube = kube or KubeApi.connect()
    except (SandboxError, OSError) as exc:
        if isinstance(exc, SandboxError):
            message, hint = exc.message, exc.hint
        else:
            message = f"cannot prepare the node ({type(exc).__name__})"
            hint = "check the node agent's hostPath mounts (deploy/node-agent.yaml)"
        print(f"error: {message}\n  hint: {hint}", file=sys.stderr)
        return 1
    backend = PodBackend(kube, config, env=env, packs=packs or PackStore())
    host = SandboxHost(
        config=config, env=env, sandbox_backend=backend, host_backend=HostRoutesRefused(), async_teardown=True
    )
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    agent = NodeAgent(host, kube, backend, node)
    logger.info("node agent serving run pods on %s", node)
    try:
        agent.run(stop)
    finally:
        for session in list(host.active_runs()):
            host.cancel(session)
        agent.join(timeout=30)
        host.close()
    return 0


def node_name(env: Mapping[str, str] | None = None) -> str:
    """The node this agent serves (the DaemonSet passes spec.nodeName as NODE_NAME)."""
    name = (os.environ if env is None else env).get("NODE_NAME", "").strip()
    if not name:
        raise EngineError(
            "NODE_NAME is not set", reason=AuditReason.CONFIG_INVALID,
            hint="run the node agent from deploy/node-agent.yaml (it passes spec.nodeName as NODE_NAME)",
            check="kubernetes",
        )  # fmt: skip
    return name


__all__ = [
    "HostRoutesRefused",
    "NodeAgent",
    "PackStore",
    "Placement",
    "PodBackend",
    "PodWorkload",
    "node_name",
    "placed",
]
