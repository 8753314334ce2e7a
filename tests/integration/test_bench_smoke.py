"""The benchmark's smoke mode runs end to end so its code never rots; it asserts that it ran, never speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from bench import run
from bench._plan import SECTION_NAMES
from bench.report.results import SECTIONS, render
from host.core.owner import owner_token
from host.engine.labels import LABEL_OWNER


def check_smoke(data: dict[str, Any], text: str) -> None:
    """What a smoke run (one runtime, runc) must have written."""
    plan, reps = run.SMOKE, run.SMOKE.reps
    for title in SECTIONS:
        assert f"\n## {title}\n" in text
    assert data["mode"] == "smoke" and data["errors"] == [] and data["leftovers"] == 0
    for key in ("date", "git_revision", "cpu_model", "cores", "memory_gib", "kernel", "docker_server",
                "docker_runtimes", "load_at_start", "load_at_end", "image"):
        assert data["machine"][key] not in (None, "", [])
    # for section: for repetition: for runtime
    assert [(m["section"], m["rep"], m["runtime"]) for m in data["measurements"]] == [
        (s, r + 1, "host" if s == "broker_tools" else "runc") for s in SECTION_NAMES for r in range(reps)]
    assert set(data["load_by_section"]) == set(SECTION_NAMES)

    cold = data["cold"]["runc"]
    assert cold["run_ms"]["n"] == cold["floor_sdk_ms"]["n"] == cold["floor_cli_ms"]["n"] == reps * plan.cold
    assert len(cold["run_ms"]["rep_medians"]) == reps and "spread" in cold["run_ms"]
    assert {"create", "start", "boot", "report", "teardown", "total"} <= set(cold["stages_ms"])
    calls = data["calls"]["runc"]
    for key in ("tool_ms", "tool_stub_ms", "echo_ms", "stdio_ms"):
        assert calls[key]["n"] == reps * plan.calls
    assert calls["tool_over_floor"]["n"] == reps
    broker = data["broker"]["runc"]
    for key in ("direct_ms", "session_ms", "sandbox_ms", "direct_first_chunk_ms", "sandbox_first_chunk_ms",
                "direct_tools_ms", "sandbox_tools_ms", "direct_tools_first_chunk_ms",
                "sandbox_tools_first_chunk_ms", "relay_ms", "relay_first_chunk_ms", "relay_tools_ms",
                "relay_tools_first_chunk_ms"):
        assert broker[key]["n"] == reps * plan.broker
    assert broker["overhead_ms"]["n"] == broker["first_chunk_overhead_ms"]["n"] == reps
    for key in ("relay_ms_over_direct", "sandbox_ms_over_relay", "sandbox_tools_first_chunk_ms_over_relay"):
        assert broker[key]["n"] == reps
    tools = data["broker_tools"]["host"]
    assert (tools["tools"], tools["schema_bytes"] >= 2048) == (8, True)
    for key in ("direct_ms", "session_ms", "direct_first_chunk_ms", "session_first_chunk_ms"):
        assert tools[key]["n"] == reps * plan.calls
    level = data["concurrency"]["runc"][str(plan.levels[0])]
    assert level["failures"] == 0 and level["leftovers"] == 0 and level["peak_active"] >= 1
    assert level["throughput_over_floor"]["n"] == reps
    warm = data["warm"]["runc"]
    assert warm["submitted"] == reps * plan.warm and warm["server_ms"]["n"] == warm["warm_runs"] >= 1
    assert warm["aio_client_ms"]["n"] >= 1 and warm["p95_over_p50"]["n"] >= 1

    statuses = {(t["target"], t["status"]) for t in data["targets"]}
    assert ("64 concurrent: failures", "not measured") in statuses  # smoke never runs 64 at once
    assert {s for _, s in statuses} <= {"met", "missed", "unstable", "not measured"}
    assert text == render(data)  # the Markdown is a pure function of the JSON


@pytest.mark.docker
def test_smoke_writes_every_section(
    tmp_path: Path, docker_client: docker.DockerClient, pinned_image: str
) -> None:
    assert run.main(["--smoke", "--runtimes", "runc", "--out", str(tmp_path)]) == 0

    data = json.loads((tmp_path / "smoke.json").read_text())
    check_smoke(data, (tmp_path / "smoke.md").read_text())
    assert data["machine"]["image"] == pinned_image
    assert not docker_client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner_token()}"})
