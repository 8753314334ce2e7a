"""Hostile sequential orchestration agents (format §5.5): pipelines the host runs on a thread of its own.

A sequential agent runs no code, but its manifest is pack-authored: which packages its steps call, how
results are mapped into later steps, its step names. Each run here is a community (unverified) agent
through the real SandboxHost; what reached the tools is read from the tools' own call log, what the host
held from its RSS, and the audit log is searched for the step names, inputs and tool output the runs
carried (they must appear in the runs' results: the control).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from host.runtime.backends.sequential import MAX_KEPT_RESULTS_BYTES
from host.runtime.runner import RunResult, SandboxHost
from host.tools.calls import MAX_ARGUMENTS_BYTES
from tests.hostile.conftest import TOOLPACK, Lab, Ledger, brief, rss_bytes
from tests.support.cli import cli

pytestmark = pytest.mark.docker

SEQ_TOOLS = "hx-seq-tools"
MARK = uuid.uuid4().hex[:10]
STEP_MARK = f"hxstep{MARK}"
"""In every step name: never in the audit."""
INPUT_MARK = f"hxinput{MARK}"
OUTPUT_MARK = f"hxoutput{MARK}"
RAW = {"\x1b": "ESC", "\x07": "BEL", "\x9b": "8-bit CSI", "\u202e": "RLO"}
HOSTILE_NAME = f"{STEP_MARK}\x1b]0;pwned\x07\x1b[2K\rok: done\x9b31m\u202etxt"
HOSTILE_NAME_SHOWN = f"{STEP_MARK}\\x1b]0;pwned\\x07\\x1b[2K\\rok: done\\x9b31m\\u202etxt"
BLOB = 900_000
"""Characters of one big step result: under the 1 MiB result cap."""

SEQ_TOOLS_SOURCE = '''
"""hx-seq-tools: big results for pipelines to map around, and a sink that logs what it received."""
import json

LOG = __LOG__


def _note(tool, **extra):
    with open(LOG, "a") as fh:
        fh.write(json.dumps({"tool": tool, **extra}) + "\\n")


def big(n=900000, tag="", **kwargs):
    _note("big")
    return {"tag": tag, "note": __OUTPUT__, "blob": "x" * int(n)}


def sink(**kwargs):
    _note("sink", keys=len(kwargs), size=len(json.dumps(kwargs)))
    return {"keys": len(kwargs)}
'''


def install_seq_tools(lab: Lab) -> Path:
    """A trusted tool pack (the host worker) that makes big results and logs what reaches it."""
    log = lab.root / "seq-tools.jsonl"
    log.touch()
    pack = lab.root / "seq-packs" / SEQ_TOOLS
    pack.mkdir(parents=True)
    source = SEQ_TOOLS_SOURCE.replace("__LOG__", repr(str(log))).replace("__OUTPUT__", repr(OUTPUT_MARK))
    (pack / "hx_seq_tools.py").write_text(source)
    manifest = {
        "package_id": SEQ_TOOLS, "version": "1.0.0", "package_type": "toolpack", "entrypoint": "hx_seq_tools",
        "capabilities": {"tools": [{"name": n, "entrypoint": f"hx_seq_tools:{n}"} for n in ("big", "sink")]},
    }  # fmt: skip
    (pack / "agentnode.yaml").write_text(json.dumps(manifest))
    lab.state.install(pack, trust="trusted")
    return log


def pipeline(lab: Lab, slug: str, steps: list[dict[str, Any]], allowed: list[str] | None) -> str:
    """Install a community sequential agent (JSON is YAML); `allowed` None leaves the allowlist out."""
    agent: dict[str, Any] = {
        "goal": "a hostile pipeline",
        "orchestration": {"mode": "sequential", "steps": steps},
        "limits": {"max_runtime_seconds": 60},
    }
    if allowed is not None:
        agent["tool_access"] = {"allowed_packages": allowed}
    manifest = {"package_id": slug, "version": "1.0.0", "package_type": "agent", "agent": agent}
    pack = lab.root / "seq-packs" / slug
    pack.mkdir(parents=True)
    (pack / "agentnode.yaml").write_text(json.dumps(manifest))
    entry = lab.state.install(pack)
    if entry.sandbox_volume:
        lab.volumes.add(entry.sandbox_volume)
    return slug


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def step(name: str, tool: str, **mapping: Any) -> dict[str, Any]:
    return {"name": f"{STEP_MARK}-{name}", "tool": tool, "input_mapping": mapping}


def end_record(lab: Lab, result: RunResult) -> dict[str, Any]:
    (record,) = [r for r in lab.audit() if r["run_id"] == result.run_id]
    return record


OFF_ALLOWLIST = {
    "not-in-manifest": ([SEQ_TOOLS], f"{TOOLPACK}:echo", "TOOL_NOT_ALLOWED"),
    "empty-allowlist": ([], f"{TOOLPACK}:echo", "TOOL_NOT_ALLOWED"),
    "traversing-slug": ([SEQ_TOOLS, TOOLPACK], f"../{TOOLPACK}:echo", "INVALID_REQUEST"),
    "uninstalled": ([SEQ_TOOLS, "hx-nowhere"], "hx-nowhere:run", "TOOL_NOT_FOUND"),
    "host-ceiling": ([SEQ_TOOLS, TOOLPACK], f"{TOOLPACK}:echo", "TOOL_NOT_ALLOWED"),
}
"""(manifest allowlist, the hostile step's tool, the refusal); the host ceiling allows only SEQ_TOOLS."""


def test_hostile_pipelines_are_refused_and_bounded(make_lab: Any, ledger: Ledger) -> None:
    lab = make_lab("runc")
    log = install_seq_tools(lab)
    runs: list[RunResult] = []

    def run(slug: str, host: SandboxHost, **kwargs: Any) -> tuple[RunResult, float, int]:
        """One run; its seconds and the host's peak RSS growth while it ran (sampled every 5 ms)."""
        rss, started, peak, done = rss_bytes(), time.monotonic(), [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_bytes())
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            result = lab.run(slug, host=host, kwargs={"text": INPUT_MARK, **kwargs})
        finally:
            done.set()
            sampler.join()
        runs.append(result)
        return result, round(time.monotonic() - started, 2), max(peak[0], rss_bytes()) - rss

    host = lab.host()
    # The control for the audit row: a pipeline that works returns its input and its tool's output.
    slug = pipeline(lab, "hx-seq-ok", [step("ok", f"{SEQ_TOOLS}:big", n=10, tag="$input.text")], [SEQ_TOOLS])
    control, _, _ = run(slug, host)
    assert control.success, (control.error_code, control.error)
    # Off the allowlist: a first step that works, then the hostile one; the run must stop there.
    refusals: dict[str, tuple[RunResult, int]] = {}
    for variant, (allowed, tool, _) in OFF_ALLOWLIST.items():
        if variant == "host-ceiling":
            lab.configure(tools={"allowed_packages": [SEQ_TOOLS]})
            host = lab.host()  # reads the ceiling
        steps = [step("first", f"{SEQ_TOOLS}:big", n=10, tag="$input.text"), step("hostile", tool, x=1)]
        slug = pipeline(lab, f"hx-seq-{variant}", steps, allowed)
        spy_before = len(lab.tool_calls())
        result, _, _ = run(slug, host)
        refusals[variant] = (result, len(lab.tool_calls()) - spy_before)
    for variant, (_, tool, reason) in OFF_ALLOWLIST.items():
        result, reached = refusals[variant]
        record = end_record(lab, result)
        steps = (result.result or {}).get("steps_completed", [])
        first_runs = bool(OFF_ALLOWLIST[variant][0])  # with an empty allowlist the first step is refused too
        expected_steps = [True, False] if first_runs else [False]
        ledger.attack(
            f"caps.sequential.off_allowlist.{variant}",
            expected=f"a pipeline step calling {tool!r} (manifest allowlist {OFF_ALLOWLIST[variant][0]}"
            + (", host ceiling [hx-seq-tools]" if variant == "host-ceiling" else "")
            + f") fails as {reason} before any tool runs: the run ends step_failed at that step (the first "
            "step, allowed, has run unless the allowlist is empty), the spy tool pack logs no call, the "
            "audit counts the one refusal",
            observed=brief({"code": result.error_code, "error": result.error, "steps": len(steps),
                            "spy_calls": reached, "audit": [record["tool_calls"], record["tool_refusals"]]}),
            ok=not result.success
            and result.error_code == "step_failed"
            and f"failed: {reason}:" in result.error
            and [s.get("success") for s in steps] == expected_steps
            and reached == 0
            and (record["tool_calls"], record["tool_refusals"]) == (int(first_runs), 1),
        )  # fmt: skip

    # The host's call ceiling binds a community pipeline: 5 steps, a ceiling of 2.
    lab.configure(limits={"max_tool_calls": 2})
    ceiling_host = lab.host()
    slug = pipeline(
        lab, "hx-seq-calls", [step(f"s{i}", f"{SEQ_TOOLS}:big", n=1) for i in range(5)], [SEQ_TOOLS]
    )
    before = len(calls(log))
    capped, _, _ = run(slug, ceiling_host)
    made = len(calls(log)) - before
    record = end_record(lab, capped)
    ledger.attack(
        "caps.sequential.host_call_ceiling",
        expected="a 5-step pipeline under the host's limits.max_tool_calls 2: the third step fails as "
        "TOOL_CALL_LIMIT, exactly 2 calls reach the tool (its own log), the audit counts 2",
        observed=brief(
            {
                "code": capped.error_code,
                "error": capped.error,
                "tool_log_calls": made,
                "audit_calls": record["tool_calls"],
            }
        ),
        ok=not capped.success
        and "failed: TOOL_CALL_LIMIT:" in capped.error
        and made == 2
        and record["tool_calls"] == 2,
    )
    lab.configure(limits={})
    host = lab.host()

    # $steps amplification: one ~0.9 MB result mapped into 2000 arguments of the next step.
    fan = {f"k{i}": f"$steps.{STEP_MARK}-big" for i in range(2000)}
    steps = [step("big", f"{SEQ_TOOLS}:big", n=BLOB), step("sink", f"{SEQ_TOOLS}:sink", **fan)]
    slug = pipeline(lab, "hx-seq-amplify", steps, [SEQ_TOOLS])
    before = len(calls(log))
    amplified, seconds, rss = run(slug, host)
    sunk = [c for c in calls(log)[before:] if c["tool"] == "sink"]
    ledger.attack(
        "cost.sequential.argument_amplification",
        expected=f"a ~0.9 MB step result mapped into 2000 arguments of the next step (~1.8 GB as JSON) is "
        f"refused as TOO_LARGE (> {MAX_ARGUMENTS_BYTES} bytes) before it is serialized: the sink tool never "
        "runs, the run ends in < 10 s, the host's peak RSS grows < 64 MiB",
        observed=brief(
            {
                "code": amplified.error_code,
                "error": amplified.error,
                "seconds": seconds,
                "peak_rss_growth_mib": round(rss / 2**20, 1),
                "sink_calls": len(sunk),
            }
        ),
        ok=not amplified.success
        and f"failed: TOO_LARGE: arguments_json exceeds {MAX_ARGUMENTS_BYTES} bytes" in amplified.error
        and not sunk
        and seconds < 10
        and rss < 64 << 20,
    )

    # Kept results: 20 big results that a last step maps, past the 16 MiB the pipeline keeps.
    many = [step(f"b{i}", f"{SEQ_TOOLS}:big", n=BLOB) for i in range(20)]
    last = step("sink", f"{SEQ_TOOLS}:sink", **{f"k{i}": f"$steps.{STEP_MARK}-b{i}" for i in range(20)})
    slug = pipeline(lab, "hx-seq-keep", [*many, last], [SEQ_TOOLS])
    before = len(calls(log))
    kept, seconds, rss = run(slug, host)
    ran = [c["tool"] for c in calls(log)[before:]]
    limit = MAX_KEPT_RESULTS_BYTES // (BLOB + 30) + 1  # the step whose result passes the bound
    ledger.attack(
        "cost.sequential.kept_results_bound",
        expected=f"20 results of ~0.9 MB that a last step maps: the step whose result passes the "
        f"{MAX_KEPT_RESULTS_BYTES >> 20} MiB the pipeline keeps fails (step {limit}), no later step runs, "
        "the host's peak RSS grows < 128 MiB",
        observed=brief(
            {
                "code": kept.error_code,
                "error": kept.error,
                "tools_run": len(ran),
                "sink": ran.count("sink"),
                "peak_rss_growth_mib": round(rss / 2**20, 1),
            }
        ),
        ok=not kept.success
        and f"exceed {MAX_KEPT_RESULTS_BYTES} bytes" in kept.error
        and ran == ["big"] * limit
        and rss < 128 << 20,
    )

    # Nothing a pipeline carried reaches the audit; it does reach the runs' results (the control).
    audit_text = (lab.state.dir / "audit.jsonl").read_text()
    results_text = json.dumps([[r.error, r.result] for r in runs], default=str)
    marks = {m: [m in results_text, m in audit_text] for m in (STEP_MARK, INPUT_MARK, OUTPUT_MARK)}
    ledger.attack(
        "secrets.sequential.audit_sanitized",
        expected="step names, the run's input and tool output (markers each) appear in the pipelines' "
        f"results and errors ({len(runs)} runs) but nowhere in the audit log",
        observed=brief({"marker: [in results, in audit]": marks, "audit_records": len(lab.audit())}),
        ok=all(seen == [True, False] for seen in marks.values()) and len(lab.audit()) == len(runs),
    )


def test_a_hostile_step_name_is_escaped_in_run_output(make_lab: Any, ledger: Ledger) -> None:
    lab = make_lab("runc")
    install_seq_tools(lab)
    steps = [{"name": HOSTILE_NAME, "tool": f"{TOOLPACK}:echo", "input_mapping": {}}]
    slug = pipeline(lab, "hx-seq-term", steps, [SEQ_TOOLS])
    env = {**lab.state.env, "LANG": "C.UTF-8"}
    for key in ("DOCKER_HOST", "DOCKER_CONFIG"):
        if key in os.environ:
            env[key] = os.environ[key]
    proc = cli(env, "run", slug, timeout=120)
    seen = proc.stdout + proc.stderr
    raw = [name for ch, name in RAW.items() if ch in seen]
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("WARNING ")]
    ledger.attack(
        "terminal.sequential_step_name.human",
        expected="`run` of a pipeline whose failing step's name holds OSC/CSI/CR/C1/bidi and a fake `ok:` "
        "exits 1 with one `error:` line naming the step escaped (\\x1b, \\r, \\x9b, \\u202e), nothing raw",
        observed=f"exit {proc.returncode}; raw: {raw or 'none'}; lines {len(lines)}; "
        f"stderr {brief(ascii(proc.stderr), 240)}",
        ok=proc.returncode == 1
        and not raw
        and bool(lines)
        and lines[0].startswith("error: Step '")
        and HOSTILE_NAME_SHOWN in lines[0]
        and not any(line.startswith("ok:") for line in lines),
    )
