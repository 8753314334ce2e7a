"""The names the Kubernetes objects share (labels, node paths, deploy names) and the forms the API accepts."""

from __future__ import annotations

import re
from typing import Any

# --- the contract (docs/kubernetes.md) -------------------------------------------------------------------
LABEL_ROLE = "sandbox.agentnode.net/role"
ROLE_AGENT_RUN = "agent-run"
LABEL_AGENTRUN = "sandbox.agentnode.net/agentrun"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "agentnode-sandbox"
ANNOTATION_PIDS = "sandbox.agentnode.net/pids-limit"
"""A local run's process ceiling, recorded on the pod: Kubernetes has no per-pod pids field, so on a cluster
the node's kubelet `podPidsLimit` is what bounds a run's processes (set it there)."""
RUN_HOST_DIR = "/var/lib/agentnode-sandbox/run"
PACK_HOST_DIR = "/var/lib/agentnode-sandbox/packs"
STATE_HOST_DIR = "/var/lib/agentnode-sandbox"
NODE_AUDIT_FILE = f"{STATE_HOST_DIR}/audit/audit.jsonl"
"""A node agent's audit log: on the node's disk, so it outlives the node agent's pod."""
CONTROLLER_AUDIT_DIR = "/var/lib/agentnode-sandbox-controller"
"""The controller's audit log (the runs it refuses) lives on its PersistentVolumeClaim."""
CONTROLLER_AUDIT_FILE = f"{CONTROLLER_AUDIT_DIR}/audit.jsonl"
NAMESPACE = "agentnode-system"
POD_UID_ENV = "AGENTNODE_POD_UID"
RUN_DIR_PREFIX = "run-"
"""A run pod's socket directory is `<RUN_HOST_DIR>/run-<pod uid>`: the node agent's run root holds run
directories by the single-host naming (host/runtime/rundir.py): its startup sweep audits what a crashed one
left."""
RUNTIME_CLASS = "gvisor"
"""The RuntimeClass of a runsc run (handler runsc); a runc run names none and gets the node's default."""
AGENT_CONTAINER = "agent"
POD_NAME_PREFIX = "arun-"

# --- the deploy names --------------------------------------------------------------------------------------
CONTROLLER_NAME = "agentnode-sandbox-controller"
NODE_AGENT_NAME = "agentnode-sandbox-node-agent"
CONFIG_MAP_NAME = "agentnode-sandbox-config"
LLM_SECRET_NAME = "agentnode-sandbox-llm"  # noqa: S105 (a name, not a secret)
CONFIG_DIR = "/etc/agentnode-sandbox"
ADMISSION_POLICY_NAME = "agentnode-sandbox-run-pods"
NETWORK_POLICY_NAME = "agentnode-sandbox-run-pods-isolated"
HOST_IMAGE = "agentnode-sandbox:0.1.0"
"""The host's own image (controller and node agent), overridden with kustomize's `images:`."""

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


def is_dns_label(value: str) -> bool:
    """A Kubernetes namespace, AgentRun or RuntimeClass name: 1-63 of a-z 0-9 -, alphanumeric at both ends."""
    return bool(_DNS_LABEL.fullmatch(value))


def object_meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    return {**meta, "labels": {LABEL_MANAGED_BY: MANAGED_BY}, **extra}


def quantity_bytes(n: int) -> str:
    """A byte count as the API server prints it back (its canonical form), so an expected pod compares
    equal to the live one: the largest binary suffix that divides it, else the largest decimal one."""
    if n == 0:
        return "0"
    for suffix, unit in (
        ("Ei", 2**60),
        ("Pi", 2**50),
        ("Ti", 2**40),
        ("Gi", 2**30),
        ("Mi", 2**20),
        ("Ki", 1024),
    ):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    for suffix, unit in (
        ("E", 10**18),
        ("P", 10**15),
        ("T", 10**12),
        ("G", 10**9),
        ("M", 10**6),
        ("k", 1000),
    ):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def quantity_cpu(millis: int) -> str:
    """Millicores in the API server's canonical form ("1", "1500m")."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


__all__ = [
    "ADMISSION_POLICY_NAME",
    "AGENT_CONTAINER",
    "ANNOTATION_PIDS",
    "CONFIG_DIR",
    "CONFIG_MAP_NAME",
    "CONTROLLER_AUDIT_DIR",
    "CONTROLLER_AUDIT_FILE",
    "CONTROLLER_NAME",
    "HOST_IMAGE",
    "LABEL_AGENTRUN",
    "LABEL_MANAGED_BY",
    "LABEL_ROLE",
    "LLM_SECRET_NAME",
    "MANAGED_BY",
    "NAMESPACE",
    "NETWORK_POLICY_NAME",
    "NODE_AGENT_NAME",
    "NODE_AUDIT_FILE",
    "PACK_HOST_DIR",
    "POD_NAME_PREFIX",
    "POD_UID_ENV",
    "ROLE_AGENT_RUN",
    "RUNTIME_CLASS",
    "RUN_DIR_PREFIX",
    "RUN_HOST_DIR",
    "STATE_HOST_DIR",
    "is_dns_label",
    "object_meta",
    "quantity_bytes",
    "quantity_cpu",
]
