"""Model-driven tool calling through a real sandboxed agent, the real openai/anthropic SDKs in the host and
the local fake provider (issue 15, host side).

The agent speaks the wire contract with the generated stubs (sandbox_wrapper.protocol), as any client of it
may: ListTools, CallLlm or StreamLlm with tools, RunTool through the gate for each call the model makes, a
`tool` message with each result, and again until the model answers with text. The tests check what the
agent saw, what the provider received (the host's tool definitions, under provider-safe names, with the
key) and what the audit counted, and that the key, the host model and provider error bodies never reach
the agent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from host.audit.verify import verify_audit
from host.runtime.runner import RunResult
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer, FakeToolCall
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

CANARY = "sk-canary-tools-9e4f1b27c3"
HOST_MODEL = "host-model-tools-secret-51a8"
REVERSE = "word-tools:reverse_words"
AGENT_TEXT = "AGENT-AUTHORED-DESCRIPTION-6d2e"
GOAL = "alpha beta gamma"

AGENT = """
import json, os
import grpc
from sandbox_wrapper.protocol import llm_pb2, llm_pb2_grpc, tools_pb2, tools_pb2_grpc


def refusal(err):
    reason = next((v for k, v in err.trailing_metadata() or () if k == "agentnode-reason"), "")
    return {"status": err.code().name, "reason": reason, "details": err.details() or ""}


def stream(llm, request):
    text, deltas, final = [], [], None
    # StreamLlmRequest has CallLlmRequest's fields under the same numbers.
    for chunk in llm.StreamLlm(llm_pb2.StreamLlmRequest.FromString(request.SerializeToString())):
        text.append(chunk.delta)
        deltas += [[d.index, d.id, d.name, d.arguments_delta] for d in chunk.tool_call_deltas]
        if chunk.done:
            final = chunk
    return "".join(text), final.finish_reason, list(final.tool_calls), deltas


def run(context, plan=None, **kwargs):
    plan = plan or {}
    seen = {"rounds": [], "tool_runs": [], "errors": [], "forced_runs": []}
    socket_path = os.environ.get("AGENTNODE_SOCKET", "/run/agentnode/sandbox.sock")
    with grpc.insecure_channel("unix:" + socket_path) as ch:
        llm, tools = llm_pb2_grpc.LlmServiceStub(ch), tools_pb2_grpc.ToolServiceStub(ch)
        listed = llm.ListTools(llm_pb2.ListToolsRequest()).tools
        seen["listed"] = [[t.name, t.description, t.parameters_json] for t in listed]
        # Offer what ListTools gave, with our own text in it: the host must send its own copy instead.
        offered = [llm_pb2.ToolDefinition(name=t.name, description=plan.get("description", t.description),
                                          parameters_json=t.parameters_json) for t in listed]
        offered += [llm_pb2.ToolDefinition(name=n) for n in plan.get("extra_tools", [])]
        messages = [llm_pb2.ChatMessage(role="user", content=context.goal)]
        fmt = plan.get("response_format")
        for _ in range(plan.get("rounds", 4)):
            request = llm_pb2.CallLlmRequest(messages=messages, tools=offered)
            if fmt:
                request.response_format.CopyFrom(llm_pb2.ResponseFormat(**fmt))
            try:
                if plan.get("stream"):
                    content, finish, calls, deltas = stream(llm, request)
                else:
                    answer = llm.CallLlm(request)
                    content, finish, deltas = answer.content, answer.finish_reason, []
                    calls = list(answer.tool_calls)
            except grpc.RpcError as err:
                seen["errors"].append(refusal(err))
                break
            seen["rounds"].append({
                "content": content, "finish": llm_pb2.FinishReason.Name(finish), "deltas": deltas,
                "calls": [[c.id, c.name, c.arguments_json, c.refused] for c in calls]})
            if not calls:
                break
            messages.append(llm_pb2.ChatMessage(role="assistant", content=content, tool_calls=calls))
            for call in calls:
                slug, _, tool = call.name.partition(":")
                if call.refused:
                    result = "refused: no such tool"
                    if plan.get("run_refused"):  # a disobedient agent: the gate still decides
                        try:
                            tools.RunTool(tools_pb2.RunToolRequest(
                                package_slug=slug, tool_name=tool, arguments_json=call.arguments_json))
                            seen["forced_runs"].append("ran")
                        except grpc.RpcError as err:
                            seen["forced_runs"].append(refusal(err))
                else:
                    out = tools.RunTool(tools_pb2.RunToolRequest(
                        package_slug=slug, tool_name=tool, arguments_json=call.arguments_json))
                    result = out.result_json if out.success else "error: " + out.error
                    seen["tool_runs"].append([call.name, out.success, result])
                messages.append(llm_pb2.ChatMessage(role="tool", tool_call_id=call.id, content=result))
    return seen
