"""One argument model for both clients and both calls (host/api/events.RunArgs, run_request): every field
reaches the wire the same way, and a keyword that is not a field is refused like a plain signature's."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest

from host._proto.agentnode.sandbox.v1 import runner_pb2
from host.api.aio import AsyncRunnerClient
from host.api.client import RunnerClient
from host.api.events import RunArgs, run_request
from host.policy.caller import CallerInfo, RunOverrides


def test_every_field_reaches_both_requests_alike() -> None:
    args: RunArgs = {
        "goal": "count",
        "kwargs": {"n": 3},
        "runtime": "runsc",
        "caller": CallerInfo.parse(tenant="acme", request_id="r-1"),
        "limits": RunOverrides(max_runtime_seconds=5),
    }
    submit = run_request(runner_pb2.SubmitRunRequest, "hello", args)
    stream = run_request(runner_pb2.StreamRunRequest, "hello", args)
    assert submit.SerializeToString(deterministic=True) == stream.SerializeToString(deterministic=True)
    assert (submit.slug, submit.goal, submit.runtime) == ("hello", "count", "runsc")
    assert json.loads(submit.kwargs_json) == {"n": 3}
    assert (submit.caller.tenant, submit.caller.request_id) == ("acme", "r-1")
    assert submit.limits.max_runtime_seconds == 5


def test_absent_fields_stay_unset() -> None:
    request = run_request(runner_pb2.SubmitRunRequest, "hello", {})
    assert not request.HasField("goal") and not request.HasField("caller") and not request.HasField("limits")
    assert (request.kwargs_json, request.runtime) == ("{}", "")


def test_a_keyword_that_is_no_field_is_a_type_error_before_anything_is_sent() -> None:
    with pytest.raises(TypeError, match="'gaol'"):
        run_request(runner_pb2.SubmitRunRequest, "hello", {"gaol": "typo"})  # type: ignore[typeddict-unknown-key]
    client = RunnerClient("/nonexistent/admin.sock", connect_timeout=0.1)
    try:
        with pytest.raises(TypeError, match="'gaol'"):
            client.submit("hello", gaol="typo")  # type: ignore[call-arg]
    finally:
        client.close()

    async def follow() -> None:
        async with AsyncRunnerClient("/nonexistent/admin.sock", connect_timeout=0.1) as aclient:
            async for _ in aclient.stream("hello", gaol="typo"):  # type: ignore[call-arg]
                pass

    with pytest.raises(TypeError, match="'gaol'"):
        asyncio.run(follow())


def test_both_clients_take_the_same_arguments() -> None:
    def shape(method: object) -> list[tuple[str, object]]:
        return [(p.name, p.kind) for p in inspect.signature(method).parameters.values()]  # type: ignore[arg-type]

    assert shape(RunnerClient.submit) == shape(AsyncRunnerClient.submit)
    assert shape(RunnerClient.stream) == shape(AsyncRunnerClient.stream)


def test_a_files_request_and_a_reports_files_cross_the_wire_unchanged() -> None:
    from pathlib import Path

    from host.api.events import files_message, files_request, result_from
    from host.api.server import report_from
    from host.files.run import FilesRequest
    from host.runtime.result import RunResult

    request = FilesRequest(workspace=Path("/p"), export_patch=Path("/x.patch"),
                           inputs=(("a", Path("/a")), ("b", b"\x00\xff")), output_dir=Path("/o"))  # fmt: skip
    wire = run_request(runner_pb2.SubmitRunRequest, "s", {"files": request})
    assert files_request(wire.files) == request and files_message(request) == wire.files
    assert not run_request(runner_pb2.SubmitRunRequest, "s", {"files": FilesRequest()}).HasField("files")
    files = {"workspace": {"files": 2, "digest": "a" * 64}, "changes": {"paths": [{"path": "ä.txt"}]}}
    back = result_from(report_from(RunResult(True, result=1, files=files)))
    assert back.files == files and result_from(report_from(RunResult(True, result=1))).files is None
