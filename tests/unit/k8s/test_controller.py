"""The controller admits AgentRuns as `run` does and makes one pod per run, against the API server stand-in.

The real kopf operator runs the controller's handlers in a thread, over real HTTP and watch streams; each test
asserts the API objects and the controller's audit log (exactly one record per run it decides, none for runs
the node agent owns, and never the spec's text).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kopf
import pytest

from host.core.errors import AuditReason
from host.k8s.api import KubeApi, KubeError
from host.k8s.controller import (
    LOST,
    NOTHING,
    POD_SELECTOR,
    REFUSED,
    SCHEDULED,
    Controller,
    build_registry,
    controller_run_id,
    operator_settings,
    quiet_kopf_logging,
    run_controller,
)
from host.k8s.objects.agentrun import API_VERSION, KIND, RunRequest, agentrun
from host.k8s.objects.names import LABEL_ROLE, ROLE_AGENT_RUN
from host.k8s.objects.pod import pod_for, pod_mismatches
from host.policy.admission import admit
from host.spec.config import load_config
from host.spec.lockfile import LockEntry, Lockfile
from tests.support.k8s import eventually as poll
from tests.support.kubeapi import KubeAPI, kube_api

__all__ = ["kube_api"]  # the fixture, from tests.support.kubeapi

NS = "runs"
PINNED = "registry.example/agentnode-sandbox@sha256:" + "c" * 64
GOAL = "goal-text-never-copied-7d1e"
SECRET = "kwargs-secret-never-copied-4b9a"
CALLER = {"tenant": "acme", "requestId": "req-42", "labels": {"team": "blue"}}


eventually = functools.partial(poll, timeout=10.0)


def _manifest(slug: str) -> dict[str, Any]:
    return {
        "package_id": slug,
        "version": "1.0.0",
        "name": slug,
        "package_type": "agent",
        "agent": {"entrypoint": "agent_mod:run", "goal": "test", "limits": {"max_runtime_seconds": 60}},
    }


class Cluster:
    """A tmp config dir (config, lockfile, audit log), the stand-in, and the controller's operator."""

    def __init__(self, root: Path, kube_api: KubeAPI) -> None:
        self.root, self.api = root, kube_api
        (root / "cfg").mkdir()
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "AGENTNODE_CONFIG": str(root / "cfg")}
        self.configure()
        self.lockfile = Lockfile(load_config(self.env).paths.lockfile)
        self.install("hello-agent", "unverified")
        self.install("host-agent", "trusted")
        kube_api.create("namespaces", {"metadata": {"name": NS}})  # kopf serves namespaces that exist
        self.controller: RecordingController | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self.failures: list[BaseException] = []

    def configure(self, **agent_sandbox: Any) -> None:
        section = {"enabled": True, "image": PINNED, **agent_sandbox}
        (self.root / "cfg" / "config.json").write_text(json.dumps({"agent_sandbox": section}))

    def install(self, slug: str, trust: str) -> None:
        self.lockfile.put(
            LockEntry(
                slug=slug,
                version="1.0.0",
                package_type="agent",
                trust_level=trust,
                artifact_hash=hashlib.sha256(slug.encode()).hexdigest(),
                import_subdir="",
                sandbox_volume=None,
                host_path=None,
                manifest=_manifest(slug),
                installed_at="2026-01-01T00:00:00Z",
            )
        )

    # -- the operator -------------------------------------------------------------------------------------

    def new_controller(self) -> RecordingController:
        return RecordingController(KubeApi(self.api.api_client()), load_config(self.env), env=self.env)

    def start(self) -> RecordingController:
        """A fresh controller (a new process, as far as it knows) and its kopf operator, watching."""
        assert self._thread is None
        controller = self.controller = self.new_controller()
        registry = build_registry(controller)
        kopf.on.login(registry=registry)(lambda **_: self.api.connection_info())
        settings = operator_settings()
        settings.watching.server_timeout = 10
        settings.watching.connect_timeout = 2
        settings.networking.request_timeout = 5
        settings.queueing.idle_timeout = 1
        settings.queueing.exit_timeout = 2
        stop, ready = threading.Event(), threading.Event()

        def operate() -> None:
            try:
                asyncio.run(
                    kopf.operator(
                        registry=registry, settings=settings, standalone=True, namespaces=[NS],
                        stop_flag=stop, ready_flag=ready,
                    )
                )  # fmt: skip
            except BaseException as exc:  # reported by the test
                self.failures.append(exc)

        self._stop, self._thread = stop, threading.Thread(target=operate, name="kopf", daemon=True)
        self._thread.start()
        assert ready.wait(10), self.failures
        self.api.wait_for_watches(4)  # CRDs, namespaces, AgentRuns and run pods
        return controller

    def stop(self) -> None:
        if self._thread is None or self._stop is None:
            return
        self._stop.set()
        self._thread.join(15)
        assert not self._thread.is_alive() and not self.failures, self.failures
        self._thread = self._stop = None
        if self.controller is not None:
            self.controller.close()
        eventually(lambda: self.api.watches == 0)  # kopf hung up its watches on the way out

    # -- the cluster's objects ----------------------------------------------------------------------------

    def submit(self, name: str, *, slug: str = "hello-agent", **spec: Any) -> dict[str, Any]:
        body = agentrun(name, NS, RunRequest(slug=slug, goal=GOAL, kwargs={"token": SECRET}))
        body["spec"]["caller"] = CALLER
        body["spec"].update(spec)
        return self.api.create("agentruns", body, namespace=NS)

    def run(self, name: str) -> dict[str, Any]:
        found = self.api.get("agentruns", NS, name)
        assert found is not None
        return found

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.run(name).get("status") or {})

    def phase(self, name: str) -> str:
        return str(self.status(name).get("phase") or "")

    def pods(self) -> list[dict[str, Any]]:
        return self.api.objects("pods", NS)

    def audit_lines(self) -> list[bytes]:
        path = load_config(self.env).paths.audit_file
        return [line for line in path.read_bytes().split(b"\n") if line] if path.exists() else []

    def records(self) -> list[dict[str, Any]]:
        return [r for r in map(json.loads, self.audit_lines()) if r.get("event") == "agent_run"]

    def expected_pod(self, run: Mapping[str, Any]) -> dict[str, Any]:
        config = load_config(self.env)
        admission = admit(str(run["spec"]["slug"]), lockfile=self.lockfile, config=config, env=self.env)
        return pod_for(admission, run, config)

    def assert_no_spec_text(self) -> None:
        """Neither the goal nor the kwargs appear anywhere but in the spec."""
        for run in self.api.objects("agentruns", NS):
            outside = {**run, "spec": None}
            assert GOAL not in json.dumps(outside) and SECRET not in json.dumps(outside)
        for text in (json.dumps(self.pods()), b"\n".join(self.audit_lines()).decode()):
            assert GOAL not in text and SECRET not in text


