"""A sandboxed agent written against the agentnode SDK runs unchanged: `import agentnode_sdk` resolves to the
host's compatibility package, its AgentContext is the context the agent gets, and a host tool raising
AgentNodeToolError fails only its call."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

TOOLS = """
from agentnode_sdk.exceptions import AgentNodeToolError


def fail(text=""):
    raise AgentNodeToolError("secret-" + text, tool_name="fail", details={"text": text})


def echo(text=""):
    return {"echo": text}


def where():
    import agentnode_sdk
    from agentnode_sdk.runtimes.agent_runner import AgentContext

    return [agentnode_sdk.__file__, AgentContext.__module__]
"""

AGENT = """
import agentnode_sdk
from agentnode_sdk import ToolError
from agentnode_sdk.exceptions import AgentNodeError, AgentNodeToolError
from agentnode_sdk.models import RunToolResult
from agentnode_sdk.runtimes.agent_runner import (
    AgentContext, AgentLimitExceeded, AgentTerminated, LLMResult, RetryConfig, ToolContext,
)


def run(context, **kwargs):
    failed = context.run_tool("sdk-tools", "fail", text="sk-live-1")
    echoed = context.run_tool("sdk-tools", "echo", text="hi")
    where = context.run_tool("sdk-tools", "where")
    try:
        context.run_tool("sdk-tools", "echo", text="over the cap")
        limit = "not raised"
    except AgentLimitExceeded as exc:
        limit = type(exc).__name__
    try:
        agentnode_sdk.run_tool("sdk-tools", "echo")
        nested = "ran"
    except NotImplementedError as exc:
        nested = str(exc)
    try:
        raise ToolError("raised by the agent", tool_name="self")
    except AgentNodeToolError as exc:
        caught = [exc.tool_name, exc.details, isinstance(exc, AgentNodeError)]
    return {
        "is_context": isinstance(context, AgentContext),
        "sdk_file": agentnode_sdk.__file__,
        "version": agentnode_sdk.__version__,
        "failed": [isinstance(failed, RunToolResult), failed.success, failed.error, failed.result],
        "mode_used": failed.mode_used,
        "tool_sees": where.result,
        "echoed": [echoed.success, echoed.result],
        "limit": limit,
        "nested": nested,
        "caught": caught,
        "types": [LLMResult.__name__, ToolContext().has_tools, RetryConfig().max_retries,
                  issubclass(AgentTerminated, RuntimeError)],
    }
"""


def _toolpack(parent: Path) -> Path:
    pack = parent / "sdk-tools"
    pack.mkdir(parents=True)
    (pack / "sdk_tools.py").write_text(textwrap.dedent(TOOLS))
    (pack / "agentnode.yaml").write_text(
        'package_id: sdk-tools\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: sdk_tools\n'
        "capabilities:\n  tools:\n"
        "    - name: fail\n      entrypoint: sdk_tools:fail\n"
        "    - name: echo\n      entrypoint: sdk_tools:echo\n"
        "    - name: where\n      entrypoint: sdk_tools:where\n"
    )
    return pack


@pytest.mark.parametrize("tool_trust", ["trusted", "unverified"])  # the host's tool worker, a tool sandbox
def test_an_sdk_written_agent_and_tool_run_unchanged(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, runtime: str, tool_trust: str
) -> None:
    host_state.install(_toolpack(tmp_path / "tools"), trust=tool_trust)
    agent = make_agent(
        "sdk-agent",
        AGENT,
        extra="tool_access:\n  allowed_packages: [sdk-tools]\nlimits:\n  max_tool_calls: 3\n",
    )
    host_state.install(agent)

    host = host_state.host()
    try:
        result = host.run("sdk-agent", runtime=runtime)
    finally:
        host.close()

    assert result.success, (result.error_code, result.error, result.logs)
    out = result.result
    assert out["is_context"] is True
    assert out["sdk_file"] == "/opt/agentnode/site/sandbox_wrapper/_compat/agentnode_sdk/__init__.py"
    assert out["version"].endswith("+agentnode-sandbox")
    # The tool's AgentNodeToolError failed its call like any exception, by type only (no message text).
    assert out["failed"] == [True, False, "tool raised AgentNodeToolError", None]
    assert out["echoed"] == [True, {"echo": "hi"}]
    # The tool gets the same package: stand-ins in the host worker, the wrapper's classes in a tool sandbox.
    if tool_trust == "trusted":
        assert out["mode_used"] == "host_worker"
        assert out["tool_sees"] == [
            str(REPO / "sandbox_wrapper" / "_compat" / "agentnode_sdk" / "__init__.py"),
            "agentnode_sdk.runtimes.agent_runner",
        ]
    else:
        assert out["mode_used"] == "tool_sandbox"
        assert out["tool_sees"] == [out["sdk_file"], "sandbox_wrapper._context"]
    assert out["limit"] == "AgentLimitExceeded"  # the SDK's name catches what the context raises
    assert "context.run_tool" in out["nested"]
    assert out["caught"] == ["self", {}, False]
    assert out["types"] == ["LlmResult", False, 2, True]
    assert "sk-live" not in str(out)
