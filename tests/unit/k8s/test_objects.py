"""The Kubernetes objects (host/k8s/objects/), checked offline: valid against the bundled API schemas of
current Kubernetes versions, hardened field by field, compared against tampered pods, and deploy/ never
drifting from what the code renders."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from host.engine.contract import HOME_IN_CONTAINER, PACK_DIR_IN_CONTAINER, SOCKET_DIR_IN_CONTAINER
from host.engine.wrapper_env import SOCKET_WAIT_ENV, WRAPPER_ARGS
from host.k8s.objects.admission import admission_policy, admission_policy_binding
from host.k8s.objects.agentrun import (
    API_VERSION,
    KIND,
    MAX_GOAL_CHARS,
    MAX_KWARGS_JSON_CHARS,
    agentrun,
    agentrun_crd,
)
from host.k8s.objects.deploy import deploy_objects
from host.k8s.objects.names import (
    CONTROLLER_NAME,
    LABEL_AGENTRUN,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    LLM_SECRET_NAME,
    NODE_AGENT_NAME,
    PACK_HOST_DIR,
    POD_UID_ENV,
    ROLE_AGENT_RUN,
    RUN_DIR_PREFIX,
    RUN_HOST_DIR,
    quantity_bytes,
    quantity_cpu,
)
from host.k8s.objects.pod import PodInputs, pod_mismatches, run_pod
from host.policy.caller import MAX_LABELS, CallerInfo
from tests.support.paths import REPO

K8S_VERSIONS = ("1.36.0", "1.37.0")
"""The newest two minor versions whose schemas kubernetes-validate bundles."""
UID = "0f0e7a8c-1b2c-4d5e-8f90-a1b2c3d4e5f6"
IMAGE = "registry.example.com/agentnode/sandbox@sha256:" + "a" * 64
PACK = "b" * 64
EVIL = "EVIL"
"""Every attacker-chosen value and name below contains this; no mismatch path may."""


def inputs(**overrides: Any) -> PodInputs:
    fields: dict[str, Any] = {
        "namespace": "team-a",
        "agentrun_name": "nightly-report",
        "agentrun_uid": UID,
        "image": IMAGE,
        "runtime_class_name": "gvisor",
        "pack_digest": PACK,
        "import_root": "/pack/src",
        "preload": "report.main",
    }
    return PodInputs(**{**fields, **overrides})


@pytest.fixture
def pod() -> dict[str, Any]:
    return run_pod(inputs())


def container(pod: dict[str, Any]) -> dict[str, Any]:
    [agent] = pod["spec"]["containers"]
    assert isinstance(agent, dict)
    return agent


# --- (1) valid against the API's own schemas ---------------------------------------------------------------


def _objects() -> Iterator[Any]:
    for obj in deploy_objects():
        yield pytest.param(obj, id=f"{obj['kind']}/{obj['metadata']['name']}")
    yield pytest.param(run_pod(inputs()), id="Pod/gvisor")
    yield pytest.param(run_pod(inputs(runtime_class_name=None, preload="")), id="Pod/runc")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("obj", list(_objects()))
def test_every_object_is_valid_in_strict_mode(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_refuses_an_unknown_field(pod: dict[str, Any]) -> None:
    container(pod)["securityContext"]["bogus"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)


def _json_schema(node: Any) -> Any:
    """The CRD's OpenAPI schema as JSON Schema: the Kubernetes extensions (CEL rules and the like) are the
    API server's to apply, not jsonschema's; a pattern's `$` is Go's (the end of the text), which Python
    spells `\\Z` (its `$` also matches before a final newline)."""
    if isinstance(node, dict):
        return {
            k: v[:-1] + "\\Z" if k == "pattern" and v.endswith("$") else _json_schema(v)
            for k, v in node.items()
            if not k.startswith("x-kubernetes-")
        }
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    return node


@pytest.fixture(scope="module")
def agentrun_validator() -> jsonschema.protocols.Validator:
    [version] = agentrun_crd()["spec"]["versions"]
    schema = _json_schema(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def test_the_crd_has_the_contract_names() -> None:
    crd = agentrun_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "agentruns.sandbox.agentnode.net"
    assert (spec["group"], spec["scope"]) == ("sandbox.agentnode.net", "Namespaced")
    assert spec["names"] | {"shortNames": spec["names"]["shortNames"]} == {
        "kind": "AgentRun", "listKind": "AgentRunList", "plural": "agentruns", "singular": "agentrun",
        "shortNames": ["arun"],
    }  # fmt: skip
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [c["jsonPath"] for c in version["additionalPrinterColumns"]] == [
        ".status.phase", ".status.errorCode", ".metadata.creationTimestamp"
    ]  # fmt: skip
    root = version["schema"]["openAPIV3Schema"]
    assert root["properties"]["spec"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "spec is immutable: create a new AgentRun instead"}
    ]
    status = root["properties"]["status"]["properties"]
    assert set(status) == {
        "phase", "runId", "podName", "podUid", "success", "resultJson", "errorCode", "error", "hint",
        "timedOut", "durationMs", "auditDigest", "observedGeneration", "modeUsed", "resultTruncated",
    }  # fmt: skip
    assert status["phase"]["enum"] == ["Pending", "Scheduled", "Running", "Succeeded", "Failed"]
    assert all("maxLength" in s for s in status.values() if s["type"] == "string" and "enum" not in s)


def test_agentrun_bodies_match_the_crd(agentrun_validator: jsonschema.protocols.Validator) -> None:
    caller = CallerInfo.parse("acme", "req-1", {"team": "search"})
    full = agentrun("nightly", "team-a", slug="report", goal="sum up", kwargs={"n": 1, "é": [True]},
                    runtime="runsc", caller=caller)  # fmt: skip
    assert full == {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "nightly", "namespace": "team-a"},
        "spec": {
            "slug": "report", "goal": "sum up", "kwargsJson": '{"n":1,"é":[true]}', "runtime": "runsc",
            "caller": {"tenant": "acme", "requestId": "req-1", "labels": {"team": "search"}},
        },
    }  # fmt: skip
    minimal = agentrun("nightly", "team-a", slug="report", caller=CallerInfo())
    assert minimal["spec"] == {"slug": "report"}
    for body in (full, minimal):
        agentrun_validator.validate(body)


def _spec(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": fields}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_spec(goal="no slug"), id="missing-slug"),
        pytest.param({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}}, id="missing-spec"),
        pytest.param(_spec(slug="report", runtime="kata"), id="bad-runtime"),
        pytest.param(_spec(slug="report", runtime="crun"), id="runtime-not-on-a-cluster"),
        pytest.param(_spec(slug="../etc"), id="slug-path"),
        pytest.param(_spec(slug="Report"), id="slug-capitals"),
        pytest.param(_spec(slug="r" * 65), id="slug-too-long"),
        pytest.param(_spec(slug="report\n"), id="slug-newline"),
        pytest.param(_spec(slug="report", goal="g" * (MAX_GOAL_CHARS + 1)), id="goal-too-long"),
        pytest.param(
            _spec(slug="report", kwargsJson="1" * (MAX_KWARGS_JSON_CHARS + 1)), id="kwargs-too-long"
        ),
        pytest.param(_spec(slug="report", caller={"tenant": "a b"}), id="tenant"),
        pytest.param(_spec(slug="report", caller={"requestId": "x" * 129}), id="request-id"),
        pytest.param(
            _spec(slug="report", caller={"labels": {f"k{i}": "" for i in range(MAX_LABELS + 1)}}), id="labels"
        ),
        pytest.param(_spec(slug="report", caller={"labels": {"k": "a b"}}), id="label-value"),
    ],
)
def test_bad_agentrun_bodies_are_refused(
    agentrun_validator: jsonschema.protocols.Validator, body: dict[str, Any]
) -> None:
    assert not agentrun_validator.is_valid(body)


def test_a_status_is_bounded_too(agentrun_validator: jsonschema.protocols.Validator) -> None:
    body = agentrun("nightly", "team-a", slug="report")
    body["status"] = {
        "phase": "Succeeded", "runId": "ab" * 16, "success": True, "durationMs": 12,
        "auditDigest": "c" * 64, "errorCode": "agent_completed", "observedGeneration": 1,
    }  # fmt: skip
    agentrun_validator.validate(body)
    for bad in ({"phase": "Done"}, {"errorCode": "Bad Code"}, {"durationMs": -1}, {"auditDigest": "x"}):
        assert not agentrun_validator.is_valid({**body, "status": bad})


# --- (2) the pod's hardening, as data ----------------------------------------------------------------------


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


_PSS_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                     "projected", "secret"}  # fmt: skip
_PSS_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                     "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"}  # fmt: skip


def pss_restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """The Pod Security Standards' "restricted" profile (which includes "baseline"), control by control."""
    out: list[str] = []
    pod_sc = pod_spec.get("securityContext", {})
    containers = [*pod_spec.get("containers", []), *pod_spec.get("initContainers", []),
                  *pod_spec.get("ephemeralContainers", [])]  # fmt: skip
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            out.append(flag)
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= _PSS_VOLUME_TYPES:
            out.append(f"volume {volume['name']}: {','.join(sorted(kinds))}")
    if any(s["name"] not in _PSS_SAFE_SYSCTLS for s in pod_sc.get("sysctls", [])):
        out.append("sysctls")
    for sc, where in [(pod_sc, "pod"), *((c.get("securityContext", {}), c["name"]) for c in containers)]:
        if sc.get("windowsOptions", {}).get("hostProcess"):
            out.append(f"{where}: hostProcess")
        if sc.get("seLinuxOptions", {}).get("type", "") not in (
            "",
            "container_t",
            "container_init_t",
            "container_kvm_t",
            "container_engine_t",
        ):
            out.append(f"{where}: seLinux type")
        if sc.get("seLinuxOptions", {}).get("user") or sc.get("seLinuxOptions", {}).get("role"):
            out.append(f"{where}: seLinux user/role")
        if sc.get("appArmorProfile", {}).get("type", "RuntimeDefault") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: appArmor")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
        if sc.get("runAsNonRoot") is False:
            out.append(f"{where}: runAsNonRoot false")
        if "seccompProfile" in sc and sc["seccompProfile"].get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccomp")
    for c in containers:
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{c['name']}: procMount")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            out.append(f"{c['name']}: drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities added")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot")
        if (sc.get("seccompProfile") or pod_sc.get("seccompProfile")) is None:
            out.append(f"{c['name']}: seccomp unset")
    return out


