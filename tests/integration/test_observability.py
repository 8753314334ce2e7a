"""A real sandboxed run's span tree (the SDK's in-memory exporter): the run, its stages, its tool and LLM
calls under it, back-dated and ordered, with host facts only (no prompt, argument or completion)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from host.core.logs import JsonFormatter, RunIdFilter
from host.policy.caller import CallerInfo
from host.runtime.telemetry.tracing import RunTracer
from tests.support.fake_llm import FakeLlmServer
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

SECRET_PROMPT = "prompt-text-that-must-not-be-traced"
SECRET_ARGUMENT = "argument-text-that-must-not-be-traced"

AGENT = f"""
def run(context, **kwargs):
    counted = context.run_tool("word-tools", "count_words", text="{SECRET_ARGUMENT} two")
    context.try_tool("not-allowed-pack")
    answer = context.call_llm("{SECRET_PROMPT}")
    return {{"words": counted.result, "answer": answer.content}}
"""


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


def test_a_sandboxed_run_is_one_span_tree_of_its_stages_and_calls(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer
) -> None:
    host_state.install(REPO / "examples" / "word-tools", trust="trusted")
    host_state.install(make_agent("traced", AGENT, extra=(
        "tool_access:\n  allowed_packages: [word-tools]\nllm_access:\n  enabled: true\n  max_calls: 2\n"
    )))  # fmt: skip
    host_state.env.update({"OPENAI_API_KEY": "sk-trace-test", "OPENAI_BASE_URL": fake_llm.base_url_openai})
    exporter = InMemorySpanExporter()
    host = host_state.host(tracer=RunTracer.exporting(exporter))
    try:
        result = host.run("traced", caller=CallerInfo.parse(tenant="acme", request_id="req-9"))
    finally:
        host.close()
    assert result.success, (result.error_code, result.error, result.logs)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "agentnode.run"
    assert dict(root.attributes or {}).items() >= {
        "agentnode.run_id": result.run_id, "agentnode.slug": "traced", "agentnode.mode": "agent_sandbox",
        "agentnode.reason": "agent_completed", "agentnode.success": True,
        "agentnode.caller.tenant": "acme", "agentnode.caller.request_id": "req-9",
    }.items()  # fmt: skip
    children = [s for s in spans if s.parent is not None]
    assert all(s.parent.span_id == root.context.span_id for s in children)  # type: ignore[union-attr]
    assert all(s.context.trace_id == root.context.trace_id for s in children)
    names = [s.name for s in sorted(children, key=lambda s: s.start_time or 0)]
    for stage in ("agentnode.admission", "agentnode.prepare", "agentnode.start", "agentnode.agent",
                  "agentnode.finish"):  # fmt: skip
        assert stage in names
    tools = [s for s in children if s.name == "agentnode.tool_call"]
    assert sorted(str((s.attributes or {})["agentnode.outcome"]) for s in tools) == ["TOOL_NOT_ALLOWED", "ok"]
    ran = next(s for s in tools if (s.attributes or {})["agentnode.outcome"] == "ok")
    assert dict(ran.attributes or {}).items() >= {("agentnode.tool.package", "word-tools"),
                                                  ("agentnode.tool.name", "count_words")}  # fmt: skip
    (llm,) = [s for s in children if s.name == "agentnode.llm_call"]
    assert (llm.attributes or {})["agentnode.outcome"] == "ok"
    assert int((llm.attributes or {})["agentnode.llm.input_tokens"]) > 0
    agent = next(s for s in children if s.name == "agentnode.agent")
    for call in [*tools, llm]:  # the calls happened while the agent ran, inside the run
        assert agent.start_time <= call.start_time <= call.end_time <= agent.end_time  # type: ignore[operator]
        assert root.start_time <= call.start_time and call.end_time <= root.end_time  # type: ignore[operator]
    text = repr([(s.name, dict(s.attributes or {})) for s in spans])
    assert SECRET_PROMPT not in text and SECRET_ARGUMENT not in text and "sk-trace-test" not in text


def test_log_records_of_a_runs_threads_carry_its_run_id(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    host_state.install(make_agent("unbrokered", """
        def run(context, **kwargs):
            try:
                context.call_llm("hello")
            except Exception as exc:
                return {"refused": type(exc).__name__}
    """, extra="llm_access:\n  enabled: true\n  max_calls: 1\n"))  # fmt: skip
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.addFilter(RunIdFilter())  # as the CLI's handler: each record stamped where it is logged
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    host = host_state.host()  # no provider configured: the broker logs why, on the run server's thread
    try:
        result = host.run("unbrokered")
    finally:
        host.close()
        logging.getLogger().removeHandler(handler)
    assert result.success and result.result == {"refused": "LlmAccessError"}
    lines = [json.loads(JsonFormatter().format(r)) for r in records if "LLM call refused" in r.getMessage()]
    assert lines and all(line["run_id"] == result.run_id for line in lines)
