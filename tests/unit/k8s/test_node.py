"""The node agent against a Kubernetes API stand-in (real HTTP, watch streams), with a kubelet stand-in that
runs each pod's wrapper as a local process on the pod's socket: scheduled → socket → task → result in
status → pod deleted, and every way that goes wrong (forged or tampered pods, restarts, evictions,
deletions, duplicate events, another node's pods)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import AuditReason, EngineError
from host.core.owner import owner_token
from host.k8s.api import KubeApi
from host.k8s.node import PackStore, serve_node
from host.k8s.objects.pod import pod_for
from host.policy.admission import admit
from host.runtime.rundir import RunDir
from host.spec.lockfile import Lockfile
from tests.support.k8s import NAMESPACE, NODE, Cluster, cluster, eventually
from tests.support.kubeapi import kube_api

__all__ = ["cluster", "kube_api"]  # fixtures

HELLO = """
def run(context, n=0, **kwargs):
    print("hello from the pod", flush=True)
    return {"n": n, "goal": context.goal}
"""
SLEEPER = """
import time
def run(context, **kwargs):
    time.sleep(120)
    return {"slept": True}
"""


class Agent:
    """A node agent serving the cluster's node on a thread (what `serve --node` runs)."""

    def __init__(self, cluster: Cluster, kube: KubeApi | None = None) -> None:
        self.stop = threading.Event()
        self.code: list[int] = []
        kube = kube or KubeApi(cluster.api.api_client())
        packs = PackStore(cluster.packs_root)
        self.thread = threading.Thread(
            target=lambda: self.code.append(serve_node(cluster.env, stop=self.stop, kube=kube, packs=packs)),
            daemon=True,
        )
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive() and self.code == [0]


@pytest.fixture
def agent(cluster: Cluster) -> Iterator[Agent]:
    running = Agent(cluster)
    cluster.api.wait_for_watches(1, timeout=10)
    yield running
    running.close()


def ended(cluster: Cluster, name: str) -> dict[str, Any]:
    """The AgentRun's status once it is terminal."""
    status: dict[str, Any] = eventually(
        lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed") and cluster.status(name),
        what=f"{name}'s result in its status",
    )
    return status


def _pods(cluster: Cluster) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.api.objects("pods", NAMESPACE)]


def test_a_run_pod_is_served_reported_and_deleted(cluster: Cluster, agent: Agent) -> None:
    entry = cluster.install("hello-k8s", HELLO)
    run = cluster.submit("hello-k8s", "r1", goal="say hi", kwargs={"n": 7})
    pod = cluster.place(run)
    kubelet = cluster.start_kubelet(pod, entry)
    status = ended(cluster, "r1")
    assert status["phase"] == "Succeeded", status
    assert json.loads(status["resultJson"]) == {"n": 7, "goal": "say hi"}
    eventually(lambda: not _pods(cluster), what="the pod deleted")
    kubelet.join(timeout=30)
    (record,) = cluster.audit()
    assert record["reason"] == "agent_completed" and record["run_id"] == status["runId"]
    lines = cluster.config.paths.audit_file.read_bytes().splitlines()
    line = next(raw for raw in lines if b'"event":"agent_run"' in raw)
    assert status["auditDigest"] == hashlib.sha256(line).hexdigest()
    rundir = cluster.run_root / f"run-{pod['metadata']['uid']}"
    eventually(lambda: not rundir.exists(), what="the run dir gone")


def test_a_pod_on_another_node_is_not_touched(cluster: Cluster, agent: Agent) -> None:
    cluster.install("hello-k8s", HELLO)
    other = cluster.place(cluster.submit("hello-k8s", "elsewhere"), node="node-b")
    mine_entry = cluster.install("hello-two", HELLO)
    mine = cluster.place(cluster.submit("hello-two", "here"))
    cluster.start_kubelet(mine, mine_entry)
    eventually(lambda: cluster.status("here").get("phase") == "Succeeded", what="this node's run")
    assert cluster.api.get("pods", NAMESPACE, other["metadata"]["name"]) is not None
    assert cluster.status("elsewhere")["phase"] == "Scheduled"
    assert not (cluster.run_root / f"run-{other['metadata']['uid']}").exists()
    assert [r["run_id"] for r in cluster.audit()] == [cluster.status("here")["runId"]]


