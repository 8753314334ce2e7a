"""Every row of the trust routing table through SandboxHost.run, each ending in exactly one audit record.

The probe agent appends its run id to an absolute host path: the file appears only when the agent really
ran on the host, so a sandboxed or refused run that leaves it behind has leaked onto the host.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from host.audit.verify import verify_audit
from host.runtime.runner import RunResult
from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

PROBE = """
import os

MARKER = {marker!r}

def run(context, **kwargs):
    try:
        with open(MARKER, "a") as fh:
            fh.write(context.run_id + "\\n")
        wrote = True
    except OSError:
        wrote = False
    return {{"pid": os.getpid(), "wrote_marker": wrote, "run_id": context.run_id}}
"""

MISSING_IMAGE = "sha256:" + "0" * 64


@dataclass(frozen=True)
class Row:
    """One routing case: how the pack is installed and configured, and where the run must end up."""

    trust: str  # the trust level the pack is installed with
    flag: bool  # AGENTNODE_AGENT_SANDBOX
    expect: str  # "sandbox" | "host" | "refused_flag_off" | "refused_trust"
    policy: str | None = None  # agent_sandbox.host_trust_policy; None = not set (default)
    lock_trust: Any = ...  # trust_level rewritten in the lockfile after install (None = key removed)


ROWS = {
    # the table itself
    "verified-flag-off": Row("verified", False, "refused_flag_off"),
    "unverified-flag-off": Row("unverified", False, "refused_flag_off"),
    "verified-flag-on": Row("verified", True, "sandbox"),
    "unverified-flag-on": Row("unverified", True, "sandbox"),
    "trusted-flag-off": Row("trusted", False, "host"),
    "curated-flag-off": Row("curated", False, "host"),
    "trusted-flag-on": Row("trusted", True, "host"),
    "curated-flag-on": Row("curated", True, "host"),
    # trust edited in the lockfile: missing, empty, unknown, and case/whitespace variants
    "empty-trust": Row("unverified", True, "refused_trust", lock_trust=""),
    "bogus-trust": Row("unverified", True, "refused_trust", lock_trust="bogus"),
    "bogus-trust-flag-off": Row("unverified", False, "refused_trust", lock_trust="bogus"),
    "missing-trust": Row("unverified", True, "refused_trust", lock_trust=None),
    "spaced-upper-verified": Row("unverified", True, "sandbox", lock_trust="  VERIFIED "),
    "spaced-upper-verified-flag-off": Row("unverified", False, "refused_flag_off", lock_trust="  VERIFIED "),
    "spaced-mixed-trusted": Row("trusted", True, "host", lock_trust=" Trusted  "),
    # host_trust_policy
    "default-policy-explicit": Row("trusted", True, "host", policy="default"),
    "curated_only-trusted": Row("trusted", True, "sandbox", policy="curated_only"),
    "curated_only-curated": Row("curated", True, "host", policy="curated_only"),
    "curated_only-unverified": Row("unverified", True, "sandbox", policy="curated_only"),
    "curated_only-trusted-flag-off": Row("trusted", False, "refused_flag_off", policy="curated_only"),
    "none-trusted": Row("trusted", True, "sandbox", policy="none"),
    "none-curated": Row("curated", True, "sandbox", policy="none"),
    "none-verified": Row("verified", True, "sandbox", policy="none"),
    "none-curated-flag-off": Row("curated", False, "refused_flag_off", policy="none"),
}


def _edit_lock_trust(state: HostState, slug: str, trust: Any) -> None:
    path = state.dir / "agentnode.lock"
    data = json.loads(path.read_text())
    if trust is None:
        del data["packages"][slug]["trust_level"]
    else:
        data["packages"][slug]["trust_level"] = trust
    path.write_text(json.dumps(data))


def _run(state: HostState, slug: str) -> RunResult:
    host = state.host()
    try:
        return host.run(slug)
    finally:
        host.close()


def _one_record(state: HostState, result: RunResult) -> dict[str, Any]:
    audit = state.audit()
    assert len(audit) == 1, audit
    rec = audit[0]
    assert rec["event"] == "agent_run" and rec["run_id"] == result.run_id and rec["slug"] == "probe"
    assert verify_audit(state.dir / "audit.jsonl").ok
    return rec


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_routing_row(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, row: Row
) -> None:
    marker = tmp_path / "ran-on-host"
    host_state.install(make_agent("probe", PROBE.format(marker=str(marker))), trust=row.trust)
    if row.lock_trust is not ...:
        _edit_lock_trust(host_state, "probe", row.lock_trust)
    host_state.env["AGENTNODE_AGENT_SANDBOX"] = "1" if row.flag else "0"
    if row.policy is not None:
        host_state.write_config({"host_trust_policy": row.policy})

    result = _run(host_state, "probe")
    rec = _one_record(host_state, result)
    expected_trust = row.trust if row.lock_trust is ... else row.lock_trust
    assert rec["trust"] == expected_trust

    if row.expect == "sandbox":
        assert result.success, (result.error_code, result.error, result.logs)
        assert result.mode_used == "agent_sandbox"
        assert result.result["wrote_marker"] is False and not marker.exists()
        assert result.result["run_id"] == result.run_id
        assert rec["action"] == "allow" and rec["reason"] == "agent_completed"
        assert rec["source"] == "agent_sandbox" and rec["sandbox"] is True
        assert rec["runtime"] == "runc" and rec["image"] == host_state.image
    elif row.expect == "host":
        assert result.success, (result.error_code, result.error, result.logs)
        assert result.mode_used == "agent_host"
        assert result.result["wrote_marker"] is True and result.result["pid"] != os.getpid()
        assert marker.read_text().split() == [result.run_id]
        assert rec["action"] == "allow" and rec["reason"] == "agent_completed"
        assert rec["source"] == "agent_host" and rec["sandbox"] is False
        assert rec["runtime"] is None and rec["image"] is None
    else:
        assert not result.success and result.result is None
        assert result.error_code == row.expect, (result.error_code, result.error)
        assert not marker.exists()
        assert rec["action"] == "deny" and rec["reason"] == row.expect and rec["sandbox"] is False
        assert rec["llm"] is None and rec["tool_calls"] == 0
        if row.expect == "refused_flag_off":
            assert "AGENTNODE_AGENT_SANDBOX" in result.error and "agent_sandbox.enabled" in result.error
            assert rec["source"] == "agent_sandbox"
        else:
            assert "trust" in result.error


@pytest.mark.parametrize(
    ("env_flag", "config_flag", "expect"),
    [
        (None, True, "sandbox"),
        (None, False, "refused_flag_off"),
        (None, None, "refused_flag_off"),  # default off
        ("0", True, "refused_flag_off"),  # env wins over the config file
        (" TRUE ", False, "sandbox"),
        ("false", True, "refused_flag_off"),
    ],
)
def test_feature_flag_sources(
    host_state: HostState,
    make_agent: Callable[..., Path],
    tmp_path: Path,
    *,
    env_flag: str | None,
    config_flag: bool | None,
    expect: str,
) -> None:
    marker = tmp_path / "ran-on-host"
    host_state.install(make_agent("probe", PROBE.format(marker=str(marker))), trust="unverified")
    host_state.env.pop("AGENTNODE_AGENT_SANDBOX")
    if env_flag is not None:
        host_state.env["AGENTNODE_AGENT_SANDBOX"] = env_flag
    host_state.write_config({} if config_flag is None else {"enabled": config_flag})
    result = _run(host_state, "probe")
    rec = _one_record(host_state, result)
    if expect == "sandbox":
        assert result.success and result.mode_used == "agent_sandbox", (result.error_code, result.error)
        assert rec["sandbox"] is True and rec["reason"] == "agent_completed"
    else:
        assert result.error_code == expect and rec["reason"] == expect and rec["action"] == "deny"
    assert not marker.exists()


# -- the host path is never a fallback -------------------------------------------------------------------


def _break_image(state: HostState) -> None:
    state.write_config({"image": MISSING_IMAGE})


def _remove_volume(state: HostState) -> None:
    entry = json.loads((state.dir / "agentnode.lock").read_text())["packages"]["probe"]
    state.client.volumes.get(entry["sandbox_volume"]).remove(force=True)


@pytest.mark.parametrize(
    ("trust", "policy", "breakage", "reason"),
    [
        ("unverified", None, _break_image, "image_missing"),
        ("verified", None, _remove_volume, "volume_missing"),
        # a trusted agent has a host copy; routed to the sandbox by policy it still must not fall back to it
        ("trusted", "none", _break_image, "image_missing"),
        ("trusted", "curated_only", _remove_volume, "volume_missing"),
    ],
    ids=[
        "unverified-missing-image",
        "verified-missing-volume",
        "trusted-policy-none-missing-image",
        "trusted-curated_only-missing-volume",
    ],
)
def test_failed_sandbox_fails_closed_never_on_host(
    host_state: HostState,
    make_agent: Callable[..., Path],
    tmp_path: Path,
    docker_client: docker.DockerClient,
    *,
    trust: str,
    policy: str | None,
    breakage: Callable[[HostState], None],
    reason: str,
) -> None:
    marker = tmp_path / "ran-on-host"
    entry = host_state.install(make_agent("probe", PROBE.format(marker=str(marker))), trust=trust)
    assert entry.sandbox_volume is not None
    assert (entry.host_path is not None) == (trust == "trusted")
    breakage(host_state)
    if policy is not None:
        section = json.loads((host_state.dir / "config.json").read_text())["agent_sandbox"]
        host_state.write_config({**section, "host_trust_policy": policy})

    result = _run(host_state, "probe")
    assert not result.success and result.error_code == reason, (result.error_code, result.error)
    assert result.mode_used == "agent_sandbox" and result.hint
    assert not marker.exists(), "the agent ran on the host after its sandbox failed"
    rec = _one_record(host_state, result)
    assert rec["action"] == "deny" and rec["reason"] == reason
    assert rec["source"] == "agent_sandbox" and rec["sandbox"] is True
    assert (
        docker_client.containers.list(
            all=True, filters={"label": f"io.agentnode.sandbox.run-id={result.run_id}"}
        )
        == []
    )
