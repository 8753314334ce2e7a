"""The run pod an admitted AgentRun gets: one function, so the controller that creates it and the node agent
that verifies it can never disagree about what it must be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from host.core.errors import AuditReason, EngineError
from host.core.vocab import Runtime
from host.engine.contract import PACK_DIR_IN_CONTAINER, ContainerLimits
from host.k8s.objects import PodInputs, run_pod
from host.policy.admission import Admission
from host.spec.config import HostConfig

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


__all__ = ["POD_START_GRACE_SECONDS", "pod_for"]