def test_a_pod_no_agentrun_of_ours_made_is_deleted_unserved(cluster: Cluster, agent: Agent) -> None:
    """Labels are claims anyone with pod create rights can make: the AgentRun must name this very pod."""
    cluster.install("hello-k8s", HELLO)
    real = cluster.place(cluster.submit("hello-k8s", "victim"))
    forged = copy.deepcopy(real)
    for key in ("uid", "resourceVersion", "creationTimestamp", "generation"):
        forged["metadata"].pop(key, None)
    forged["metadata"]["name"] = "forged"
    forged.pop("status", None)
    forged["spec"].pop("nodeName", None)
    made = cluster.api.create("pods", forged)  # same owner reference, labels and spec; not the recorded uid
    cluster.api.schedule(NAMESPACE, "forged", NODE)
    eventually(lambda: cluster.api.get("pods", NAMESPACE, "forged") is None, what="the forged pod deleted")
    assert not (cluster.run_root / f"run-{made['metadata']['uid']}").exists()
    assert cluster.audit() == []  # nothing ran for it
    assert cluster.api.get("pods", NAMESPACE, real["metadata"]["name"]) is not None  # the real one waits on
    assert cluster.status("victim")["podUid"] == real["metadata"]["uid"]


def test_a_tampered_pod_is_refused_and_audited(cluster: Cluster, agent: Agent) -> None:
    entry = cluster.install("hello-k8s", HELLO)
    run = cluster.submit("hello-k8s", "tampered")
    config = cluster.config
    lockfile = Lockfile(config.paths.lockfile)
    a = admit("hello-k8s", lockfile=lockfile, config=config, env=cluster.env, runtime=None)
    pod = pod_for(a, run, config)
    pod["spec"]["containers"][0]["image"] = "registry.example/evil@sha256:" + "b" * 64
    placed = cluster.place(run, pod=pod)  # the controller's pod, altered by someone with pod rights
    cluster.start_kubelet(placed, entry)
    status = ended(cluster, "tampered")
    assert status["errorCode"] == "pod_refused" and "controller" in status["hint"]
    assert "evil" not in json.dumps(status)
    eventually(lambda: not _pods(cluster), what="the pod deleted")
    (record,) = cluster.audit()
    assert record["reason"] == "pod_refused"


def test_duplicate_events_and_a_dropped_watch_serve_a_pod_once(cluster: Cluster, agent: Agent) -> None:
    entry = cluster.install("sleepy", SLEEPER)
    pod = cluster.place(cluster.submit("sleepy", "once"))
    cluster.start_kubelet(pod, entry)
    eventually(lambda: cluster.status("once").get("phase") == "Running", what="the run started")
    for _ in range(3):
        cluster.api.drop_watches()  # the agent lists again: the same pod arrives as ADDED once more
        cluster.api.wait_for_watches(1, timeout=10)
        cluster.api.set_status("pods", NAMESPACE, pod["metadata"]["name"], {"message": "touched"})
    cluster.api.delete("agentruns", NAMESPACE, "once")  # ends it: the pod goes with its owner
    eventually(lambda: len(cluster.audit()) == 1, what="the run's one record")
    eventually(lambda: not _pods(cluster), what="the pod gone")
    assert len(cluster.audit()) == 1


