"""The run pod (host/k8s/objects/pod.py), checked offline: hardened field by field, its inputs refused where
they must never reach a node, and compared against tampered pods."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from host.engine.contract import HOME_IN_CONTAINER, PACK_DIR_IN_CONTAINER, SOCKET_DIR_IN_CONTAINER
from host.engine.wrapper_env import SOCKET_WAIT_ENV, WRAPPER_ARGS
from host.k8s.objects.agentrun import API_VERSION, KIND
from host.k8s.objects.names import (
    LABEL_AGENTRUN,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    PACK_HOST_DIR,
    POD_UID_ENV,
    ROLE_AGENT_RUN,
    RUN_DIR_PREFIX,
    RUN_HOST_DIR,
)
from host.k8s.objects.pod import pod_mismatches, run_pod
from tests.unit.k8s._support import IMAGE, PACK, UID, container, inputs, pss_restricted_violations

EVIL = "EVIL"
"""Every attacker-chosen value and name below contains this; no mismatch path may."""


@pytest.fixture
def pod() -> dict[str, Any]:
    return run_pod(inputs())


# --- (1) the pod's hardening, as data ----------------------------------------------------------------------


def test_the_pod_has_the_contract_identity(pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == (f"arun-{UID}", "team-a")
    assert meta["labels"] == {LABEL_MANAGED_BY: "agentnode-sandbox", LABEL_ROLE: ROLE_AGENT_RUN,
                              LABEL_AGENTRUN: "nightly-report"}  # fmt: skip
    assert meta["ownerReferences"] == [
        {"apiVersion": API_VERSION, "kind": KIND, "name": "nightly-report", "uid": UID, "controller": True,
         "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert meta["annotations"] == {"sandbox.agentnode.net/pids-limit": "256"}


def test_the_pod_spec_is_hardened(pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert spec["shareProcessNamespace"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 3600
    assert (spec["dnsPolicy"], spec["dnsConfig"]) == ("None", {"nameservers": ["127.0.0.1"]})
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                       "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    assert "initContainers" not in spec and "ephemeralContainers" not in spec and "hostAliases" not in spec
    assert "runtimeClassName" not in run_pod(inputs(runtime_class_name=None))["spec"]


def test_the_agent_container_is_hardened(pod: dict[str, Any]) -> None:
    agent = container(pod)
    assert agent["name"] == "agent"
    assert (agent["image"], agent["imagePullPolicy"]) == (IMAGE, "IfNotPresent")
    assert agent["command"] == ["/usr/bin/python3", *WRAPPER_ARGS]
    assert "args" not in agent
    assert agent["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
        "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
    }  # fmt: skip
    resources = {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "128Mi"}
    assert agent["resources"] == {"limits": resources, "requests": resources}
    assert "ports" not in agent and "envFrom" not in agent


def test_the_agent_environment_is_the_wrappers(pod: dict[str, Any]) -> None:
    env = {e["name"]: e for e in container(pod)["env"]}
    assert len(env) == len(container(pod)["env"])
    values = {name: e.get("value", "") for name, e in env.items() if "valueFrom" not in e}
    assert values == {
        "HOME": HOME_IN_CONTAINER, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
        "PYTHONPATH": "/opt/agentnode/site", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
        "AGENTNODE_SOCKET": f"{SOCKET_DIR_IN_CONTAINER}/sandbox.sock", "AGENTNODE_IMPORT_ROOT": "/pack/src",
        "AGENTNODE_FETCH_TIMEOUT": "0", "AGENTNODE_PRELOAD": "report.main", SOCKET_WAIT_ENV: "120",
    }  # fmt: skip
    assert env[POD_UID_ENV] == {
        "name": POD_UID_ENV, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}
    }  # fmt: skip
    # An empty value is left out, as the API server leaves it out.
    assert {"name": "AGENTNODE_PRELOAD"} in container(run_pod(inputs(preload="")))["env"]


def test_the_pod_mounts_only_its_socket_its_pack_and_memory(pod: dict[str, Any]) -> None:
    assert pod["spec"]["volumes"] == [
        {"name": "socket", "hostPath": {"path": RUN_HOST_DIR, "type": "Directory"}},
        {"name": "pack", "hostPath": {"path": f"{PACK_HOST_DIR}/{PACK}", "type": "Directory"}},
        {"name": "home", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "sealed", "emptyDir": {"medium": "Memory", "sizeLimit": "4Ki"}},
    ]
    assert container(pod)["volumeMounts"] == [
        {"name": "socket", "mountPath": SOCKET_DIR_IN_CONTAINER, "readOnly": True,
         "subPathExpr": f"{RUN_DIR_PREFIX}$({POD_UID_ENV})"},
        {"name": "pack", "mountPath": PACK_DIR_IN_CONTAINER, "readOnly": True},
        {"name": "home", "mountPath": HOME_IN_CONTAINER},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "sealed", "mountPath": "/dev/shm", "readOnly": True},
        {"name": "sealed", "mountPath": "/dev/mqueue", "readOnly": True},
    ]  # fmt: skip
    assert run_pod(inputs(pack_digest=f"sha256:{PACK}")) == pod


def test_the_pod_meets_pod_security_restricted_but_for_its_two_hostpaths(pod: dict[str, Any]) -> None:
    # The contract's hostPath volumes are the one departure; test_admission.py: the policy pins them.
    assert pss_restricted_violations(pod["spec"]) == ["volume socket: hostPath", "volume pack: hostPath"]
    assert pss_restricted_violations(run_pod(inputs(runtime_class_name=None))["spec"]) == [
        "volume socket: hostPath", "volume pack: hostPath"
    ]  # fmt: skip


def test_the_pss_checks_see_what_they_check(pod: dict[str, Any]) -> None:
    container(pod)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
    pod["spec"]["hostPID"] = True
    assert {"hostPID", "agent: privileged", "agent: allowPrivilegeEscalation"} <= set(
        pss_restricted_violations(pod["spec"])
    )


# --- (2) PodInputs refuses what must never reach a node ---------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "registry.example.com/agentnode/sandbox:latest",
        "registry.example.com/agentnode/sandbox",
        "sha256:" + "a" * 64,
        "sandbox@sha256:" + "a" * 63,
        "sandbox@sha256:" + "A" * 64,
        "sandbox@sha512:" + "a" * 128,
        "sandbox@sha256:" + "a" * 64 + "\n",
        " sandbox@sha256:" + "a" * 64,
        "Sandbox@sha256:" + "a" * 64,
        "../sandbox@sha256:" + "a" * 64,
        "sandbox@sha256:" + "a" * 64 + "@sha256:" + "b" * 64,
        "",
    ],
)
def test_an_unpinned_image_is_refused(image: str) -> None:
    with pytest.raises(ValueError, match=r"PodInputs\.image") as info:
        inputs(image=image)
    assert image.strip() == "" or image.strip() not in str(info.value)


@pytest.mark.parametrize(
    "image",
    [IMAGE, "sandbox@sha256:" + "0" * 64, "localhost:5000/a/b_c:v1.2@sha256:" + "f" * 64],
)
def test_pinned_images_are_accepted(image: str) -> None:
    assert container(run_pod(inputs(image=image)))["image"] == image


@pytest.mark.parametrize(
    "digest",
    ["../../etc", "a" * 63, "a" * 65, "A" * 64, "sha256:" + "a" * 63, "sha512:" + "a" * 64,
     "a" * 32 + "/" + "a" * 31, "sha256:../" + "a" * 61, "a" * 64 + "\n", "",
     f"agentnode-pack-x-1.0.0-{'a' * 16}"],
)  # fmt: skip
def test_an_unsafe_pack_digest_is_refused(digest: str) -> None:
    with pytest.raises(ValueError, match=r"PodInputs\.pack_digest"):
        inputs(pack_digest=digest)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("agentrun_uid", "../x"), ("agentrun_uid", UID.upper()), ("namespace", "Team"),
        ("agentrun_name", "n" * 64), ("agentrun_name", "a_b"), ("runtime_class_name", "g visor"),
        ("import_root", "/etc"), ("import_root", "/pack/../etc"), ("import_root", "/packs"),
        ("preload", "os; x"), ("memory_bytes", 0), ("cpu_millis", -1), ("pids", True),
        ("active_deadline_seconds", 1.5), ("socket_wait_seconds", 601), ("tmp_bytes", 0),
    ],
)  # fmt: skip
def test_other_bad_inputs_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"PodInputs\.{field}"):
        inputs(**{field: value})


# --- (3) pod_mismatches: what the node agent refuses --------------------------------------------------------


def as_served(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server hands it back: defaults, placement and bookkeeping added, false plain
    booleans dropped (omitempty)."""
    live = copy.deepcopy(pod)
    live["metadata"] |= {
        "uid": "11111111-2222-3333-4444-555555555555",
        "resourceVersion": "4711",
        "generation": 1,
        "creationTimestamp": "2030-01-01T00:00:00Z",
        "managedFields": [{"manager": "kopf", "operation": "Update"}],
    }
    spec = live["spec"]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        del spec[flag]
    spec |= {
        "nodeName": "node-1",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
        ],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
        "nodeSelector": {"runtime": "gvisor"},
    }  # fmt: skip
    for c in spec["containers"]:
        c |= {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    live["status"] = {"phase": "Pending", "qosClass": "Guaranteed", "hostIP": "10.0.0.1"}
    return live


def test_the_expected_pod_as_served_matches(pod: dict[str, Any]) -> None:
    assert pod_mismatches(pod, as_served(pod)) == []
    runc = run_pod(inputs(runtime_class_name=None, preload=""))
    assert pod_mismatches(runc, as_served(runc)) == []


def _extra_container(live: dict[str, Any]) -> None:
    live["spec"]["containers"].append(
        {**container(live), "name": EVIL, "image": f"{EVIL}@sha256:" + "e" * 64}
    )


def _cap_added(live: dict[str, Any]) -> None:
    container(live)["securityContext"]["capabilities"]["add"] = [f"SYS_ADMIN_{EVIL}"]


def _read_write(live: dict[str, Any]) -> None:
    del container(live)["volumeMounts"][0]["readOnly"]


Attack = Callable[[dict[str, Any]], Any]
ATTACKS: list[tuple[str, Attack, str]] = [
    ("extra-container", _extra_container, "spec.containers[+extra]"),
    ("init-container", lambda p: p["spec"].update(initContainers=[{"name": EVIL, "image": EVIL}]),
     "spec.initContainers"),
    ("ephemeral-container", lambda p: p["spec"].update(ephemeralContainers=[{"name": EVIL, "image": EVIL}]),
     "spec.ephemeralContainers"),
    ("image-swap", lambda p: container(p).update(image=f"{EVIL}@sha256:" + "e" * 64),
     "spec.containers[agent].image"),
    ("command-change", lambda p: container(p).update(command=["/bin/sh", "-c", EVIL]),
     "spec.containers[agent].command"),
    ("args-added", lambda p: container(p).update(args=[EVIL]), "spec.containers[agent].args"),
    ("env-added", lambda p: container(p)["env"].append({"name": EVIL, "value": EVIL}),
     "spec.containers[agent].env"),
    ("env-from-secret", lambda p: container(p).update(envFrom=[{"secretRef": {"name": EVIL}}]),
     "spec.containers[agent].envFrom"),
    ("privileged", lambda p: container(p)["securityContext"].update(privileged=True),
     "spec.containers[agent].securityContext"),
    ("cap-added", _cap_added, "spec.containers[agent].securityContext"),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "spec.hostPID"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "spec.hostIPC"),
    ("extra-hostPath",
     lambda p: p["spec"]["volumes"].append({"name": EVIL, "hostPath": {"path": f"/{EVIL}"}}),
     "spec.volumes[+extra]"),
    ("socket-path-changed", lambda p: p["spec"]["volumes"][0]["hostPath"].update(path=f"/{EVIL}"),
     "spec.volumes[socket]"),
    ("pack-path-changed", lambda p: p["spec"]["volumes"][1]["hostPath"].update(path=f"/{EVIL}"),
     "spec.volumes[pack]"),
    ("readOnly-dropped", _read_write, "spec.containers[agent].volumeMounts"),
    ("runtimeClass-removed", lambda p: p["spec"].pop("runtimeClassName"), "spec.runtimeClassName"),
    ("runtimeClass-changed", lambda p: p["spec"].update(runtimeClassName=EVIL.lower()),
     "spec.runtimeClassName"),
    ("token-automounted", lambda p: p["spec"].update(automountServiceAccountToken=True),
     "spec.automountServiceAccountToken"),
    ("token-default", lambda p: p["spec"].pop("automountServiceAccountToken"),
     "spec.automountServiceAccountToken"),
    ("label-changed", lambda p: p["metadata"]["labels"].update({LABEL_ROLE: EVIL}),
     f"metadata.labels[{LABEL_ROLE}]"),
    ("label-added", lambda p: p["metadata"]["labels"].update({EVIL: EVIL}), "metadata.labels[+extra]"),
    ("ownerReferences-changed", lambda p: p["metadata"]["ownerReferences"][0].update(uid=EVIL),
     "metadata.ownerReferences"),
    ("shareProcessNamespace", lambda p: p["spec"].update(shareProcessNamespace=True),
     "spec.shareProcessNamespace"),
    ("hostAliases", lambda p: p["spec"].update(hostAliases=[{"ip": "10.0.0.1", "hostnames": [EVIL]}]),
     "spec.hostAliases"),
    ("sysctls", lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": EVIL, "value": "1"}]),
     "spec.securityContext"),
    ("runAsUser-root", lambda p: p["spec"]["securityContext"].update(runAsUser=0), "spec.securityContext"),
    ("resources-raised", lambda p: container(p)["resources"]["limits"].update(memory="64Gi"),
     "spec.containers[agent].resources"),
    ("deadline-removed", lambda p: p["spec"].pop("activeDeadlineSeconds"), "spec.activeDeadlineSeconds"),
    ("dns-restored", lambda p: p["spec"].update(dnsPolicy="ClusterFirst"), "spec.dnsPolicy"),
    ("unknown-spec-field", lambda p: p["spec"].update({EVIL: True}), "spec[+extra]"),
    ("unknown-container-field", lambda p: container(p).update({EVIL: True}),
     "spec.containers[agent][+extra]"),
    ("container-renamed", lambda p: container(p).update(name=EVIL), "spec.containers[agent]"),
    ("pids-annotation",
     lambda p: p["metadata"]["annotations"].update({"sandbox.agentnode.net/pids-limit": EVIL}),
     "metadata.annotations[sandbox.agentnode.net/pids-limit]"),
    ("other-namespace", lambda p: p["metadata"].update(namespace=EVIL.lower()), "metadata.namespace"),
    ("runtime-annotation",
     lambda p: p["metadata"]["annotations"].update({"dev.gvisor.flag.network": EVIL}),
     "metadata.annotations[+extra]"),
]  # fmt: skip


@pytest.mark.parametrize(("attack", "path"), [pytest.param(a, p, id=name) for name, a, p in ATTACKS])
def test_each_tampering_is_named_and_never_echoed(pod: dict[str, Any], attack: Attack, path: str) -> None:
    live = as_served(pod)
    attack(live)
    found = pod_mismatches(pod, live)
    assert path in found
    assert not any(EVIL.lower() in p.lower() for p in found)


def test_a_runtime_class_added_to_a_runc_pod_is_a_mismatch() -> None:
    runc = run_pod(inputs(runtime_class_name=None))
    live = as_served(runc)
    live["spec"]["runtimeClassName"] = "kata"
    assert pod_mismatches(runc, live) == ["spec.runtimeClassName"]


@pytest.mark.parametrize(
    "garbage",
    [{}, {"spec": EVIL}, {"spec": {"containers": EVIL, "volumes": [1, None, [EVIL]]}},
     {"metadata": [EVIL], "spec": {"containers": [{"name": [EVIL]}, None]}}],
)  # fmt: skip
def test_malformed_pods_are_mismatches_not_crashes(pod: dict[str, Any], garbage: dict[str, Any]) -> None:
    found = pod_mismatches(pod, garbage)
    assert found and not any(EVIL in p for p in found)
