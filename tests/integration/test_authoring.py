"""Agent authoring end to end in the sandbox: entrypoint styles, one error code per failure, host tool packs.

(The example agent's happy path is tests/integration/test_end_to_end.py; here: its refusal handling, the
raw-stubs example, the failure modes and the tool pack contract.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import ManifestError
from host.runtime.runner import RunResult
from tests.support.fake_llm import FakeLlmServer
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = pytest.mark.docker

CANARY = "sk-canary-authoring-20c4f1"

MARKER_TOOLS = """
import os, time

LOG = {log!r}


def _note(line):
    with open(LOG, "a") as fh:
        fh.write(line + "\\n")


def record(word):
    _note("record " + word)
    return {{"recorded": word}}


def echo_controls(timeout=None, mode=None, sleep=0.0):
    time.sleep(sleep)
    _note("echo_controls")
    return {{"timeout": timeout, "mode": mode, "pid": os.getpid()}}
"""

MARKER_MANIFEST = """\
package_id: marker-tools
version: "1.0.0"
package_type: toolpack
capabilities:
  tools:
    - name: record
      entrypoint: marker_tools:record
      input_schema:
        type: object
        properties:
          word: {type: string, maxLength: 10}
        required: [word]
        additionalProperties: false
    - name: echo_controls
      entrypoint: marker_tools:echo_controls
"""


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


def _run(state: HostState, slug: str, **kwargs: Any) -> RunResult:
    host = state.host()
    try:
        return host.run(slug, **kwargs)
    finally:
        host.close()


def _install_marker_tools(state: HostState, tmp_path: Path, trust: str) -> Path:
    log = tmp_path / "marker-tools.log"
    pack = tmp_path / "toolpacks" / "marker-tools"
    pack.mkdir(parents=True)
    (pack / "marker_tools.py").write_text(MARKER_TOOLS.format(log=str(log)))
    (pack / "agentnode.yaml").write_text(MARKER_MANIFEST)
    state.install(pack, trust=trust)
    return log


def _log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# -- the examples ---------------------------------------------------------------------------------------


def test_example_agent_handles_refusals_gracefully(host_state: HostState, fake_llm: FakeLlmServer) -> None:
    """word-tools installed as a community pack (its call runs in a tool sandbox), LLM access disabled by
    the host: the run still succeeds and records the refusal."""
    host_state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=fake_llm.base_url_openai)
    host_state.write_config({"llm": {"enabled": False}})
    host_state.install(REPO / "examples" / "word-tools", trust="unverified")
    host_state.install(REPO / "examples" / "hello-agent", trust="unverified")
    result = _run(host_state, "hello-agent")
    assert result.success and result.mode_used == "agent_sandbox", (result.error_code, result.error)
    refusals = result.result["refusals"]
    assert [r["step"] for r in refusals] == ["llm"]
    assert refusals[0]["reason"] == "LLM_NOT_GRANTED"
    assert isinstance(result.result["word_count"], int) and "greeting" not in result.result
    assert fake_llm.requests == []
    rec = host_state.audit()[0]
    assert rec["tool_refusals"] == 0 and rec["llm"]["refused_disabled"] == 1
    assert rec["tool_calls_tool_sandbox"] == rec["tool_sandboxes_started"] == 1


def test_raw_stubs_example_runs_sandboxed(host_state: HostState) -> None:
    host_state.install(REPO / "examples" / "word-tools", trust="trusted")
    host_state.install(REPO / "examples" / "raw-stubs-agent", trust="unverified")
    result = _run(host_state, "raw-stubs-agent", goal="one two three")
    assert result.success and result.mode_used == "agent_sandbox", (result.error_code, result.error)
    assert result.result["tool"]["success"] is True
    assert result.result["tool"]["result"] == {"text": "three two one"}
    assert result.result["tool"]["tools_remaining"] == 1
    assert result.result["llm"]["status"] == "PERMISSION_DENIED"
    assert result.result["llm"]["reason"] == "LLM_NOT_GRANTED"


# -- entrypoint styles ------------------------------------------------------------------------------------


def test_async_entrypoint_runs_sandboxed(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    host_state.install(
        make_agent(
            "async-agent",
            """
            import asyncio

            async def main(context, who="nobody", **kwargs):
                await asyncio.sleep(0.05)
                return {"hello": who, "run_id": context.run_id, "goal": context.goal}
            """,
            entrypoint="async_agent:main",
        )
    )
    result = _run(host_state, "async-agent", kwargs={"who": "async"}, runtime=runtime)
    assert result.success, (result.error_code, result.error, result.logs)
    assert result.result == {"hello": "async", "run_id": result.run_id, "goal": "probe"}


EXISTING_STYLE = """
def run(context, **kwargs):
    counts = []
    while context.iteration < context.max_iterations:
        context.next_iteration()
        result = context.run_tool("word-tools", "count_words", text=context.goal)
        if result.success:
            counts.append(result.result["count"])
        else:
            counts.append(result.error)
    try:
        context.next_iteration()
        past_limit = None
    except Exception as exc:
        past_limit = type(exc).__name__
    summary = context.call_llm_text([{"role": "user", "content": "summarize %s" % counts}])
    return {
        "counts": counts,
        "iterations": context.iteration,
        "past_limit": past_limit,
        "summary": summary,
        "tool_calls_made": context.tool_calls_made,
        "tools_remaining": context.tools_remaining,
        "max_tool_calls": context.max_tool_calls,
        "allowed_packages": context.allowed_packages,
        "available": [context.is_tool_available("word-tools"), context.is_tool_available("other")],
        "kwargs": kwargs,
    }