def test_an_evicted_pod_ends_its_run_failed(cluster: Cluster, agent: Agent) -> None:
    entry = cluster.install("sleepy", SLEEPER)
    pod = cluster.place(cluster.submit("sleepy", "evicted"))
    cluster.start_kubelet(pod, entry)
    eventually(lambda: cluster.status("evicted").get("phase") == "Running", what="the run started")
    evicted = {"phase": "Failed", "reason": "Evicted"}
    cluster.api.set_status("pods", NAMESPACE, pod["metadata"]["name"], evicted)
    status = ended(cluster, "evicted")
    assert status["success"] is False and status["errorCode"]
    (record,) = cluster.audit()
    assert record["reason"] == status["errorCode"]
    eventually(lambda: not _pods(cluster), what="the pod deleted")


def test_a_pod_evicted_before_its_run_was_wired_ends_the_run_at_once(cluster: Cluster) -> None:
    """The eviction's watch event arrives while the run is still being admitted (no workload to hand it
    to yet): the node agent reads the pod once its workload is registered, so the run ends failed now,
    not at its deadline. (No kubelet here: nothing else would ever end it.)"""
    cluster.install("sleepy", SLEEPER)
    pod = cluster.place(cluster.submit("sleepy", "early"))

    class EvictWhileAdmitting(KubeApi):
        def patch_agentrun_status(self, ref: Any, status: Any) -> dict[str, Any]:
            patched = super().patch_agentrun_status(ref, status)
            if status == {"phase": "Running"}:  # the node agent took the pod; its run is not wired yet
                evicted = {"phase": "Failed", "reason": "Evicted"}
                cluster.api.set_status("pods", NAMESPACE, pod["metadata"]["name"], evicted)
                time.sleep(0.5)  # the watch delivers the event while there is no workload for it
            return patched

    agent = Agent(cluster, EvictWhileAdmitting(cluster.api.api_client()))
    try:
        status = ended(cluster, "early")
        assert status["success"] is False and status["errorCode"]
        (record,) = cluster.audit()
        assert record["reason"] == status["errorCode"]
    finally:
        agent.close()


def test_an_agentrun_deleted_mid_run_cancels_it(cluster: Cluster, agent: Agent) -> None:
    entry = cluster.install("sleepy", SLEEPER)
    pod = cluster.place(cluster.submit("sleepy", "gone"))
    kubelet = cluster.start_kubelet(pod, entry)
    eventually(lambda: cluster.status("gone").get("phase") == "Running", what="the run started")
    cluster.api.delete("agentruns", NAMESPACE, "gone")  # the garbage collector deletes its pod
    eventually(lambda: len(cluster.audit()) == 1, what="the run's record")
    kubelet.join(timeout=30)
    assert kubelet.returncode is not None and kubelet.returncode != 0  # its container was killed
    assert cluster.audit()[0]["action"] == "deny"


def test_a_restarted_node_agent_fails_the_runs_it_lost(cluster: Cluster) -> None:
    """What a node agent that died mid-run leaves: the pod running, its socket directory with a crash record
    owned by a process that is gone. The next one audits the run once (host_lost) and fails it."""
    cluster.install("sleepy", SLEEPER)
    pod = cluster.place(cluster.submit("sleepy", "orphan"))
    cluster.api.set_status("agentruns", NAMESPACE, "orphan", {"phase": "Running", "runId": "f" * 32})
    rundir = RunDir(cluster.run_root / f"run-{pod['metadata']['uid']}")
    rundir.path.mkdir()
    rundir.owner_file.write_text("999999999:1")  # a process that does not exist
    rundir.record_run({"run_id": "f" * 32, "slug": "sleepy", "trust": "unverified", "source": "agent_sandbox",
                       "sandbox": True, "runtime": "runc", "image": None, "caller": None})  # fmt: skip
    assert owner_token() != "999999999:1"
    agent = Agent(cluster)
    try:
        status = ended(cluster, "orphan")
        assert status["errorCode"] == "host_lost" and "again" in status["hint"]
        eventually(lambda: not _pods(cluster), what="the pod deleted")
        (record,) = cluster.audit()
        assert (record["reason"], record["run_id"]) == ("host_lost", "f" * 32)
        assert not rundir.path.exists()
    finally:
        agent.close()


