"""host.aio against a real admin server (a fake SandboxHost behind it): typed results and events, the error
mapping, and cancellation by task cancellation."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from host.aio import AsyncRunnerClient, RunFinished, RunLog, RunStarted
from host.api.server import build_admin_server
from host.core.errors import EngineError, InvalidRequest
from host.policy.caller import CallerInfo
from tests.unit.api.test_server import FakeHost


@pytest.fixture
def served() -> Iterator[tuple[FakeHost, Path]]:
    host = FakeHost()
    root = Path(tempfile.mkdtemp(prefix="an-aio-"))  # short: Unix socket paths are capped near 108 bytes
    socket = root / "s" / "admin.sock"
    server = build_admin_server(host, socket)  # type: ignore[arg-type]
    server.start()
    try:
        yield host, socket
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(root, ignore_errors=True)


def test_submit_and_stream_give_typed_results_and_events(served: tuple[FakeHost, Path]) -> None:
    host, socket = served

    async def main() -> tuple[object, list[object]]:
        async with AsyncRunnerClient(socket) as client:
            result = await client.submit("agent", goal="g", kwargs={"n": 1}, runtime="runc")
            events = [e async for e in client.stream("agent", caller=CallerInfo.parse(tenant="acme"))]
            return result, events

    result, events = asyncio.run(main())
    assert getattr(result, "success", None) is True and getattr(result, "result", None) == {"ok": True}
    assert events[0] == RunStarted("run-1")
    assert events[1:3] == [RunLog("run-1", "first line"), RunLog("run-1", "\x1b[31mred\x1b[0m")]
    assert isinstance(events[-1], RunFinished) and events[-1].result.run_id == "run-1" and len(events) == 4
    assert (host.runs[0]["goal"], host.runs[0]["kwargs"], host.runs[0]["runtime"]) == ("g", {"n": 1}, "runc")
    assert host.runs[1]["caller"].tenant == "acme"


def test_a_malformed_request_is_an_invalid_request_not_a_host_that_is_down(
    served: tuple[FakeHost, Path],
) -> None:
    host, socket = served

    async def main() -> None:
        async with AsyncRunnerClient(socket) as client:
            await client.submit("agent", runtime="kata")

    with pytest.raises(InvalidRequest) as info:
        asyncio.run(main())
    assert isinstance(info.value, ValueError) and str(info.value) == "runtime must be runc or runsc"
    assert host.runs == []


def test_nothing_answering_is_an_engine_error_with_the_fix(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncRunnerClient(tmp_path / "none.sock", connect_timeout=0.5) as client:
            await client.submit("agent")

    with pytest.raises(EngineError) as info:
        asyncio.run(main())
    assert "nothing answers" in str(info.value) and "agentnode-sandbox serve" in info.value.hint


@pytest.mark.parametrize(
    "slug",
    [
        "slow",  # the run has its id and goes on until the caller leaves
        "late",  # the run is still starting: no run id has been announced yet
    ],
)
def test_cancelling_the_task_cancels_the_run(served: tuple[FakeHost, Path], slug: str) -> None:
    host, socket = served

    async def main() -> None:
        async with AsyncRunnerClient(socket) as client:
            task = asyncio.create_task(client.submit(slug))
            while not host.runs:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert host.cancelled.wait(10)  # the host was told to cancel it (a late run once it had its id)


def test_a_client_built_outside_the_loop_opens_its_channel_in_the_loop_that_uses_it(
    served: tuple[FakeHost, Path],
) -> None:
    _, socket = served
    client = AsyncRunnerClient(socket)  # built where no loop runs, as a module-level client would be

    async def use() -> bool:
        try:
            return (await client.submit("agent")).success
        finally:
            await client.close()

    assert asyncio.run(use()) is True
    assert asyncio.run(use()) is True  # closed, then opened again in another loop
