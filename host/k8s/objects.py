"""The Kubernetes objects of docs/kubernetes.md as plain data, built in one place so the controller, the node
agent, the deploy files and the tests cannot disagree about a name, a label or a hardening field."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from host.core.vocab import Runtime
from host.engine.contract import (
    HOME_IN_CONTAINER,
    PACK_DIR_IN_CONTAINER,
    SANDBOX_GID,
    SANDBOX_UID,
    SOCKET_DIR_IN_CONTAINER,
    SOCKET_NAME,
    ContainerLimits,
)
from host.engine.wrapper_env import SOCKET_WAIT_ENV, WRAPPER_ARGS, wrapper_env
from host.policy.caller import (
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_REQUEST_ID_CHARS,
    MAX_TENANT_CHARS,
    CallerInfo,
)
from host.spec.manifest.model import SLUG_RE

# --- the contract (docs/kubernetes.md) -------------------------------------------------------------------
GROUP = "sandbox.agentnode.net"
VERSION = "v1alpha1"
KIND = "AgentRun"
PLURAL = "agentruns"
SINGULAR = "agentrun"
SHORT_NAME = "arun"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"
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

# --- bounds of an AgentRun ---------------------------------------------------------------------------------
# A local run's kwargs are bounded only by the admin socket's 16 MiB message; an AgentRun is one etcd object
# (1.5 MiB by default, spec and status together), so these caps are smaller: at 4 UTF-8 bytes a character,
# the worst case of goal + kwargsJson + resultJson + error + hint still fits.
MAX_GOAL_CHARS = 16 * 1024
MAX_KWARGS_JSON_CHARS = 128 * 1024
MAX_RESULT_JSON_CHARS = 128 * 1024
MAX_ERROR_CHARS = 1024
MAX_HINT_CHARS = 1024
MAX_AGENTRUN_NAME_CHARS = 63
"""An AgentRun's name is a label value on its pod, and label values stop at 63 characters."""
PHASES = ("Pending", "Scheduled", "Running", "Succeeded", "Failed")

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,63}\Z)[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:[A-Za-z0-9][A-Za-z0-9.-]{{0,252}}(?::[0-9]{{1,5}})?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}",
    re.ASCII,
)
"""A registry reference pinned by digest (an optional tag beside it is ignored by every runtime)."""
_PACK_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
# Each part starts with a letter, digit or `_`: never `.` or `..`.
_IMPORT_ROOT = re.compile(
    rf"{PACK_DIR_IN_CONTAINER}(?:/[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}){{0,8}}", re.ASCII
)
_MODULE = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?", re.ASCII)
_MAX_SOCKET_WAIT_SECONDS = 600
"""The wrapper's own ceiling on AGENTNODE_SOCKET_WAIT_SECONDS (sandbox_wrapper/_runner.py)."""


def is_dns_label(value: str) -> bool:
    """A Kubernetes namespace, AgentRun or RuntimeClass name: 1-63 of a-z 0-9 -, alphanumeric at both ends."""
    return bool(_DNS_LABEL.fullmatch(value))


def _anchored(pattern: re.Pattern[str]) -> str:
    """A Python fullmatch pattern as OpenAPI/CEL spell it (a search, so it needs both anchors)."""
    return f"^(?:{pattern.pattern})$"


def _labels(agentrun_name: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_ROLE: ROLE_AGENT_RUN, LABEL_AGENTRUN: agentrun_name}


def _meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
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


# --- the AgentRun ------------------------------------------------------------------------------------------


def _string(max_length: int, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length}
    if pattern is not None:
        schema["pattern"] = pattern
    return schema