"""

SECRET_TOOLS = """
def peek(**kwargs):
    return {"secret": "ran"}
"""


@dataclass
class Bench:
    """One test's host, fake provider, agent factory and log capture."""

    state: HostState
    fake: FakeLlmServer
    make_agent: Callable[..., Path]
    tmp: Path
    log: pytest.LogCaptureFixture


@pytest.fixture
def bench(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[Bench]:
    caplog.set_level(logging.DEBUG)  # everything the host logs, SDKs included, is checked for leaks
    with FakeLlmServer() as srv:
        yield Bench(host_state, srv, make_agent, tmp_path, caplog)


def _setup(b: Bench, provider: str) -> None:
    """The provider binding (canary key, host model), word-tools and an installed tool pack that is not on
    the agent's allowlist (secret-tools), and the agent."""
    if provider == "openai":
        b.state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=b.fake.base_url_openai)
    else:
        b.state.env.update(ANTHROPIC_API_KEY=CANARY, ANTHROPIC_BASE_URL=b.fake.base_url_anthropic)
    b.state.write_config({"llm": {"provider": provider, "model": HOST_MODEL}})
    b.state.install(REPO / "examples" / "word-tools", trust="trusted")
    secret = b.tmp / "toolpacks" / "secret-tools"
    secret.mkdir(parents=True)
    (secret / "secret_tools.py").write_text(SECRET_TOOLS)
    (secret / "agentnode.yaml").write_text(
        'package_id: secret-tools\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: secret_tools\n'
        "capabilities:\n  tools:\n    - name: peek\n      entrypoint: secret_tools:peek\n"
    )
    b.state.install(secret, trust="trusted")
    extra = "tool_access:\n  allowed_packages: [word-tools]\nllm_access:\n  enabled: true\n"
    b.state.install(b.make_agent("looper", AGENT, extra=extra))


def _run(b: Bench, plan: dict[str, Any], runtime: str | None = None) -> tuple[RunResult, dict[str, Any]]:
    host = b.state.host()
    try:
        result = host.run("looper", goal=GOAL, kwargs={"plan": plan}, runtime=runtime)
    finally:
        host.close()
    assert result.success, (result.error_code, result.error, result.logs)
    return result, dict(result.result)


def _record(b: Bench, result: RunResult) -> dict[str, Any]:
    audit = b.state.audit()
    assert len(audit) == 1 and audit[0]["run_id"] == result.run_id
    assert verify_audit(b.state.dir / "audit.jsonl").ok
    return audit[0]


def _assert_no_leak(b: Bench, result: RunResult) -> None:
    """The key, the host model and provider error bodies reach neither the agent, its result, its logs, the
    host's logs nor the audit; nothing the agent or the model wrote reaches the audit."""
    visible = json.dumps(result.to_json()) + result.logs
    audit_text = (b.state.dir / "audit.jsonl").read_text()
    for secret in (CANARY, SECRET_IN_ERROR_BODY):
        assert secret not in visible and secret not in audit_text and secret not in b.log.text
    assert HOST_MODEL not in visible and b.fake.base_url not in visible
    for authored in (GOAL, AGENT_TEXT, "reverse_words", "peek"):
        assert authored not in audit_text


def _sent_tools(provider: str, body: dict[str, Any]) -> list[tuple[str, str, Any]]:
    if provider == "openai":
        return [(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"])
                for t in body.get("tools", [])]  # fmt: skip
    return [(t["name"], t.get("description", ""), t["input_schema"]) for t in body.get("tools", [])]


WORD_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
PROVIDERS = ["openai", "anthropic"]
STREAMING = pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])


