"""The seccomp profile of a sandbox on Podman: Podman's own default, without user-namespace creation.

dockerd's default profile lets a process without CAP_SYS_ADMIN create no namespaces. Podman's (from
containers/common) allows `unshare`, `clone` and `clone3` with any flags, so an agent under runc could make
a user namespace, be root in it and reach the kernel code only namespace root reaches (mounts, netfilter in
a fresh network namespace, ...). A run on Podman therefore names this profile: Podman's own default
(its allowlist and every other rule unchanged), where `unshare` fails with EPERM, `clone` is allowed only
without namespace flags (dockerd's rule), and `clone3`, whose flags seccomp cannot read, fails with ENOSYS
so that the C library falls back to `clone`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from host.core.errors import AuditReason, EngineError

PODMAN_DEFAULT_PROFILE = Path("/usr/share/containers/seccomp.json")
"""Where containers-common installs the default profile Podman applies (containers.conf `seccomp_profile`)."""

NAMESPACE_FLAGS = 0x7E020000
"""The namespace flags of clone(2): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET."""

EPERM = 1
ENOSYS = 38
_TAKEN_OVER = frozenset({"unshare", "clone", "clone3"})


def without_namespaces(base: dict[str, Any]) -> dict[str, Any]:
    """`base` (a profile in the OCI/Docker JSON form) with `unshare`, `clone` and `clone3` ruled as the module
    says; every other rule is kept as it is (pure)."""
    profile = copy.deepcopy(base)
    rules = []
    for rule in profile.get("syscalls") or []:
        names = [name for name in rule.get("names") or [] if name not in _TAKEN_OVER]
        if names:
            rules.append({**rule, "names": names})
    rules += [
        {"names": ["unshare"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        },
    ]
    profile["syscalls"] = rules
    return profile


def podman_profile(directory: Path, base_path: Path = PODMAN_DEFAULT_PROFILE) -> Path:
    """Write (once per content) the derived profile into `directory` (the host's own) and return its path
    for `security_opt`; fail closed when Podman's default profile cannot be read."""
    try:
        base = json.loads(base_path.read_text())
        if not isinstance(base, dict) or not isinstance(base.get("syscalls"), list):
            raise ValueError("not a seccomp profile")
    except (OSError, ValueError) as exc:
        raise EngineError(
            f"cannot read Podman's default seccomp profile {base_path} ({type(exc).__name__})",
            reason=AuditReason.START_FAILED,
            hint="install containers-common (Podman's default profile; runs derive theirs from it), or run "
            "under Docker; check with: agentnode-sandbox doctor",
            check="start",
        ) from None
    text = json.dumps(without_namespaces(base), sort_keys=True)
    path = directory / f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    try:
        if not path.is_file():
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
    except OSError as exc:
        raise EngineError(
            f"cannot write the runs' seccomp profile into {directory} ({type(exc).__name__})",
            reason=AuditReason.START_FAILED,
            hint="make the host's config directory writable (AGENTNODE_CONFIG), then rerun",
            check="start",
        ) from None
    return path


__all__ = ["PODMAN_DEFAULT_PROFILE", "podman_profile", "without_namespaces"]