class RecordingController(Controller):
    """The controller, recording what each handler call decided (a test's sync point, never a sleep)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decided: list[tuple[str, str, str]] = []
        self._seen_lock = threading.Lock()

    def reconcile(self, agentrun: Mapping[str, Any]) -> str:
        outcome = super().reconcile(agentrun)
        with self._seen_lock:
            self.decided.append(("reconcile", str(agentrun["metadata"]["name"]), outcome))
        return outcome

    def pod_changed(self, event_type: str, pod: Mapping[str, Any]) -> str:
        outcome = super().pod_changed(event_type, pod)
        with self._seen_lock:
            self.decided.append((event_type, str(pod["metadata"]["name"]), outcome))
        return outcome

    def saw(self, kind: str, name: str, outcome: str | None = None) -> bool:
        with self._seen_lock:
            return any(k == kind and n == name and (outcome is None or o == outcome)
                       for k, n, o in self.decided)  # fmt: skip


@pytest.fixture
def cluster(kube_api: KubeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[Cluster]:
    caplog.set_level("DEBUG")
    kopf_level = logging.getLogger("kopf").level
    quiet_kopf_logging()  # as run_controller does: kopf's DEBUG lines quote whole objects
    c = Cluster(tmp_path, kube_api)
    try:
        yield c
    finally:
        c.stop()
        logging.getLogger("kopf").setLevel(kopf_level)
    assert GOAL not in caplog.text and SECRET not in caplog.text  # no log line quotes the spec


def scheduled(c: Cluster, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for the AgentRun to be Scheduled; (its AgentRun, its one pod)."""
    eventually(lambda: c.phase(name) == "Scheduled")
    run = c.run(name)
    pods = c.pods()
    assert [p["metadata"]["name"] for p in pods] == [f"arun-{run['metadata']['uid']}"]
    return run, pods[0]


def assert_refused(c: Cluster, name: str, reason: AuditReason) -> dict[str, Any]:
    """Failed with `reason`, a hint, and exactly one audit record of it whose digest the status carries."""
    eventually(lambda: c.phase(name) == "Failed")
    status = c.status(name)
    uid = c.run(name)["metadata"]["uid"]
    assert status["errorCode"] == reason.value and status["success"] is False
    assert status["hint"] and status["error"]
    assert status["runId"] == controller_run_id(uid) and "podUid" not in status
    records = c.records()
    assert len(records) == 1, records
    record = records[0]
    assert record["reason"] == reason.value and record["action"] == "deny"
    assert record["run_id"] == status["runId"]
    line = next(raw for raw in c.audit_lines() if b'"event":"agent_run"' in raw)
    assert status["auditDigest"] == hashlib.sha256(line).hexdigest()
    c.assert_no_spec_text()
    return record