@STREAMING
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_model_driven_tool_loop_in_a_real_sandbox(
    bench: Bench, runtime: str, provider: str, streaming: bool
) -> None:
    bench.fake.default = Behaviour(
        text="the words, reversed", tool_calls=(FakeToolCall(REVERSE, {"text": GOAL}),), echo_results=True
    )
    _setup(bench, provider)
    result, seen = _run(bench, {"stream": streaming, "description": AGENT_TEXT}, runtime)

    # ListTools: the allowlist's tools as the manifest declares them; nothing of secret-tools.
    assert [name for name, _, _ in seen["listed"]] == ["word-tools:count_words", REVERSE]
    assert json.loads(seen["listed"][1][2]) == WORD_SCHEMA
    assert seen["listed"][1][1] == "Reverse the order of the words of a text."
    # Round 1: the model calls the tool and the agent runs it through the gate; round 2: the answer.
    first, second = seen["rounds"]
    assert first["finish"] == "FINISH_REASON_TOOL_CALLS"
    [[call_id, name, arguments, refused]] = first["calls"]
    assert (name, json.loads(arguments), refused) == (REVERSE, {"text": GOAL}, False)
    assert seen["tool_runs"] == [[REVERSE, True, json.dumps({"text": "gamma beta alpha"})]]
    assert second == {
        "content": 'the words, reversed: {"text": "gamma beta alpha"}',
        "finish": "FINISH_REASON_STOP",
        "deltas": [],
        "calls": [],
    }
    if streaming:
        assert first["deltas"][0][:3] == [0, call_id, REVERSE]
        assert json.loads("".join(d[3] for d in first["deltas"])) == {"text": GOAL}
    assert seen["errors"] == []

    # The provider got the host's definitions under provider-safe names, the result by call id, the key.
    assert bench.fake.problems == []
    assert len(bench.fake.requests) == 2
    for request in bench.fake.requests:
        assert request.body["model"] == HOST_MODEL
        assert CANARY in request.headers.get("authorization", "") + request.headers.get("x-api-key", "")
        sent = _sent_tools(provider, request.body)
        assert [n for n, _, _ in sent] == ["word-tools__count_words", "word-tools__reverse_words"]
        assert sent[1][1:] == ("Reverse the order of the words of a text.", WORD_SCHEMA)
        assert AGENT_TEXT not in json.dumps(request.body)
    last = json.dumps(bench.fake.requests[1].body)
    assert call_id in last and "gamma beta alpha" in last

    record = _record(bench, result)
    assert record["runtime"] == runtime and record["sandbox"] is True
    assert (record["tool_calls"], record["llm_tool_calls"], record["llm_tool_calls_refused"]) == (1, 1, 0)
    assert (record["llm"]["calls"], record["llm"]["ok"], record["llm"]["model"]) == (2, 2, HOST_MODEL)
    _assert_no_leak(bench, result)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_tool_outside_the_allowlist_is_refused_before_the_provider(bench: Bench, provider: str) -> None:
    _setup(bench, provider)
    # Installed but not allowlisted (by CallLlm); not installed at all (by StreamLlm).
    for extra, streaming in ((["secret-tools:peek"], False), (["evil-pack:rm"], True)):
        result, seen = _run(bench, {"extra_tools": extra, "stream": streaming})
        assert seen["rounds"] == [] and seen["tool_runs"] == []
        [error] = seen["errors"]
        assert (error["status"], error["reason"]) == ("PERMISSION_DENIED", "LLM_TOOL_NOT_ALLOWED")
        assert extra[0] not in error["details"]
        _assert_no_leak(bench, result)
    assert bench.fake.requests == []
    records = bench.state.audit()
    assert [r["llm"]["refused_tool"] for r in records] == [1, 1]
    assert all(r["llm"]["calls"] == 0 and r["tool_calls"] == 0 for r in records)


@STREAMING
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_model_call_of_an_undefined_tool_comes_back_refused_and_runs_nothing(
    bench: Bench, provider: str, streaming: bool
) -> None:
    calls = (FakeToolCall("secret-tools:peek", {}), FakeToolCall("rm_rf_everything", {"path": "/"}))
    bench.fake.default = Behaviour(text="ok then", tool_calls=calls, echo_results=True)
    _setup(bench, provider)
    result, seen = _run(bench, {"stream": streaming, "run_refused": True})
    first, second = seen["rounds"]
    assert [(c[1], c[3]) for c in first["calls"]] == [("secret-tools:peek", True), ("rm_rf_everything", True)]
    assert second["content"] == "ok then: refused: no such tool | refused: no such tool"
    assert seen["tool_runs"] == []
    # A disobedient agent runs them anyway: the gate refuses both (neither is on the allowlist).
    assert [r["reason"] for r in seen["forced_runs"]] == ["TOOL_NOT_ALLOWED", "TOOL_NOT_ALLOWED"]
    assert bench.fake.problems == []
    record = _record(bench, result)
    assert (record["llm_tool_calls"], record["llm_tool_calls_refused"]) == (2, 2)
    assert record["tool_calls"] == 0 and record["tool_refusals"] == 2
    _assert_no_leak(bench, result)


