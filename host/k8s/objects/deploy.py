"""What a cluster has deployed (namespace, RBAC, policies, the controller, the node agent), in apply order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from host.core.vocab import Runtime
from host.engine.contract import SANDBOX_GID
from host.k8s.objects.admission import admission_policy, admission_policy_binding
from host.k8s.objects.agentrun import GROUP, PLURAL, agentrun_crd
from host.k8s.objects.names import (
    CONFIG_DIR,
    CONFIG_MAP_NAME,
    CONTROLLER_AUDIT_DIR,
    CONTROLLER_AUDIT_FILE,
    CONTROLLER_NAME,
    HOST_IMAGE,
    LABEL_ROLE,
    LLM_SECRET_NAME,
    NAMESPACE,
    NETWORK_POLICY_NAME,
    NODE_AGENT_NAME,
    NODE_AUDIT_FILE,
    ROLE_AGENT_RUN,
    RUN_HOST_DIR,
    RUNTIME_CLASS,
    STATE_HOST_DIR,
    object_meta,
)
from host.k8s.objects.pod import pod_security, restricted_container_security


def namespace(name: str = NAMESPACE) -> dict[str, Any]:
    """The controller's and node agent's namespace. Pod Security "privileged" on purpose: the node agent is
    root with a hostPath (see node_agent_daemonset); run pods live in their AgentRun's namespace."""
    meta = object_meta(name)
    meta["labels"] = {**meta["labels"], "pod-security.kubernetes.io/enforce": "privileged"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


_namespace = namespace  # deploy_objects' parameter of the same name shadows it there


def network_policy(namespace: str) -> dict[str, Any]:
    """No traffic in or out of a run pod: it talks to its node agent over its Unix socket only. One in
    every namespace that holds AgentRuns (it is only enforced where the network plugin supports policies)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(NETWORK_POLICY_NAME, namespace),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_ROLE: ROLE_AGENT_RUN}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def runtime_class(name: str = RUNTIME_CLASS, handler: str = Runtime.RUNSC.value) -> dict[str, Any]:
    """gVisor for runsc runs; the node's containerd must have the runsc handler configured."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": object_meta(name),
        "handler": handler,
    }


def service_account(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(name, namespace)}


def _rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str]) -> dict[str, Any]:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


def controller_cluster_role() -> dict[str, Any]:
    """The controller creates run pods and writes AgentRun status; kopf also watches CRDs and namespaces."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": object_meta(CONTROLLER_NAME),
        "rules": [
            _rule([GROUP], [PLURAL], ["get", "list", "watch", "patch"]),
            _rule([GROUP], [f"{PLURAL}/status"], ["get", "patch", "update"]),
            # a pod whose owner reference blocks the owner's deletion needs this where the API server
            # enforces owner-reference permissions (OwnerReferencesPermissionEnforcement, e.g. OpenShift)
            _rule([GROUP], [f"{PLURAL}/finalizers"], ["update"]),
            _rule([""], ["pods"], ["create", "get", "list", "watch", "delete"]),
            _rule([""], ["events"], ["create", "patch"]),
            _rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["get", "list", "watch"]),
            _rule([""], ["namespaces"], ["list", "watch"]),
        ],
    }


def node_agent_cluster_role() -> dict[str, Any]:
    """The node agent watches run pods and AgentRuns and reports; it never creates a pod."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": object_meta(NODE_AGENT_NAME),
        "rules": [
            _rule([""], ["pods"], ["get", "list", "watch", "delete"]),
            _rule([GROUP], [PLURAL], ["get", "list", "watch"]),
            _rule([GROUP], [f"{PLURAL}/status"], ["get", "patch"]),
        ],
    }


def cluster_role_binding(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """Binds the ClusterRole `name` to the ServiceAccount `name` (each component has one of each)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": object_meta(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


def _component_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name}


def _config_env() -> list[dict[str, Any]]:
    return [
        {"name": "AGENTNODE_CONFIG", "value": f"{CONFIG_DIR}/config.json"},
        {"name": "HOME", "value": "/tmp"},
        {
            "name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
        },
    ]


def _config_volumes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes = [
        {"name": "config", "configMap": {"name": CONFIG_MAP_NAME}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    return mounts, volumes


def controller_audit_claim(namespace: str = NAMESPACE) -> dict[str, Any]:
    """Where the controller's audit log lives: the runs it refuses get their one record there, and it must
    outlive the controller's pod."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(f"{CONTROLLER_NAME}-audit", namespace),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def controller_deployment(
    namespace: str = NAMESPACE, image: str = HOST_IMAGE, *, run_namespaces: Sequence[str] = ("default",)
) -> dict[str, Any]:
    """The controller: restricted like any workload; it keeps its service account token (it calls the API).
    One replica, replaced not rolled: two controllers would race to create the same pods."""
    mounts, volumes = _config_volumes()
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(CONTROLLER_NAME, namespace),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _component_labels(CONTROLLER_NAME)},
            "template": {
                "metadata": {"labels": _component_labels(CONTROLLER_NAME)},
                "spec": {
                    "serviceAccountName": CONTROLLER_NAME,
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": {**pod_security(), "fsGroup": SANDBOX_GID},  # its audit volume
                    "containers": [
                        {
                            "name": "controller",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            # only the namespaces that hold the deny-all NetworkPolicy: an AgentRun anywhere
                            # else is never admitted, so no run pod exists where egress is open
                            "command": [
                                "agentnode-sandbox", "k8s-controller",
                                *(arg for ns in run_namespaces for arg in ("--namespace", ns)),
                            ],
                            "env": [
                                *_config_env(),
                                {"name": "AGENTNODE_AUDIT_FILE", "value": CONTROLLER_AUDIT_FILE},
                            ],
                            "securityContext": restricted_container_security(),
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "volumeMounts": [*mounts, {"name": "audit", "mountPath": CONTROLLER_AUDIT_DIR}],
                        }
                    ],
                    "volumes": [
                        *volumes,
                        {"name": "audit", "persistentVolumeClaim": {"claimName": f"{CONTROLLER_NAME}-audit"}},
                    ],
                },
            },
        },
    }