def _spec_schema() -> dict[str, Any]:
    caller_label_key = r"^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$"
    return {
        "type": "object",
        "description": "What to run. Immutable: a changed request is a new AgentRun.",
        "required": ["slug"],
        "properties": {
            "slug": _string(64, _anchored(SLUG_RE)),
            "goal": _string(MAX_GOAL_CHARS),
            "kwargsJson": {
                **_string(MAX_KWARGS_JSON_CHARS),
                "description": "The run's keyword arguments as JSON text (an object).",
            },
            "runtime": {"type": "string", "enum": [Runtime.RUNSC.value, Runtime.RUNC.value]},
            "caller": {
                "type": "object",
                "properties": {
                    "tenant": _string(MAX_TENANT_CHARS, r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"),
                    "requestId": _string(MAX_REQUEST_ID_CHARS, r"^[A-Za-z0-9._:/+=-]{1,128}$"),
                    "labels": {
                        "type": "object",
                        "description": (
                            f"At most {MAX_LABELS}; names are 1-{MAX_LABEL_KEY_CHARS} of a-z 0-9 . _ - "
                            f"({caller_label_key}; checked by the controller, as OpenAPI cannot constrain "
                            "map keys)."
                        ),
                        "maxProperties": MAX_LABELS,
                        "additionalProperties": _string(
                            MAX_LABEL_VALUE_CHARS, r"^[A-Za-z0-9._:/+=@-]{0,128}$"
                        ),
                    },
                },
            },
        },
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "spec is immutable: create a new AgentRun instead"}
        ],
    }


def _status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "runId": _string(64, r"^[0-9a-f]{1,64}$"),
            "podName": _string(253),
            "podUid": _string(36),
            "success": {"type": "boolean"},
            "resultJson": _string(MAX_RESULT_JSON_CHARS),
            "errorCode": {**_string(64, r"^[a-z][a-z0-9_]{0,63}$"), "description": "An audit reason."},
            "error": _string(MAX_ERROR_CHARS),
            "hint": _string(MAX_HINT_CHARS),
            "timedOut": {"type": "boolean"},
            "durationMs": {"type": "integer", "format": "int64", "minimum": 0},
            "auditDigest": {
                **_string(71, r"^(?:sha256:)?[0-9a-f]{64}$"),
                "description": "sha256 of the run's audit record line.",
            },
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "modeUsed": _string(32, r"^[a-z_]{1,32}$"),
            "resultTruncated": {
                "type": "boolean",
                "description": "The result was larger than resultJson may hold, so it is not in the status.",
            },
        },
    }


