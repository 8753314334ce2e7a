"""Every llm_access rule and tool cap through a real sandboxed run, the real SDKs and a local fake provider.

The probe agent reports everything it saw (LlmResult fields, error types, reasons and strings, stream
chunks), so the tests can check both what the agent was told and what it was never told: the host model,
the API key, the provider's error body.
"""

from __future__ import annotations

import json
import logging
import math
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from host.audit.verify import verify_audit
from host.runtime.runner import RunResult
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer
from tests.support.host_state import HostState

pytestmark = [pytest.mark.docker, pytest.mark.podman]

CANARY = "sk-canary-caps-3b9d0e7a51f2"
HOST_MODEL = "host-model-secret-7c1e"

PROBE = """
import json, threading, time
from sandbox_wrapper import AgentLimitExceeded, LlmAccessError


def _error(exc):
    return {"ok": False, "type": type(exc).__name__, "runtime_error": isinstance(exc, RuntimeError),
            "reason": getattr(exc, "reason", None), "error": str(exc)}


def _call(context, messages):
    try:
        r = context.call_llm(messages)
    except LlmAccessError as exc:
        return _error(exc)
    return {"ok": True, "content": r.content, "finish_reason": r.finish_reason, "usage": r.usage,
            "model": r.model, "repr": repr(r)}


def _stream(context, messages):
    start, chunks = time.monotonic(), []
    try:
        for chunk in context.stream_llm(messages):
            chunks.append([round(time.monotonic() - start, 3), chunk])
    except LlmAccessError as exc:
        return {**_error(exc), "chunks": chunks}
    return {"ok": True, "chunks": chunks}


def _tool(context, slug, i):
    try:
        r = context.run_tool(slug, i=i)
    except (AgentLimitExceeded, PermissionError) as exc:
        return {"ok": False, "type": type(exc).__name__, "error": str(exc)}
    return {"ok": r.success, "result": r.result, "error": r.error, "mode_used": r.mode_used}


def _burst(n, one):
    barrier, out, lock = threading.Barrier(n), [], threading.Lock()

    def worker(i):
        barrier.wait()
        rec = one(i)
        with lock:
            out.append(rec)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def run(context, plan=(), **kwargs):
    seen = []
    for step in plan:
        op = step["op"]
        if op == "call":
            seen.append(_call(context, step["messages"]))
        elif op == "stream":
            seen.append(_stream(context, step["messages"]))
        elif op == "llm_burst":
            seen.append(_burst(step["n"], lambda i: _call(context, "hello %d" % i)))
        elif op == "tool_burst":
            seen.append(_burst(step["n"], lambda i: _tool(context, step["slug"], i)))
        elif op == "tool":
            seen.append(_tool(context, step["slug"], 0))
    return {"seen": seen, "system_prompt": context.system_prompt, "goal": context.goal,
            "allowed_packages": context.allowed_packages, "max_tool_calls": context.max_tool_calls,
            "tools_remaining": context.tools_remaining, "tool_calls_made": context.tool_calls_made}
"""

APPENDER = """
import os, time

LOG = {log!r}


def run(i, **kwargs):
    time.sleep(0.2)
    with open(LOG, "a") as fh:
        fh.write("%d %d\\n" % (i, os.getpid()))
    return {{"i": i, "env_keys": sorted(os.environ)}}
"""


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


