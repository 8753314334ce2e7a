"""Cap attacks: racing the tool and LLM caps with threads, smuggling run control through tool arguments."""

from __future__ import annotations

import pytest

from tests.hostile.conftest import STUBS, Lab, Ledger, brief
from tests.support.fake_llm import Behaviour

pytestmark = pytest.mark.docker

RACER = (
    STUBS
    + r"""
import threading
from collections import Counter

def run(context, threads=32, **kwargs):
    seen = {"tool": Counter(), "llm": Counter(), "raw_tool": Counter()}
    lock = threading.Lock()
    gate = threading.Barrier(3 * threads)

    def note(kind, key):
        with lock:
            seen[kind][key] += 1

    def via_context_tool():
        gate.wait()
        try:
            r = context.run_tool("hostile-tools", "count")
            note("tool", "ok" if r.success else "failed")
        except Exception as exc:
            note("tool", type(exc).__name__)

    def via_context_llm():
        gate.wait()
        try:
            context.call_llm("hi")
            note("llm", "ok")
        except Exception as exc:
            note("llm", type(exc).__name__ + ":" + getattr(exc, "reason", ""))

    def via_own_channel():
        stub = tools_pb2_grpc.ToolServiceStub(channel())  # a separate connection per thread
        gate.wait()
        r = status(tool(stub, "{}"))
        note("raw_tool", "ok" if r["ok"] else r["code"] + "/" + r["reason"])

    workers = [threading.Thread(target=f) for f in (via_context_tool, via_context_llm, via_own_channel)
               for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {k: dict(v) for k, v in seen.items()}
"""
)

SMUGGLER = (
    STUBS
    + r"""
import time

SMUGGLED = {"timeout": 9999, "mode": "host", "deadline": 0, "root": "/", "entrypoint": "os:system",
            "package_slug": "word-tools", "tool_name": "boom", "arguments_json": "{}", "max_tool_calls": 1000,
            "trust": "curated", "cwd": "/", "env": {"OPENAI_API_KEY": "x"}, "run_id": "other"}

def run(context, **kwargs):
    stub = tools_pb2_grpc.ToolServiceStub(channel())
    r = stub.RunTool(tools_pb2.RunToolRequest(package_slug="hostile-tools", tool_name="echo",
                                              arguments_json=json.dumps(SMUGGLED)), timeout=30)
    kwargs = json.loads(r.result_json)["kwargs"] if r.success else None
    out = {"echo": {"success": r.success, "kwargs": kwargs,
                    "mode_used": r.mode_used, "tools_remaining": r.tools_remaining}}
    started = time.monotonic()
    nap = context.run_tool("hostile-tools", "nap", seconds=30, timeout=9999, deadline=9999)
    out["nap"] = {"success": nap.success, "error": nap.error, "elapsed": round(time.monotonic() - started, 1)}
    out["after"] = context.run_tool("hostile-tools", "count").success
    out["smuggled"] = SMUGGLED
    return out
"""
)


def test_concurrency_cannot_exceed_caps(lab: Lab, ledger: Ledger) -> None:
    lab.llm.default = Behaviour(text="ok", delay=0.3)  # slow provider: a wide window for a race
    lab.agent("racer", RACER, max_tool_calls=4, llm_calls=3, max_runtime_seconds=120)
    result = lab.run("racer")
    assert result.success, (result.error_code, result.error, result.logs[-3000:])
    seen = result.result
    record = lab.audit()[-1]
    tools_ran = len(lab.tool_calls("count"))
    agent_ok = seen["tool"].get("ok", 0) + seen["raw_tool"].get("ok", 0)
    ledger.attack(
        "caps.tool_calls_race",
        expected="64 concurrent tool calls (32 via context, 32 own channels), cap 4: 4 reach the tool",
        observed=brief(
            {
                "host_tool_invocations": tools_ran,
                "audit_tool_calls": record["tool_calls"],
                "agent_saw": {"context": seen["tool"], "own_channels": seen["raw_tool"]},
            }
        ),
        ok=tools_ran == 4 and record["tool_calls"] == 4 and agent_ok == 4,
    )
    llm = record["llm"] or {}
    ledger.attack(
        "caps.llm_calls_race",
        expected="32 concurrent LLM calls vs cap 3: exactly 3 reach the provider, the rest are refused",
        observed=brief(
            {
                "provider_requests": len(lab.llm.requests),
                "audit_llm_calls": llm.get("calls"),
                "agent_saw": seen["llm"],
            }
        ),
        ok=len(lab.llm.requests) == 3
        and llm.get("calls") == 3
        and seen["llm"].get("ok") == 3
        and sum(seen["llm"].values()) == 32,
    )


def test_run_control_cannot_be_smuggled(lab: Lab, ledger: Ledger, short_tool_timeout: float) -> None:
    lab.agent("smuggler", SMUGGLER, max_tool_calls=5)
    result = lab.run("smuggler")
    assert result.success, (result.error_code, result.error, result.logs[-3000:])
    out = result.result
    echo = out["echo"]
    host_seen = lab.tool_calls("echo")
    ledger.attack(
        "smuggle.envelope_keys_in_arguments",
        expected="timeout/mode/deadline/root/entrypoint/slug/... reach the echo tool only as its own kwargs",
        observed=brief(
            {
                "tool_got_keys": host_seen[0]["keys"] if host_seen else None,
                "mode_used": echo["mode_used"],
                "tools_remaining": echo["tools_remaining"],
                "other_tools_ran": sorted({c["tool"] for c in lab.tool_calls()} - {"echo", "nap", "count"}),
            }
        ),
        ok=echo["success"]
        and echo["kwargs"] == out["smuggled"]
        and len(host_seen) == 1
        and host_seen[0]["keys"] == sorted(out["smuggled"])
        and echo["mode_used"] == "host_worker"
        and echo["tools_remaining"] == 4
        and not lab.tool_calls("boom"),
    )
    nap = out["nap"]
    ledger.attack(
        "smuggle.timeout_argument",
        expected=f"nap(seconds=30, timeout=9999) still times out at the host's {short_tool_timeout:.0f} s",
        observed=brief(nap),
        ok=not nap["success"]
        and "timed out" in (nap["error"] or "")
        and nap["elapsed"] < short_tool_timeout + 4
        and out["after"] is True,
    )
