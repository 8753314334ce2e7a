"""The pinned image's boot bundle (sandbox_wrapper/_boot.py), seen from inside a real sandbox: the wrapper's
boot modules came from it, and it was put away before the agent's code was imported, under each runtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

AGENT = """
import sys

def run(context, **kwargs):
    import grpc
    import grpc._channel
    import typing
    import sandbox_wrapper._runner as runner
    return {
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
    host_state.install(make_agent("boot-bundle", AGENT))
    host = host_state.host()
    try:
        result = host.run("boot-bundle", runtime=runtime)
    finally:
        host.close()
    assert result.success, (result.error, result.logs)
    seen = result.result
    assert seen["grpc"] == seen["runner"] == seen["channel"] == seen["typing"] == "_BundledLoader"
    assert "_BundleFinder" not in seen["meta_path"]
    assert seen["mine"] == "SourceFileLoader"  # the pack's own module: found and read as usual