@pytest.fixture
def leak_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Everything the host process logs during the test, at DEBUG, from every logger (SDKs included)."""
    caplog.set_level(logging.DEBUG)
    return caplog


def _openai_host(state: HostState, fake: FakeLlmServer, llm: dict[str, Any] | None = None) -> None:
    state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=fake.base_url_openai)
    state.write_config({"llm": {"model": HOST_MODEL, **(llm or {})}})


def _agent(make_agent: Callable[..., Path], llm_access: str | None, *, extra: str = "") -> Path:
    block = "" if llm_access is None else "llm_access:\n" + textwrap.indent(textwrap.dedent(llm_access), "  ")
    return make_agent("probe", PROBE, extra=block + extra)


def _run(state: HostState, plan: list[dict[str, Any]], runtime: str | None = None) -> RunResult:
    host = state.host()
    try:
        return host.run("probe", kwargs={"plan": plan}, runtime=runtime)
    finally:
        host.close()


def _seen(result: RunResult) -> list[Any]:
    assert result.success, (result.error_code, result.error, result.logs)
    return list(result.result["seen"])


def _record(state: HostState, result: RunResult) -> dict[str, Any]:
    audit = state.audit()
    assert len(audit) == 1 and audit[0]["run_id"] == result.run_id
    assert verify_audit(state.dir / "audit.jsonl").ok
    return audit[0]


def _assert_no_leak(
    state: HostState, result: RunResult, fake: FakeLlmServer, log: pytest.LogCaptureFixture | None = None
) -> None:
    """The key, the host model and provider error text reach neither the agent, the result, the logs nor
    the audit log; the provider URL never reaches the agent."""
    visible = json.dumps(result.to_json())
    audit_text = (state.dir / "audit.jsonl").read_text()
    for secret in (CANARY, SECRET_IN_ERROR_BODY):
        assert secret not in visible and secret not in audit_text
        if log is not None:
            assert secret not in log.text
    assert HOST_MODEL not in visible and fake.base_url not in visible


# -- race-free caps ---------------------------------------------------------------------------------------


def test_fifty_concurrent_llm_calls_reach_the_provider_exactly_five_times(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer, runtime: str
) -> None:
    fake_llm.default = Behaviour(text="fake reply", delay=0.3)  # keep the admitted calls in flight together
    _openai_host(host_state, fake_llm)
    host_state.install(_agent(make_agent, "enabled: true\nmax_calls: 5\n"))

    result = _run(host_state, [{"op": "llm_burst", "n": 50}], runtime)
    (burst,) = _seen(result)
    assert len(burst) == 50
    ok = [r for r in burst if r["ok"]]
    refused = [r for r in burst if not r["ok"]]
    assert len(ok) == 5 and all(r["content"] == "fake reply" and r["model"] == "" for r in ok)
    assert len(refused) == 45
    assert {(r["type"], r["reason"], r["runtime_error"]) for r in refused} == {
        ("LlmAccessError", "LLM_CALL_LIMIT", True)
    }
    assert all(r["error"].startswith("LLM_CALL_LIMIT:") for r in refused)
    assert len(fake_llm.requests) == 5

    llm = _record(host_state, result)["llm"]
    assert (llm["requests"], llm["calls"], llm["ok"], llm["refused_limit"]) == (50, 5, 5, 45)
    assert llm["max_calls"] == 5 and llm["model"] == HOST_MODEL
    _assert_no_leak(host_state, result, fake_llm)


def _install_appender(state: HostState, tmp_path: Path, trust: str = "trusted") -> Path:
    log = tmp_path / "appender.log"
    pack = tmp_path / "toolpacks" / "appender"
    pack.mkdir(parents=True)
    (pack / "appender.py").write_text(APPENDER.format(log=str(log)))
    (pack / "agentnode.yaml").write_text(
        'package_id: appender\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: appender\n'
    )
    state.install(pack, trust=trust)
    return log


def test_fifty_concurrent_tool_calls_run_exactly_five_tools(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, runtime: str
) -> None:
    log = _install_appender(host_state, tmp_path)
    host_state.install(
        make_agent(
            "probe",
            PROBE,
            extra="tool_access:\n  allowed_packages: [appender]\nlimits:\n  max_tool_calls: 5\n",
        )
    )
    result = _run(host_state, [{"op": "tool_burst", "n": 50, "slug": "appender"}], runtime)
    (burst,) = _seen(result)
    ok = [r for r in burst if r["ok"]]
    refused = [r for r in burst if not r["ok"]]
    assert len(ok) == 5 and all(r["mode_used"] == "host_worker" for r in ok)
    assert len(refused) == 45
    assert {r["type"] for r in refused} == {"AgentLimitExceeded"}
    assert all(r["error"].startswith("TOOL_CALL_LIMIT:") for r in refused)
    lines = log.read_text().splitlines()
    assert len(lines) == 5
    assert sorted(int(line.split()[0]) for line in lines) == sorted(r["result"]["i"] for r in ok)
    assert result.result["tools_remaining"] == 0

    rec = _record(host_state, result)
    assert rec["tool_calls"] == 5 and rec["tool_refusals"] == 45


# -- every llm_access rule and refusal reason -------------------------------------------------------------

LONG = "0123456789ABCDEFGHIJ"  # 20 characters


@dataclass(frozen=True)
class LlmCase:
    """One llm_access rule: manifest block, host ceiling, provider script, the agent's calls, outcomes."""

    llm_access: str | None
    calls: list[Any]
    expect: list[str]  # "ok" or the LlmAccessError reason, one per call
    provider_requests: int
    counters: dict[str, int]
    host_llm: dict[str, Any] = field(default_factory=dict)
    script: tuple[Behaviour, ...] = ()
    system_prompt: str = ""


