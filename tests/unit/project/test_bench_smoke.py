"""The benchmark's statistics and reports, without Docker: repetitions combined into a median and a
spread, the 20% instability flag, target verdicts (unstable included), the interleaving loop, and both
Markdown reports rendered from synthetic results. (tests/integration/test_bench_smoke.py runs the smoke
benchmark itself against the engine.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import _compare, _drive
from bench._plan import FULL, SECTION_NAMES, SMOKE, Plan, parse_sections
from bench._roots import REPO
from bench._stats import UNSTABLE_SPREAD, combine, figure, rep_value, spread, summary, unstable_figures
from bench.measure.broker import BROKER_ROUNDS
from bench.measure.concurrency import over_floor
from bench.report.compare import compare_figures, finish_compare, render_compare
from bench.report.results import SECTIONS, aggregate, finish, render, targets

# -- statistics ---------------------------------------------------------------------------------------


def test_spread_is_range_over_median_of_the_repetitions() -> None:
    assert spread([10.0, 11.0, 12.0]) == pytest.approx(2 / 11, abs=1e-3)
    assert spread([5.0]) is None  # one repetition has no spread
    assert spread([0.0, 0.0]) == 0.0
    assert spread([-1.0, 0.0, 1.0]) is None  # median 0 and they differ: no relative spread
    assert figure([-1.0, 0.0, 1.0])["unstable"] is True
    assert spread([-2.0, -2.2, -1.8]) == pytest.approx(0.2)  # relative to |median|


def test_a_floor_batch_with_failed_runs_gives_no_ratio() -> None:
    assert over_floor(3.0, {"throughput": 2.0, "failures": 0}) == 1.5
    assert over_floor(3.0, {"throughput": 0.5, "failures": 4, "errors": ["ReadTimeout"]}) is None
    assert over_floor(3.0, {}) is None  # no floor measured


def test_twenty_percent_is_the_limit() -> None:
    assert UNSTABLE_SPREAD == 0.20
    assert figure([10.0, 12.0, 11.0])["unstable"] is False  # spread 2/11 = 18%
    assert figure([10.0, 12.0])["unstable"] is False  # spread 2/11 (median of two is 11)
    assert figure([10.0, 13.0, 11.0])["unstable"] is True  # 3/11 = 27%
    assert figure([10.0])["unstable"] is False and figure([10.0])["spread"] is None
    assert figure([0.001, 0.002])["unstable"] is False  # differences below 0.01 (the reports' precision)
    assert figure([0.0, 0.02])["unstable"] is True
    assert figure([]) == {"n": 0}


def test_summaries_combine_into_median_of_medians_and_median_of_p95s() -> None:
    reps = [summary([1.0, 2.0, 3.0, 10.0]), summary([2.0, 2.0, 2.0, 4.0]), summary([3.0, 3.0, 3.0, 5.0]),
            {"n": 0}]
    got = combine(reps)
    assert got["n"] == 12  # samples of the repetitions that measured something
    assert got["rep_medians"] == [2.5, 2.0, 3.0] and got["median"] == 2.5
    assert got["spread"] == pytest.approx(0.4) and got["unstable"] is True
    assert got["rep_p95s"] == [10.0, 4.0, 5.0] and got["p95"] == 5.0
    assert got["p95_spread"] == pytest.approx(1.2) and got["p95_unstable"] is True
    assert (got["min"], got["max"]) == (1.0, 10.0)
    assert combine([{"n": 0}, {"n": 0}]) == {"n": 0}


def test_combine_keeps_the_shape_and_treats_counts_strings_and_lists() -> None:
    reps: list[Any] = [
        {"ratio": 1.1, "failures": 0, "leftovers": 1, "peak_active": 64, "tools": 8, "runs": 3,
         "model": "m", "reasons": ["b"], "nested": {"x": summary([1.0]), "gone": None}},
        None,  # a failed repetition is left out
        {"ratio": 1.3, "failures": 2, "leftovers": 0, "peak_active": 60, "tools": 8, "runs": 4,
         "model": "m", "reasons": ["a", "b"], "nested": {"x": summary([1.2])}},
    ]
    got = combine(reps)
    assert got["ratio"]["median"] == pytest.approx(1.2) and got["ratio"]["rep_medians"] == [1.1, 1.3]
    assert (got["failures"], got["leftovers"], got["peak_active"], got["tools"]) == (2, 1, 60, 8)
    assert got["runs"]["rep_medians"] == [3.0, 4.0]  # integers that differ become a figure
    assert (got["model"], got["reasons"]) == ("m", ["a", "b"])
    assert got["nested"]["x"]["rep_medians"] == [1.0, 1.2] and got["nested"]["gone"] is None
    assert combine([None, None]) is None


def test_rep_value_reads_one_repetition_at_a_path() -> None:
    rep = {"a": {"b": summary([1.0, 3.0])}, "r": 2.0, "z": {"n": 0}}
    assert rep_value(rep, ("a", "b")) == 2.0 and rep_value(rep, ("a", "b"), "p95") == 3.0
    assert rep_value(rep, ("r",)) == 2.0 and rep_value(rep, ("r",), "p95") is None
    assert rep_value(rep, ("z",)) is None and rep_value(rep, ("missing", "x")) is None


def test_unstable_figures_names_each_one() -> None:
    tree = combine([{"x": {"y": summary([10.0])}, "ok": 1.0}, {"x": {"y": summary([20.0])}, "ok": 1.0}])
    found = unstable_figures(tree, "calls runc")
    assert [(u["figure"], u["which"]) for u in found] == [("calls runc x.y", "median"),
                                                          ("calls runc x.y", "p95")]
    assert found[0]["reps"] == [10.0, 20.0]


# -- plan and loop -------------------------------------------------------------------------------------


def test_plans_repeat_every_section_and_keep_full_counts() -> None:
    assert FULL.reps >= 3 and SMOKE.reps >= 1
    # about the single-pass sample counts of before, spread over the repetitions
    assert 18 <= FULL.reps * FULL.cold <= 24 and FULL.reps * FULL.calls == 300
    assert FULL.reps * FULL.warm == 30
    # the broker's overheads are differences of two medians: more samples, taken in rounds
    assert FULL.reps * FULL.broker >= 120 and FULL.broker % BROKER_ROUNDS == 0
    assert Plan.from_json(json.loads(json.dumps(FULL.to_json()))) == FULL
    assert parse_sections(None) == SECTION_NAMES
    assert parse_sections("warm, calls") == ("calls", "warm")  # run order, not the order given
    with pytest.raises(ValueError, match="nope"):
        parse_sections("calls,nope")


def test_drive_interleaves_runtimes_and_alternates_revisions() -> None:
    calls: list[tuple[str, str, str]] = []

    def side(name: str) -> _drive.Measure:
        def measure(section: str, runtime: str) -> dict[str, Any]:
            calls.append((section, runtime, name))
            if (section, runtime, name) == ("cold", "runsc", "b"):
                raise RuntimeError("boom")
            return {"v": float(len(calls)), "errors": ["a level failed"] if section == "broker_tools" else []}
        return measure

    plan = Plan(**{**SMOKE.to_json(), "reps": 2, "levels": (2,)})
    stores: dict[str, dict[str, Any]] = {s: {"raw": {}, "errors": []} for s in ("a", "b")}
    log: dict[str, Any] = {"load_by_section": {}, "measurements": []}
    _drive.drive(plan, ("broker_tools", "cold"), ["runc", "runsc"], sides={"a": side("a"), "b": side("b")},
                 stores=stores, log=log)
    assert calls == [
        ("broker_tools", "host", "a"), ("broker_tools", "host", "b"),  # host-only: one slot a repetition
        ("broker_tools", "host", "b"), ("broker_tools", "host", "a"),
        ("cold", "runc", "a"), ("cold", "runc", "b"), ("cold", "runsc", "b"), ("cold", "runsc", "a"),  # rep 1
        ("cold", "runc", "b"), ("cold", "runc", "a"), ("cold", "runsc", "a"), ("cold", "runsc", "b"),  # rep 2
    ]
    assert stores["b"]["raw"]["cold"]["runsc"] == [None, None]  # failed twice, recorded, loop went on
    assert len(stores["a"]["raw"]["cold"]["runsc"]) == 2
    assert any("cold 1/2 runsc [b]: RuntimeError: boom" in e for e in stores["b"]["errors"])
    assert any("a level failed" in e for e in stores["a"]["errors"])
    assert set(log["load_by_section"]) == {"broker_tools", "cold"}
    for load in log["load_by_section"].values():
        assert {"load1", "busy"} <= set(load["before"]) and {"load1", "busy"} <= set(load["after"])
    assert len(log["measurements"]) == 12 and {"before", "after"} <= set(log["measurements"][0])


# -- synthetic results -----------------------------------------------------------------------------


def _s(ms: float) -> dict[str, float]:
    return summary([ms * 0.9, ms, ms * 1.3])  # median ms, p95 1.3 ms


_CPU = {"machine": 350.0, "process": 8.0, "engine": 45.0, "rest": 297.0}


def _rep(k: float, *, tool_ratio: float = 1.2, throughput: float = 4.0) -> dict[str, dict[str, Any]]:
    """One repetition of every section; `k` scales the times so repetitions differ."""
    stages = {s: _s(v * k) for s, v in (("route", 1), ("boot", 200), ("teardown", 80), ("total", 450),
                                         ("to_result", 370))}
    return {
        "broker_tools": {"host": {"tools": 8, "schema_bytes": 2069, "request_bytes": 5400,
                                  "direct_ms": _s(3.9), "session_ms": _s(4.4 * k),
                                  "direct_first_chunk_ms": _s(3.9), "session_first_chunk_ms": _s(4.3),
                                  "overhead_ms": 0.5 * k, "first_chunk_overhead_ms": 0.4}},
        "cold": {"runc": {"floor_sdk_ms": _s(440), "floor_cli_ms": _s(470), "floor": "sdk",
                          "floor_stages_ms": {"create": _s(20), "total": _s(440)}, "run_ms": _s(490 * k),
                          "ratio": round(1.1 * k, 2), "stages_ms": stages,
                          "boot_probe_ms": {"interpreter": _s(30), "import_grpc": _s(170),
                                            "import_wrapper": _s(40)},
                          "teardown_steps_ms": {"at once": {"exit_wait": _s(0), "server_stop": _s(1.5),
                                                            "remove_verify": _s(70), "rundir": _s(0.5),
                                                            "total": _s(73)}}}},
        "cli": {"runc": {"process_ms": _s(900 * k), "docker_cli_ms": _s(380), "ratio": round(2.4 * k, 2),
                         "run_duration_ms": _s(450), "imports_ms": _s(330), "library_imports_ms": _s(120),
                         "prelaunch_imports_ms": _s(140),
                         "served_process_ms": _s(120), "served_docker_cli_ms": _s(400), "served_ratio": 0.3}},
        "calls": {"runc": {"tool_ms": _s(1.0), "tool_stub_ms": _s(0.9), "cached_lookup_tool_ms": _s(0.9),
                           "free_tool_ms": _s(0.7), "echo_ms": _s(0.3), "stdio_ms": _s(0.14),
                           "tool_over_echo": 3.3, "stdio_over_echo": 0.47, "tool_over_floor": tool_ratio,
                           "host_side": {"gate_ms": _s(0.30), "gate_cached_lookup_ms": _s(0.19 * k),
                                         "worker_ms": _s(0.07)}}},
        "tool_sandbox": {"runc": {"trusted_ms": _s(0.8), "community_ms": _s(0.82), "ratio": 1.02,
                                  "first_call_ms": 310.0 * k,
                                  "first_start_ms": {"verified": 3.0, "socket_ready": 4.0, "created": 15.0,
                                                     "started": 180.0, "connected": 300.0,
                                                     "first_reply": None}}},
        "broker": {"runc": {"model": "fake", "direct_ms": _s(3.0), "session_ms": _s(2.9),
                            "sandbox_ms": _s(3.5),
                            "direct_first_chunk_ms": _s(2.8), "session_first_chunk_ms": _s(2.9),
                            "sandbox_first_chunk_ms": _s(3.3), "overhead_ms": 0.5 * k,
                            "first_chunk_overhead_ms": 0.5, "sandbox_rpc_floor_ms": _s(0.3)}},
        "warm": {"runc": {"pool_size": 4, "submitted": 10, "warm_runs": 10, "server_ms": _s(13.0 * k),
                          "client_ms": _s(15.8), "aio_client_ms": _s(16.0), "aio_server_ms": _s(13.1),
                          "aio_over_sync_ms": 0.2, "p95_over_p50": 1.3, "aio_client_share_ms": _s(2.9),
                          "sync_client_share_ms": _s(2.8), "aio_share_over_sync_ms": 0.1,
                          "stages_ms": {"claim": _s(0.4), "handover": _s(0.44), "agent": _s(6.5),
                                        "finish": _s(4.8)},
                          "audit_append_ms": _s(1.0),
                          "filler_probe_ms": {"refilling": _s(15), "paused": _s(31)}}},
        "concurrency": {"runc": {"64": {"wall_s": 64 / throughput, "throughput": throughput, "failures": 0,
                                        "failure_reasons": [], "leftovers": 0, "peak_active": 64,
                                        "host_mb_per_run": 0.26, "host_rss_mb": [80.0, 97.0],
                                        "container_mb_per_run": 17.0, "shim_mb_per_run": 16.0,
                                        "run_ms": _s(9000), "floor": {"wall_s": 15.0, "throughput": 4.2,
                                                                      "failures": 0, "errors": [],
                                                                      "cpu_ms_per_run": _CPU},
                                        "hardened_floor": {"wall_s": 15.5, "throughput": 4.1, "failures": 0,
                                                           "errors": [], "cpu_ms_per_run": _CPU},
                                        "cpu_ms_per_run": {**_CPU, "process": 25.0},
                                        "throughput_over_floor": round(throughput / 4.2, 2),
                                        "throughput_over_hardened_floor": round(throughput / 4.1, 2)}}},
        "egress": {"runc": {"direct_ms": _s(2.0), "sandbox_ms": _s(2.0 + 0.8 * k),
                            "added_ms": round(0.8 * k, 3), "direct_mib_s": _s(900),
                            "sandbox_mib_s": _s(800), "throughput_ratio": 0.89,
                            "floor_ms": _s(1.8), "floor_mib_s": _s(950)}},
        "files": {"runc": {"tree": {"files": 200, "mib": 8.0}, "tar_mib_s": _s(200),
                           "snapshot_mib_s": _s(180), "snapshot_over_tar": 0.9, "modified": 100,
                           "changes_ms": _s(10.0 * k), "hash_ms": _s(9.0),
                           "changes_over_hash": round(1.1 * k, 2), "plain_ms": _s(5.0),
                           "files_ms": _s(12.0), "files_over_plain": 2.4}},
    }


def _raw(*reps: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    return {section: {rt: [r[section][rt] for r in reps] for rt in reps[0][section]}
            for section in SECTION_NAMES}


MACHINE = {"date": "2026-12-01T00:00:00Z", "git_revision": "abc+dirty", "cpu_model": "cpu", "cores": 2,
           "memory_gib": 23.5, "kernel": "6.x", "python": "3.11", "docker_server": "20.10",
           "docker_runtimes": ["runc", "runsc"], "runsc": "", "load_at_start": [0.5, 0.5, 0.5],
           "load_at_end": [1.0, 1.0, 1.0], "image": "sha256:x"}


def _results(*reps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return finish({
        "mode": "full", "command": ".venv/bin/python -m bench.run", "plan": FULL.to_json(),
        "machine": MACHINE,
        "runtimes": ["runc"], "sections": list(SECTION_NAMES), "raw": _raw(*reps), "errors": [],
        "load_by_section": {"cold": {"before": {"load1": 0.4, "busy": 1}, "after": {"load1": 1.6, "busy": 3},
                                     "seconds": 60.0, "quiesce_s": 9.0}},
        "measurements": [],
    })


def _status(results: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(t["target"], t["runtime"]): t["status"] for t in results["targets"]}


def test_targets_met_missed_unstable_and_not_measured() -> None:
    stable = _results(_rep(1.0), _rep(1.02), _rep(0.98))
    got = _status(stable)
    assert got[("tool call / (bare gRPC echo + worker round trip)", "runc")] == "met"  # 1.2 <= 1.3
    assert got[("warm run p50 (server side)", "runc")] == "missed"  # 13 ms > 6 ms
    assert got[("warm run p95 / p50 (server side)", "runc")] == "met"
    assert got[("64 concurrent: throughput / docker's at 64", "runc")] == "met"  # 4.0 / 4.2 = 0.95
    assert got[("16 concurrent: throughput / docker's at 16", "runc")] == "not measured"
    assert got[("64 concurrent: failures", "runc")] == "met"
    assert got[("64 concurrent: host memory per active run", "runc")] == "met"
    # the gate call as runs make it (pack looked up once) minus the worker round trip: 0.19 - 0.07 > 0.1
    assert got[("the gate's own share of a tool call (host-timed gate call - worker round trip)", "runc")] \
        == "missed"
    assert got[("broker overhead: sandbox call_llm - direct SDK (median)", "runc")] == "met"
    assert got[("first streamed chunk: sandbox - direct provider (median)", "runc")] == "met"
    assert got[("egress: one HTTPS request, path - direct (median)", "runc")] == "met"  # 0.8 <= 1 ms
    assert got[("egress: 64 MiB download, path / direct throughput", "runc")] == "met"  # 0.89 >= 0.8x
    assert got[("files: workspace snapshot / tar c | tar x (throughput)", "runc")] == "met"
    assert got[("files: change set of 100 modified files / hashing them", "runc")] == "met"  # 1.1 <= 1.2
    assert got[("files: warm run with a 1 MiB input and artifact / without files", "runc")] == "missed"
    assert stable["unstable"] == []
    missed = {t["target"]: t for t in stable["targets"] if t["status"] == "missed"}
    assert "claim 0.40" in missed["warm run p50 (server side)"]["floor"]  # the stage breakdown beside it
    assert "worker round trip 0.07" in missed[
        "the gate's own share of a tool call (host-timed gate call - worker round trip)"]["floor"]
    assert all(t["floor"] == "" for t in stable["targets"] if t["status"] == "met")

    # repetitions that disagree by more than 20% make the target unstable, whichever side of the goal
    shaky = _results(_rep(1.0, tool_ratio=1.0, throughput=3.0), _rep(1.0, tool_ratio=1.25, throughput=4.0),
                     _rep(1.0, tool_ratio=1.5, throughput=4.1))
    got = _status(shaky)
    assert got[("tool call / (bare gRPC echo + worker round trip)", "runc")] == "unstable"
    throughput = next(t for t in shaky["targets"]
                      if t["target"] == "64 concurrent: throughput / docker's at 64")
    assert throughput["status"] == "unstable" and "docker alone 4.20 runs/s" in throughput["floor"]
    assert "⚠" in throughput["measured"] and throughput["reps"] == [0.71, 0.95, 0.98]
    assert {u["figure"] for u in shaky["unstable"]} >= {"calls runc tool_over_floor",
                                                         "concurrency runc 64.throughput"}


def test_warm_speedup_is_derived_from_the_cold_section() -> None:
    results = _results(_rep(1.0), _rep(1.1))
    warm = results["warm"]["runc"]
    assert warm["cold_to_result_ms"]["median"] == results["cold"]["runc"]["stages_ms"]["to_result"]["median"]
    assert warm["speedup"]["n"] == 2 and warm["speedup"]["median"] > 20
    assert (warm["submitted"], warm["warm_runs"]) == (20, 20)  # counts add up over the repetitions


def test_report_renders_every_section_with_spreads_and_the_unstable_list() -> None:
    results = _results(_rep(1.0), _rep(1.3), _rep(1.0))
    text = render(results)
    for title in SECTIONS:
        assert f"\n## {title}\n" in text
    assert "13.0 ±30% ⚠" in text  # warm server median: repetitions 13.0 / 16.9 / 13.0
    assert "⚠ unstable: figures whose repetitions disagree by more than 20%" in text
    assert "- warm runc server_ms: median 13.0 ±30% (13.0 / 16.9 / 13.0); " \
        "p95 16.9 ±30% (16.9 / 22.0 / 16.9)" in text
    assert "| warm run p50 (server side) | runc | 13.0 ms ±30% ⚠ | 13.0 / 16.9 / 13.0 | <= 6 ms " \
        "| **unstable** | stages (median ms): claim 0.40" in text
    assert "| first streamed chunk: sandbox - direct provider (median) | runc | 0.50 ms ±0% " \
        "| 0.50 / 0.50 / 0.50 | <= 1 ms | **met** |  |" in text
    assert "| cold | 0.40 | 1 | 1.60 | 3 | 60.0 | 9.00 |" in text  # load before / after the section
    # issue 16's host.aio target, from each client's share of its runs
    assert "| warm run through host.aio - blocking client (each client's share of its runs) | runc " \
        "| 0.10 ms ±0% | 0.10 / 0.10 / 0.10 | <= 1 ms | **met** |  |" in text
    # issue 19's process-to-process target, with where the process's time goes beside it
    assert "| process to process: run --json / docker run | runc | 2.40x ±30% ⚠ | 2.40 / 3.12 / 2.40 " \
        "| <= 1.15x | **unstable** | docker run 380 ms, ours 900 ms: the run 450 ms, imports alone " \
        "330 ms (before the container is asked for: 140 ms), a new interpreter importing only gRPC " \
        "120 ms |" in text
    assert "| process to process, a serve host running: run --json / docker run | runc | 0.30x ±0% " \
        "| 0.30 / 0.30 / 0.30 | <= 1.15x | **met** |  |" in text
    # a throughput miss names the CPU per run beside docker's, and the hardened-spec floor
    missed = render(_results(*[_rep(1.0, throughput=3.0)] * 3))
    assert "| 64 concurrent: throughput / docker's at 64 | runc | 0.71x ±0% | 0.71 / 0.71 / 0.71 " \
        "| >= 0.95x | **missed** | ours 3.00 runs/s, docker alone 4.20 runs/s, docker with a run's " \
        "hardened spec 4.10 runs/s (ours / that 0.73x); CPU per run (ms) ours / docker's: machine " \
        "350 / 350, process 25.0 / 8.00, engine 45.0 / 45.0, rest 297 / 297 |" in missed
    assert text == render(json.loads(json.dumps(results)))  # a pure function of the JSON

    one = _results(_rep(1.0))  # a single repetition: figures without a spread
    assert "±" not in render(one).split("## Load")[0].split("## Targets")[1]


def test_targets_of_an_empty_run_are_empty() -> None:
    assert targets({}) == []
    assert aggregate({}) == {}


def test_compare_reports_each_figure_of_both_revisions_and_their_ratio() -> None:
    base = [_rep(1.0), _rep(1.0)]
    candidate = [_rep(0.5), _rep(0.5)]
    raw = {"base": _raw(*base), "candidate": _raw(*candidate)}
    raw["candidate"]["calls"]["runc"][1] = None  # the candidate's second calls repetition failed
    data = finish_compare({
        "mode": "compare smoke", "command": ".venv/bin/python -m bench.run --compare HEAD --smoke",
        "plan": SMOKE.to_json(), "machine": MACHINE, "raw": raw,
        "errors": {"base": [], "candidate": ["calls 2/2 runc [candidate]: RuntimeError: x"]},
        "base": {"label": "HEAD", "commit": "abc", "image": "sha256:b", "host_module": "/t/host/__init__.py"},
        "candidate": {"label": "the working tree", "commit": "abc+dirty", "image": "sha256:c",
                      "host_module": "/w/host/__init__.py"},
        "load_by_section": {}, "measurements": [],
    })
    rows = {(f["section"], f["runtime"], f["figure"]): f for f in data["figures"]}
    warm = rows[("warm", "runc", "server_ms")]
    assert (warm["base"]["median"], warm["candidate"]["median"]) == (13.0, 6.5)
    assert warm["ratio"]["median"] == pytest.approx(0.5) and warm["ratio"]["n"] == 2  # paired repetitions
    assert rows[("warm", "runc", "server_ms p95")]["ratio"]["median"] == pytest.approx(0.5)
    assert rows[("calls", "runc", "host_side.gate_cached_lookup_ms")]["ratio"]["n"] == 1  # pairs only
    speedup = rows[("warm", "runc", "speedup")]  # combined across sections: the ratio of the medians
    assert speedup["ratio"] == {"n": 0} and speedup["ratio_of_medians"] == pytest.approx(1.0)
    assert compare_figures({}, {}) == []

    text = render_compare(data)
    assert "# agentnode-sandbox benchmarks: base vs candidate" in text
    assert "**base**: HEAD (`abc`)" in text and "**candidate**: the working tree (`abc+dirty`)" in text
    assert "| `server_ms` | runc | 13.0 ±0% | 6.50 ±0% | 0.50x ±0% |" in text
    assert "| `host_side.gate_cached_lookup_ms` | runc | 0.19 ±0% | 0.10 | 0.50x |" in text  # one pair
    assert "| warm run p50 (server side) | runc | <= 6 ms | 13.0 ms ±0% | **missed** | 6.50 ms ±0% " \
        "| **missed** | 0.50x |" in text
    assert "| the gate's own share of a tool call (host-timed gate call - worker round trip) | runc " \
        "| <= 0.1 ms | 0.12 ms ±0% | **missed** | 0.03 ms | **met** |" in text
    assert "calls 2/2 runc [candidate]: RuntimeError: x" in text
    assert text == render_compare(json.loads(json.dumps(data)))


def test_a_revision_that_cannot_start_is_a_recorded_error_not_a_crash(tmp_path: Path) -> None:
    """--compare's worker imports host from its revision's tree only (the editable install of this
    checkout must not fill in what the revision lacks); a revision that cannot start says why."""
    tree = tmp_path / "tree"
    (tree / "host").mkdir(parents=True)
    (tree / "host" / "__init__.py").write_text("raise ImportError('this revision is broken')\n")
    (tree / "sandbox_wrapper").mkdir()
    (tree / "sandbox_wrapper" / "__init__.py").write_text("")
    root = _compare._overlay(tmp_path / "root", tree)
    assert (root / "host").resolve() == tree / "host" and (root / "bench").resolve() == REPO / "bench"
    assert (root / "sitecustomize.py").read_text() == (tree / "sitecustomize.py").read_text()
    worker = _compare.Worker("base", "broken", "abc", root, tree, SMOKE)
    with pytest.raises(RuntimeError, match="could not start: ImportError: this revision is broken"):
        worker.start()
    assert worker.proc is None

    # the overlay's sitecustomize: `host.<module>` missing from the revision is not found elsewhere
    (tree / "host" / "__init__.py").write_text("")
    probe = subprocess.run(
        [sys.executable, "-c",
         "import host, importlib.util; print(host.__file__, importlib.util.find_spec('host.core'))"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, check=True,
    )
    assert probe.stdout.split() == [str(root / "host" / "__init__.py"), "None"]
