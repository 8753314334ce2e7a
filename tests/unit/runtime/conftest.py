"""Fixtures of the run server's tests (test_session, test_rpcwire, test_runserver*; the harness is
_support.py). A test module with a fixture of the same name (the `env` of test_rundir and test_prelaunch)
uses its own."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.tools.workers import ToolRunner
from tests.support.fake_llm import FakeLlmServer
from tests.unit.runtime._support import Env, write_toolpack


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    sock_dir = tempfile.mkdtemp(dir="/tmp", prefix="ses-")  # a Unix socket path must fit 108 bytes
    runner = ToolRunner()
    with FakeLlmServer() as fake_llm:
        e = Env(tmp=tmp_path, fake_llm=fake_llm, runner=runner, sock_dir=sock_dir)
        e.packs["word-tools"] = write_toolpack(tmp_path / "packs", "word-tools")
        e.packs["community-tools"] = write_toolpack(tmp_path / "packs", "community-tools", trust="unverified")
        try:
            yield e
        finally:
            for run in e.runs:
                run.channel.close()
                run.server.stop(grace=None).wait(5)
            runner.close()
            shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request types the run servers decoded (our own decoding step, counted)."""
    from host.runtime import runserver as _runserver

    seen: list[str] = []
    real = _runserver.decode

    def counting(message_type: Any, raw: bytes, max_fields: int) -> Any:
        seen.append(str(message_type.DESCRIPTOR.name))
        return real(message_type, raw, max_fields)

    monkeypatch.setattr(_runserver, "decode", counting)
    return seen