CASES = {
    "not-granted-no-block": LlmCase(
        None,
        ["hi", "again"],
        ["LLM_NOT_GRANTED", "LLM_NOT_GRANTED"],
        0,
        {"requests": 2, "calls": 0, "refused_disabled": 2},
    ),
    "not-granted-enabled-not-literal-true": LlmCase(
        'enabled: "true"\n',
        ["hi"],
        ["LLM_NOT_GRANTED"],
        0,
        {"refused_disabled": 1, "enabled": False},
    ),
    "disabled-by-host": LlmCase(
        "enabled: true\n",
        ["hi"],
        ["LLM_NOT_GRANTED"],
        0,
        {"refused_disabled": 1, "enabled": False},
        host_llm={"enabled": False},
    ),
    "input-too-large": LlmCase(
        "enabled: true\nmax_input_chars: 50\n",
        ["x" * 43, "x" * 42],  # "user" and 4 per message count too: 43 + 4 + 4 = 51 > 50
        ["LLM_INPUT_TOO_LARGE", "ok"],
        1,
        {"requests": 2, "calls": 1, "ok": 1, "refused_input": 1, "max_input_chars": 50},
    ),
    "input-counts-the-system-prompt": LlmCase(
        "enabled: true\nmax_input_chars: 50\n",
        ["y" * 3, "y" * 2],  # the system message alone counts 30 + len("system") + 4 = 40
        ["LLM_INPUT_TOO_LARGE", "ok"],
        1,
        {"refused_input": 1, "ok": 1},
        system_prompt="s" * 30,
    ),
    "input-counts-every-message": LlmCase(
        "enabled: true\nmax_input_chars: 50\n",
        [
            [
                {"role": "system", "content": "a" * 20},
                {"role": "assistant", "content": "b" * 20},
                {"role": "user", "content": "c" * 20},
            ]
        ],
        ["LLM_INPUT_TOO_LARGE"],
        0,
        {"refused_input": 1},
    ),
    "output-too-large": LlmCase(
        "enabled: true\nmax_output_chars: 12\n",
        ["long please", "short please"],
        ["LLM_OUTPUT_TOO_LARGE", "ok"],
        2,
        {"calls": 2, "ok": 1, "refused_output": 1},
        script=(Behaviour(text=LONG),),
    ),
    "model-not-allowed-empty-list": LlmCase(
        "enabled: true\nallowed_models: []\n",
        ["hi"],
        ["LLM_MODEL_NOT_ALLOWED"],
        0,
        {"refused_model": 1, "calls": 0},
    ),
    "model-not-allowed-no-match": LlmCase(
        "enabled: true\nallowed_models: [some-other-model]\n",
        ["hi"],
        ["LLM_MODEL_NOT_ALLOWED"],
        0,
        {"refused_model": 1, "calls": 0},
    ),
    "model-not-allowed-by-host": LlmCase(
        "enabled: true\n",
        ["hi"],
        ["LLM_MODEL_NOT_ALLOWED"],
        0,
        {"refused_model": 1},
        host_llm={"allowed_models": []},
    ),
    "model-allowed-on-both-sides": LlmCase(
        f"enabled: true\nallowed_models: [{HOST_MODEL}, other]\n",
        ["hi"],
        ["ok"],
        1,
        {"ok": 1},
        host_llm={"allowed_models": [HOST_MODEL]},
    ),
    # 429 and 5xx are retried by the broker (3 attempts in all, one call slot): the agent sees the error
    # only when every attempt failed.
    "provider-429-rate-limited": LlmCase(
        "enabled: true\n",
        ["hi", "again"],
        ["LLM_RATE_LIMITED", "ok"],
        4,
        {"provider_errors": 1, "ok": 1, "calls": 2, "retries": 2, "retries_rate_limited": 2},
        script=(Behaviour(status=429),) * 3,
    ),
    "provider-500-unavailable": LlmCase(
        "enabled: true\n",
        ["hi", "again"],
        ["LLM_UNAVAILABLE", "ok"],
        4,
        {"provider_errors": 1, "ok": 1, "retries": 2, "retries_server_error": 2},
        script=(Behaviour(status=500),) * 3,
    ),
    "provider-503-retried-then-ok": LlmCase(
        "enabled: true\n",
        ["hi"],
        ["ok"],
        2,
        {"provider_errors": 0, "ok": 1, "calls": 1, "retries": 1, "retries_server_error": 1},
        script=(Behaviour(status=503),),
    ),
    "provider-401-unavailable": LlmCase(
        "enabled: true\n",
        ["hi", "again"],
        ["LLM_UNAVAILABLE", "ok"],
        2,
        {"provider_errors": 1, "ok": 1},
        script=(Behaviour(status=401),),
    ),
    "provider-garbage-unavailable": LlmCase(
        "enabled: true\n",
        ["hi", "again"],
        ["LLM_UNAVAILABLE", "ok"],
        2,
        {"provider_errors": 1, "ok": 1},
        script=(Behaviour(garbage=True),),
    ),
    "provider-hang-timeout": LlmCase(
        "enabled: true\n",
        ["hi", "again"],
        ["LLM_TIMEOUT", "ok"],
        2,
        {"provider_errors": 1, "ok": 1},
        script=(Behaviour(hang=True),),
        host_llm={"timeout_seconds": 1},
    ),
    "host-ceiling-wins": LlmCase(
        "enabled: true\nmax_calls: 20\n",
        ["a", "b", "c"],
        ["ok", "ok", "LLM_CALL_LIMIT"],
        2,
        {"max_calls": 2, "calls": 2, "ok": 2, "refused_limit": 1},
        host_llm={"max_calls": 2},
    ),
    "builtin-ceiling-when-host-sets-none": LlmCase(
        "enabled: true\nmax_calls: 500\nmax_input_chars: 999999\n",
        ["a"],
        ["ok"],
        1,
        {"max_calls": 20, "max_input_chars": 24000, "max_output_chars": 24000},
    ),
    # Token and cost budgets (host/llm/budget.py): reserved before the call from an input estimate, settled
    # from the provider's usage (the fake counts characters: "hi" is 2 input tokens, "fake reply" 10 out).
    "token-budget-refuses-naming-max-total-tokens": LlmCase(
        "enabled: true\nmax_output_tokens: 20\nmax_total_tokens: 30\n",
        ["hi", "again", "x"],
        ["ok", "ok", "LLM_TOKEN_BUDGET"],
        2,
        {"max_total_tokens": 30, "max_output_tokens": 20, "calls": 2, "refused_total_tokens": 1,
         "input_tokens": 7, "output_tokens": 20},
    ),
    "cost-budget-priced-from-the-host-table": LlmCase(
        "enabled: true\n",
        ["hi"],
        ["ok"],
        1,
        {"input_tokens": 2, "output_tokens": 10, "cost_usd": 1.2e-05, "refused_cost": 0},
        host_llm={
            "max_cost_usd": 1.0, "prices": {HOST_MODEL: {"input_per_million": 1, "output_per_million": 1}}
        },
    ),
    "cost-budget-without-a-price-fails-closed": LlmCase(
        "enabled: true\nmax_cost_usd: 0.5\n",
        ["hi"],
        ["LLM_COST_BUDGET"],
        0,
        {"calls": 0, "refused_cost": 1, "input_tokens": 0},
    ),
    "host-ceiling-above-builtin": LlmCase(
        "enabled: true\n",
        ["a"],
        ["ok"],
        1,
        {"max_calls": 30},
        host_llm={"max_calls": 30},
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_llm_access_rule(
    host_state: HostState,
    make_agent: Callable[..., Path],
    fake_llm: FakeLlmServer,
    leak_log: pytest.LogCaptureFixture,
    case: LlmCase,
) -> None:
    _openai_host(host_state, fake_llm, case.host_llm)
    fake_llm.script(*case.script)
    prompt = f"system_prompt: {case.system_prompt}\n" if case.system_prompt else ""
    agent = make_agent(
        "probe",
        PROBE,
        extra=prompt
        + ("" if case.llm_access is None else "llm_access:\n" + textwrap.indent(case.llm_access, "  ")),
    )
    host_state.install(agent)

    result = _run(host_state, [{"op": "call", "messages": m} for m in case.calls])
    seen = _seen(result)  # a refusal never ends the run
    assert [s["reason"] if not s["ok"] else "ok" for s in seen] == case.expect, seen
    for s in seen:
        if s["ok"]:
            assert s["model"] == "" and s["finish_reason"] == "stop" and s["content"] == "fake reply"
        else:
            assert s["type"] == "LlmAccessError" and s["runtime_error"] is True
            assert s["error"].startswith(s["reason"] + ":")
    assert len(fake_llm.requests) == case.provider_requests
    for request in fake_llm.requests:
        assert request.body["model"] == HOST_MODEL
        assert request.headers["authorization"] == f"Bearer {CANARY}"

    llm = _record(host_state, result)["llm"]
    assert {k: llm[k] for k in case.counters} == case.counters
    assert llm["requests"] == len(case.calls)
    _assert_no_leak(host_state, result, fake_llm, leak_log)


def test_spend_is_bounded_before_the_call(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer
) -> None:
    """The provider is told the max-tokens bound derived from max_output_chars, and gets every message."""
    _openai_host(host_state, fake_llm)
    host_state.install(
        make_agent(
            "probe",
            PROBE,
            extra="system_prompt: be brief\nllm_access:\n  enabled: true\n  max_output_chars: 300\n",
        )
    )
    result = _run(host_state, [{"op": "call", "messages": "count to three"}])
    assert _seen(result)[0]["ok"]
    (request,) = fake_llm.requests
    assert request.body["max_completion_tokens"] == math.ceil(300 / 3)
    assert request.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "count to three"},
    ]