# --- admission and the one pod ------------------------------------------------------------------------------


def test_an_agentrun_gets_exactly_its_pod_and_no_audit_record_yet(cluster: Cluster) -> None:
    cluster.start()
    cluster.submit("first")
    run, pod = scheduled(cluster, "first")
    uid = run["metadata"]["uid"]
    assert pod_mismatches(cluster.expected_pod(run), pod) == []
    owners = pod["metadata"]["ownerReferences"]
    assert owners == [{"apiVersion": API_VERSION, "kind": KIND, "name": "first", "uid": uid,
                       "controller": True, "blockOwnerDeletion": True}]  # fmt: skip
    assert pod["metadata"]["labels"][LABEL_ROLE] == ROLE_AGENT_RUN
    status = run["status"]
    assert status == {"phase": "Scheduled", "podName": f"arun-{uid}", "podUid": pod["metadata"]["uid"],
                      "observedGeneration": 1}  # fmt: skip
    assert cluster.records() == []  # the node agent writes this run's record
    cluster.assert_no_spec_text()
    pods = f"/api/v1/namespaces/{NS}/pods"  # kopf's list and watch: selected by the API server
    pods_watched = [r.query for r in cluster.api.requests if r.method == "GET" and r.path == pods]
    assert pods_watched and all(q.get("labelSelector") == POD_SELECTOR for q in pods_watched)


def test_duplicate_events_and_restarts_make_nothing_twice(cluster: Cluster) -> None:
    controller = cluster.start()
    cluster.submit("dup")
    cluster.api.drop_watches()  # mid-way: kopf lists again and sees the AgentRun a second time
    run, pod = scheduled(cluster, "dup")
    before = run["status"]
    assert controller.reconcile(run) == NOTHING  # a duplicate event
    assert controller.pod_changed("MODIFIED", pod) == NOTHING

    cluster.api.drop_watches()
    cluster.api.patch("agentruns", NS, "dup", {"metadata": {"labels": {"touched": "yes"}}})
    cluster.stop()
    restarted = cluster.start()  # a new controller: kopf resumes every AgentRun it finds
    eventually(lambda: restarted.saw("reconcile", "dup", NOTHING))
    again, pod_again = scheduled(cluster, "dup")
    assert again["status"] == before and pod_again["metadata"]["uid"] == pod["metadata"]["uid"]
    assert cluster.records() == []


def test_an_identical_pod_left_by_an_earlier_attempt_is_adopted(cluster: Cluster) -> None:
    run = cluster.submit("adopt")
    existing = cluster.api.create("pods", cluster.expected_pod(run), namespace=NS)
    controller = cluster.new_controller()
    assert controller.reconcile(run) == SCHEDULED
    assert cluster.status("adopt")["podUid"] == existing["metadata"]["uid"]
    assert len(cluster.pods()) == 1 and cluster.records() == []


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("not_installed", AuditReason.NOT_INSTALLED),
        ("bad_spec", AuditReason.CONFIG_INVALID),
        ("image_not_pinned", AuditReason.IMAGE_NOT_PINNED),
        ("trusted_pack", AuditReason.REFUSED_TRUST),
        ("sandbox_disabled", AuditReason.REFUSED_FLAG_OFF),
    ],
)
def test_a_refused_run_fails_with_one_audit_record_and_no_pod(
    cluster: Cluster, case: str, reason: AuditReason
) -> None:
    spec: dict[str, Any] = {}
    slug = "hello-agent"
    if case == "not_installed":
        slug = "missing-agent"
    elif case == "bad_spec":
        spec = {"kwargsJson": f'["{SECRET}"]'}
    elif case == "image_not_pinned":
        cluster.configure(image="agentnode-sandbox:unit")
    elif case == "trusted_pack":
        slug = "host-agent"
    elif case == "sandbox_disabled":
        cluster.configure(enabled=False)
    cluster.start()
    cluster.submit("refused", slug=slug, **spec)
    record = assert_refused(cluster, "refused", reason)
    assert cluster.pods() == []
    assert record["slug"] == slug
    if case == "bad_spec":  # the request did not validate: no caller metadata to trust
        assert record["caller"] is None
    else:
        assert record["caller"] == {"tenant": "acme", "request_id": "req-42", "labels": {"team": "blue"}}
    if case == "trusted_pack":
        assert "single host" in cluster.status("refused")["hint"]
    # a duplicate event, and a restart, decide nothing again
    assert cluster.controller is not None and cluster.controller.reconcile(cluster.run("refused")) == NOTHING
    assert cluster.new_controller().reconcile(cluster.run("refused")) == NOTHING
    assert len(cluster.records()) == 1


