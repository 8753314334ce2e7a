"""An agent's output in its result: all of what it wrote before returning, as written, on every path, and
the per-run end-of-output marks that say so never in it, even when the engine's followed stream ends short."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host.engine.http import EngineClient, LogStream
from tests.support.host_state import HostState

pytestmark = [pytest.mark.docker, pytest.mark.podman]

CHATTY = """
import os, sys
def run(context, n=3, **kwargs):
    for i in range(n):
        print(f"out {i}", flush=(i % 2 == 0))
        print(f"err {i}", file=sys.stderr)
    os.write(1, b"raw\\0bytes ")
    print("no line end", end="")  # still buffered when the agent returns
    return n
"""
EXPECTED_OUT = "".join(f"out {i}\n" for i in range(3))
EXPECTED_ERR = "".join(f"err {i}\n" for i in range(3))


class ShortFollow(EngineClient):
    """The real engine client, except that a followed log gives only its first frame and then ends, as
    Podman's sometimes does (containers/podman#21914): the host must get the rest from the engine."""

    def __init__(self, real: EngineClient, follows: list[int]) -> None:
        self.__dict__.update(real.__dict__)
        self._follows = follows

    def logs(self, container: str, *, follow: bool = True) -> LogStream:
        stream = super().logs(container, follow=follow)
        if not follow:
            return stream
        self._follows.append(1)
        return _FirstFrame(stream)  # type: ignore[return-value]


class _FirstFrame:
    def __init__(self, stream: LogStream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        try:
            for frame in self._stream:
                yield frame
                return
        finally:
            self._stream.close()


def kept_as_written(logs: str) -> None:
    """Every piece the agent wrote, each stream in its own order, and nothing of the marks (the engine may
    interleave the two streams anywhere between writes)."""
    assert "agentnode:end-of-output" not in logs and "\0agentnode" not in logs, logs
    assert "".join(re.findall(r"out \d\n", logs)) == EXPECTED_OUT, logs
    assert "".join(re.findall(r"err \d\n", logs)) == EXPECTED_ERR, logs
    assert "raw\0bytes " in logs and "no line end" in logs, logs
    assert len(logs) == len(EXPECTED_OUT + EXPECTED_ERR + "raw\0bytes no line end"), logs


def test_a_result_carries_all_the_agents_output_and_never_the_marks(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    host_state.install(make_agent("chatty", CHATTY))
    host = host_state.host()
    try:
        results = [host.run("chatty", runtime=runtime) for _ in range(3)]
    finally:
        host.close()
    for result in results:
        assert result.success and result.result == 3, (result.error_code, result.error)
        kept_as_written(result.logs)


def test_a_followed_stream_that_ends_short_is_completed_from_the_engines_log(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    host_state.install(make_agent("chatty", CHATTY))
    follows: list[int] = []
    short = ShortFollow(host_state.engine, follows)
    lines: list[str] = []
    host: Any = host_state.host(client_factory=lambda: short)
    try:
        result = host.run("chatty", runtime=runtime, on_log=lines.append)
    finally:
        host.close()
    assert follows, "the run's output was not followed through the short client"
    assert result.success and result.result == 3, (result.error_code, result.error)
    kept_as_written(result.logs)
    # the live lines got the recovered output too, before the result
    err = [line for line in lines if line.startswith("err ")]
    assert err == EXPECTED_ERR.splitlines(), (lines, result.logs)