def test_a_pack_whose_files_differ_from_the_lockfile_fails_closed(cluster: Cluster, agent: Agent) -> None:
    entry = cluster.install("hello-k8s", HELLO)
    placed_files: Path = cluster.packs_root / entry.volume_digest
    (placed_files / "agent.py").write_text("def run(context, **kw):\n    return {'swapped': True}\n")
    pod = cluster.place(cluster.submit("hello-k8s", "swapped"))
    cluster.start_kubelet(pod, entry)
    status = ended(cluster, "swapped")
    assert status["errorCode"] == "volume_stale" and str(placed_files) in status["hint"]
    (record,) = cluster.audit()
    assert record["reason"] == "volume_stale"


def test_a_stop_that_comes_while_the_agent_lists_ends_it_promptly(cluster: Cluster) -> None:
    """Stop arriving between watches (the agent was listing) still ends the agent at once: the watch it
    opens next is aborted too, not waited out for its whole timeout (60 s)."""
    stop = threading.Event()

    class StopWhileListing(KubeApi):
        def list_pods(self, *, label_selector: str, field_selector: str = "") -> tuple[list[Any], str]:
            listed = super().list_pods(label_selector=label_selector, field_selector=field_selector)
            lists.append(1)
            if len(lists) == 2:
                stop.set()  # the list after recovery's: stop now, before the watch opens
            return listed

    lists: list[int] = []

    code: list[int] = []
    kube, packs = StopWhileListing(cluster.api.api_client()), PackStore(cluster.packs_root)
    thread = threading.Thread(
        target=lambda: code.append(serve_node(cluster.env, stop=stop, kube=kube, packs=packs)), daemon=True
    )
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive() and code == [0]


def test_no_node_name_fails_with_one_line(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    env: dict[str, Any] = {k: v for k, v in cluster.env.items() if k != "NODE_NAME"}
    assert serve_node(env, stop=threading.Event(), kube=KubeApi(cluster.api.api_client())) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: NODE_NAME is not set") and "node-agent.yaml" in err


@pytest.mark.parametrize("spoil", ["pycache", "pyc", "group-writable", "symlink", "not-root"])
def test_a_pack_tree_with_what_its_hash_does_not_cover_is_refused(cluster: Cluster, spoil: str) -> None:
    """The pod mounts the whole directory: debris the hash skips (a .pyc runs), a link, or a file someone
    else could rewrite after the check is never served."""
    entry = cluster.install("hello-k8s", HELLO)
    tree = cluster.packs_root / entry.volume_digest
    store = PackStore(cluster.packs_root)
    store.verify(entry)  # the clean tree passes
    if spoil == "pycache":
        (tree / "__pycache__").mkdir()
        (tree / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\0" * 16)
    elif spoil == "pyc":
        (tree / "helper.pyc").write_bytes(b"\0" * 16)
    elif spoil == "group-writable":
        (tree / "agent.py").chmod(0o664)
    elif spoil == "symlink":
        (tree / "link.py").symlink_to("/etc/hostname")
    else:
        os.chown(tree / "agent.py", 65532, 65532)
    with pytest.raises(EngineError) as info:
        store.verify(entry)
    assert info.value.reason is AuditReason.VOLUME_STALE and str(tree) in info.value.hint


def test_a_restart_serves_pods_the_kubelet_started_but_no_agent_served(cluster: Cluster) -> None:
    """The kubelet makes every started pod's directory: only one holding a node agent's records was lost."""
    entry = cluster.install("hello-k8s", HELLO)
    pod = cluster.place(cluster.submit("hello-k8s", "fresh"))
    (cluster.run_root / f"run-{pod['metadata']['uid']}").mkdir(mode=0o750)  # as the kubelet leaves it
    cluster.start_kubelet(pod, entry)
    agent = Agent(cluster)
    try:
        assert ended(cluster, "fresh")["phase"] == "Succeeded"
    finally:
        agent.close()