def node_agent_daemonset(namespace: str = NAMESPACE, image: str = HOST_IMAGE) -> dict[str, Any]:
    """`serve --node` on every node: it serves each run pod of its node over that pod's socket and is the
    only component that calls an LLM provider (the keys come from the Secret, which may be absent)."""
    mounts, volumes = _config_volumes()
    # Root, because it makes the run sockets and pack directories on the node, root-owned as the contract
    # says (docs/kubernetes.md), under a root-owned hostPath; with CHOWN and FOWNER to hand each run's socket
    # directory to the sandbox uid (65532) and no one else, and DAC_OVERRIDE to remove it afterwards and to
    # read and verify packs whatever their modes. It never escalates (no privilege escalation, read-only
    # root).
    security = {**restricted_container_security(uid=0, gid=0), "runAsNonRoot": False}
    security["capabilities"] = {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": object_meta(NODE_AGENT_NAME, namespace),
        "spec": {
            "selector": {"matchLabels": _component_labels(NODE_AGENT_NAME)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": _component_labels(NODE_AGENT_NAME)},
                "spec": {
                    "serviceAccountName": NODE_AGENT_NAME,
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(uid=0, gid=0),
                    "containers": [
                        {
                            "name": "node-agent",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["agentnode-sandbox", "serve", "--node"],
                            "env": [
                                {
                                    "name": "NODE_NAME",
                                    "valueFrom": {
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}
                                    },
                                },
                                *_config_env(),
                                # its run directories and its audit log live on the node, beside the
                                # packs (the config is a read-only ConfigMap)
                                {"name": "AGENTNODE_RUN_DIR", "value": RUN_HOST_DIR},
                                {"name": "AGENTNODE_AUDIT_FILE", "value": NODE_AUDIT_FILE},
                            ],
                            "envFrom": [{"secretRef": {"name": LLM_SECRET_NAME, "optional": True}}],
                            "securityContext": security,
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "256Mi"},
                                "limits": {"memory": "2Gi"},
                            },
                            "volumeMounts": [{"name": "state", "mountPath": STATE_HOST_DIR}, *mounts],
                        }
                    ],
                    "volumes": [
                        {"name": "state", "hostPath": {"path": STATE_HOST_DIR, "type": "DirectoryOrCreate"}},
                        *volumes,
                    ],
                },
            },
        },
    }


def deploy_objects(
    namespace: str = NAMESPACE, image: str = HOST_IMAGE, *, run_namespaces: Sequence[str] = ("default",)
) -> list[dict[str, Any]]:
    """Everything a cluster needs, in apply order (the CRD first, the workloads last). `run_namespaces` are
    the namespaces that hold AgentRuns: each gets the deny-all NetworkPolicy."""
    return [
        agentrun_crd(),
        _namespace(namespace),
        runtime_class(),
        service_account(CONTROLLER_NAME, namespace),
        service_account(NODE_AGENT_NAME, namespace),
        controller_cluster_role(),
        node_agent_cluster_role(),
        cluster_role_binding(CONTROLLER_NAME, namespace),
        cluster_role_binding(NODE_AGENT_NAME, namespace),
        *(network_policy(ns) for ns in run_namespaces),
        admission_policy(namespace),
        admission_policy_binding(),
        controller_audit_claim(namespace),
        controller_deployment(namespace, image, run_namespaces=run_namespaces),
        node_agent_daemonset(namespace, image),
    ]


__all__ = [
    "cluster_role_binding",
    "controller_audit_claim",
    "controller_cluster_role",
    "controller_deployment",
    "deploy_objects",
    "namespace",
    "network_policy",
    "node_agent_cluster_role",
    "node_agent_daemonset",
    "runtime_class",
    "service_account",
]
