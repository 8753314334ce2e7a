"""A cluster's state for the node agent's tests: config, lockfile and a node's pack store, the controller's
part (AgentRun + its pod) and a kubelet stand-in that runs the pod's wrapper as a local process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from host._admission import admit
from host._config import HostConfig, load_config
from host._k8s_objects import agentrun as agentrun_body
from host._k8s_pod import pod_for
from host._manifest import manifest_data, parse_manifest
from host._packs import LockEntry, Lockfile, artifact_hash
from tests.support.kubeapi import KubeAPI
from tests.support.packs import write_agent
from tests.support.paths import REPO

PINNED = "registry.example/agentnode-sandbox@sha256:" + "a" * 64
NODE = "node-a"
NAMESPACE = "runs"


@dataclass
class Cluster:
    """One node's view: its config (env), the lockfile, its pack store and the API stand-in."""

    api: KubeAPI
    env: dict[str, str]
    packs_root: Path
    run_root: Path
    kubelets: list[Kubelet] = field(default_factory=list)

    @property
    def config(self) -> HostConfig:
        return load_config(self.env)

    def install(self, slug: str, source: str, *, trust: str = "unverified", agent: str = "") -> LockEntry:
        """Install an agent pack as the lockfile records it, its files placed on this node by digest."""
        src = write_agent(Path(tempfile.mkdtemp(prefix="an-k8s-src-")), slug, source, agent=agent)
        digest = artifact_hash(src)
        shutil.copytree(src, self.packs_root / digest)
        manifest = parse_manifest(yaml.safe_load((src / "agentnode.yaml").read_text()), source="")
        entry = LockEntry(
            slug=slug, version="1.0.0", package_type="agent", trust_level=trust, artifact_hash=digest,
            import_subdir="", sandbox_volume=f"agentnode-pack-{slug}-1.0.0-{digest[:12]}", host_path=None,
            manifest=manifest_data(manifest), installed_at="2026-12-01T00:00:00Z",
        )  # fmt: skip
        Lockfile(load_config(self.env).paths.lockfile).put(entry)
        return entry

    def submit(self, slug: str, name: str, **spec: Any) -> dict[str, Any]:
        """What a user does: create an AgentRun."""
        return dict(self.api.create("agentruns", agentrun_body(name, NAMESPACE, slug=slug, **spec)))

    def place(
        self, agentrun: dict[str, Any], *, node: str = NODE, pod: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The controller's and scheduler's part: the AgentRun's pod (as built, or `pod`), its uid recorded
        in the AgentRun's status, bound to `node`."""
        config = self.config
        request_runtime = (agentrun.get("spec") or {}).get("runtime")
        a = admit(agentrun["spec"]["slug"], lockfile=Lockfile(config.paths.lockfile), config=config,
                  env=self.env, runtime=request_runtime)  # fmt: skip
        assert a.refusal is None, a.refusal
        body = pod if pod is not None else pod_for(a, agentrun, config)
        created = self.api.create("pods", body)
        name = agentrun["metadata"]["name"]
        meta = created["metadata"]
        recorded = {"phase": "Scheduled", "podName": meta["name"], "podUid": meta["uid"]}
        self.api.set_status("agentruns", NAMESPACE, name, recorded)
        self.api.schedule(NAMESPACE, created["metadata"]["name"], node)
        return dict(self.api.get("pods", NAMESPACE, created["metadata"]["name"]) or {})

    def start_kubelet(self, pod: dict[str, Any], entry: LockEntry) -> Kubelet:
        kubelet = Kubelet(self, pod, entry)
        kubelet.start()
        self.kubelets.append(kubelet)
        return kubelet

    def status(self, name: str) -> dict[str, Any]:
        return dict((self.api.get("agentruns", NAMESPACE, name) or {}).get("status") or {})

    def audit(self) -> list[dict[str, Any]]:
        path = self.config.paths.audit_file
        if not path.exists():
            return []
        return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == "agent_run"]


class Kubelet(threading.Thread):
    """What a kubelet does for one pod: start its container (here the wrapper as a local process with the
    pod's socket wait), report its exit in the pod's status, and kill it when the pod is deleted."""

    def __init__(self, cluster: Cluster, pod: dict[str, Any], entry: LockEntry) -> None:
        super().__init__(daemon=True)
        self.cluster, self.pod, self.entry = cluster, pod, entry
        self.returncode: int | None = None
        self.stderr = ""

    def run(self) -> None:
        uid, name = self.pod["metadata"]["uid"], self.pod["metadata"]["name"]
        socket = self.cluster.run_root / f"run-{uid}" / "sandbox.sock"
        env = {
            "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1",
            "AGENTNODE_SOCKET": str(socket), "AGENTNODE_SOCKET_WAIT_SECONDS": "60",
            "AGENTNODE_IMPORT_ROOT": str(self.cluster.packs_root / self.entry.volume_digest),
            "AGENTNODE_FETCH_TIMEOUT": "0",
        }  # fmt: skip
        self.cluster.api.set_status("pods", NAMESPACE, name, {"phase": "Running"})
        proc = subprocess.Popen([sys.executable, "-s", "-m", "sandbox_wrapper"], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        while proc.poll() is None:
            if self.cluster.api.get("pods", NAMESPACE, name) is None:
                proc.kill()  # the pod was deleted: its container goes with it
            time.sleep(0.05)
        self.returncode = proc.returncode
        if proc.stderr is not None:
            with proc.stderr:
                self.stderr = proc.stderr.read()
        terminated = {"exitCode": proc.returncode if proc.returncode >= 0 else 137, "reason": "Completed"}
        status = {"phase": "Succeeded" if proc.returncode == 0 else "Failed",
                  "containerStatuses": [{"name": "agent", "state": {"terminated": terminated}}]}  # fmt: skip
        try:
            self.cluster.api.set_status("pods", NAMESPACE, name, status)
        except Exception:  # the pod is gone already: nothing to report to
            pass


def eventually(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or predicate}")
        time.sleep(0.05)


@pytest.fixture
def cluster(kube_api: KubeAPI, tmp_path: Path) -> Iterator[Cluster]:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps(
        {"agent_sandbox": {"enabled": True, "image": PINNED, "runtime": "runc"}}
    ))  # fmt: skip
    run_root = Path(tempfile.mkdtemp(prefix="an-k8s-"))  # short: a socket path fits in 108 bytes
    packs_root = tmp_path / "packs"
    packs_root.mkdir()
    env = {"AGENTNODE_CONFIG": str(config_dir), "AGENTNODE_RUN_DIR": str(run_root), "NODE_NAME": NODE,
           "HOME": str(tmp_path)}  # fmt: skip
    made = Cluster(api=kube_api, env=env, packs_root=packs_root, run_root=run_root)
    yield made
    for kubelet in made.kubelets:
        kubelet.join(timeout=30)
    shutil.rmtree(run_root, ignore_errors=True)
