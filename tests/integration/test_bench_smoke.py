"""The benchmark's smoke mode runs end to end so its code never rots; it asserts that it ran, never speed."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from bench import run
from bench._report import SECTIONS, render, targets
from host._engine import LABEL_OWNER, owner_token


@pytest.mark.docker
def test_smoke_writes_every_section(
    tmp_path: Path, docker_client: docker.DockerClient, pinned_image: str
) -> None:
    assert run.main(["--smoke", "--runtimes", "runc", "--out", str(tmp_path)]) == 0

    data = json.loads((tmp_path / "smoke.json").read_text())
    text = (tmp_path / "smoke.md").read_text()
    for title in SECTIONS:
        assert f"\n## {title}\n" in text
    assert data["mode"] == "smoke" and data["errors"] == [] and data["leftovers"] == 0
    for key in ("date", "git_revision", "cpu_model", "cores", "memory_gib", "kernel", "docker_server",
                "docker_runtimes", "load_at_start", "load_at_end", "image"):
        assert data["machine"][key] not in (None, "", [])
    assert data["machine"]["image"] == pinned_image

    cold = data["cold"]["runc"]
    assert cold["run_ms"]["n"] == cold["floor_sdk_ms"]["n"] == cold["floor_cli_ms"]["n"] == run.SMOKE.cold
    assert {"create", "start", "boot", "report", "teardown", "total"} <= set(cold["stages_ms"])
    calls = data["calls"]["runc"]
    for key in ("tool_ms", "tool_stub_ms", "echo_ms", "stdio_ms"):
        assert calls[key]["n"] == run.SMOKE.calls
    broker = data["broker"]["runc"]
    for key in ("direct_ms", "session_ms", "sandbox_ms", "direct_first_chunk_ms", "sandbox_first_chunk_ms",
                "direct_tools_ms", "sandbox_tools_ms", "direct_tools_first_chunk_ms",
                "sandbox_tools_first_chunk_ms"):
        assert broker[key]["n"] == run.SMOKE.broker
    assert broker["tools_overhead_ms"] is not None and broker["tools_first_chunk_overhead_ms"] is not None
    tools = data["broker_tools"]
    assert (tools["tools"], tools["schema_bytes"] >= 2048) == (8, True)
    for key in ("direct_ms", "session_ms", "direct_first_chunk_ms", "session_first_chunk_ms"):
        assert tools[key]["n"] == run.SMOKE.calls
    level = data["concurrency"]["runc"][str(run.SMOKE.levels[0])]
    assert level["failures"] == 0 and level["leftovers"] == 0 and level["peak_active"] >= 1
    warm = data["warm"]["runc"]
    assert warm["submitted"] == run.SMOKE.warm and warm["server_ms"]["n"] == warm["warm_runs"] >= 1
    assert warm["aio_client_ms"]["n"] >= 1 and warm["aio_over_sync_ms"] is not None

    statuses = {(t["target"], t["status"]) for t in data["targets"]}
    assert ("64 concurrent: failures", "not measured") in statuses  # smoke never runs 64 at once
    assert {s for _, s in statuses} <= {"met", "missed", "not measured"}
    assert text == render(data)  # the Markdown is a pure function of the JSON
    assert not docker_client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner_token()}"})


def test_targets_say_met_missed_or_not_measured() -> None:
    results = {
        "cold": {"runc": {"ratio": 1.2}, "runsc": {"ratio": 1.4}},
        "calls": {"runc": {"tool_over_echo": None}},
        "broker": {"runc": {"overhead_ms": 2.5}},
        "broker_tools": {"overhead_ms": 0.5, "first_chunk_overhead_ms": None},
        "concurrency": {"runc": {"64": {"failures": 0, "leftovers": 1, "throughput": 9.0,
                                         "host_mb_per_run": 5.0}}},
        "warm": {"runc": {"server_ms": {"n": 3, "median": 24.0}, "speedup": 9.5}},
    }
    got = {(t["target"], t["runtime"]): t["status"] for t in targets(results)}
    assert got == {
        ("cold run / docker floor", "runc"): "met",
        ("cold run / docker floor", "runsc"): "missed",
        ("tool call / bare gRPC echo", "runc"): "not measured",
        ("broker overhead (median)", "runc"): "missed",
        ("broker overhead from the sandbox, 8 tools + 2 KiB JSON schema (median)", "runc"): "not measured",
        ("first streamed chunk in the sandbox after the provider's, same call (median)", "runc"):
            "not measured",
        ("broker overhead, 8 tools + 2 KiB JSON schema (median)", "host"): "met",
        ("first streamed chunk after the provider's, same call (median)", "host"): "not measured",
        ("64 concurrent: failures", "runc"): "met",
        ("64 concurrent: leftovers", "runc"): "missed",
        ("64 concurrent: throughput", "runc"): "met",
        ("64 concurrent: host memory per active run", "runc"): "met",
        ("warm run p50 (server side)", "runc"): "met",
        ("warm speed-up over cold", "runc"): "missed",
        ("warm run p50 through host.aio over the blocking client", "runc"): "not measured",
    }
