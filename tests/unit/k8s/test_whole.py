"""The whole Kubernetes path on the API stand-in: `run --backend kubernetes` creates an AgentRun, the real
kopf controller admits it and makes its pod, a scheduler stand-in binds it, a kubelet stand-in runs the
pod's wrapper, the node agent serves it over its socket, and the CLI prints the local `--json` contract."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from host.cli.main import main
from host.k8s.api import KubeApi
from host.k8s.controller import Controller, build_registry, operator_settings
from host.k8s.node import PackStore, serve_node
from tests.support.k8s import NAMESPACE, NODE, Cluster, cluster, eventually
from tests.support.kubeapi import kube_api

__all__ = ["cluster", "kube_api"]  # fixtures

AGENT = """
def run(context, n=0, **kwargs):
    print("working", flush=True)
    return {"n": n * 2, "goal": context.goal, "tenant_seen": "tenant" in kwargs}
"""


class Plant:
    """The cluster's moving parts on threads: the controller (kopf), a scheduler that binds each new run pod
    to the node and starts its kubelet, and the node agent."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.entry: Any = None
        """The installed pack every run pod here runs (what the node holds at its digest)."""

    def start(self) -> None:
        c = self.cluster
        c.api.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        controller = Controller(KubeApi(c.api.api_client()), c.config, env=c.env)
        registry = build_registry(controller)
        kopf.on.login(registry=registry)(lambda **_: c.api.connection_info())
        settings = operator_settings()
        settings.watching.server_timeout = 10
        settings.networking.request_timeout = 5
        settings.queueing.exit_timeout = 2
        ready = threading.Event()

        def operate() -> None:
            try:
                asyncio.run(kopf.operator(
                    registry=registry, settings=settings, standalone=True, namespaces=[NAMESPACE],
                    stop_flag=self.stop, ready_flag=ready,
                ))  # fmt: skip
            except BaseException as exc:  # reported by the test
                self.failures.append(exc)
            finally:
                controller.close()

        kube = KubeApi(c.api.api_client())
        packs = PackStore(c.packs_root)
        self._spawn(operate)
        self._spawn(lambda: serve_node(c.env, stop=self.stop, kube=kube, packs=packs))
        self._spawn(self.schedule)
        assert ready.wait(10), self.failures

    def _spawn(self, target: Any) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)

    def schedule(self) -> None:
        """Bind every unbound run pod to the node and start its container (what the scheduler and the
        kubelet do)."""
        seen: set[str] = set()
        while not self.stop.wait(0.05):
            for pod in self.cluster.api.objects("pods", NAMESPACE):
                uid = pod["metadata"]["uid"]
                if uid in seen:
                    continue
                seen.add(uid)
                self.cluster.api.schedule(NAMESPACE, pod["metadata"]["name"], NODE)
                bound = self.cluster.api.get("pods", NAMESPACE, pod["metadata"]["name"])
                if bound is not None:
                    self.cluster.start_kubelet(dict(bound), self.entry)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not self.failures, self.failures


def client_side(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig naming the stand-in (the user's side), and this process's env as the cluster's."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": cluster.api.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": NAMESPACE}}],
    }))  # fmt: skip
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    return kubeconfig


@pytest.fixture
def plant(cluster: Cluster) -> Iterator[Plant]:
    running = Plant(cluster)
    yield running
    running.close()


def test_run_backend_kubernetes_end_to_end_on_the_stand_in(
    cluster: Cluster, plant: Plant, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    plant.entry = cluster.install("doubler", AGENT)
    plant.start()
    kubeconfig = client_side(cluster, tmp_path, monkeypatch)
    code = main(["run", "doubler", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--json",
                 "--goal", "double it", "--arg", "n=21", "--tenant", "acme"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    payload = json.loads(out)
    assert payload["success"] is True, payload
    assert payload["result"] == {"n": 42, "goal": "double it", "tenant_seen": False}
    assert set(payload) == {"success", "result", "error", "error_code", "mode_used", "run_id", "timed_out",
                            "duration_ms", "hint", "logs", "path"}  # fmt: skip
    assert payload["path"] == "kubernetes"
    (record,) = cluster.audit()  # the node agent's; the controller wrote none (it refused nothing)
    assert record["run_id"] == payload["run_id"] and record["reason"] == "agent_completed"
    assert record["caller"]["tenant"] == "acme"
    eventually(lambda: not cluster.api.objects("pods", NAMESPACE), what="the run pod deleted")
    (run,) = cluster.api.objects("agentruns", NAMESPACE)
    assert run["status"]["phase"] == "Succeeded" and run["status"]["auditDigest"]


def test_a_refused_run_comes_back_through_the_whole_path(
    cluster: Cluster, plant: Plant, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    plant.start()
    kubeconfig = client_side(cluster, tmp_path, monkeypatch)
    code = main(["run", "not-installed", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
                 "--json"])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code != 0 and payload["success"] is False and payload["error_code"] == "not_installed"
    assert payload["hint"]
    (record,) = cluster.audit()  # the controller's: the one record of a refused run
    assert record["reason"] == "not_installed"
    assert not cluster.api.objects("pods", NAMESPACE)