"""


def test_existing_style_agent_runs_unchanged(
    host_state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer, runtime: str
) -> None:
    host_state.env.update(OPENAI_API_KEY=CANARY, OPENAI_BASE_URL=fake_llm.base_url_openai)
    host_state.install(REPO / "examples" / "word-tools", trust="trusted")
    host_state.install(
        make_agent(
            "classic",
            EXISTING_STYLE,
            extra="tool_access:\n  allowed_packages: [word-tools]\n"
            "limits:\n  max_iterations: 3\n  max_tool_calls: 5\n"
            "llm_access:\n  enabled: true\n",
        )
    )
    result = _run(
        host_state, "classic", goal="five words in this goal", kwargs={"mode": "fast"}, runtime=runtime
    )
    assert result.success and result.mode_used == "agent_sandbox", (result.error_code, result.error)
    assert result.result == {
        "counts": [5, 5, 5],
        "iterations": 3,
        "past_limit": "AgentLimitExceeded",
        "summary": "fake reply",
        "tool_calls_made": 3,
        "tools_remaining": 2,
        "max_tool_calls": 5,
        "allowed_packages": ["word-tools"],
        "available": [True, False],
        "kwargs": {"mode": "fast"},
    }
    rec = host_state.audit()[0]
    assert rec["tool_calls"] == 3 and rec["llm"]["ok"] == 1


# -- one error code per failure mode ------------------------------------------------------------------------

FAILURES: dict[str, tuple[str, str, str, str]] = {
    # name: (entrypoint, source, error_code, text the error must contain)
    "import-raises": (
        "agent:run",
        "raise RuntimeError('secret-agent-text at import')\n",
        "import_failed",
        "RuntimeError",
    ),
    "import-missing-dependency": (
        "agent:run",
        "import numpy_is_not_in_the_image\n",
        "import_failed",
        "ModuleNotFoundError",
    ),
    "module-missing": (
        "nowhere:run",
        "def run(context, **kwargs):\n    return 1\n",
        "import_failed",
        "'nowhere'",
    ),
    "function-missing": (
        "agent:main",
        "def run(context, **kwargs):\n    return 1\n",
        "entrypoint_not_found",
        "'main'",
    ),
    "function-not-callable": ("agent:run", "run = 42\n", "entrypoint_not_found", "non-callable"),
    "exception": (
        "agent:run",
        "def run(context, **kwargs):\n    raise ValueError('secret-agent-text')\n",
        "agent_exception",
        "ValueError",
    ),
    "system-exit": (
        "agent:run",
        "import sys\ndef run(context, **kwargs):\n    sys.exit(7)\n",
        "system_exit",
        "7",
    ),
    "keyboard-interrupt": (
        "agent:run",
        "def run(context, **kwargs):\n    raise KeyboardInterrupt\n",
        "base_exception",
        "KeyboardInterrupt",
    ),
    "custom-base-exception": (
        "agent:run",
        "class Escape(BaseException):\n    pass\ndef run(context, **kwargs):\n    raise Escape('out')\n",
        "base_exception",
        "Escape",
    ),
    "unserializable-set": (
        "agent:run",
        "def run(context, **kwargs):\n    return {1, 2}\n",
        "result_not_serializable",
        "not JSON-serializable",
    ),
    "unserializable-nan": (
        "agent:run",
        "def run(context, **kwargs):\n    return float('nan')\n",
        "result_not_serializable",
        "not JSON-serializable",
    ),
    "oversized-result": (
        "agent:run",
        "def run(context, **kwargs):\n    return 'x' * (1024 * 1024 + 1)\n",
        "result_too_large",
        "cap",
    ),
    "iteration-limit": (
        "agent:run",
        "def run(context, **kwargs):\n    while True:\n        context.next_iteration()\n",
        "agent_limit",
        "iteration",
    ),
    "exits-without-reporting": (
        "agent:run",
        "import os\ndef run(context, **kwargs):\n    os._exit(0)\n",
        "exited_before_result",
        "before reporting",
    ),
}


@pytest.mark.parametrize("name", list(FAILURES))
def test_each_failure_mode_has_its_own_error_code(
    host_state: HostState, make_agent: Callable[..., Path], name: str
) -> None:
    entrypoint, source, code, text = FAILURES[name]
    pack = make_agent("broken", source)
    manifest = pack / "agentnode.yaml"
    manifest.write_text(manifest.read_text().replace('"agent:run"', f'"{entrypoint}"'))
    host_state.install(pack)
    result = _run(host_state, "broken")
    assert not result.success and result.error_code == code, (result.error_code, result.error, result.logs)
    assert text in result.error
    assert result.mode_used == "agent_sandbox" and result.result is None
    (rec,) = host_state.audit()
    assert rec["action"] == "deny" and rec["run_id"] == result.run_id and rec["sandbox"] is True
    assert rec["reason"] == ("exited_before_result" if code == "exited_before_result" else "agent_error")
    assert "secret-agent-text" not in json.dumps(rec)


def test_bad_entrypoint_is_refused_before_any_container(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    """The host validates the entrypoint at install and again at run, so a bad one never reaches a sandbox."""
    with pytest.raises(ManifestError, match=r"agent\.entrypoint"):
        host_state.install(make_agent("bad-at-install", "", entrypoint="agent:run:extra"))
    host_state.install(make_agent("bad-in-lock", "def run(context, **kwargs):\n    return 1\n"))
    lock = host_state.dir / "agentnode.lock"
    data = json.loads(lock.read_text())
    data["packages"]["bad-in-lock"]["manifest"]["agent"]["entrypoint"] = "agent:run()"
    lock.write_text(json.dumps(data))
    result = _run(host_state, "bad-in-lock")
    assert not result.success and result.error_code == "manifest_invalid", (result.error_code, result.error)
    assert "agent.entrypoint" in result.error
    (rec,) = host_state.audit()
    assert rec["reason"] == "manifest_invalid" and rec["action"] == "deny"


# -- host tool packs -------------------------------------------------------------------------------------

TOOL_CALLER = """
import json
from sandbox_wrapper import AgentLimitExceeded


