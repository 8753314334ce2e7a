"""The run server's ToolService: every tool refusal at its canonical status, the call cap atomic under
concurrency, non-finite arguments never reaching a tool."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from sandbox_wrapper._proto.agentnode.sandbox.v1 import tools_pb2
from tests.unit.runtime._support import Env, assert_refused, refused

# --- every refusal reason, through the wire ------------------------------------------------------------


def test_tool_refusals_map_to_their_canonical_status(env: Env) -> None:
    run = env.started(max_tool_calls=1)
    marker = str(env.tmp / "ran.txt")
    cases: list[tuple[str, grpc.RpcError]] = [
        ("TOOL_NOT_ALLOWED", refused(run.run_tool, "other-tools", "echo", {})),
        ("TOOL_NOT_FOUND", refused(run.run_tool, "ghost", "echo", {})),
        ("TOOL_NOT_FOUND", refused(run.run_tool, "word-tools", "nope", {})),
        ("TOOL_PACK_UNTRUSTED", refused(run.run_tool, "community-tools", "echo", {})),
        ("TOOL_ARGUMENTS_INVALID", refused(run.run_tool, "word-tools", "append", {"wrong": 1})),
        ("INVALID_REQUEST", refused(run.run_tool, "word-tools", "echo", "{not json")),
        ("INVALID_REQUEST", refused(run.run_tool, "", "echo", {})),
        ("TOO_LARGE", refused(run.run_tool, "word-tools", "echo", {"x": "y" * (1 << 20)})),
    ]
    ok = run.run_tool("word-tools", "append", {"path": marker})
    assert ok.success and json.loads(ok.result_json) == "appended"
    assert (ok.tool_calls_made, ok.tools_remaining, ok.mode_used) == (1, 0, "host_worker")
    cases.append(("TOOL_CALL_LIMIT", refused(run.run_tool, "word-tools", "append", {"path": marker})))
    for expected, err in cases:
        assert_refused(err, expected)
    assert Path(marker).read_text() == "ran\n"
    assert run.session.tools.refusals == len(cases)


def test_spent_time_budget_is_run_deadline(env: Env) -> None:
    run = env.started(deadline=time.monotonic() - 1)
    assert_refused(refused(run.run_tool, "word-tools", "echo", {}), "RUN_DEADLINE")


# --- concurrency: the cap is atomic across the wire ----------------------------------------------------


def test_fifty_concurrent_tool_calls_run_exactly_the_cap(env: Env) -> None:
    run = env.started(max_tool_calls=5)
    marker = env.tmp / "lines.txt"
    request = tools_pb2.RunToolRequest(
        package_slug="word-tools", tool_name="append", arguments_json=json.dumps({"path": str(marker)})
    )
    with futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: _outcome(run.tools.RunTool, request), range(50)))
    ok = [r for r in results if isinstance(r, tools_pb2.RunToolResponse)]
    refusals = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(ok) == 5 and all(r.success for r in ok) and len(refusals) == 45
    for err in refusals:
        assert_refused(err, "TOOL_CALL_LIMIT")
    assert marker.read_text() == "ran\n" * 5
    assert run.session.tools.calls_made == 5 and run.session.tools.refusals == 45


def _outcome(call: Callable[..., Any], request: Any) -> Any:
    try:
        return call(request, timeout=60)
    except grpc.RpcError as err:
        return err


# --- non-finite numbers never cross --------------------------------------------------------------------


@pytest.mark.parametrize("arguments", ['{"x": 1e999}', '{"x": [-1e999]}', '{"x": 1E309}', '{"x": -Infinity}'])
def test_non_finite_tool_arguments_never_reach_a_tool(env: Env, arguments: str) -> None:
    run = env.started()
    assert_refused(refused(run.run_tool, "word-tools", "echo", arguments), "INVALID_REQUEST")
    assert run.session.tools.calls_made == 0
