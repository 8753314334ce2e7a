"""The node agent's session side for real: a Docker container built from the run pod's own spec (the pinned
image, the pod's command, env, mounts, user and hardening) stands in for the kubelet's container, and the run
completes through the real socket under each runtime, its result in the AgentRun's status."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.core.owner import owner_token
from host.engine.labels import LABEL_OWNER
from host.k8s.api import KubeApi
from host.k8s.node import PackStore, serve_node
from tests.support.k8s import NAMESPACE, Cluster, cluster, docker_kwargs_for_pod, eventually
from tests.support.kubeapi import kube_api

pytestmark = pytest.mark.docker

__all__ = ["cluster", "kube_api"]  # fixtures

AGENT = """
import os, socket
def run(context, n=0, **kwargs):
    print("line from the pod", flush=True)
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2)
        network = "reachable"
    except OSError:
        network = "none"
    words = context.goal.split()
    return {"n": n, "words": len(words), "uid": os.getuid(), "network": network,
            "root_writable": os.access("/", os.W_OK)}
"""


class DockerKubelet(threading.Thread):
    """Runs the pod's container on the real engine once the pod is bound; reports its exit in the pod's
    status and kills it when the pod is deleted; the container is always removed."""

    def __init__(self, cluster: Cluster, client: docker.DockerClient, pod: dict[str, Any], image: str,
                 runtime: str) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.cluster, self.client, self.pod, self.image, self.runtime = cluster, client, pod, image, runtime
        self.container_id = ""
        self.exit_code: int | None = None

    def run(self) -> None:
        name = self.pod["metadata"]["name"]
        kwargs = docker_kwargs_for_pod(
            self.pod, image=self.image, runtime=self.runtime, run_root=self.cluster.run_root,
            packs_root=self.cluster.packs_root, labels={LABEL_OWNER: owner_token()},
        )  # fmt: skip
        for mount in kwargs["mounts"]:  # the kubelet makes a missing subPath directory (root's, 0750)
            if mount["Source"].startswith(f"{self.cluster.run_root}/"):
                Path(mount["Source"]).mkdir(mode=0o750, exist_ok=True)
        container = self.client.containers.run(**kwargs)
        self.container_id = container.id
        self.cluster.api.set_status("pods", NAMESPACE, name, {"phase": "Running"})
        while True:
            try:
                self.exit_code = int(container.wait(timeout=0.5)["StatusCode"])
                break
            except Exception:
                if self.cluster.api.get("pods", NAMESPACE, name) is None:
                    with contextlib.suppress(docker.errors.APIError):  # it may have exited meanwhile
                        container.kill()
        terminated = {"exitCode": self.exit_code, "reason": "Completed" if self.exit_code == 0 else "Error"}
        with contextlib.suppress(Exception):
            self.cluster.api.set_status("pods", NAMESPACE, name, {
                "phase": "Succeeded" if self.exit_code == 0 else "Failed",
                "containerStatuses": [{"name": "agent", "state": {"terminated": terminated}}],
            })  # fmt: skip

    def logs(self) -> str:
        with contextlib.suppress(Exception):
            return self.client.api.logs(self.container_id).decode(errors="replace")[-2000:]
        return ""

    def remove(self) -> None:
        if self.container_id:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_container(self.container_id, force=True)


@pytest.fixture
def node_dirs(cluster: Cluster) -> Iterator[Cluster]:
    """The node's pack store where the container's uid can read it (pytest's tmp dirs are private)."""
    store = Path(tempfile.mkdtemp(prefix="an-k8s-packs-"))
    os.chmod(store, 0o755)
    cluster.packs_root = store
    yield cluster
    shutil.rmtree(store, ignore_errors=True)


def test_a_run_completes_through_the_real_socket_in_the_pods_container(
    node_dirs: Cluster, docker_client: docker.DockerClient, pinned_image: str, runtime: str
) -> None:
    cluster = node_dirs
    entry = cluster.install("k8s-real", AGENT)
    os.chmod(cluster.packs_root / entry.volume_digest, 0o755)
    stop = threading.Event()
    kube = KubeApi(cluster.api.api_client())
    codes: list[int] = []
    agent = threading.Thread(target=lambda: codes.append(
        serve_node(cluster.env, stop=stop, kube=kube, packs=PackStore(cluster.packs_root))))  # fmt: skip
    agent.start()
    kubelet: DockerKubelet | None = None
    try:
        cluster.api.wait_for_watches(1, timeout=10)
        spec_runtime = "runsc" if runtime == "runsc" else "runc"
        pod = cluster.place(cluster.submit("k8s-real", "real", goal="three words here", kwargs={"n": 5},
                                           runtime=spec_runtime))  # fmt: skip
        assert pod["spec"].get("runtimeClassName") == ("gvisor" if runtime == "runsc" else None)
        kubelet = DockerKubelet(cluster, docker_client, pod, pinned_image, runtime)
        kubelet.start()
        status = eventually(lambda: cluster.status("real").get("phase") in ("Succeeded", "Failed")
                            and cluster.status("real"), timeout=120, what="the run's result")  # fmt: skip
        assert status["phase"] == "Succeeded", (status, kubelet.logs())
        result = json.loads(status["resultJson"])
        assert result == {"n": 5, "words": 3, "uid": 65532, "network": "none", "root_writable": False}
        eventually(lambda: cluster.api.get("pods", NAMESPACE, pod["metadata"]["name"]) is None,
                   what="the pod deleted")  # fmt: skip
        kubelet.join(timeout=60)
        assert kubelet.exit_code == 0
        (record,) = cluster.audit()
        assert (record["reason"], record["run_id"]) == ("agent_completed", status["runId"])
    finally:
        stop.set()
        agent.join(timeout=60)
        if kubelet is not None:
            kubelet.join(timeout=30)
            kubelet.remove()
    assert codes == [0]
