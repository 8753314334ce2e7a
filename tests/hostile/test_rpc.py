"""Protocol attacks: the agent opens its own gRPC channel (or a raw socket) to its socket and misbehaves."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from host.llm.broker import LlmBroker
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession, RunTask
from host.spec.config import LlmHostConfig
from host.spec.manifest.load import load_manifest
from host.spec.manifest.model import ToolpackManifest
from host.tools.calls import InstalledToolpack
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper.protocol import (
    llm_pb2,
    llm_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)
from tests.hostile.conftest import (
    CANARY,
    STUBS,
    TOOLPACK,
    Lab,
    Ledger,
    brief,
    write_toolpack,
)
from tests.support.fake_llm import FakeLlmServer

pytestmark = pytest.mark.docker

RPC_ATTACKER = (
    STUBS
    + r"""
def garbage(payload):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(PATH)
        s.sendall(payload)
    except OSError as exc:  # the garbage never reached the host: the probe broke
        s.close()
        return {"sent": False, "error": type(exc).__name__}
    try:
        got = s.recv(4096)
        return {"sent": True, "host_replied_bytes": len(got)}
    except OSError as exc:
        return {"sent": True, "error": type(exc).__name__}
    finally:
        s.close()

def run(context, **kwargs):
    ch = channel()
    tools = tools_pb2_grpc.ToolServiceStub(ch)  # type: ignore[no-untyped-call]
    session = session_pb2_grpc.SessionServiceStub(ch)  # type: ignore[no-untyped-call]
    out = {}
    out["oversized"] = status(tool(tools, json.dumps({"blob": "x" * (5 << 20)})))
    out["args_over_cap"] = status(tool(tools, json.dumps({"blob": "x" * (2 << 20)})))
    out["garbage"] = [garbage(os.urandom(65536)),
                      garbage(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(8192)),
                      garbage(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")]
    out["after_garbage"] = status(tool(tools, "{}"))
    raw = ch.unary_unary("/agentnode.sandbox.v1.ToolService/RunTool")
    out["malformed_protobuf"] = status(lambda: raw(b"\xff\xff\xff\xff\x0f\x0a\x80", timeout=10))
    unknown = ch.unary_unary("/agentnode.sandbox.v1.AdminService/Shutdown")
    out["unknown_method"] = status(lambda: unknown(b"", timeout=10))
    fetch = session_pb2.FetchTaskRequest(protocol_version=1)
    out["fetch_twice"] = status(lambda: session.FetchTask(fetch, timeout=10))
    out["bad_arguments"] = {name: status(tool(tools, text)) for name, text in (
        ("not_json", "{oops"), ("array", "[1, 2]"), ("nan", '{"a": NaN}'),
        ("deep", "[" * 100000 + "]" * 100000))}
    out["bad_slug"] = {slug: status(tool(tools, "{}", slug=slug)) for slug in (
        "../../etc", "", "word-tools", "HOSTILE-TOOLS")}
    flood = []
    def hammer():
        flood.append(status(lambda: session.FetchTask(fetch, timeout=60)))
    # 200 at once: far past the host's 64 calls in flight per run, and below the run's own pids ceiling
    # (256 tasks, threads included), which 300 crossed whenever a loaded host answered slowly.
    threads = [threading.Thread(target=hammer) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["flood"] = dict(Counter(f"{r.get('code')}/{r.get('reason')}" for r in flood))
    out["after_flood"] = status(tool(tools, "{}"))
    ch.close()
    return out
"""
)

REPORTER = (
    STUBS
    + r"""
def run(context, **kwargs):
    ch = channel()
    session = session_pb2_grpc.SessionServiceStub(ch)  # type: ignore[no-untyped-call]
    tools = tools_pb2_grpc.ToolServiceStub(ch)  # type: ignore[no-untyped-call]
    llm = llm_pb2_grpc.LlmServiceStub(ch)  # type: ignore[no-untyped-call]
    # The control: one tool call and one LLM call before the report reach the host (and are counted).
    context.run_tool("hostile-tools", "count")
    context.call_llm("hi")
    session.ReportResult(session_pb2.ReportResultRequest(value_json='"first"'))
    # Everything below races the host's teardown: the host may only refuse or be gone.
    print("after the report: calling", flush=True)
    seen = [status(lambda: session.ReportResult(session_pb2.ReportResultRequest(value_json='"second"'),
                                                timeout=5)),
            status(tool(tools, "{}")),
            status(lambda: llm.CallLlm(llm_pb2.CallLlmRequest(
                messages=[llm_pb2.ChatMessage(role="user", content="hi")]), timeout=5))]
    print("after the report:", json.dumps(seen), flush=True)
    return "third"
"""
)


def test_malformed_oversized_and_out_of_order_rpcs(lab: Lab, ledger: Ledger) -> None:
    lab.agent("rpc-attacker", RPC_ATTACKER, max_runtime_seconds=120)
    result = lab.run("rpc-attacker")
    assert result.success, (result.error_code, result.error, result.logs[-3000:])
    out = result.result
    counted = len(lab.tool_calls("count"))
    record = lab.audit()[-1]

    def refused(item: dict[str, Any], code: str, reason: str | None = None) -> bool:
        return not item["ok"] and item["code"] == code and (reason is None or item["reason"] == reason)

    ledger.attack(
        "rpc.oversized_request",
        expected="a 5 MiB request is refused RESOURCE_EXHAUSTED; no tool runs",
        observed=brief(out["oversized"]),
        ok=refused(out["oversized"], "RESOURCE_EXHAUSTED"),
    )
    ledger.attack(
        "rpc.arguments_over_cap",
        expected="2 MiB of arguments refused RESOURCE_EXHAUSTED/TOO_LARGE",
        observed=brief(out["args_over_cap"]),
        ok=refused(out["args_over_cap"], "RESOURCE_EXHAUSTED", "TOO_LARGE"),
    )
    ledger.attack(
        "rpc.garbage_bytes",
        expected="garbage sent on the raw socket (all 3 payloads delivered) is dropped; the host keeps "
        "serving",
        observed=brief({"garbage": out["garbage"], "next_call": out["after_garbage"]}),
        ok=all(g["sent"] for g in out["garbage"]) and out["after_garbage"]["ok"],
    )
    ledger.attack(
        "rpc.malformed_protobuf",
        expected="undecodable request bytes are refused INVALID_ARGUMENT/INVALID_REQUEST; no tool runs",
        observed=brief(out["malformed_protobuf"]),
        ok=refused(out["malformed_protobuf"], "INVALID_ARGUMENT", "INVALID_REQUEST"),
    )
    ledger.attack(
        "rpc.unknown_method",
        expected="an unknown service/method is UNIMPLEMENTED",
        observed=brief(out["unknown_method"]),
        ok=refused(out["unknown_method"], "UNIMPLEMENTED"),
    )
    ledger.attack(
        "rpc.fetch_task_twice",
        expected="a second FetchTask is FAILED_PRECONDITION/TASK_ALREADY_FETCHED",
        observed=brief(out["fetch_twice"]),
        ok=refused(out["fetch_twice"], "FAILED_PRECONDITION", "TASK_ALREADY_FETCHED"),
    )
    bad = out["bad_arguments"]
    ledger.attack(
        "rpc.bad_arguments_json",
        expected="invalid JSON, non-objects, NaN and 100k-deep nesting are INVALID_ARGUMENT/INVALID_REQUEST",
        observed=brief(bad),
        ok=all(refused(v, "INVALID_ARGUMENT", "INVALID_REQUEST") for v in bad.values()),
    )
    slugs = out["bad_slug"]
    ledger.attack(
        "rpc.foreign_or_bad_slug",
        expected="path-like, empty, unlisted or case-twisted package slugs are refused as invalid or not "
        "allowed (not merely failed)",
        observed=brief(slugs, limit=600),
        ok=all(
            refused(v, "INVALID_ARGUMENT", "INVALID_REQUEST")
            or refused(v, "PERMISSION_DENIED", "TOOL_NOT_ALLOWED")
            for v in slugs.values()
        ),
    )
    flood_ok = set(out["flood"]) <= {"FAILED_PRECONDITION/TASK_ALREADY_FETCHED", "RESOURCE_EXHAUSTED/"}
    ledger.attack(
        "rpc.concurrent_flood",
        expected="200 concurrent calls are refused (or shed); the host keeps serving afterwards",
        observed=brief({"flood": out["flood"], "next_call": out["after_flood"]}),
        ok=flood_ok and out["after_flood"]["ok"],
    )
    ledger.attack(
        "rpc.nothing_else_reached_tools",
        expected="only the 2 legitimate calls reached the host tool; audit counts 2",
        observed=brief({"tool_invocations": counted, "audit_tool_calls": record["tool_calls"]}),
        ok=counted == 2 and record["tool_calls"] == 2,
    )


def test_report_twice_then_call(lab: Lab, ledger: Ledger) -> None:
    lab.agent("reporter", REPORTER, llm_calls=3)
    result = lab.run("reporter")
    record = lab.audit()[-1]
    # Whether the agent got to send its calls after the report races the host's teardown; what is checked
    # is that nothing beyond the one tool and one LLM call made before the report reached the host (those
    # two prove the tool log and the provider count what arrives).
    ledger.attack(
        "rpc.report_twice_and_call_after",
        expected='the first report ("first") wins; later reports, tool and LLM calls reach nothing: the host '
        "saw only the one tool call and one LLM call made before the report",
        observed=brief(
            {
                "result": result.result,
                "code": result.error_code or "completed",
                "tool_invocations": len(lab.tool_calls()),
                "provider_requests": len(lab.llm.requests),
                "audit_reason": record["reason"],
                "audit_llm_calls": (record["llm"] or {}).get("calls"),
                "audit_tool_calls": record["tool_calls"],
                "agent_called_after_report": "after the report: calling" in result.logs,
            }
        ),
        ok=result.success
        and result.result == "first"
        and len(lab.tool_calls()) == 1
        and len(lab.llm.requests) == 1
        and record["reason"] == "agent_completed"
        and record["tool_calls"] == 1
        and (record["llm"] or {}).get("calls") == 1,
    )


# --- the session contract on a real server: calls before FetchTask and after ReportResult ----------------


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real run server on a real Unix socket with a real tool gate and LLM broker (no container)."""
    log = tmp_path / "tool-calls.jsonl"
    log.touch()
    pack = write_toolpack(tmp_path, log)
    manifest = load_manifest(pack)
    assert isinstance(manifest, ToolpackManifest)
    installed = InstalledToolpack(
        slug=TOOLPACK, version="1.0.0", trust="trusted", root=pack, manifest=manifest
    )
    llm = FakeLlmServer().start()
    runner = ToolRunner()
    broker = LlmBroker(LlmHostConfig(), {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": llm.base_url_openai})
    policy = RunPolicy(
        allowed_packages=(TOOLPACK,),
        max_tool_calls=5,
        max_runtime_seconds=60,
        max_iterations=5,
        llm=LlmPolicy(enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000),
        clamped=(),
    )
    gate = ToolGate(
        allowed_packages=policy.allowed_packages,
        max_tool_calls=5,
        lookup=lambda slug: installed if slug == TOOLPACK else None,
        runner=runner,
        deadline=time.monotonic() + 60,
    )
    task = RunTask(
        run_id="r1", entrypoint="agent:run", goal="g", kwargs_json="{}", policy=policy, system_prompt=""
    )
    session = RunSession(task=task, tools=gate, llm=broker.session(policy.llm))
    sock_dir = Path(tempfile.mkdtemp(prefix="anh-h-", dir="/tmp"))
    server = build_run_server(session, str(sock_dir / "s.sock"))
    server.start()
    channel = grpc.insecure_channel(f"unix:{sock_dir / 's.sock'}")
    try:
        yield {"channel": channel, "session": session, "log": log, "llm": llm}
    finally:
        channel.close()
        server.stop(grace=None).wait()
        runner.close()
        llm.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _calls(channel: grpc.Channel) -> dict[str, Callable[[], Any]]:
    session = session_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]
    tools = tools_pb2_grpc.ToolServiceStub(channel)  # type: ignore[no-untyped-call]
    llm = llm_pb2_grpc.LlmServiceStub(channel)  # type: ignore[no-untyped-call]
    chat = [llm_pb2.ChatMessage(role="user", content="hi")]
    return {
        "RunTool": lambda: tools.RunTool(
            tools_pb2.RunToolRequest(package_slug=TOOLPACK, tool_name="count", arguments_json="{}"),
            timeout=10,
        ),
        "CallLlm": lambda: llm.CallLlm(llm_pb2.CallLlmRequest(messages=chat), timeout=10),
        "StreamLlm": lambda: list(llm.StreamLlm(llm_pb2.StreamLlmRequest(messages=chat), timeout=10)),
        "ReportResult": lambda: session.ReportResult(
            session_pb2.ReportResultRequest(value_json='"sneaky"'), timeout=10
        ),
    }


def _reason(call: Callable[[], Any]) -> str:
    try:
        call()
    except grpc.RpcError as err:
        reason = next((v for k, v in (err.trailing_metadata() or ()) if k == "agentnode-reason"), "")
        return f"{err.code().name}/{reason}"
    return "ok"


def test_calls_before_fetch_and_after_report(harness: dict[str, Any], ledger: Ledger) -> None:
    channel, session, log, llm = harness["channel"], harness["session"], harness["log"], harness["llm"]
    stub = session_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]
    fetch = stub.FetchTask
    calls = _calls(channel)
    before = {name: _reason(call) for name, call in calls.items()}
    reached_before = {"tool_log": len(log.read_text().splitlines()), "provider": len(llm.requests)}
    fetch(session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION), timeout=10)
    # The control: between FetchTask and ReportResult the same calls work, and the tool log and the
    # provider count each of them; "nothing reached" before and after is measured by counters that count.
    control = {name: _reason(calls[name]) for name in ("RunTool", "CallLlm")}
    counted = {"tool_log": len(log.read_text().splitlines()), "provider": len(llm.requests)}
    control_ok = set(control.values()) == {"ok"} and counted == {"tool_log": 1, "provider": 1}
    ledger.attack(
        "rpc.call_before_fetch",
        expected="RunTool/CallLlm/StreamLlm/ReportResult before FetchTask: FAILED_PRECONDITION/"
        "TASK_NOT_FETCHED; nothing reaches tools or provider (after FetchTask one RunTool and one CallLlm "
        "do, and are counted)",
        observed=brief({**before, "reached": reached_before, "control": control, "control_counted": counted}),
        ok=set(before.values()) == {"FAILED_PRECONDITION/TASK_NOT_FETCHED"}
        and reached_before == {"tool_log": 0, "provider": 0}
        and control_ok,
    )
    stub.ReportResult(session_pb2.ReportResultRequest(value_json=json.dumps("first")), timeout=10)
    after = {name: _reason(call) for name, call in _calls(channel).items()}
    after["FetchTask"] = _reason(
        lambda: fetch(session_pb2.FetchTaskRequest(protocol_version=PROTOCOL_VERSION))
    )
    ledger.attack(
        "rpc.call_after_report",
        expected="every call after ReportResult: FAILED_PRECONDITION/RUN_FINISHED; the first result stays",
        observed=brief(
            {
                **after,
                "result": session.outcome.value_json if session.outcome else None,
                "tool_log": len(log.read_text().splitlines()),
                "provider": len(llm.requests),
            }
        ),
        ok=set(after.values()) == {"FAILED_PRECONDITION/RUN_FINISHED"}
        and session.outcome is not None
        and session.outcome.value_json == '"first"'
        and control_ok
        and len(log.read_text().splitlines()) == counted["tool_log"]
        and len(llm.requests) == counted["provider"],
    )
