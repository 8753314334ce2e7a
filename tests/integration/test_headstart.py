"""A cold run's container started from the command's record before anything else (host/runtime/headstart.py),
on the real engine: adopted when it is exactly the sandbox the host verified, removed otherwise, and never a
cause of anything the usual path would not do (no implicit volume, no pack code before verification)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from host.core.owner import owner_token
from host.engine.contract import ContainerLimits
from host.engine.http import EngineApiError, EngineClient
from host.engine.labels import LABEL_RUN
from host.runtime.headstart import Headstart, begin, load_record, record_path
from host.runtime.prelaunch import Prelaunched, prelaunch
from host.runtime.runner import RunResult
from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

AGENT = """
import os

def run(context, **kwargs):
    print("hello from the sandbox")
    return {"goal": context.goal}
"""


def _run(host_state: HostState, slug: str, runtime: str, headstart: Headstart | None = None
         ) -> tuple[Prelaunched | None, RunResult]:  # fmt: skip
    """What `run SLUG --runtime R` does in its process: the prelaunch (taking `headstart`), then the host."""
    early = prelaunch(slug, runtime=runtime, owner=owner_token(), env=host_state.env,
                      limits=ContainerLimits(), headstart=headstart)  # fmt: skip
    host = host_state.host()
    try:
        result = host.run(slug, goal="g", runtime=runtime, prelaunched=early)
    finally:
        host.close()
        if early is not None:
            early.discard()
    return early, result


def _gone(engine: EngineClient, name: str) -> bool:
    try:
        engine.inspect_container(name)
    except EngineApiError as exc:
        return exc.status == 404
    return False


def test_the_same_command_again_starts_from_its_record_and_the_run_adopts_it(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str, engine_client: EngineClient
) -> None:
    host_state.install(make_agent("hs-adopted", AGENT))
    first, result = _run(host_state, "hs-adopted", runtime)
    assert result.success and first is not None
    assert load_record(host_state.env, "hs-adopted", runtime) is not None  # the verified request, kept
    early = begin(["run", "hs-adopted", "--runtime", runtime, "--json"], host_state.env)
    assert early is not None and early.started(60), early.error
    inspected = engine_client.inspect_container(early.container_id)
    assert inspected["State"]["Running"] and inspected["Name"] == f"/{early.name}"
    # no preload: the wrapper waits for its socket before it imports anything of the pack
    assert "AGENTNODE_PRELOAD=" in inspected["Config"]["Env"]
    assert not (Path(early.rundir) / "sandbox.sock").exists()
    taken, result = _run(host_state, "hs-adopted", runtime, headstart=early)
    assert result.success, (result.error, result.logs)
    assert result.result == {"goal": "g"} and "hello from the sandbox" in result.logs
    assert taken is not None and result.run_id == early.run_id and early.adopted
    records = host_state.audit()
    assert [r["run_id"] for r in records] == [first.run_id, early.run_id]
    assert all(r["reason"] == "agent_completed" for r in records)
    assert engine_client.containers(labels=[f"{LABEL_RUN}={early.run_id}"]) == []
    assert not Path(early.rundir).exists()


@pytest.mark.parametrize("tamper", ["memory", "preload", "privileged"])
def test_a_replayed_request_the_host_would_not_send_is_removed_and_never_served(
    host_state: HostState, make_agent: Callable[..., Path], engine_client: EngineClient, tamper: str
) -> None:
    """The record is rewritten behind the host's back (its key still holds): the container it starts is not
    the one the host verified, so it is removed, the run gets its own sandbox, and a fresh record is kept."""
    host_state.install(make_agent("hs-tampered", AGENT))
    assert _run(host_state, "hs-tampered", "runc")[1].success
    path = Path(record_path(host_state.env, "hs-tampered", "runc"))
    text = path.read_text()
    if tamper == "memory":
        text = re.sub(r'"Memory": \d+', '"Memory": 268435456', text, count=1)
    elif tamper == "preload":
        text = text.replace('"AGENTNODE_PRELOAD="', '"AGENTNODE_PRELOAD=agent"', 1)
    else:
        text = text.replace('"HostConfig": {', '"HostConfig": {"Privileged": true, ', 1)
    assert text != path.read_text()
    path.write_text(text)
    early = begin(["run", "hs-tampered", "--runtime", "runc"], host_state.env)
    assert early is not None and early.started(60), early.error
    _, result = _run(host_state, "hs-tampered", "runc", headstart=early)
    assert result.success and result.run_id != early.run_id and not early.adopted
    assert _gone(engine_client, early.name) and not Path(early.rundir).exists()
    assert [r["run_id"] for r in host_state.audit()][-1] == result.run_id  # the removed one never ran
    record = load_record(host_state.env, "hs-tampered", "runc")
    assert record is not None and "268435456" not in record["body"] and "Privileged" not in record["body"]
    assert '"AGENTNODE_PRELOAD="' in record["body"]


def test_a_head_start_for_a_run_that_is_then_refused_is_removed(
    host_state: HostState, make_agent: Callable[..., Path], engine_client: EngineClient
) -> None:
    """The prelaunch settles a head start on every path: here the run is refused (another agent, not
    installed), and the container already started is removed before the refusal is reported."""
    host_state.install(make_agent("hs-refused", AGENT))
    assert _run(host_state, "hs-refused", "runc")[1].success
    early = begin(["run", "hs-refused", "--runtime", "runc"], host_state.env)
    assert early is not None and early.started(60)
    assert prelaunch("not-installed", runtime="runc", owner=owner_token(), env=host_state.env,
                     limits=ContainerLimits(), headstart=early) is None  # fmt: skip
    assert _gone(engine_client, early.name) and not Path(early.rundir).exists()
    # refused with the same record in place (here: the sandbox flag off for this process only)
    assert load_record(host_state.env, "hs-refused", "runc") is not None
    early = begin(["run", "hs-refused", "--runtime", "runc"], host_state.env)
    assert early is not None and early.started(60)
    off = {**host_state.env, "AGENTNODE_AGENT_SANDBOX": "0"}
    assert prelaunch("hs-refused", runtime="runc", owner=owner_token(), env=off, limits=ContainerLimits(),
                     headstart=early) is None  # fmt: skip
    assert _gone(engine_client, early.name)
    # the record is dropped: a refusal that holds does not start a container on every later run
    assert load_record(host_state.env, "hs-refused", "runc") is None


def test_a_removed_pack_volume_is_not_recreated_by_a_head_start(
    host_state: HostState, make_agent: Callable[..., Path], engine_client: EngineClient
) -> None:
    """An engine creates a missing named volume on create: a head start checks the pack volume first, so
    the run fails as it would without one (volume missing), and no empty volume appears in its place."""
    entry = host_state.install(make_agent("hs-novolume", AGENT))
    assert _run(host_state, "hs-novolume", "runc")[1].success
    volume = entry.sandbox_volume
    assert volume
    engine_client.remove_volume(volume, force=True)
    early = begin(["run", "hs-novolume", "--runtime", "runc"], host_state.env)
    assert early is not None and not early.started(60) and not early.created()
    _, result = _run(host_state, "hs-novolume", "runc", headstart=early)
    assert not result.success and result.error_code == "volume_missing", result.error_code
    with pytest.raises(EngineApiError) as missing:
        engine_client.inspect_volume(volume)
    assert missing.value.status == 404
    assert json.loads(json.dumps(result.to_json()))["error_code"] == "volume_missing"