def test_a_retried_refusal_is_audited_once(cluster: Cluster) -> None:
    """A status patch that failed is retried by kopf: the same record, never a second one."""
    run = cluster.submit("retry", slug="missing-agent")
    controller = cluster.new_controller()
    real = controller.kube.patch_agentrun_status
    calls: list[int] = []

    def failing_once(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise KubeError("the API server did not answer PATCH", status=0)
        return real(*args, **kwargs)

    controller.kube.patch_agentrun_status = failing_once  # type: ignore[method-assign]
    with pytest.raises(KubeError, match="did not answer"):
        controller.reconcile(run)
    assert len(cluster.records()) == 1 and cluster.phase("retry") == ""
    assert controller.reconcile(run) == REFUSED
    assert cluster.new_controller().reconcile(cluster.run("retry")) == NOTHING
    assert_refused(cluster, "retry", AuditReason.NOT_INSTALLED)


def test_a_pod_not_made_by_the_controller_is_deleted_and_the_run_refused(cluster: Cluster) -> None:
    run = cluster.submit("squat")  # no controller yet: a squatter gets there first
    squatter = cluster.expected_pod(run)
    squatter["spec"]["hostNetwork"] = True
    squatter["spec"]["containers"][0]["image"] = "registry.example/other@sha256:" + "d" * 64
    planted = cluster.api.create("pods", squatter, namespace=NS)
    controller = cluster.start()
    record = assert_refused(cluster, "squat", AuditReason.POD_REFUSED)
    assert cluster.pods() == []  # deleted
    assert record["trust"] == "unverified" and record["caller"]["tenant"] == "acme"
    # its deletion is no lost run of ours
    eventually(lambda: controller.saw("DELETED", planted["metadata"]["name"], NOTHING))
    assert len(cluster.records()) == 1


# --- run pods that end --------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["evicted", "deleted"])
def test_a_pod_lost_before_its_run_started_fails_the_run_with_one_record(cluster: Cluster, how: str) -> None:
    controller = cluster.start()
    cluster.submit("lost")
    run, pod = scheduled(cluster, "lost")
    name = pod["metadata"]["name"]
    if how == "evicted":
        cluster.api.set_status("pods", NS, name, {"phase": "Failed", "reason": "Evicted"})
    else:
        cluster.api.delete("pods", NS, name)
    eventually(lambda: cluster.phase("lost") == "Failed")
    status = cluster.status("lost")
    assert status["errorCode"] == "host_lost" and status["hint"] == "submit the AgentRun again"
    assert "before its run started" in status["error"]
    records = cluster.records()
    assert len(records) == 1 and records[0]["reason"] == "host_lost" and records[0]["slug"] == "hello-agent"
    assert records[0]["run_id"] == status["runId"] == controller_run_id(run["metadata"]["uid"])
    assert records[0]["caller"]["request_id"] == "req-42" and records[0]["sandbox"] is True
    assert status["auditDigest"] == hashlib.sha256(cluster.audit_lines()[-1]).hexdigest()
    # the same pod's next events (and a restart's resume) write nothing more
    if how == "evicted":
        cluster.api.delete("pods", NS, name)
        eventually(lambda: controller.saw("DELETED", name))
    assert cluster.new_controller().reconcile(cluster.run("lost")) == NOTHING
    assert len(cluster.records()) == 1
    cluster.assert_no_spec_text()


def test_a_pod_lost_mid_run_fails_the_run_but_the_node_agent_owns_the_record(cluster: Cluster) -> None:
    controller = cluster.start()
    cluster.submit("mid")
    _, pod = scheduled(cluster, "mid")
    cluster.api.set_status("agentruns", NS, "mid", {"phase": "Running", "runId": "ab" * 16})  # the node agent
    cluster.api.set_status("pods", NS, pod["metadata"]["name"], {"phase": "Failed", "reason": "Evicted"})
    eventually(lambda: cluster.phase("mid") == "Failed")
    status = cluster.status("mid")
    assert status["errorCode"] == "host_lost" and status["runId"] == "ab" * 16
    assert "auditDigest" not in status
    # decided by the pod's event, or by a repeated creation event that found the pod ended: either way
    eventually(lambda: controller.saw("MODIFIED", pod["metadata"]["name"]))
    assert controller.saw("MODIFIED", pod["metadata"]["name"], LOST) or controller.saw(
        "reconcile", "mid", LOST
    )
    assert cluster.records() == []


def test_a_pod_deleted_after_its_run_reported_changes_nothing(cluster: Cluster) -> None:
    controller = cluster.start()
    cluster.submit("done")
    _, pod = scheduled(cluster, "done")
    reported = {"phase": "Succeeded", "success": True, "runId": "cd" * 16, "resultJson": '{"ok":true}'}
    cluster.api.set_status("agentruns", NS, "done", reported)  # the node agent's report
    before = cluster.status("done")
    cluster.api.delete("pods", NS, pod["metadata"]["name"])  # as the node agent does after its report
    eventually(lambda: controller.saw("DELETED", pod["metadata"]["name"], NOTHING))
    assert cluster.status("done") == before and cluster.records() == []


def test_an_agentrun_deleted_mid_run_takes_its_pod_and_the_controller_writes_nothing(
    cluster: Cluster,
) -> None:
    controller = cluster.start()
    cluster.submit("gone")
    _, pod = scheduled(cluster, "gone")
    cluster.api.set_status("agentruns", NS, "gone", {"phase": "Running", "runId": "ef" * 16})
    cluster.api.delete("agentruns", NS, "gone")
    assert cluster.pods() == []  # the garbage collector took the pod with its owner
    eventually(lambda: controller.saw("DELETED", pod["metadata"]["name"], NOTHING))
    assert cluster.records() == []


def test_a_run_pod_of_no_agentrun_or_of_another_is_ignored(cluster: Cluster) -> None:
    cluster.submit("real")
    controller = cluster.new_controller()
    assert controller.reconcile(cluster.run("real")) == SCHEDULED
    real_pod = cluster.pods()[0]
    stray = {**real_pod, "metadata": {**real_pod["metadata"], "uid": "0" * 8 + "-0000-0000-0000-" + "0" * 12}}
    assert controller.pod_changed("DELETED", stray) == NOTHING  # names our AgentRun, is not its pod
    orphan = {"metadata": {"name": "arun-x", "namespace": NS, "uid": "u"}, "status": {"phase": "Failed"}}
    assert controller.pod_changed("MODIFIED", orphan) == NOTHING
    assert cluster.phase("real") == "Scheduled" and cluster.records() == []


def test_a_pod_gone_while_no_controller_watched_is_found_on_resume(cluster: Cluster) -> None:
    cluster.submit("quiet")
    assert cluster.new_controller().reconcile(cluster.run("quiet")) == SCHEDULED
    cluster.api.delete("pods", NS, cluster.pods()[0]["metadata"]["name"])  # nobody watching
    assert cluster.new_controller().reconcile(cluster.run("quiet")) == LOST
    assert cluster.status("quiet")["errorCode"] == "host_lost" and len(cluster.records()) == 1


# --- run_controller -----------------------------------------------------------------------------------------


def test_run_controller_serves_until_stopped(cluster: Cluster) -> None:
    stop = threading.Event()
    codes: list[int] = []
    kube = KubeApi(cluster.api.api_client())
    login = lambda **_: cluster.api.connection_info()  # noqa: E731
    thread = threading.Thread(
        target=lambda: codes.append(
            run_controller(cluster.env, namespaces=[NS], stop=stop, kube=kube, login=login)
        ),
        daemon=True,
    )
    thread.start()
    try:
        cluster.api.wait_for_watches(4, timeout=10)
        cluster.submit("cli")
        scheduled(cluster, "cli")
    finally:
        stop.set()
        thread.join(15)
    assert codes == [0]


def test_run_controller_fails_closed_with_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = KubeApi(cluster.api.api_client())
    assert run_controller(cluster.env, kube=kube) == 2  # no namespace named
    (cluster.root / "cfg" / "config.json").write_text('{"agent_sandbox": {"runtime": "kata"}}')
    assert run_controller(cluster.env, namespaces=[NS], kube=kube) == 1
    cluster.configure()
    nowhere = KubeApi.connect(host="http://127.0.0.1:9")
    assert run_controller(cluster.env, namespaces=[NS], kube=nowhere) == 1

    def no_credentials(**_: Any) -> kopf.ConnectionInfo:
        raise kopf.LoginError("no credentials")

    assert run_controller(cluster.env, namespaces=[NS], kube=kube, login=no_credentials) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") and "(next: " in line for line in lines)
    assert "agent_sandbox.runtime" in lines[1] and "API server" in lines[2] and "log in" in lines[3]
    assert cluster.api.watches == 0  # nothing was watched