# -- streaming ----------------------------------------------------------------------------------------------


def test_stream_chunks_arrive_as_the_provider_sends_them(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer, runtime: str
) -> None:
    text = "alpha beta gamma delta epsilon zeta"
    fake_llm.script(Behaviour(text=text, chunks=5, chunk_delay=0.4))
    _openai_host(host_state, fake_llm)
    host_state.install(_agent(make_agent, "enabled: true\n"))
    result = _run(host_state, [{"op": "stream", "messages": "stream please"}], runtime)
    (stream,) = _seen(result)
    assert stream["ok"], stream
    chunks = stream["chunks"]
    assert "".join(c for _, c in chunks) == text
    assert len(chunks) >= 4
    # Forwarded as they come, not buffered until the end: the provider paced them 0.4 s apart.
    assert chunks[-1][0] - chunks[0][0] >= 1.0, chunks
    assert fake_llm.requests[0].body["stream"] is True
    llm = _record(host_state, result)["llm"]
    assert (llm["calls"], llm["ok"]) == (1, 1)
    _assert_no_leak(host_state, result, fake_llm)


def test_stream_output_cap_cuts_mid_stream_and_the_run_goes_on(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer
) -> None:
    text = "".join(f"{i:02d}-------|" for i in range(6))  # 60 chars in 6 chunks of 10
    fake_llm.script(Behaviour(text=text, chunks=6, chunk_delay=0.1))
    _openai_host(host_state, fake_llm)
    host_state.install(_agent(make_agent, "enabled: true\nmax_output_chars: 25\n"))
    result = _run(
        host_state,
        [
            {"op": "stream", "messages": "stream please"},
            {"op": "call", "messages": "and now a short one"},
        ],
    )
    stream, after = _seen(result)
    assert not stream["ok"] and stream["reason"] == "LLM_OUTPUT_TOO_LARGE", stream
    assert "".join(c for _, c in stream["chunks"]) == text[:25]
    assert len(stream["chunks"]) == 3
    assert after["ok"] and after["content"] == "fake reply"
    llm = _record(host_state, result)["llm"]
    assert (llm["calls"], llm["ok"], llm["refused_output"]) == (2, 1, 1)
    _assert_no_leak(host_state, result, fake_llm)