def test_the_pod_meets_pod_security_restricted_but_for_its_two_hostpaths(pod: dict[str, Any]) -> None:
    # The contract's hostPath volumes are the one departure; the admission policy pins them (see (6)).
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


def test_the_controller_meets_pod_security_restricted() -> None:
    [deployment] = [o for o in deploy_objects() if o["kind"] == "Deployment"]
    assert pss_restricted_violations(deployment["spec"]["template"]["spec"]) == []


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (512 * 2**20, "512Mi"), (3 * 2**30, "3Gi"), (1536, "1536"), (2000, "2k"), (4096, "4Ki"),
     (10**6 + 1, "1000001")],
)  # fmt: skip
def test_quantities_are_in_the_api_servers_canonical_form(n: int, text: str) -> None:
    assert quantity_bytes(n) == text


def test_cpu_quantities() -> None:
    assert [quantity_cpu(m) for m in (1000, 1500, 250, 4000)] == ["1", "1500m", "250m", "4"]


# --- (3) PodInputs refuses what must never reach a node ---------------------------------------------------


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


# --- (4) pod_mismatches: what the node agent refuses --------------------------------------------------------


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


# --- (5) deploy/ is what the code renders ------------------------------------------------------------------


def test_the_committed_deploy_files_are_fresh(tmp_path: Path) -> None:
    subprocess.run([str(REPO / "scripts" / "render-deploy"), str(tmp_path)], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    committed = {p.name: p.read_text() for p in (REPO / "deploy").iterdir() if p.is_file()}
    rendered = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert sorted(committed) == sorted(rendered) == sorted([
        "admission-policy.yaml", "controller.yaml", "crd.yaml", "kustomization.yaml", "namespace.yaml",
        "network-policy.yaml", "node-agent.yaml", "rbac.yaml", "runtime-class.yaml",
    ])  # fmt: skip
    stale = [name for name in rendered if committed[name] != rendered[name]]
    assert stale == [], "deploy/ is stale: run scripts/render-deploy"


def test_the_deploy_files_hold_every_object_in_apply_order() -> None:
    deploy = REPO / "deploy"
    kustomization = yaml.safe_load((deploy / "kustomization.yaml").read_text())
    loaded = [
        doc for name in kustomization["resources"] for doc in yaml.safe_load_all((deploy / name).read_text())
    ]
    objects = deploy_objects()
    assert sorted(map(json.dumps, loaded)) == sorted(map(json.dumps, objects))
    assert loaded[0]["kind"] == "CustomResourceDefinition" and loaded[1]["kind"] == "Namespace"
    for text in (p.read_text() for p in deploy.iterdir()):
        assert text.startswith("# generated by scripts/render-deploy; do not edit\n")


def test_rbac_is_least_privilege() -> None:
    roles = {o["metadata"]["name"]: o["rules"] for o in deploy_objects() if o["kind"] == "ClusterRole"}

    def verbs(name: str, resource: str) -> set[str]:
        return {v for r in roles[name] if resource in r["resources"] for v in r["verbs"]}

    assert verbs(CONTROLLER_NAME, "pods") == {"create", "get", "list", "watch", "delete"}
    assert verbs(NODE_AGENT_NAME, "pods") == {"get", "list", "watch", "delete"}
    assert verbs(NODE_AGENT_NAME, "agentruns") == {"get", "list", "watch"}
    assert verbs(NODE_AGENT_NAME, "agentruns/status") == {"get", "patch"}
    assert verbs(CONTROLLER_NAME, "agentruns/status") == {"get", "patch", "update"}
    for rules in roles.values():
        assert not any(
            "*" in r["verbs"] or "*" in r["resources"] or "secrets" in r["resources"] for r in rules
        )


def test_the_node_agent_alone_gets_the_llm_keys() -> None:
    by_kind = {o["kind"]: o for o in deploy_objects()}
    node = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    [agent] = node["containers"]
    assert agent["command"] == ["agentnode-sandbox", "serve", "--node"]
    assert agent["envFrom"] == [{"secretRef": {"name": LLM_SECRET_NAME, "optional": True}}]
    assert {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
    } in (agent["env"])
    assert {
        "name": "state",
        "hostPath": {"path": "/var/lib/agentnode-sandbox", "type": "DirectoryOrCreate"},
    } in (node["volumes"])
    caps = {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}
    assert agent["securityContext"]["capabilities"] == caps
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["AGENTNODE_RUN_DIR"] == "/var/lib/agentnode-sandbox/run"
    assert env["AGENTNODE_AUDIT_FILE"].startswith("/var/lib/agentnode-sandbox/")
    assert not node.get("hostNetwork") and not agent["securityContext"]["privileged"]
    controller = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert controller["serviceAccountName"] == CONTROLLER_NAME
    command = controller["containers"][0]["command"]
    assert command == ["agentnode-sandbox", "k8s-controller", "--namespace", "default"]
    policed = [o["metadata"]["namespace"] for o in deploy_objects() if o["kind"] == "NetworkPolicy"]
    assert command[3::2] == policed  # the controller admits runs only where the deny-all policy is
    assert "envFrom" not in controller["containers"][0]


def test_run_pods_get_no_traffic() -> None:
    [policy] = [o for o in deploy_objects() if o["kind"] == "NetworkPolicy"]
    assert policy["spec"] == {"podSelector": {"matchLabels": {LABEL_ROLE: ROLE_AGENT_RUN}},
                              "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}  # fmt: skip


# --- (6) the admission policy refuses each property --------------------------------------------------------

CONTROLLER_USER = "system:serviceaccount:agentnode-system:agentnode-sandbox-controller"
REFUSED = {
    "creator": f"request.userInfo.username == '{CONTROLLER_USER}'",
    "creator.labels": "== (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})",
    "creator.annotations": "== (has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {})",
    "creator.owner": "== (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])",
    "runtimeClassName": "object.spec.runtimeClassName == 'gvisor'",
    "automountServiceAccountToken": "object.spec.automountServiceAccountToken == false",
    "hostNetwork": "object.spec.hostNetwork == false",
    "hostPID": "object.spec.hostPID == false",
    "hostIPC": "object.spec.hostIPC == false",
    "shareProcessNamespace": "object.spec.shareProcessNamespace == false",
    "initContainers": "size(object.spec.initContainers) == 0",
    "ephemeralContainers": "size(object.spec.ephemeralContainers) == 0",
    "readOnlyRootFilesystem": "c.securityContext.readOnlyRootFilesystem == true",
    "allowPrivilegeEscalation": "c.securityContext.allowPrivilegeEscalation == false",
    "capabilities.drop": "'ALL' in c.securityContext.capabilities.drop",
    "capabilities.add": "size(c.securityContext.capabilities.add) == 0",
    "privileged": "c.securityContext.privileged == false",
    "runAsNonRoot": "object.spec.securityContext.runAsNonRoot",
    "seccomp": "object.spec.securityContext.seccompProfile.type == 'RuntimeDefault'",
    "hostPath.run": f"v.hostPath.path == '{RUN_HOST_DIR}'",
    "hostPath.pack": f"v.hostPath.path.matches('^{PACK_HOST_DIR}/[0-9a-f]{{64}}$')",
    "hostPath.readOnly": "m.name in variables.hostPathVolumes) || (has(m.readOnly) && m.readOnly == true)",
    "socket.subPathExpr": f"m.subPathExpr == '{RUN_DIR_PREFIX}$({POD_UID_ENV})'",
}


@pytest.mark.parametrize(("prop", "needle"), REFUSED.items(), ids=list(REFUSED))
def test_the_admission_policy_has_a_rule_for(prop: str, needle: str) -> None:
    expressions = [v["expression"] for v in admission_policy()["spec"]["validations"]]
    assert any(needle in e for e in expressions), prop


def test_the_admission_policy_matches_run_pods_and_denies() -> None:
    policy, binding = admission_policy(), admission_policy_binding()
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"] == {
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                           "resources": ["pods", "pods/ephemeralcontainers", "pods/resize"]}],
        "objectSelector": {"matchLabels": {LABEL_ROLE: ROLE_AGENT_RUN}},
    }  # fmt: skip
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    for rule in spec["validations"]:
        expression = rule["expression"]
        assert rule["reason"] == "Forbidden" and rule["message"]
        assert "\\" not in expression  # no escape CEL could read differently from Python
        assert expression.count("(") == expression.count(")") and expression.count("'") % 2 == 0
    names = {v["name"] for v in spec["variables"]}
    expressions = " ".join(r["expression"] for r in spec["validations"])
    used = {n for n in ("hostPathVolumes", "runDirVolumes") if f"variables.{n}" in expressions}
    assert used == names
    namespaced = admission_policy("other-ns")["spec"]["validations"][0]["expression"]
    assert "system:serviceaccount:other-ns:agentnode-sandbox-controller" in namespaced
