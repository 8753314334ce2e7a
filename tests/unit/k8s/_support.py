"""What the object tests share: a run pod's inputs, its container, and the Pod Security "restricted" check."""

from __future__ import annotations

from typing import Any

from host.k8s.objects.pod import PodInputs

UID = "0f0e7a8c-1b2c-4d5e-8f90-a1b2c3d4e5f6"
IMAGE = "registry.example.com/agentnode/sandbox@sha256:" + "a" * 64
PACK = "b" * 64


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


def container(pod: dict[str, Any]) -> dict[str, Any]:
    [agent] = pod["spec"]["containers"]
    assert isinstance(agent, dict)
    return agent


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
