"""The pinned image's boot bundle (sandbox_wrapper/_boot.py), seen from inside a real sandbox: the wrapper's
boot modules came from it, and it was put away before the agent's code was imported, under each runtime;
what the wrapper defers (sandbox_wrapper/_defer.py) was not imported for it, and works when the agent
uses it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.host_state import HostState

pytestmark = [pytest.mark.docker, pytest.mark.podman]

AGENT = """
import sys

def run(context, **kwargs):
    import grpc
    import grpc._channel
    import typing
    import sandbox_wrapper._runner as runner
    from google.protobuf.internal import api_implementation
    from sandbox_wrapper import _defer
    deferred = {name: _defer.is_deferred(name) for name in _defer.WRAPPER_DEFERRED}
    loaded = sorted(
        n for n in sys.modules if n.startswith(("grpc.aio", "asyncio")) or n.endswith("python_message")
    )
    import grpc.aio._call  # a submodule first: the real package is imported for it, once
    return {
        "deferred": deferred,
        "loaded_before_use": loaded,
        "aio_works": grpc.aio.AioRpcError is grpc.aio._call.AioRpcError and callable(grpc.aio.server),
        "protobuf_backend": api_implementation.Type(),
        "grpc": type(grpc.__spec__.loader).__name__,
        "runner": type(runner.__spec__.loader).__name__,
        "channel": type(grpc._channel.__spec__.loader).__name__,  # imported as the run's channel opened
        "typing": type(typing.__spec__.loader).__name__,
        "meta_path": [type(f).__name__ for f in sys.meta_path],
        "mine": type(sys.modules[__name__].__spec__.loader).__name__,
    }
"""


def test_the_wrapper_boots_from_the_bundle_and_puts_it_away_before_the_agent(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    seen = host_state.run_once(make_agent("boot-bundle", AGENT), "boot-bundle", runtime)
    assert seen["grpc"] == seen["runner"] == seen["channel"] == seen["typing"] == "_BundledLoader"
    assert "_BundleFinder" not in seen["meta_path"]
    assert seen["mine"] == "SourceFileLoader"  # the pack's own module: found and read as usual


def test_what_the_wrapper_defers_is_not_imported_until_the_agent_uses_it(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    seen = host_state.run_once(make_agent("boot-defer", AGENT), "boot-defer", runtime)
    assert seen["protobuf_backend"] == "upb"  # the backend that never calls python_message
    assert seen["deferred"] == {
        "grpc.aio": True,
        "google.protobuf.internal.python_message": True,
        "asyncio": True,
    }
    assert seen["loaded_before_use"] == []
    assert seen["aio_works"] is True


ASYNC_AGENT = """
import asyncio
import sys

async def run(context, **kwargs):
    await asyncio.sleep(0)
    return {"loop": type(asyncio.get_running_loop()).__name__, "modules": "asyncio.subprocess" in sys.modules}
"""


def test_an_async_agent_runs_on_the_real_asyncio_the_wrapper_deferred(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    seen = host_state.run_once(make_agent("boot-async", ASYNC_AGENT), "boot-async", runtime)
    assert seen == {"loop": "_UnixSelectorEventLoop", "modules": True}


def test_a_pack_that_ships_an_asyncio_still_runs_on_the_standard_librarys(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    """As before asyncio was deferred (the wrapper had imported it at boot): the pack's import root comes
    first on sys.path, and PyPI's 2014 `asyncio` backport still appears in old requirement lists."""
    pack = make_agent("boot-shadow", ASYNC_AGENT)
    (pack / "asyncio.py").write_text("raise ImportError('the pack shadowed asyncio')\n")
    seen = host_state.run_once(pack, "boot-shadow", runtime)
    assert seen == {"loop": "_UnixSelectorEventLoop", "modules": True}