def run(context, calls=(), **kwargs):
    out = []
    for slug, tool_name, arguments in calls:
        try:
            r = context.run_tool(slug, tool_name, **arguments)
        except (PermissionError, AgentLimitExceeded) as exc:
            out.append({"raised": type(exc).__name__, "error": str(exc)})
            continue
        out.append({"success": r.success, "result": r.result, "error": r.error, "mode_used": r.mode_used})
    out.append({"try_tool": repr(context.try_tool(calls[0][0], calls[0][1], **calls[0][2]))})
    return out
"""


@pytest.mark.parametrize("trust", ["verified", "unverified"])
def test_community_toolpacks_run_in_a_tool_sandbox_never_on_the_host(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, trust: str
) -> None:
    """The same marker tools that write to a host file when trusted: as community code they run in the
    run's tool sandbox, where that host path does not exist, so the host file stays untouched."""
    log = _install_marker_tools(host_state, tmp_path, trust)
    host_state.install(
        make_agent("caller", TOOL_CALLER, extra="tool_access:\n  allowed_packages: [marker-tools]\n")
    )
    calls = [["marker-tools", "record", {"word": "hi"}]]
    result = _run(host_state, "caller", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    ran, tried = result.result
    assert ran == {"success": False, "result": None, "error": "tool raised FileNotFoundError",
                   "mode_used": "tool_sandbox"}
    assert tried["try_tool"].startswith("ToolResult(success=False")
    assert _log_lines(log) == []
    rec = host_state.audit()[0]
    assert rec["tool_calls"] == rec["tool_calls_tool_sandbox"] == 2 and rec["tool_refusals"] == 0
    assert rec["tool_sandboxes_started"] == 1


def test_arguments_are_checked_against_the_schema_before_the_tool_runs(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    log = _install_marker_tools(host_state, tmp_path, "trusted")
    # Refused calls are failed dispatches (format §4.4): a valid call between every two keeps the slug's
    # circuit breaker (3 failures) closed.
    host_state.install(
        make_agent("caller", TOOL_CALLER, extra="tool_access:\n  allowed_packages: [marker-tools]\n")
    )
    calls = [
        ["marker-tools", "record", {"word": 123}],
        ["marker-tools", "record", {}],
        ["marker-tools", "record", {"word": "fine"}],
        ["marker-tools", "record", {"word": "ok", "extra": 1}],
        ["marker-tools", "record", {"word": "x" * 11}],
        ["marker-tools", "record", {"word": "fine2"}],
    ]
    result = _run(host_state, "caller", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    first, second, valid, third, fourth, valid2, _tried = result.result
    invalid = [first, second, third, fourth]
    for refused in invalid:
        assert refused["success"] is False and refused["error"].startswith("TOOL_ARGUMENTS_INVALID:"), refused
    assert "123" not in json.dumps(invalid)  # values are never echoed back
    assert valid == {
        "success": True,
        "result": {"recorded": "fine"},
        "error": None,
        "mode_used": "host_worker",
    }
    assert valid2["result"] == {"recorded": "fine2"}
    assert _log_lines(log) == ["record fine", "record fine2"]  # only valid calls ran (try_tool repeats one)
    rec = host_state.audit()[0]
    assert rec["tool_calls"] == 2 and rec["tool_refusals"] == 5


def test_tool_name_selects_among_the_tools(host_state: HostState, make_agent: Callable[..., Path]) -> None:
    host_state.install(REPO / "examples" / "word-tools", trust="curated")
    host_state.install(
        make_agent("caller", TOOL_CALLER, extra="tool_access:\n  allowed_packages: [word-tools]\n")
    )
    text = {"text": "a b c"}
    calls = [
        ["word-tools", "count_words", text],
        ["word-tools", "reverse_words", text],
        ["word-tools", None, text],
        ["word-tools", "no_such_tool", text],
    ]
    result = _run(host_state, "caller", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    count, reverse, unnamed, unknown, _tried = result.result
    assert count["result"] == {"count": 3} and reverse["result"] == {"text": "c b a"}
    # word-tools' package entrypoint defines no `run`: no name, or an unknown one, finds no function (§3.3)
    for missed in (unnamed, unknown):
        assert missed["success"] is False and missed["error"].startswith("tool not found:"), missed
        assert "count_words" in missed["error"] and "reverse_words" in missed["error"]


def test_tool_arguments_named_timeout_or_mode_do_not_steer_the_runner(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    log = _install_marker_tools(host_state, tmp_path, "trusted")
    host_state.install(
        make_agent("caller", TOOL_CALLER, extra="tool_access:\n  allowed_packages: [marker-tools]\n")
    )
    calls = [
        # a 0.01 s "timeout" must not cut a 1.5 s tool short, and "mode" must not move it in-process
        ["marker-tools", "echo_controls", {"timeout": 0.01, "mode": "in_process", "sleep": 1.5}],
        ["marker-tools", "echo_controls", {"timeout": 0, "mode": "host"}],
    ]
    result = _run(host_state, "caller", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    slow, quick, _tried = result.result
    assert slow["success"] is True and slow["mode_used"] == "host_worker", slow
    assert {k: slow["result"][k] for k in ("timeout", "mode")} == {"timeout": 0.01, "mode": "in_process"}
    assert quick["success"] is True and quick["result"]["timeout"] == 0 and quick["result"]["mode"] == "host"
    assert slow["result"]["pid"] != os.getpid() and quick["result"]["pid"] != os.getpid()
    assert _log_lines(log) == ["echo_controls"] * 3
