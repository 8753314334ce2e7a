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

from host.k8s.objects.agentrun import RunRequest
from host.k8s.objects.agentrun import agentrun as agentrun_body
from host.k8s.objects.pod import pod_for
from host.packs.files import artifact_hash
from host.policy.admission import admit
from host.spec.config import HostConfig, load_config
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.manifest.load import manifest_data, parse_manifest
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
        with tempfile.TemporaryDirectory(prefix="an-k8s-src-") as scratch:  # each test run left one behind
            src = write_agent(Path(scratch), slug, source, agent=agent)
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
        body = agentrun_body(name, NAMESPACE, RunRequest(slug=slug, **spec))
        return dict(self.api.create("agentruns", body))

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
    """Poll `predicate` until it returns something truthy (its value); fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


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


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion, as the kubelet applies it to subPathExpr."""
    for name, value in env.items():
        text = text.replace(f"$({name})", value)
    return text


def docker_kwargs_for_pod(
    pod: dict[str, Any], *, image: str, runtime: str, run_root: Path, packs_root: Path, labels: dict[str, str]
) -> dict[str, Any]:
    """What a kubelet would run for this pod, as Docker create arguments: the pod's own command, env
    (downward API resolved), mounts (hostPaths mapped to this machine's node directories, subPathExpr
    expanded, emptyDirs as tmpfs), user, read-only root, dropped capabilities and limits. No network stands
    in for the deny-all NetworkPolicy. Only the image differs: no registry here, so the locally pinned image
    (the same build) stands in for the pod's registry reference."""
    from docker.types import Mount

    from host.k8s.objects.names import PACK_HOST_DIR, RUN_HOST_DIR

    spec = pod["spec"]
    (container,) = spec["containers"]
    uid = pod["metadata"]["uid"]
    fields = {"metadata.uid": uid, "metadata.name": pod["metadata"]["name"],
              "metadata.namespace": pod["metadata"]["namespace"]}  # fmt: skip
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        ref = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[var["name"]] = fields[ref] if ref else str(var.get("value", ""))
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    host_dirs = {RUN_HOST_DIR: run_root, PACK_HOST_DIR: packs_root}
    mounts: list[Mount] = []
    tmpfs: dict[str, str] = {}
    for m in container.get("volumeMounts") or []:
        volume = volumes[m["name"]]
        if "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", "16Mi").replace("Mi", "m").replace("Ki", "k")
            mode = "ro" if m.get("readOnly") else "rw"
            tmpfs[m["mountPath"]] = f"{mode},nosuid,nodev,noexec,size={size},uid=65532,gid=65532,mode=0700"
            continue
        path = volume["hostPath"]["path"]
        base = next(f"{to}{path[len(pre):]}" for pre, to in host_dirs.items() if path.startswith(pre))
        sub = _expand(m.get("subPathExpr") or m.get("subPath") or "", env)
        source = f"{base}/{sub}" if sub else base
        read_only = bool(m.get("readOnly"))
        mounts.append(Mount(target=m["mountPath"], source=source, type="bind", read_only=read_only))
    security = container.get("securityContext") or {}
    pod_security = spec.get("securityContext") or {}
    limits = (container.get("resources") or {}).get("limits") or {}
    memory = str(limits.get("memory", "512Mi")).replace("Mi", "m").replace("Gi", "g")
    command = list(container.get("command") or []) + list(container.get("args") or [])
    return {
        "image": image,
        "entrypoint": command[:1],
        "command": command[1:],
        "environment": env,
        "user": f"{pod_security.get('runAsUser', 65532)}:{pod_security.get('runAsGroup', 65532)}",
        "read_only": bool(security.get("readOnlyRootFilesystem")),
        "cap_drop": ["ALL"] if "ALL" in ((security.get("capabilities") or {}).get("drop") or []) else [],
        "security_opt": ["no-new-privileges"] if security.get("allowPrivilegeEscalation") is False else [],
        "network_mode": "none",
        "mem_limit": memory,
        "pids_limit": 256,
        "mounts": mounts,
        "tmpfs": tmpfs,
        "runtime": runtime,
        "labels": labels,
        "detach": True,
    }