def agentrun_crd() -> dict[str, Any]:
    """The AgentRun CustomResourceDefinition: bounds mirror a local run's, and the spec cannot change once
    admitted (the pod that runs it is made from it exactly once)."""
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec_schema(),
            "status": _status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_AGENTRUN_NAME_CHARS}",
                "message": f"an AgentRun name is at most {MAX_AGENTRUN_NAME_CHARS} characters "
                "(it is a label value on its pod)",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": _meta(CRD_NAME),
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Error", "type": "string", "jsonPath": ".status.errorCode"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def agentrun(
    name: str,
    namespace: str,
    *,
    slug: str,
    goal: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    runtime: Runtime | str | None = None,
    caller: CallerInfo | None = None,
) -> dict[str, Any]:
    """An AgentRun body; `kwargs` travels as compact JSON text (kwargsJson), so no schema has to describe
    it. Unset fields are left out: the controller fills them from the cluster's config."""
    spec: dict[str, Any] = {"slug": slug}
    if goal is not None:
        spec["goal"] = goal
    if kwargs is not None:
        spec["kwargsJson"] = json.dumps(
            dict(kwargs), separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    if runtime is not None:
        spec["runtime"] = str(runtime)
    if caller is not None and not caller.empty:
        who: dict[str, Any] = {}
        if caller.tenant:
            who["tenant"] = caller.tenant
        if caller.request_id:
            who["requestId"] = caller.request_id
        if caller.labels:
            who["labels"] = dict(caller.labels)
        spec["caller"] = who
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


# --- the run pod -------------------------------------------------------------------------------------------

_DEFAULT_LIMITS = ContainerLimits()
_WHOLE_FIELDS = ("memory_bytes", "cpu_millis", "pids", "ephemeral_storage_bytes", "active_deadline_seconds",
                 "socket_wait_seconds", "home_bytes", "tmp_bytes")  # fmt: skip


@dataclass(frozen=True)
class PodInputs:
    """Everything a run pod is made of, and nothing else: checked here, since the image and the pack digest
    end up in a pull and a node path."""

    namespace: str
    agentrun_name: str
    agentrun_uid: str
    image: str
    """A registry reference pinned by digest (`repo@sha256:<64 hex>`): a node pulls what was pinned."""
    runtime_class_name: str | None
    """None: the node's default runtime (runc)."""
    pack_digest: str
    """The pack volume's digest (LockEntry.volume_digest: `<64 hex>`, or `sha256:<64 hex>`)."""
    import_root: str
    preload: str = ""
    memory_bytes: int = _DEFAULT_LIMITS.memory_bytes
    cpu_millis: int = int(_DEFAULT_LIMITS.cpus * 1000)
    pids: int = _DEFAULT_LIMITS.pids
    ephemeral_storage_bytes: int = 128 * 1024 * 1024
    """The pod's logs (its root is read-only and its scratch space is memory)."""
    active_deadline_seconds: int = 3600
    socket_wait_seconds: int = 120
    home_bytes: int = _DEFAULT_LIMITS.home_bytes
    tmp_bytes: int = _DEFAULT_LIMITS.tmp_bytes

    def __post_init__(self) -> None:
        for field_name in _WHOLE_FIELDS:
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"PodInputs.{field_name} must be a positive whole number")
        runtime_class = self.runtime_class_name
        checks = (
            ("namespace", _DNS_LABEL.fullmatch(self.namespace)),
            ("agentrun_name", _DNS_SUBDOMAIN.fullmatch(self.agentrun_name)),
            ("agentrun_uid", _UID.fullmatch(self.agentrun_uid)),
            ("image", len(self.image) <= 512 and _IMAGE.fullmatch(self.image)),
            ("pack_digest", _PACK_DIGEST.fullmatch(self.pack_digest)),
            ("import_root", _IMPORT_ROOT.fullmatch(self.import_root)),
            ("preload", len(self.preload) <= 256 and _MODULE.fullmatch(self.preload)),
            ("runtime_class_name", runtime_class is None or _DNS_LABEL.fullmatch(runtime_class)),
            ("socket_wait_seconds", self.socket_wait_seconds <= _MAX_SOCKET_WAIT_SECONDS),
        )
        for field_name, ok in checks:
            if not ok:  # the message never holds the value: it may be anything an AgentRun carried
                raise ValueError(f"PodInputs.{field_name} is not of the accepted form")

    @property
    def pack_hex(self) -> str:
        match = _PACK_DIGEST.fullmatch(self.pack_digest)
        assert match is not None  # checked in __post_init__
        return match.group(1)

    @property
    def pod_name(self) -> str:
        return pod_name(self.agentrun_uid)


def pod_name(agentrun_uid: str) -> str:
    """The run pod's name: deterministic, so a repeated event never creates a second pod."""
    return f"{POD_NAME_PREFIX}{agentrun_uid}"