@STREAMING
@pytest.mark.parametrize("provider", PROVIDERS)
def test_json_output_and_provider_errors_in_a_tool_loop(bench: Bench, provider: str, streaming: bool) -> None:
    done = {"words": 3, "done": True}
    loop = Behaviour(tool_calls=(FakeToolCall(REVERSE, {"text": GOAL}),), json_value=done)
    bench.fake.script(loop, *[Behaviour(status=500)] * 3)  # the tool call, then a failure (3 attempts)
    _setup(bench, provider)
    schema = json.dumps({"type": "object", "properties": {"words": {"type": "integer"}}})
    fmt = {"type": "RESPONSE_FORMAT_TYPE_JSON_SCHEMA", "schema_name": "summary", "schema_json": schema}
    failed, seen = _run(bench, {"stream": streaming, "response_format": fmt})
    assert [e["reason"] for e in seen["errors"]] == ["LLM_UNAVAILABLE"]
    _assert_no_leak(bench, failed)
    bench.fake.default = loop
    result, seen = _run(bench, {"stream": streaming, "response_format": fmt})
    final = seen["rounds"][-1]
    assert json.loads(final["content"]) == done
    assert final["finish"] == "FINISH_REASON_STOP" and final["calls"] == []
    assert bench.fake.problems == []
    body = bench.fake.requests[-1].body
    if provider == "openai":
        assert body["response_format"]["json_schema"]["name"] == "summary"
    else:
        assert body["tool_choice"] == {"type": "any"}  # a tool call, or the answer through the response tool
    _assert_no_leak(bench, result)


CONTEXT_AGENT = """
import asyncio


async def run(context, stream=False, **kwargs):
    tools = context.allowed_tool_context()
    messages = [{"role": "user", "content": "reverse the goal's words"}]
    if stream:
        with context.stream_llm(messages, tool_context=tools) as s:
            text = "".join(s)
        first = s.result
    else:
        first = await context.acall_llm(messages, tool_context=tools)
    final = await context.arun_llm_tool_loop(messages, max_rounds=4)
    return {
        "specs": [spec["name"] for spec in tools.tool_specs],
        "first": {
            "finish": first.finish_reason,
            "calls": [[c["name"], c["arguments"]] for c in first.tool_calls],
        },
        "final": final.content,
        "tool_calls_made": context.tool_calls_made,
    }
"""


@STREAMING
@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_agent_context_drives_a_model_tool_loop(
    bench: Bench, runtime: str, provider: str, streaming: bool
) -> None:
    """AgentContext v1 as a published agent calls it (allowed_tool_context, call_llm with a tool context,
    run_llm_tool_loop), from an async entrypoint, through the real wrapper in a real sandbox."""
    bench.fake.default = Behaviour(
        text="the words, reversed", tool_calls=(FakeToolCall(REVERSE, {"text": GOAL}),), echo_results=True
    )
    _setup(bench, provider)
    extra = "tool_access:\n  allowed_packages: [word-tools]\nllm_access:\n  enabled: true\n"
    bench.state.install(bench.make_agent("ctx-looper", CONTEXT_AGENT, extra=extra))
    host = bench.state.host()
    try:
        result = host.run("ctx-looper", goal=GOAL, kwargs={"stream": streaming}, runtime=runtime)
    finally:
        host.close()
    assert result.success, (result.error_code, result.error, result.logs)
    out = result.result
    assert out["specs"] == ["word-tools:count_words", REVERSE]
    assert out["first"]["finish"] == "tool_calls"
    [[name, arguments]] = out["first"]["calls"]
    assert (name, json.loads(arguments)) == (REVERSE, {"text": GOAL})
    assert out["final"] == 'the words, reversed: {"text": "gamma beta alpha"}'
    assert out["tool_calls_made"] == 1  # the loop's one call went through the gate
    assert bench.fake.problems == []
    _assert_no_leak(bench, result)