# -- the key stays on the host --------------------------------------------------------------------------


def test_canary_key_never_leaves_the_host(
    host_state: HostState,
    make_agent: Callable[..., Path],
    fake_llm: FakeLlmServer,
    tmp_path: Path,
    leak_log: pytest.LogCaptureFixture,
) -> None:
    _openai_host(host_state, fake_llm)
    _install_appender(host_state, tmp_path)
    leaky = PROBE + textwrap.dedent("""
        import os
        _inner = run
        def run(context, **kwargs):
            out = _inner(context, **kwargs)
            out["env"] = dict(os.environ)
            return out
    """)
    host_state.install(
        make_agent(
            "probe",
            leaky,
            extra="tool_access:\n  allowed_packages: [appender]\nllm_access:\n  enabled: true\n",
        )
    )
    fake_llm.script(
        Behaviour(),
        Behaviour(status=401),
        *[Behaviour(status=429)] * 3,  # retried by the broker: 3 attempts
        *[Behaviour(status=500)] * 3,
        Behaviour(garbage=True),
        Behaviour(text="streamed reply", chunks=3),
    )
    result = _run(
        host_state,
        [
            {"op": "call", "messages": "ok"},
            {"op": "call", "messages": "401"},
            {"op": "call", "messages": "429"},
            {"op": "call", "messages": "500"},
            {"op": "call", "messages": "garbage"},
            {"op": "stream", "messages": "stream"},
            {"op": "tool", "slug": "appender"},
        ],
    )
    seen = _seen(result)
    assert [s.get("reason") for s in seen[:5]] == [
        None,
        "LLM_UNAVAILABLE",
        "LLM_RATE_LIMITED",
        "LLM_UNAVAILABLE",
        "LLM_UNAVAILABLE",
    ]
    assert seen[5]["ok"] and seen[6]["ok"]
    # The tool worker's environment holds no provider key either.
    assert not any("API_KEY" in k for k in seen[6]["result"]["env_keys"])
    assert not any("API_KEY" in k or "BASE_URL" in k for k in result.result["env"])
    # The provider did receive the key, host-side, on every request (the 429 and the 500 were tried 3 times).
    assert len(fake_llm.requests) == 10
    assert all(r.headers["authorization"] == f"Bearer {CANARY}" for r in fake_llm.requests)
    _assert_no_leak(host_state, result, fake_llm, leak_log)
    assert CANARY not in result.logs and CANARY not in result.error


