"""`python -m sandbox_wrapper` as a real subprocess against the fake host: one outcome per run, exit codes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2, session_pb2, tools_pb2
from tests.support.fake_host import FakeHost, Refusal, Served, make_task, serve

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
Code = session_pb2.AgentErrorCode


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


@pytest.fixture
def served(host: FakeHost) -> Iterator[Served]:
    running = serve(host)
    yield running
    running.stop()


def wrapper_env(socket_path: str, import_root: Path, preload: str | None = None) -> dict[str, str]:
    """Only the documented variables."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "AGENTNODE_SOCKET": socket_path,
        "AGENTNODE_IMPORT_ROOT": str(import_root),
        "PYTHONDONTWRITEBYTECODE": "1",  # the pack is read-only in the container; keep examples/ clean
        **({"AGENTNODE_PRELOAD": preload} if preload is not None else {}),
    }


def run_wrapper(
    socket_path: str, import_root: Path, preload: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The wrapper as the container runs it: a fresh interpreter with only the documented variables."""
    env = wrapper_env(socket_path, import_root, preload)
    return subprocess.run(
        [sys.executable, "-m", "sandbox_wrapper"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def run_agent(
    served: Served, tmp_path: Path, source: str, entrypoint: str = "agent:run", **task: Any
) -> subprocess.CompletedProcess[str]:
    """Write `source` as agent.py in a pack dir, script the task, and run the wrapper once."""
    (tmp_path / "agent.py").write_text(textwrap.dedent(source))
    served.host.task = make_task(entrypoint=entrypoint, **task)
    return run_wrapper(served.socket_path, tmp_path)


def completion(content: str) -> llm_pb2.CallLlmResponse:
    return llm_pb2.CallLlmResponse(content=content, finish_reason=llm_pb2.FINISH_REASON_STOP)


def value_of(host: FakeHost) -> Any:
    assert host.report.WhichOneof("outcome") == "value_json", host.report
    return json.loads(host.report.value_json)


def failure_of(host: FakeHost, proc: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    assert proc.returncode == 0, proc.stderr
    assert host.report.WhichOneof("outcome") == "failure", host.report
    message = host.report.failure.message
    assert "\n" not in message and 0 < len(message) <= 500
    return host.report.failure.code, message


def test_success_preserves_ints_floats_and_kwargs(served: Served, tmp_path: Path) -> None:
    proc = run_agent(
        served, tmp_path,
        """
        def run(context, n, big):
            return {"n": n, "half": n / 2, "one": 1.0, "big": big, "goal": context.goal}
        """,
        kwargs_json='{"n": 3, "big": 123456789012345678901234567890}',
    )
    assert proc.returncode == 0, proc.stderr
    assert served.host.fetches[0].protocol_version == PROTOCOL_VERSION
    value = value_of(served.host)
    assert value == {"n": 3, "half": 1.5, "one": 1.0, "big": 123456789012345678901234567890,
                     "goal": "count these words"}
    assert type(value["n"]) is int and type(value["one"]) is float


def test_the_hosts_mark_ends_each_output_stream_after_the_agent(served: Served, tmp_path: Path) -> None:
    mark = b"\0agentnode:end-of-output:" + b"ab" * 16 + b"\0"
    proc = run_agent(
        served, tmp_path,
        """
        import os, sys
        def run(context):
            print("buffered", end="")  # still in sys.stdout's buffer when the agent returns
            sys.stderr.write("err")
            os.write(1, b" raw")
            return 1
        """,
        output_mark=mark,
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == 1
    assert proc.stdout.encode() == b" rawbuffered" + mark  # flushed first: the mark comes after all of it
    assert proc.stderr.encode() == b"err" + mark


def test_without_a_mark_nothing_is_added_to_the_output(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    print('x')\n    return 1\n")
    assert proc.returncode == 0 and proc.stdout == "x\n" and proc.stderr == ""


def test_async_entrypoint_is_awaited(served: Served, tmp_path: Path) -> None:
    proc = run_agent(
        served, tmp_path,
        """
        import asyncio
        async def main(context):
            await asyncio.sleep(0)
            return ["async", context.run_id]
        """,
        entrypoint="agent:main",
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == ["async", "run-test"]


def test_module_without_function_calls_run(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    return None\n", entrypoint="agent")
    assert proc.returncode == 0, proc.stderr
    assert served.host.report.value_json == "null"


@pytest.mark.parametrize("entrypoint", ["", "agent:", "agent:run:x", "bad-name:run", "agent:not valid"])
def test_bad_entrypoint(served: Served, tmp_path: Path, entrypoint: str) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    return 1\n", entrypoint=entrypoint)
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_BAD_ENTRYPOINT
    assert repr(entrypoint) in message


def test_import_failure_names_the_module(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "import no_such_dependency_xyz\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_IMPORT_FAILED
    assert message == "cannot import 'agent': ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    assert "Traceback" in proc.stderr


def test_missing_module_is_an_import_failure(served: Served, tmp_path: Path) -> None:
    served.host.task = make_task(entrypoint="ghost.module:run")
    proc = run_wrapper(served.socket_path, tmp_path)
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_IMPORT_FAILED
    assert message.startswith("cannot import 'ghost.module': ModuleNotFoundError")


def test_syntax_error_is_an_import_failure(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    return (\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_IMPORT_FAILED
    assert message.startswith("cannot import 'agent': SyntaxError:")
    assert "line 2" in message


def test_the_wrapper_leaves_once_it_reported_whatever_the_agent_left_running(
    served: Served, tmp_path: Path
) -> None:
    """The outcome is fixed when it is reported: a thread the agent left behind does not keep the sandbox."""
    source = """
        import threading, time
        def run(context):
            threading.Thread(target=time.sleep, args=(120,)).start()  # not a daemon
            print("printed just before returning")
            return 1
    """
    t = time.monotonic()
    proc = run_agent(served, tmp_path, source)
    assert time.monotonic() - t < 30
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == 1
    assert "printed just before returning" in proc.stdout  # flushed before leaving


class MarkerHost(FakeHost):
    """A fake host that notes, when FetchTask arrives, whether the agent's module had already run."""

    marker: Path
    marker_at_fetch: list[bool]

    def FetchTask(self, request: session_pb2.FetchTaskRequest, context: Any) -> session_pb2.FetchTaskResponse:
        self.marker_at_fetch.append(self.marker.exists())
        return super().FetchTask(request, context)


@pytest.fixture
def marker_served(tmp_path: Path) -> Iterator[Served]:
    host = MarkerHost()
    host.marker, host.marker_at_fetch = tmp_path / "imported.log", []
    running = serve(host)
    yield running
    running.stop()


IMPORT_COUNTER = """
    import pathlib
    _log = pathlib.Path(__file__).with_name("imported.log")
    with _log.open("a") as f:
        f.write("imported\\n")
    def run(context):
        return len(_log.read_text().splitlines())
"""


def test_the_preloaded_module_is_imported_once_before_the_task(marker_served: Served, tmp_path: Path) -> None:
    """A warm member does its agent's imports while it waits: the task then finds the module loaded."""
    (tmp_path / "agent.py").write_text(textwrap.dedent(IMPORT_COUNTER))
    proc = run_wrapper(marker_served.socket_path, tmp_path, preload="agent")
    assert proc.returncode == 0, proc.stderr
    assert value_of(marker_served.host) == 1  # imported once, not again for the task
    assert marker_served.host.marker_at_fetch == [True]  # FetchTask came after the import


def test_without_a_preload_the_module_is_imported_after_the_task(
    marker_served: Served, tmp_path: Path
) -> None:
    (tmp_path / "agent.py").write_text(textwrap.dedent(IMPORT_COUNTER))
    proc = run_wrapper(marker_served.socket_path, tmp_path, preload="")
    assert proc.returncode == 0, proc.stderr
    assert value_of(marker_served.host) == 1
    assert marker_served.host.marker_at_fetch == [False]


def test_a_preload_that_fails_is_the_runs_import_failure(served: Served, tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("import no_such_dependency_xyz\n")
    proc = run_wrapper(served.socket_path, tmp_path, preload="agent")
    code, message = failure_of(served.host, proc)
    assert len(served.host.fetches) == 1  # the task was still fetched, and the failure is its outcome
    assert code == Code.AGENT_ERROR_CODE_IMPORT_FAILED
    assert message == "cannot import 'agent': ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    assert proc.stderr.count("Traceback") == 1


@pytest.mark.parametrize("preload", ["ghost", "other", "not a module", "../agent", "agent:run"])
def test_a_preload_of_anything_but_the_entrypoint_module_changes_nothing(
    served: Served, tmp_path: Path, preload: str
) -> None:
    (tmp_path / "other.py").write_text("raise SystemExit('other must not matter')\n")
    served.host.task = make_task(entrypoint="agent:run")
    (tmp_path / "agent.py").write_text("def run(context):\n    return 'ok'\n")
    proc = run_wrapper(served.socket_path, tmp_path, preload=preload)
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == "ok"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def other(context):\n    return 1\n", "module 'agent' has no 'run'"),
        ("run = 42\n", "module 'agent' has a non-callable 'run'"),
    ],
)
def test_missing_or_non_callable_function(served: Served, tmp_path: Path, source: str, expected: str) -> None:
    code, message = failure_of(served.host, run_agent(served, tmp_path, source))
    assert code == Code.AGENT_ERROR_CODE_ENTRYPOINT_NOT_FOUND
    assert message == expected


