"""A one-shot run's container started before the host is built (host/runtime/prelaunch.py), on the real
engine: the host adopts it only when it is the very sandbox the run would start; any other is removed,
verifiably."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from host.core.owner import owner_token
from host.engine.contract import ContainerLimits
from host.engine.http import EngineClient
from host.engine.labels import LABEL_RUN
from host.runtime.prelaunch import PRELAUNCH_SOCKET_WAIT, prelaunch
from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

AGENT = """
def run(context, **kwargs):
    print("hello from the sandbox")
    return {"goal": context.goal}
"""


def _ours(engine: EngineClient, run_id: str) -> list[dict[str, object]]:
    return engine.containers(labels=[f"{LABEL_RUN}={run_id}"])


def test_a_prelaunched_container_becomes_the_run(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str, engine_client: EngineClient
) -> None:
    """The container is started before the host exists, its wrapper waiting for the socket; the run adopts
    it (same run id, no second container), its output and result come back, one audit record is written,
    and the container is gone after the run."""
    host_state.install(make_agent("pre-adopted", AGENT))
    early = prelaunch("pre-adopted", runtime=runtime, owner=owner_token(), env=host_state.env,
                      limits=ContainerLimits())  # fmt: skip
    assert early is not None
    inspected = engine_client.inspect_container(early.container_id)
    assert inspected["State"]["Running"]  # started, and waiting: nothing serves its socket yet
    assert f"AGENTNODE_SOCKET_WAIT_SECONDS={PRELAUNCH_SOCKET_WAIT:g}" in inspected["Config"]["Env"]
    assert not early.rundir.socket_path.exists()
    host = host_state.host()
    try:
        result = host.run("pre-adopted", goal="adopted", runtime=runtime, prelaunched=early)
    finally:
        host.close()
        early.discard()  # a no-op: the run took it
    assert result.success, (result.error, result.logs)
    assert result.result == {"goal": "adopted"} and "hello from the sandbox" in result.logs
    assert result.run_id == early.run_id and early.adopted
    assert "sandbox_started" in result.stages
    records = host_state.audit()
    assert [r["run_id"] for r in records] == [early.run_id] and records[0]["reason"] == "agent_completed"
    assert _ours(engine_client, early.run_id) == [] and not early.rundir.path.exists()


@pytest.mark.parametrize("differs", [{"pids": 128}, {"memory_bytes": 256 * 2**20}], ids=["pids", "memory"])
def test_a_prelaunched_container_the_run_would_not_start_is_removed(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str, engine_client: EngineClient,
    differs: dict[str, int],
) -> None:  # fmt: skip
    """A container started with other limits than the run's is not the run's sandbox: the run starts its
    own, and the prelaunched one is removed when discarded."""
    host_state.install(make_agent("pre-unfit", AGENT))
    limits = dataclasses.replace(ContainerLimits(), **differs)
    early = prelaunch("pre-unfit", runtime=runtime, owner=owner_token(), env=host_state.env, limits=limits)
    assert early is not None
    host = host_state.host()
    try:
        result = host.run("pre-unfit", goal="own", runtime=runtime, prelaunched=early)
    finally:
        host.close()
        early.discard()
    assert result.success and result.run_id != early.run_id and not early.adopted
    assert _ours(engine_client, early.run_id) == [] and not early.rundir.path.exists()
    assert [r["run_id"] for r in host_state.audit()] == [result.run_id]  # the discarded one never ran


def test_no_container_is_prelaunched_for_a_run_that_would_be_refused(
    host_state: HostState, make_agent: Callable[..., Path], engine_client: EngineClient
) -> None:
    """Admission comes first: with the sandbox flag off (or the agent not installed) nothing is started."""
    host_state.install(make_agent("pre-refused", AGENT))
    before = {c["Id"] for c in engine_client.containers(labels=[LABEL_RUN])}
    off = {**host_state.env, "AGENTNODE_AGENT_SANDBOX": "0"}
    for slug, env in (("pre-refused", off), ("not-installed", host_state.env)):
        assert prelaunch(slug, runtime="runc", owner=owner_token(), env=env, limits=ContainerLimits()) is None
    assert {c["Id"] for c in engine_client.containers(labels=[LABEL_RUN])} <= before