def test_anthropic_provider_end_to_end(
    host_state: HostState,
    make_agent: Callable[..., Path],
    fake_llm: FakeLlmServer,
    leak_log: pytest.LogCaptureFixture,
) -> None:
    host_state.env.update(ANTHROPIC_API_KEY=CANARY, ANTHROPIC_BASE_URL=fake_llm.base_url_anthropic)
    host_state.install(
        make_agent(
            "probe",
            PROBE,
            extra="system_prompt: you are terse\nllm_access:\n  enabled: true\n  max_output_chars: 900\n",
        )
    )
    fake_llm.script(
        Behaviour(text="anthropic says hi"),
        Behaviour(text="streamed from claude", chunks=4),
        *[Behaviour(status=429)] * 3,  # retried by the broker: 3 attempts
    )
    result = _run(
        host_state,
        [
            {"op": "call", "messages": "hello"},
            {"op": "stream", "messages": "stream"},
            {"op": "call", "messages": "limited"},
        ],
    )
    call, stream, limited = _seen(result)
    assert call["ok"] and call["content"] == "anthropic says hi" and call["finish_reason"] == "stop"
    assert call["model"] == "" and call["usage"]["output_tokens"] == len("anthropic says hi")
    assert stream["ok"] and "".join(c for _, c in stream["chunks"]) == "streamed from claude"
    assert limited["reason"] == "LLM_RATE_LIMITED"
    first = fake_llm.requests[0]
    assert first.path == "/v1/messages" and CANARY in json.dumps(first.headers)
    assert first.body["system"] == "you are terse"
    assert first.body["messages"] == [{"role": "user", "content": "hello"}]
    assert first.body["max_tokens"] == 300 and first.body["model"] == "claude-3-5-haiku-latest"
    llm = _record(host_state, result)["llm"]
    assert llm["model"] == "claude-3-5-haiku-latest" and (llm["ok"], llm["provider_errors"]) == (2, 1)
    visible = json.dumps(result.to_json())
    assert "claude" not in visible and CANARY not in visible and CANARY not in leak_log.text
    assert SECRET_IN_ERROR_BODY not in visible
