"""`init` → `install` → `run`: the scaffolded agent and toolpack work sandboxed as generated."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import yaml

from tests.integration.test_cli import OWN, install, remove_own_volumes
from tests.support.cli import cli, json_out
from tests.support.host_state import HostState
from tests.support.schema import check_schema

pytestmark = pytest.mark.docker


@pytest.fixture
def state(host_state: HostState, docker_client: docker.DockerClient) -> Iterator[HostState]:
    yield host_state
    remove_own_volumes(host_state, docker_client)


def test_scaffolded_agent_and_toolpack_run_sandboxed(state: HostState, tmp_path: Path, runtime: str) -> None:
    slug = f"{OWN}init-{uuid.uuid4().hex[:8]}"
    for args in ((slug,), ("my-tools", "--type", "toolpack")):
        proc = cli(state.env, "init", *args, "--dir", tmp_path)
        assert proc.returncode == 0, proc.stderr
    pack = tmp_path / slug

    # The generated manifest carries the opt-in llm_access block, exactly as documented.
    manifest = yaml.safe_load((pack / "agentnode.yaml").read_text())
    assert manifest["agent"]["llm_access"] == {
        "enabled": False, "max_calls": 20, "max_input_chars": 24000, "max_output_chars": 24000,
    }  # fmt: skip
    assert "# allowed_models:" in (pack / "agentnode.yaml").read_text()

    # As generated: no tools allowed, no LLM granted; the agent reports both refusals and succeeds.
    first_volume = install(state.env, pack)["sandbox_volume"]
    proc = cli(state.env, "run", slug, "--goal", "plan a picnic", "--runtime", runtime, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json_out(proc)
    check_schema("run", out)
    assert out["mode_used"] == "agent_sandbox"
    assert out["result"] == {
        "goal": "plan a picnic", "run_id": out["run_id"], "tool_calls_made": 0,
        "refusals": [{"step": "llm", "reason": "LLM_NOT_GRANTED"}],
    }  # fmt: skip

    # Allow the scaffolded toolpack: the agent's call crosses to the host and comes back.
    install(state.env, tmp_path / "my-tools", "trusted")
    text = (pack / "agentnode.yaml").read_text()
    (pack / "agentnode.yaml").write_text(text.replace("allowed_packages: []", "allowed_packages: [my-tools]"))
    assert install(state.env, pack)["sandbox_volume"] != first_volume
    # Reinstalling drops the superseded version's volume.
    assert not state.client.api.volumes(filters={"name": first_volume}).get("Volumes")
    proc = cli(state.env, "run", slug, "--goal", "plan a picnic", "--runtime", runtime, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json_out(proc)["result"]
    assert result["tool"] == {"text": "plan a picnic", "length": 13} and result["tool_calls_made"] == 1
