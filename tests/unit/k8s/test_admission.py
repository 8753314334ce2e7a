"""The admission policy (host/k8s/objects/admission.py), checked offline: a rule for each property it
refuses, and what it matches."""

from __future__ import annotations

import pytest

from host.k8s.objects.admission import admission_policy, admission_policy_binding
from host.k8s.objects.names import (
    LABEL_ROLE,
    PACK_HOST_DIR,
    POD_UID_ENV,
    ROLE_AGENT_RUN,
    RUN_DIR_PREFIX,
    RUN_HOST_DIR,
)

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
