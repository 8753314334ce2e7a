"""The ValidatingAdmissionPolicy that holds every run pod to its hardening in the API server itself."""

from __future__ import annotations

from typing import Any

from host.k8s.objects.names import (
    ADMISSION_POLICY_NAME,
    CONTROLLER_NAME,
    LABEL_ROLE,
    NAMESPACE,
    PACK_HOST_DIR,
    POD_UID_ENV,
    ROLE_AGENT_RUN,
    RUN_DIR_PREFIX,
    RUN_HOST_DIR,
    RUNTIME_CLASS,
    object_meta,
)


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
        "metadata": object_meta(ADMISSION_POLICY_NAME),
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
        "metadata": object_meta(ADMISSION_POLICY_NAME),
        "spec": {"policyName": ADMISSION_POLICY_NAME, "validationActions": ["Deny"]},
    }


__all__ = [
    "admission_policy",
    "admission_policy_binding",
    "admission_validations",
    "controller_username",
]