def owner_reference(agentrun_name: str, agentrun_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": agentrun_name,
        "uid": agentrun_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _env(values: Mapping[str, str]) -> list[dict[str, Any]]:
    # The API server drops an empty `value` (omitempty): leave it out here too, so live and expected agree.
    return [{"name": k, "value": v} if v else {"name": k} for k, v in values.items()]


def _restricted_container_security(*, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
    }


def _pod_security(*, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> dict[str, Any]:
    return {
        "runAsNonRoot": uid != 0,
        "runAsUser": uid,
        "runAsGroup": gid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def run_pod(inputs: PodInputs) -> dict[str, Any]:
    """The run's pod: the Docker spec's hardening (host/engine/spec.container_spec) in Kubernetes' terms.

    What has no pod field: the pids ceiling (the kubelet's podPidsLimit; recorded in ANNOTATION_PIDS), the
    ulimits (the runtime's defaults), the engine's `init` (the wrapper is PID 1). The network is the pod's
    own namespace with no route out: the NetworkPolicy denies all traffic and there is no DNS server.
    """
    memory = quantity_bytes(inputs.memory_bytes)
    resources = {
        "cpu": quantity_cpu(inputs.cpu_millis),
        "memory": memory,
        "ephemeral-storage": quantity_bytes(inputs.ephemeral_storage_bytes),
    }
    env = _env(
        wrapper_env(
            home=HOME_IN_CONTAINER,
            path="/usr/bin:/bin",
            pythonpath="/opt/agentnode/site",
            socket=f"{SOCKET_DIR_IN_CONTAINER}/{SOCKET_NAME}",
            import_root=inputs.import_root,
            preload=inputs.preload,
        )
    )
    env += [
        {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}},
        {"name": SOCKET_WAIT_ENV, "value": str(inputs.socket_wait_seconds)},
    ]
    spec: dict[str, Any] = {}
    if inputs.runtime_class_name is not None:
        spec["runtimeClassName"] = inputs.runtime_class_name
    spec |= {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": inputs.active_deadline_seconds,
        "terminationGracePeriodSeconds": 5,
        # No DNS: a loopback server nothing listens on (dnsPolicy None needs one nameserver).
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "securityContext": _pod_security(),
        "containers": [
            {
                "name": AGENT_CONTAINER,
                "image": inputs.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/usr/bin/python3", *WRAPPER_ARGS],
                "workingDir": HOME_IN_CONTAINER,
                "env": env,
                "securityContext": _restricted_container_security(),
                "resources": {"limits": dict(resources), "requests": dict(resources)},
                "volumeMounts": [
                    # Only this pod's own directory of the node's run dir: its socket, no other run's.
                    {
                        "name": "socket",
                        "mountPath": SOCKET_DIR_IN_CONTAINER,
                        "readOnly": True,
                        "subPathExpr": f"{RUN_DIR_PREFIX}$({POD_UID_ENV})",
                    },
                    {"name": "pack", "mountPath": PACK_DIR_IN_CONTAINER, "readOnly": True},
                    {"name": "home", "mountPath": HOME_IN_CONTAINER},
                    {"name": "tmp", "mountPath": "/tmp"},
                    # As in the Docker spec: no writable shared-memory or message-queue filesystem.
                    {"name": "sealed", "mountPath": "/dev/shm", "readOnly": True},
                    {"name": "sealed", "mountPath": "/dev/mqueue", "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {"name": "socket", "hostPath": {"path": RUN_HOST_DIR, "type": "Directory"}},
            {"name": "pack", "hostPath": {"path": f"{PACK_HOST_DIR}/{inputs.pack_hex}", "type": "Directory"}},
            {
                "name": "home",
                "emptyDir": {"medium": "Memory", "sizeLimit": quantity_bytes(inputs.home_bytes)},
            },
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": quantity_bytes(inputs.tmp_bytes)}},
            {"name": "sealed", "emptyDir": {"medium": "Memory", "sizeLimit": "4Ki"}},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": inputs.pod_name,
            "namespace": inputs.namespace,
            "labels": _labels(inputs.agentrun_name),
            "annotations": {ANNOTATION_PIDS: str(inputs.pids)},
            "ownerReferences": [owner_reference(inputs.agentrun_name, inputs.agentrun_uid)],
        },
        "spec": spec,
    }


# --- refusing a pod the node agent did not expect ----------------------------------------------------------

_ZERO_OMITTED = frozenset({"hostNetwork", "hostPID", "hostIPC"})
"""Plain booleans the API server leaves out when false."""
_SPEC_SERVER_FIELDS = frozenset({
    "nodeName", "serviceAccountName", "serviceAccount", "schedulerName", "tolerations", "priority",
    "priorityClassName", "preemptionPolicy", "nodeSelector", "affinity", "overhead", "schedulingGates",
    "readinessGates", "topologySpreadConstraints", "imagePullSecrets",
})  # fmt: skip
"""What the API server, its admission plugins (service account, priority, RuntimeClass scheduling and
overhead) or the scheduler add to a pod: placement and bookkeeping, nothing inside the boundary."""
_POD_SPEC_FIELDS = _SPEC_SERVER_FIELDS | {
    "volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "automountServiceAccountToken",
    "hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "securityContext", "hostname", "subdomain",
    "hostAliases", "dnsConfig", "runtimeClassName", "enableServiceLinks", "setHostnameAsFQDN", "os",
    "hostUsers", "resourceClaims", "resources", "hostnameOverride",
}  # fmt: skip
"""PodSpec's field names: a path names one of these or says `[+extra]`, never a name from the pod."""
_CONTAINER_SERVER_FIELDS = frozenset({"terminationMessagePath", "terminationMessagePolicy", "resizePolicy"})
_CONTAINER_FIELDS = _CONTAINER_SERVER_FIELDS | {
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources", "volumeMounts",
    "volumeDevices", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "imagePullPolicy",
    "securityContext", "stdin", "stdinOnce", "tty", "restartPolicy", "restartPolicyRules",
}  # fmt: skip


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _unset(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, list | dict | str) and not value)


def _by_name(items: Any, wanted: set[str]) -> tuple[dict[str, Mapping[str, Any]], bool]:
    """The first item of each wanted name, and whether anything else is there (never its name)."""
    found: dict[str, Mapping[str, Any]] = {}
    extra = False
    for item in items if isinstance(items, list) else []:
        name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(name, str) and name in wanted and name not in found:
            found[name] = item
        else:
            extra = True
    return found, extra


def _containers(want: Sequence[Mapping[str, Any]], got: Any) -> list[str]:
    found, extra = _by_name(got, {c["name"] for c in want})
    out: list[str] = []
    for container in want:
        path = f"spec.containers[{container['name']}]"
        have = found.get(container["name"])
        if have is None:
            out.append(path)
            continue
        out += [f"{path}.{key}" for key, value in container.items() if have.get(key) != value]
        for key, value in have.items():
            if key not in container and key not in _CONTAINER_SERVER_FIELDS and not _unset(value):
                out.append(f"{path}.{key}" if key in _CONTAINER_FIELDS else f"{path}[+extra]")
    return [*out, "spec.containers[+extra]"] if extra else out


def _volumes(want: Sequence[Mapping[str, Any]], got: Any) -> list[str]:
    found, extra = _by_name(got, {v["name"] for v in want})
    out = [f"spec.volumes[{v['name']}]" for v in want if found.get(v["name"]) != v]
    return [*out, "spec.volumes[+extra]"] if extra else out


def pod_mismatches(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Where a live pod differs from the one the controller should have made, as short field paths ([] when
    it is that pod). The live pod is hostile input: a path names our own fields or says `[+extra]`, never a
    value or a name taken from it.

    Every field of the expected spec must be equal (containers and volumes by name, each whole); what the
    server adds for placement and bookkeeping is allowed; anything else the pod carries (another container
    of any kind, a volume, host namespaces, a security context field, host aliases) is a mismatch.
    """
    out: list[str] = []
    e_meta, a_meta = _map(expected.get("metadata")), _map(actual.get("metadata"))
    out += [
        f"metadata.{key}"
        for key in ("name", "namespace", "ownerReferences")
        if e_meta.get(key) != a_meta.get(key)
    ]
    e_labels, a_labels = _map(e_meta.get("labels")), _map(a_meta.get("labels"))
    out += [f"metadata.labels[{key}]" for key, value in e_labels.items() if a_labels.get(key) != value]
    if any(key not in e_labels for key in a_labels):
        out.append("metadata.labels[+extra]")
    e_notes, a_notes = _map(e_meta.get("annotations")), _map(a_meta.get("annotations"))
    out += [f"metadata.annotations[{k}]" for k, v in e_notes.items() if a_notes.get(k) != v]
    if any(key not in e_notes for key in a_notes):
        # a runtime may read annotations when it makes the sandbox (gVisor flag overrides, AppArmor, CRI-O)
        out.append("metadata.annotations[+extra]")

    e_spec, a_spec = _map(expected.get("spec")), _map(actual.get("spec"))
    for key, want in e_spec.items():
        if key == "containers":
            out += _containers(want, a_spec.get(key))
        elif key == "volumes":
            out += _volumes(want, a_spec.get(key))
        elif key in _ZERO_OMITTED and want is False:
            if a_spec.get(key) not in (None, False):
                out.append(f"spec.{key}")
        elif key not in a_spec or a_spec[key] != want:
            out.append(f"spec.{key}")
    for key, value in a_spec.items():
        if key not in e_spec and key not in _SPEC_SERVER_FIELDS and not _unset(value):
            out.append(f"spec.{key}" if key in _POD_SPEC_FIELDS else "spec[+extra]")
    return out


# --- the deploy objects ------------------------------------------------------------------------------------


def namespace(name: str = NAMESPACE) -> dict[str, Any]:
    """The controller's and node agent's namespace. Pod Security "privileged" on purpose: the node agent is
    root with a hostPath (see node_agent_daemonset); run pods live in their AgentRun's namespace."""
    meta = _meta(name)
    meta["labels"] = {**meta["labels"], "pod-security.kubernetes.io/enforce": "privileged"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


_namespace = namespace  # deploy_objects' parameter of the same name shadows it there


def network_policy(namespace: str) -> dict[str, Any]:
    """No traffic in or out of a run pod: it talks to its node agent over its Unix socket only. One in
    every namespace that holds AgentRuns (it is only enforced where the network plugin supports policies)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(NETWORK_POLICY_NAME, namespace),
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
        "metadata": _meta(name),
        "handler": handler,
    }


def service_account(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace)}


def _rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str]) -> dict[str, Any]:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


def controller_cluster_role() -> dict[str, Any]:
    """The controller creates run pods and writes AgentRun status; kopf also watches CRDs and namespaces."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(CONTROLLER_NAME),
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
        "metadata": _meta(NODE_AGENT_NAME),
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
        "metadata": _meta(name),
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
        "metadata": _meta(f"{CONTROLLER_NAME}-audit", namespace),
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
        "metadata": _meta(CONTROLLER_NAME, namespace),
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
                    "securityContext": {**_pod_security(), "fsGroup": SANDBOX_GID},  # its audit volume
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
                            "securityContext": _restricted_container_security(),
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
    security = {**_restricted_container_security(uid=0, gid=0), "runAsNonRoot": False}
    security["capabilities"] = {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(NODE_AGENT_NAME, namespace),
        "spec": {
            "selector": {"matchLabels": _component_labels(NODE_AGENT_NAME)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": _component_labels(NODE_AGENT_NAME)},
                "spec": {
                    "serviceAccountName": NODE_AGENT_NAME,
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(uid=0, gid=0),
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


def controller_username(namespace: str = NAMESPACE) -> str:
    """Who the API server says created a pod when the controller did."""
    return f"system:serviceaccount:{namespace}:{CONTROLLER_NAME}"


def _has(path: str) -> str:
    """`has()` of every step of a dotted path (after `object.spec` or a loop variable, which are always
    there), so a missing parent reads as "not set", not as an error."""
    parts = path.split(".")
    first = 2 if path.startswith("object.spec.") else 1
    return " && ".join(f"has({'.'.join(parts[: i + 1])})" for i in range(first, len(parts)))


def _each_container(rule: str) -> str:
    return f"object.spec.containers.all(c, {rule})"


def _validation(expression: str, message: str) -> dict[str, Any]:
    return {"expression": expression, "message": message, "reason": "Forbidden"}


def _same_meta(field: str) -> str:
    """CEL: an UPDATE leaves metadata.<field> as it was (absent counts as empty)."""
    empty = "[]" if field == "ownerReferences" else "{}"
    return (
        f"(has(object.metadata.{field}) ? object.metadata.{field} : {empty}) == "
        f"(has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : {empty})"
    )


def admission_validations(
    namespace: str = NAMESPACE, *, runtime_class: str = RUNTIME_CLASS
) -> list[dict[str, Any]]:
    """The CEL rules a pod with the role label must meet: the run pod's hardening, held by the API server
    itself. They stand in for Pod Security "restricted", which run pods cannot get: their two hostPath
    volumes (pinned here to ours, read-only, the socket one to the pod's own directory)."""
    c = "c.securityContext"
    pack = f"^{PACK_HOST_DIR}/[0-9a-f]{{64}}$"  # the path holds no regex metacharacter (nor a CEL escape)
    creator = controller_username(namespace)
    return [
        _validation(
            f"(request.operation == 'UPDATE' && object.spec == oldObject.spec && "
            f"{_same_meta('labels')} && {_same_meta('annotations')} && {_same_meta('ownerReferences')}) || "
            f"request.userInfo.username == '{creator}'",
            "only the agentnode-sandbox controller creates or changes a run pod (its spec, labels, "
            "annotations or owner)",
        ),
        _validation(
            f"has(object.spec.runtimeClassName) && object.spec.runtimeClassName == '{runtime_class}'",
            f"a run pod needs runtimeClassName {runtime_class}",
        ),
        _validation(
            f"{_has('object.spec.automountServiceAccountToken')} && "
            "object.spec.automountServiceAccountToken == false",
            "a run pod needs automountServiceAccountToken: false",
        ),
        *(
            _validation(f"!has(object.spec.{f}) || object.spec.{f} == false", f"a run pod may not set {f}")
            for f in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace")
        ),
        _validation("!has(object.spec.hostAliases) || size(object.spec.hostAliases) == 0", "no hostAliases"),
        *(
            _validation(f"!has(object.spec.{f}) || size(object.spec.{f}) == 0", f"a run pod has no {f}")
            for f in ("initContainers", "ephemeralContainers")
        ),
        _validation("size(object.spec.containers) == 1", "a run pod has exactly one container"),
        _validation(
            f"{_has('object.spec.securityContext.runAsNonRoot')} && object.spec.securityContext.runAsNonRoot "
            f"&& {_each_container(f'!has({c}) || !has({c}.runAsNonRoot) || {c}.runAsNonRoot')}",
            "a run pod needs runAsNonRoot: true",
        ),
        _validation(
            f"{_has('object.spec.securityContext.seccompProfile')} && "
            "object.spec.securityContext.seccompProfile.type == 'RuntimeDefault' && "
            + _each_container(
                f"!has({c}) || !has({c}.seccompProfile) || {c}.seccompProfile.type == 'RuntimeDefault'"
            ),
            "a run pod needs the RuntimeDefault seccomp profile",
        ),
        _validation(
            _each_container(f"{_has(f'{c}.readOnlyRootFilesystem')} && {c}.readOnlyRootFilesystem == true"),
            "every container needs readOnlyRootFilesystem: true",
        ),
        _validation(
            _each_container(
                f"{_has(f'{c}.allowPrivilegeEscalation')} && {c}.allowPrivilegeEscalation == false"
            ),
            "every container needs allowPrivilegeEscalation: false",
        ),
        _validation(
            _each_container(f"{_has(f'{c}.capabilities.drop')} && 'ALL' in {c}.capabilities.drop"),
            "every container drops ALL capabilities",
        ),
        _validation(
            _each_container(f"!({_has(f'{c}.capabilities.add')}) || size({c}.capabilities.add) == 0"),
            "no container adds a capability",
        ),
        _validation(
            _each_container(f"!({_has(f'{c}.privileged')}) || {c}.privileged == false"),
            "no container is privileged",
        ),
        _validation(_each_container("!has(c.ports) || size(c.ports) == 0"), "a run pod exposes no port"),
        _validation(
            _each_container(
                "(!has(c.envFrom) || size(c.envFrom) == 0) && "
                "(!has(c.env) || c.env.all(e, !has(e.valueFrom) || has(e.valueFrom.fieldRef)))"
            ),
            "a run pod reads no Secret or ConfigMap",
        ),
        _validation(
            "!has(object.spec.volumes) || object.spec.volumes.all(v, has(v.emptyDir) || has(v.hostPath))",
            "a run pod has only emptyDir volumes and the node agent's hostPath volumes",
        ),
        _validation(
            "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || "
            "(has(v.hostPath.type) && v.hostPath.type == 'Directory' && "
            f"(v.hostPath.path == '{RUN_HOST_DIR}' || v.hostPath.path.matches('{pack}'))))",
            "a run pod's hostPath volumes are the node agent's run and pack directories only",
        ),
        _validation(
            _each_container(
                "!has(c.volumeMounts) || c.volumeMounts.all(m, !(m.name in variables.hostPathVolumes) || "
                "(has(m.readOnly) && m.readOnly == true))"
            ),
            "a run pod mounts its hostPath volumes read-only",
        ),
        _validation(
            _each_container(
                "!has(c.volumeMounts) || c.volumeMounts.all(m, !(m.name in variables.runDirVolumes) || "
                "(!has(m.subPath) && has(m.subPathExpr) && "
                f"m.subPathExpr == '{RUN_DIR_PREFIX}$({POD_UID_ENV})'))"
            )
            + " && "
            + _each_container(
                f"!has(c.env) || c.env.all(e, e.name != '{POD_UID_ENV}' || "
                f"({_has('e.valueFrom.fieldRef')} && e.valueFrom.fieldRef.fieldPath == 'metadata.uid'))"
            ),
            "a run pod mounts only its own directory of the run dir (subPathExpr of its uid)",
        ),
    ]


def admission_policy(namespace: str = NAMESPACE, *, runtime_class: str = RUNTIME_CLASS) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy over every pod carrying the role label (an update that drops the label
    still matches: the old object carries it), including the ephemeral-containers subresource."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(ADMISSION_POLICY_NAME),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        # resize: on 1.33+ a pod's resources change through it, after the node agent's check
                        "resources": ["pods", "pods/ephemeralcontainers", "pods/resize"],
                    }
                ],
                "objectSelector": {"matchLabels": {LABEL_ROLE: ROLE_AGENT_RUN}},
            },
            "variables": [
                {
                    "name": "hostPathVolumes",
                    "expression": "has(object.spec.volumes) ? "
                    "object.spec.volumes.filter(v, has(v.hostPath)).map(v, v.name) : []",
                },
                {
                    "name": "runDirVolumes",
                    "expression": "has(object.spec.volumes) ? "
                    "object.spec.volumes.filter(v, has(v.hostPath) && "
                    f"v.hostPath.path == '{RUN_HOST_DIR}').map(v, v.name) : []",
                },
            ],
            "validations": admission_validations(namespace, runtime_class=runtime_class),
        },
    }


def admission_policy_binding() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(ADMISSION_POLICY_NAME),
        "spec": {"policyName": ADMISSION_POLICY_NAME, "validationActions": ["Deny"]},
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
    "ADMISSION_POLICY_NAME",
    "AGENT_CONTAINER",
    "ANNOTATION_PIDS",
    "API_VERSION",
    "CONFIG_DIR",
    "CONFIG_MAP_NAME",
    "CONTROLLER_NAME",
    "CRD_NAME",
    "GROUP",
    "HOST_IMAGE",
    "KIND",
    "LABEL_AGENTRUN",
    "LABEL_MANAGED_BY",
    "LABEL_ROLE",
    "LLM_SECRET_NAME",
    "MANAGED_BY",
    "MAX_AGENTRUN_NAME_CHARS",
    "MAX_ERROR_CHARS",
    "MAX_GOAL_CHARS",
    "MAX_HINT_CHARS",
    "MAX_KWARGS_JSON_CHARS",
    "MAX_RESULT_JSON_CHARS",
    "NAMESPACE",
    "NETWORK_POLICY_NAME",
    "NODE_AGENT_NAME",
    "PACK_HOST_DIR",
    "PHASES",
    "PLURAL",
    "POD_NAME_PREFIX",
    "POD_UID_ENV",
    "ROLE_AGENT_RUN",
    "RUNTIME_CLASS",
    "RUN_HOST_DIR",
    "SHORT_NAME",
    "SINGULAR",
    "SOCKET_WAIT_ENV",
    "STATE_HOST_DIR",
    "VERSION",
    "PodInputs",
    "admission_policy",
    "admission_policy_binding",
    "admission_validations",
    "agentrun",
    "agentrun_crd",
    "cluster_role_binding",
    "controller_cluster_role",
    "controller_deployment",
    "controller_username",
    "deploy_objects",
    "is_dns_label",
    "namespace",
    "network_policy",
    "node_agent_cluster_role",
    "node_agent_daemonset",
    "owner_reference",
    "pod_mismatches",
    "pod_name",
    "quantity_bytes",
    "quantity_cpu",
    "run_pod",
    "runtime_class",
    "service_account",
]
