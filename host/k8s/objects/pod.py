"""The run pod: its inputs checked, the pod an admitted run gets, and a live pod held to that one."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from host.core.errors import AuditReason, EngineError
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
from host.k8s.objects.agentrun import API_VERSION, KIND
from host.k8s.objects.names import (
    AGENT_CONTAINER,
    ANNOTATION_PIDS,
    LABEL_AGENTRUN,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGED_BY,
    PACK_HOST_DIR,
    POD_NAME_PREFIX,
    POD_UID_ENV,
    ROLE_AGENT_RUN,
    RUN_DIR_PREFIX,
    RUN_HOST_DIR,
    is_dns_label,
    quantity_bytes,
    quantity_cpu,
)
from host.policy.admission import Admission
from host.spec.config import HostConfig

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


def _labels(agentrun_name: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_ROLE: ROLE_AGENT_RUN, LABEL_AGENTRUN: agentrun_name}


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
            ("namespace", is_dns_label(self.namespace)),
            ("agentrun_name", _DNS_SUBDOMAIN.fullmatch(self.agentrun_name)),
            ("agentrun_uid", _UID.fullmatch(self.agentrun_uid)),
            ("image", len(self.image) <= 512 and _IMAGE.fullmatch(self.image)),
            ("pack_digest", _PACK_DIGEST.fullmatch(self.pack_digest)),
            ("import_root", _IMPORT_ROOT.fullmatch(self.import_root)),
            ("preload", len(self.preload) <= 256 and _MODULE.fullmatch(self.preload)),
            ("runtime_class_name", runtime_class is None or is_dns_label(runtime_class)),
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


def restricted_container_security(*, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
    }


def pod_security(*, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> dict[str, Any]:
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
        "securityContext": pod_security(),
        "containers": [
            {
                "name": AGENT_CONTAINER,
                "image": inputs.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/usr/bin/python3", *WRAPPER_ARGS],
                "workingDir": HOME_IN_CONTAINER,
                "env": env,
                "securityContext": restricted_container_security(),
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


# --- the pod of an admitted run ----------------------------------------------------------------------------

POD_START_GRACE_SECONDS = 120
"""Added to the run's max_runtime_seconds for the pod's activeDeadlineSeconds: scheduling, the image pull and
the wait for the socket come first; the node agent's own deadline still ends the run on time."""


def pod_for(
    admission: Admission,
    agentrun: Mapping[str, Any],
    config: HostConfig,
    limits: ContainerLimits | None = None,
) -> dict[str, Any]:
    """The hardened pod for this admitted run of `agentrun`; raises EngineError (fail closed) when the
    config cannot make one (an image not pinned by digest, a name Kubernetes would refuse)."""
    assert admission.entry is not None and admission.policy is not None and admission.runtime is not None
    limits = limits or ContainerLimits()
    meta = agentrun.get("metadata") or {}
    entry = admission.entry
    try:
        inputs = PodInputs(
            namespace=str(meta.get("namespace") or ""),
            agentrun_name=str(meta.get("name") or ""),
            agentrun_uid=str(meta.get("uid") or ""),
            image=admission.image or "",
            runtime_class_name=(
                config.agent_sandbox.kubernetes.runtime_class if admission.runtime == Runtime.RUNSC else None
            ),
            pack_digest=entry.volume_digest,
            import_root=f"{PACK_DIR_IN_CONTAINER}/{entry.import_subdir}"
            if entry.import_subdir
            else PACK_DIR_IN_CONTAINER,
            preload=admission.manifest.entrypoint_module if admission.manifest is not None else "",
            memory_bytes=limits.memory_bytes,
            cpu_millis=int(limits.cpus * 1000),
            pids=limits.pids,
            home_bytes=limits.home_bytes,
            tmp_bytes=limits.tmp_bytes,
            active_deadline_seconds=admission.policy.max_runtime_seconds + POD_START_GRACE_SECONDS,
            socket_wait_seconds=config.agent_sandbox.kubernetes.socket_wait_seconds,
        )
    except ValueError as exc:
        image = "image" in str(exc)
        raise EngineError(
            "the sandbox image is not pinned by digest" if image else "the run pod cannot be built",
            reason=AuditReason.IMAGE_NOT_PINNED if image else AuditReason.CONFIG_INVALID,
            hint=(
                "set agent_sandbox.image to a registry reference pinned by digest (repo@sha256:...)"
                if image
                else "check the AgentRun's name and namespace, and the config (docs/kubernetes.md)"
            ),
            check="kubernetes",
        ) from None
    return run_pod(inputs)


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


__all__ = [
    "POD_START_GRACE_SECONDS",
    "PodInputs",
    "owner_reference",
    "pod_for",
    "pod_mismatches",
    "pod_name",
    "pod_security",
    "restricted_container_security",
    "run_pod",
]
