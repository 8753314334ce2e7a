"""The Podman seccomp profile: Podman's default with user-namespace creation taken out (pure data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host.core.errors import AuditReason, EngineError
from host.engine.seccomp import ENOSYS, EPERM, NAMESPACE_FLAGS, podman_profile, without_namespaces

# The shape of containers-common's default: one big unconditional allow rule naming the namespace calls,
# and capability-conditional rules around them.
BASE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 38,
    "syscalls": [
        {"names": ["read", "clone", "clone3", "unshare", "mount", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["setns"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        {"names": ["unshare"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    ],
}


def rules_for(profile: dict, name: str) -> list[dict]:
    return [rule for rule in profile["syscalls"] if name in rule["names"]]


def test_namespace_creation_is_taken_out_and_nothing_else_changes() -> None:
    derived = without_namespaces(BASE)
    assert derived["defaultAction"] == BASE["defaultAction"]
    assert derived["defaultErrnoRet"] == 38
    assert rules_for(derived, "unshare") == [
        {"names": ["unshare"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}
    ]
    assert rules_for(derived, "clone3") == [
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}
    ]
    (clone,) = rules_for(derived, "clone")
    assert clone["action"] == "SCMP_ACT_ALLOW"
    assert clone["args"] == [
        {"index": 0, "value": NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    assert NAMESPACE_FLAGS & 0x10000000  # CLONE_NEWUSER is among the refused flags
    assert rules_for(derived, "read") == [{"names": ["read", "mount", "write"], "action": "SCMP_ACT_ALLOW"}]
    assert rules_for(derived, "setns") == BASE["syscalls"][1:2]  # untouched
    assert BASE["syscalls"][0]["names"][1] == "clone"  # the input is not modified


def test_the_profile_file_is_written_once_per_content(tmp_path: Path) -> None:
    base = tmp_path / "seccomp.json"
    base.write_text(json.dumps(BASE))
    (tmp_path / "out").mkdir()
    first = podman_profile(tmp_path / "out", base)
    again = podman_profile(tmp_path / "out", base)
    assert first == again and first.parent == tmp_path / "out"
    assert json.loads(first.read_text()) == without_namespaces(BASE)
    assert first.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in (tmp_path / "out").iterdir()] == [first.name]


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"syscalls": "all"})])
def test_an_unreadable_default_profile_fails_closed(tmp_path: Path, content: str | None) -> None:
    base = tmp_path / "seccomp.json"
    if content is not None:
        base.write_text(content)
    with pytest.raises(EngineError) as caught:
        podman_profile(tmp_path, base)
    assert caught.value.reason is AuditReason.START_FAILED and "containers-common" in caught.value.hint
    assert not list(tmp_path.glob("seccomp-*"))


def test_an_unwritable_directory_fails_closed(tmp_path: Path) -> None:
    base = tmp_path / "seccomp.json"
    base.write_text(json.dumps(BASE))
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(EngineError) as caught:
        podman_profile(tmp_path / "file" / "seccomp", base)
    assert caught.value.reason is AuditReason.START_FAILED and "AGENTNODE_CONFIG" in caught.value.hint