def test_exception_is_reported_with_type_and_message(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    raise ValueError('bad input\\nsecond line')\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_AGENT_EXCEPTION
    assert message == "ValueError: bad input second line"
    assert "Traceback" in proc.stderr and "ValueError" in proc.stderr


def test_long_exception_message_is_truncated(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    raise RuntimeError('x' * 5000)\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_AGENT_EXCEPTION
    assert message.startswith("RuntimeError: xxx") and message.endswith("…") and len(message) == 500


def test_system_exit(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "import sys\ndef run(context):\n    sys.exit(7)\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_SYSTEM_EXIT
    assert message == "SystemExit: exit code 7"


@pytest.mark.parametrize("exc", ["KeyboardInterrupt('stop')", "GeneratorExit()"])
def test_base_exception(served: Served, tmp_path: Path, exc: str) -> None:
    proc = run_agent(served, tmp_path, f"def run(context):\n    raise {exc}\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_BASE_EXCEPTION
    assert message.startswith(exc.partition("(")[0])


@pytest.mark.parametrize(
    ("result", "detail"),
    [("object()", "TypeError"), ("float('nan')", "ValueError"), ("{1: {2: set()}}", "set")],
)
def test_unserializable_result(served: Served, tmp_path: Path, result: str, detail: str) -> None:
    proc = run_agent(served, tmp_path, f"def run(context):\n    return {result}\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE
    assert message.startswith("result is not JSON-serializable:") and detail in message


def test_oversized_result(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    return 'é' * 600\n", max_result_bytes=1000)
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_RESULT_TOO_LARGE
    assert message == "result is 1202 bytes of JSON; the cap is 1000 bytes"


def test_result_exactly_at_the_cap_is_accepted(served: Served, tmp_path: Path) -> None:
    proc = run_agent(served, tmp_path, "def run(context):\n    return 'a' * 998\n", max_result_bytes=1000)
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == "a" * 998


def test_uncaught_agent_limit(served: Served, tmp_path: Path) -> None:
    proc = run_agent(
        served, tmp_path,
        """
        def run(context):
            while True:
                context.next_iteration()
        """,
    )
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_AGENT_LIMIT
    assert message == "AgentLimitExceeded: iteration limit reached (3)"


def test_existing_style_agent_runs_unchanged(served: Served, tmp_path: Path) -> None:
    served.host.tools.append(
        tools_pb2.RunToolResponse(
            success=True, result_json='{"count": 3}', tool_calls_made=1, tools_remaining=4
        )
    )
    served.host.llm.append(completion("Hello!"))
    proc = run_agent(
        served, tmp_path,
        """
        def run(context, **kwargs):
            steps = []
            while context.iteration < 2:
                context.next_iteration()
                steps.append(context.iteration)
            counted = context.run_tool("word-tools", "count_words", text=context.goal)
            text = context.call_llm_text([{"role": "user", "content": "hi"}])
            return {"ok": counted.success, "count": counted.result["count"], "text": text,
                    "steps": steps, "remaining": context.tools_remaining, "kwargs": kwargs}
        """,
        kwargs_json='{"extra": true}',
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {
        "ok": True, "count": 3, "text": "Hello!", "steps": [1, 2], "remaining": 4, "kwargs": {"extra": True},
    }


def test_missing_socket_exits_3_with_one_stderr_line(tmp_path: Path) -> None:
    proc = run_wrapper(str(tmp_path / "absent.sock"), tmp_path)
    assert proc.returncode == 3
    missing = tmp_path / "absent.sock"
    assert proc.stderr.splitlines() == [f"sandbox_wrapper: host socket {missing} does not exist"]


def test_a_wrapper_told_to_wait_for_its_socket_runs_once_it_appears(served: Served, tmp_path: Path) -> None:
    """On Kubernetes the node agent makes the socket only after it has verified the pod: the wrapper waits."""
    (tmp_path / "agent.py").write_text("def run(context, **kwargs):\n    return {'waited': True}\n")
    served.host.task = make_task(entrypoint="agent:run")
    hidden = Path(served.socket_path).with_name("not-yet.sock")
    os.rename(served.socket_path, hidden)  # the server keeps listening; the path is just not there yet
    env = {**wrapper_env(served.socket_path, tmp_path), "AGENTNODE_SOCKET_WAIT_SECONDS": "30"}
    proc = subprocess.Popen([sys.executable, "-m", "sandbox_wrapper"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # still waiting, not failed
        os.rename(hidden, served.socket_path)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert value_of(served.host) == {"waited": True}


@pytest.mark.parametrize("raw", ["0.2", "abc", "-5", "nan", ""])
def test_a_socket_that_never_appears_still_fails_with_one_line(tmp_path: Path, raw: str) -> None:
    env = {**wrapper_env(str(tmp_path / "absent.sock"), tmp_path), "AGENTNODE_SOCKET_WAIT_SECONDS": raw}
    proc = subprocess.run([sys.executable, "-m", "sandbox_wrapper"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 3
    missing = tmp_path / "absent.sock"
    assert proc.stderr.splitlines() == [f"sandbox_wrapper: host socket {missing} does not exist"]


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [(None, 0.0), ("", 0.0), ("x", 0.0), ("-1", 0.0), ("nan", 0.0), ("2.5", 2.5), ("inf", 600.0),
     ("1e9", 600.0)],
)  # fmt: skip
def test_the_socket_wait_is_parsed_and_bounded(raw: str | None, seconds: float) -> None:
    from sandbox_wrapper._runner import socket_wait_seconds

    assert socket_wait_seconds(raw) == seconds


def test_refused_fetch_exits_3(served: Served, tmp_path: Path) -> None:
    served.host.fetch_refusal = Refusal(grpc.StatusCode.FAILED_PRECONDITION, "TASK_ALREADY_FETCHED")
    proc = run_wrapper(served.socket_path, tmp_path)
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert line.startswith("sandbox_wrapper: FetchTask failed: FAILED_PRECONDITION: TASK_ALREADY_FETCHED")
    assert served.host.reports == []


def test_refused_report_exits_4(served: Served, tmp_path: Path) -> None:
    served.host.report_refusal = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_LARGE")
    proc = run_agent(served, tmp_path, "def run(context):\n    return 1\n")
    assert proc.returncode == 4
    assert proc.stderr.splitlines() == [
        "sandbox_wrapper: ReportResult failed: RESOURCE_EXHAUSTED: TOO_LARGE: refused by the fake host"
    ]


def agent_task(pack: Path, **overrides: Any) -> session_pb2.FetchTaskResponse:
    """The task a host would derive from an example pack's agentnode.yaml."""
    agent = yaml.safe_load((pack / "agentnode.yaml").read_text())["agent"]
    limits, llm = agent["limits"], agent.get("llm_access", {})
    fields: dict[str, Any] = {
        "entrypoint": agent["entrypoint"],
        "goal": agent["goal"],
        "system_prompt": agent.get("system_prompt", ""),
        "allowed_packages": agent["tool_access"]["allowed_packages"],
        "limits": session_pb2.RunLimits(**limits),
        "llm": session_pb2.LlmGrant(
            enabled=llm.get("enabled") is True,
            **{k: v for k, v in llm.items() if k.startswith("max_")},
        ),
    }
    return make_task(**{**fields, **overrides})


def test_hello_agent_example(served: Served) -> None:
    pack = EXAMPLES / "hello-agent"
    served.host.task = agent_task(pack, kwargs_json='{"name": "Ada"}')
    served.host.tools.append(
        tools_pb2.RunToolResponse(
            success=True, result_json='{"count": 9}', mode_used="host_worker",
            tool_calls_made=1, tools_remaining=9,
        )
    )
    served.host.llm.append(completion("Hello, Ada!"))
    proc = run_wrapper(served.socket_path, pack)
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {
        "run_id": "run-test",
        "goal": "Say hello and count the words of this goal",
        "refusals": [],
        "word_count": 9,
        "offered_tools": [],  # the fake host lists no tools: the model is offered none
        "model_tool_calls": [],
        "greeting": "Hello, Ada!",
        "tool_calls_made": 1,
        "tools_remaining": 9,
    }
    (tool_request,) = served.host.tool_requests
    assert (tool_request.package_slug, tool_request.tool_name) == ("word-tools", "count_words")
    assert json.loads(tool_request.arguments_json) == {"text": "Say hello and count the words of this goal"}
    ((system, user),) = served.host.llm_requests
    assert system == ("system", "You are a friendly agent. Answer in one short sentence.\n")
    assert user[0] == "user" and "Ada" in user[1]


def test_hello_agent_runs_the_tool_call_the_model_chooses(served: Served) -> None:
    pack = EXAMPLES / "hello-agent"
    served.host.task = agent_task(pack, kwargs_json='{"name": "Ada"}')
    served.host.tool_definitions.append(llm_pb2.ToolDefinition(
        name="word-tools:count_words", description="Count words.", parameters_json='{"type":"object"}'))
    for calls_made in (1, 2):
        served.host.tools.append(tools_pb2.RunToolResponse(
            success=True, result_json='{"count": 3}', mode_used="host_worker",
            tool_calls_made=calls_made, tools_remaining=10 - calls_made,
        ))
    call = llm_pb2.ToolCall(id="call_1", name="word-tools:count_words", arguments_json='{"text":"a b c"}')
    served.host.llm.append(llm_pb2.CallLlmResponse(
        finish_reason=llm_pb2.FINISH_REASON_TOOL_CALLS, tool_calls=[call]))
    served.host.llm.append(completion("Hello, Ada! The goal has 3 words."))
    proc = run_wrapper(served.socket_path, pack)
    assert proc.returncode == 0, proc.stderr
    value = value_of(served.host)
    assert value["refusals"] == [] and value["offered_tools"] == ["word-tools:count_words"]
    assert value["model_tool_calls"] == [
        {"tool": "word-tools:count_words", "arguments": '{"text":"a b c"}', "result": {"count": 3}}
    ]
    assert value["greeting"] == "Hello, Ada! The goal has 3 words."
    assert value["tool_calls_made"] == 2
    first, second = served.host.llm_calls
    assert [t.name for t in first.tools] == [t.name for t in second.tools] == ["word-tools:count_words"]
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "tool"]
    tool_message = second.messages[3]
    assert (tool_message.tool_call_id, json.loads(tool_message.content)) == ("call_1", {"count": 3})
    chosen = served.host.tool_requests[1]
    assert (chosen.tool_name, json.loads(chosen.arguments_json)) == ("count_words", {"text": "a b c"})


def test_hello_agent_records_refusals_instead_of_failing(served: Served) -> None:
    served.host.task = agent_task(EXAMPLES / "hello-agent")
    served.host.tools.append(Refusal(grpc.StatusCode.PERMISSION_DENIED, "TOOL_NOT_ALLOWED"))
    served.host.llm.append(Refusal(grpc.StatusCode.PERMISSION_DENIED, "LLM_NOT_GRANTED"))
    proc = run_wrapper(served.socket_path, EXAMPLES / "hello-agent")
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host)["refusals"] == [
        {"step": "tool", "error": "TOOL_NOT_ALLOWED: refused by the fake host"},
        {"step": "llm", "reason": "LLM_NOT_GRANTED"},
    ]


def test_raw_stubs_example_reads_reasons(served: Served) -> None:
    pack = EXAMPLES / "raw-stubs-agent"
    served.host.task = agent_task(pack)
    served.host.tools.append(
        tools_pb2.RunToolResponse(success=True, result_json='{"text": "goal"}', tools_remaining=1)
    )
    served.host.llm.append(Refusal(grpc.StatusCode.PERMISSION_DENIED, "LLM_NOT_GRANTED", "not declared"))
    proc = run_wrapper(served.socket_path, pack)
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {
        "tool": {"success": True, "result": {"text": "goal"}, "error": "", "tools_remaining": 1},
        "llm": {"status": "PERMISSION_DENIED", "reason": "LLM_NOT_GRANTED",
                "details": "LLM_NOT_GRANTED: not declared"},
    }
    (request,) = served.host.tool_requests
    assert json.loads(request.arguments_json) == {"text": "reverse the words of this goal"}


def test_word_tools_example_entrypoints_resolve() -> None:
    pack = EXAMPLES / "word-tools"
    tools = yaml.safe_load((pack / "agentnode.yaml").read_text())["capabilities"]["tools"]
    spec = importlib.util.spec_from_file_location("word_tools", pack / "src" / "word_tools" / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = {t["name"]: getattr(module, t["entrypoint"].partition(":")[2]) for t in tools}
    assert calls["count_words"](text="one two  three") == {"count": 3}
    assert calls["reverse_words"](text="one two  three") == {"text": "three two one"}


# --- strict JSON and the throttle reason on the wrapper side (red-team issue 12) -------------------------


@pytest.mark.parametrize("kwargs_json", ['{"n": 1e999}', '{"n": [-1e999]}', '{"n": NaN}'])
def test_non_finite_kwargs_never_reach_the_agent(served: Served, tmp_path: Path, kwargs_json: str) -> None:
    marker = tmp_path / "called"
    proc = run_agent(
        served, tmp_path, f"def run(context, n):\n    open({str(marker)!r}, 'w').close()\n    return n\n",
        kwargs_json=kwargs_json,
    )
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_AGENT_EXCEPTION and message.startswith("ValueError:")
    assert not marker.exists()


@pytest.mark.parametrize("result", ["float('inf')", "[-float('inf')]", "{'x': 1e308 * 10}"])
def test_non_finite_results_are_not_serializable(served: Served, tmp_path: Path, result: str) -> None:
    proc = run_agent(served, tmp_path, f"def run(context):\n    return {result}\n")
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE and "ValueError" in message


def test_a_result_deeper_than_the_host_accepts_is_not_serializable(served: Served, tmp_path: Path) -> None:
    nest = (
        "def run(context, depth):\n    value = []\n    for _ in range(depth - 1):\n"
        "        value = [value]\n    return value\n"
    )
    proc = run_agent(served, tmp_path, nest, kwargs_json='{"depth": 65}')
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE and "deeper than 64" in message


def test_a_result_64_deep_is_accepted(served: Served, tmp_path: Path) -> None:
    nest = (
        "def run(context):\n    value = ['[{\"}]']\n    for _ in range(63):\n"
        "        value = [value]\n    return value\n"
    )
    proc = run_agent(served, tmp_path, nest)
    assert proc.returncode == 0, proc.stderr
    value = value_of(served.host)
    for _ in range(63):
        value = value[0]
    assert value == ['[{"}]']  # brackets inside strings never count as nesting


def test_a_non_finite_tool_result_is_a_failed_result(served: Served, tmp_path: Path) -> None:
    served.host.tools.append(tools_pb2.RunToolResponse(success=True, result_json='{"x": 1e999}'))
    proc = run_agent(
        served, tmp_path,
        """
        def run(context):
            r = context.run_tool("word-tools", "count_words", text="a b")
            return {"success": r.success, "result": r.result, "error": r.error}
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {
        "success": False, "result": None, "error": "HOST_ERROR: the tool result is not strict JSON",
    }


def test_too_many_refusals_is_a_failed_tool_result_and_an_llm_error(served: Served, tmp_path: Path) -> None:
    throttled = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_REFUSALS", "wait and retry")
    served.host.tools.append(throttled)
    served.host.llm.append(throttled)
    proc = run_agent(
        served, tmp_path,
        """
        from sandbox_wrapper import LlmAccessError

        def run(context):
            r = context.run_tool("word-tools", "count_words", text="a b")
            try:
                context.call_llm("hi")
            except LlmAccessError as exc:
                return {"tool": [r.success, r.error], "llm": exc.reason}
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {
        "tool": [False, "TOO_MANY_REFUSALS: wait and retry"], "llm": "TOO_MANY_REFUSALS",
    }


# --- agents written for the agentnode runtime and for the seed sandbox run unchanged (issue 14) ----------


def test_seed_style_agent_reads_results_as_dicts_and_catches_runtime_error(
    served: Served, tmp_path: Path
) -> None:
    served.host.tools += [
        tools_pb2.RunToolResponse(success=True, result_json='{"count": 2}', mode_used="host_worker",
                                  tool_calls_made=1, tools_remaining=4),
        Refusal(grpc.StatusCode.PERMISSION_DENIED, "TOOL_NOT_ALLOWED", "not on the allowlist"),
    ]
    served.host.llm += [completion("Hi!"), Refusal(grpc.StatusCode.PERMISSION_DENIED, "LLM_NOT_GRANTED")]
    proc = run_agent(
        served, tmp_path,
        """
        def run(context, **kwargs):
            r = context.run_tool("word-tools", "count_words", text="a b")
            completion = context.call_llm([{"role": "user", "content": "hi"}])
            refused = []
            for call in (lambda: context.run_tool("shell-tools"), lambda: context.call_llm("again")):
                try:
                    call()
                except RuntimeError as exc:
                    refused.append(str(exc).split(":")[0])
            return {"ok": r["success"], "count": r.get("result", {}).get("count"), "raw": r,
                    "reply": completion["content"], "role": completion.get("role"), "refused": refused}
        """,
    )
    assert proc.returncode == 0, proc.stderr
    value = value_of(served.host)
    assert value["raw"].pop("duration_ms") >= 0
    assert value == {
        "ok": True, "count": 2, "reply": "Hi!", "role": "assistant",
        "raw": {"success": True, "result": {"count": 2}, "error": None, "mode_used": "host_worker",
                "timed_out": False, "run_id": None},
        "refused": ["TOOL_NOT_ALLOWED", "LLM_NOT_GRANTED"],
    }


def test_runtime_style_agent_uses_the_v1_surface(served: Served, tmp_path: Path) -> None:
    served.host.tools += [
        Refusal(grpc.StatusCode.PERMISSION_DENIED, "TOOL_NOT_ALLOWED"),
        tools_pb2.RunToolResponse(success=False, error="tool raised ValueError", mode_used="host_worker",
                                  tool_calls_made=1, tools_remaining=4),
        tools_pb2.RunToolResponse(success=True, result_json="3", mode_used="host_worker",
                                  tool_calls_made=2, tools_remaining=3),
    ]
    proc = run_agent(
        served, tmp_path,
        """
        from sandbox_wrapper import AgentLimitExceeded, AgentTerminated

        def run(context, **kwargs):
            out = {"refused": context.try_tool("shell-tools"), "iterations": 0}
            try:
                while True:
                    context.next_iteration()
                    out["iterations"] += 1
            except AgentLimitExceeded:
                pass
            r = context.run_tool_with_retry("word-tools", "count_words", backoff_base=0, text=context.goal)
            out.update(success=r.success, result=r.result, made=context.tool_calls_made,
                       remaining=context.tools_remaining, llm=context.llm,
                       tools=context.allowed_tool_context().allowed_packages,
                       health=context.tool_health("word-tools")["circuit_breaker"]["state"],
                       available=context.is_tool_available("word-tools"))
            return out
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {
        "refused": None, "iterations": 3, "success": True, "result": 3, "made": 2, "remaining": 3,
        "llm": None, "tools": ["word-tools"], "health": "closed", "available": True,
    }
    assert len(served.host.tool_requests) == 3  # the refused call, the failure and its one retry


def test_uncaught_termination_is_a_limit_outcome(served: Served, tmp_path: Path) -> None:
    served.host.tools += [
        tools_pb2.RunToolResponse(success=False, error="tool raised ValueError", mode_used="host_worker",
                                  tool_calls_made=n, tools_remaining=5 - n)
        for n in (1, 2, 3)
    ]
    proc = run_agent(
        served, tmp_path,
        """
        def run(context):
            while True:
                context.run_tool("word-tools", "count_words", text="x")
        """,
    )
    code, message = failure_of(served.host, proc)
    assert code == Code.AGENT_ERROR_CODE_AGENT_LIMIT
    assert message == (
        "AgentTerminated: stopped after 3 consecutive tool errors (last: tool raised ValueError)"
    )
    assert len(served.host.tool_requests) == 3


def test_async_entrypoint_uses_the_context_and_is_run_to_completion(served: Served, tmp_path: Path) -> None:
    served.host.tools.append(
        tools_pb2.RunToolResponse(
            success=True, result_json='{"count": 1}', tool_calls_made=1, tools_remaining=4
        )
    )
    served.host.llm.append(completion("async hello"))
    proc = run_agent(
        served, tmp_path,
        """
        import asyncio

        async def run(context, name="x"):
            counted = context.run_tool("word-tools", "count_words", text=name)
            await asyncio.sleep(0)
            text = await asyncio.to_thread(context.call_llm_text, "hi " + name)
            return {"count": counted["result"]["count"], "text": text, "name": name}
        """,
        kwargs_json='{"name": "Ada"}',
    )
    assert proc.returncode == 0, proc.stderr
    assert value_of(served.host) == {"count": 1, "text": "async hello", "name": "Ada"}
