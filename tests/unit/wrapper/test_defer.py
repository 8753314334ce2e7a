"""Deferred imports (sandbox_wrapper/_defer.py), each case in a fresh interpreter: what is deferred is not
run by the imports that name it, and the first use of it, in any of the ways code reaches a module, gets the
real one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

PRELUDE = """
import json, sys
from sandbox_wrapper import _defer
_defer.defer()
out = {}
"""


def _run(body: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-s", "-c", PRELUDE + body + "\nprint(json.dumps(out))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_importing_grpc_does_not_run_its_asyncio_api_until_it_is_used() -> None:
    out = _run(
        """
import grpc
from grpc import aio as early  # kept before any use: a placeholder
import grpc.aio
out["deferred"] = _defer.is_deferred("grpc.aio")
out["submodules"] = sorted(n for n in sys.modules if n.startswith("grpc.aio."))
out["channel"] = grpc.aio.insecure_channel.__module__  # first use
out["real"] = sys.modules["grpc.aio"] is grpc.aio and not _defer.is_deferred("grpc.aio")
out["forwards"] = early.insecure_channel is grpc.aio.insecure_channel
from concurrent.futures import ThreadPoolExecutor
out["sync_server"] = type(grpc.server(ThreadPoolExecutor(1))).__name__
"""
    )
    assert out["deferred"] is True
    assert out["submodules"] == []
    assert out["channel"] == "grpc.aio._channel"
    assert out["real"] is True
    assert out["forwards"] is True
    assert out["sync_server"] == "_Server"


@pytest.mark.parametrize(
    "use",
    [
        "from grpc.aio import AioRpcError as used",
        "import grpc.aio._call as used",  # a submodule: the real package is imported first
        "import grpc.aio; used = grpc.aio.AioRpcError",
    ],
)
@pytest.mark.parametrize("settled_by", ["_defer.settle()", "import colorsys  # any later import settles"])
def test_any_way_of_using_a_deferred_module_gets_the_real_one(use: str, settled_by: str) -> None:
    out = _run(
        f"""
import grpc
{settled_by}
{use}
import grpc.aio as final
out["name"] = getattr(used, "__name__", "")
out["real"] = not _defer.is_deferred("grpc.aio") and sys.modules["grpc.aio"] is final
out["package_attr"] = grpc.aio is final
out["run_once"] = sys.modules["grpc.aio._call"].AioRpcError is final.AioRpcError
"""
    )
    assert out["run_once"] is True
    assert out["name"] in {"AioRpcError", "grpc.aio._call"}
    assert out["real"] is True
    assert out["package_attr"] is True


def test_protobuf_messages_work_without_the_pure_python_message_module() -> None:
    out = _run(
        """
from sandbox_wrapper._proto.agentnode.sandbox.v1 import session_pb2
from google.protobuf.internal import api_implementation
msg = session_pb2.FetchTaskRequest(protocol_version=7)
again = session_pb2.FetchTaskRequest.FromString(msg.SerializeToString())
out["backend"] = api_implementation.Type()
out["deferred"] = _defer.is_deferred("google.protobuf.internal.python_message")
out["text_format_loaded"] = "google.protobuf.text_format" in sys.modules
out["value"] = again.protocol_version
out["text"] = str(again).strip()  # the text form imports text_format on its own
"""
    )
    assert out["backend"] == "upb"  # the case the deferral is for; the image's backend is checked inside
    assert out["deferred"] is True
    assert out["text_format_loaded"] is False
    assert out["value"] == 7
    assert out["text"] == "protocol_version: 7"


def test_threads_racing_for_the_first_use_share_one_real_module() -> None:
    out = _run(
        """
import threading, grpc
barrier = threading.Barrier(8)
seen = []
def use():
    barrier.wait()
    seen.append(id(grpc.aio.Channel))
threads = [threading.Thread(target=use) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
out["distinct"] = len(set(seen))
out["count"] = len(seen)
"""
    )
    assert out == {"distinct": 1, "count": 8}


def test_a_module_imported_before_defer_is_left_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-s", "-c",
         "import sys, grpc.aio\nfrom sandbox_wrapper import _defer\n_defer.defer()\n"
         "print(_defer.is_deferred('grpc.aio'), type(sys.modules['grpc.aio']).__name__, "
         "any(type(f).__name__ == '_DeferringFinder' for f in sys.meta_path))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["False", "module", "True"]  # the other name is still pending


def test_the_finder_leaves_once_every_name_was_placed() -> None:
    out = _run(
        """
import grpc
from sandbox_wrapper._proto.agentnode.sandbox.v1 import session_pb2
out["finders"] = [type(f).__name__ for f in sys.meta_path]
"""
    )
    assert "_DeferringFinder" not in out["finders"]


def test_the_wrappers_asyncio_stays_deferred_through_grpc_and_works_once_settled() -> None:
    out = _run(
        """
import sys
_defer.defer(("asyncio",))  # beside the prelude's: as the wrapper defers WRAPPER_DEFERRED
import grpc, grpc._channel
import sandbox_wrapper._runner as runner  # imports asyncio itself: the placeholder
import colorsys  # a later import does not settle a top-level placeholder (gRPC would run it)
out["deferred_after_boot"] = _defer.is_deferred("asyncio")
out["in_modules"] = type(sys.modules.get("asyncio")).__name__
_defer.settle()
out["after_settle"] = "asyncio" in sys.modules
import asyncio.subprocess  # a submodule first: the real package is imported for it
async def answer():
    return 42
out["run"] = runner.asyncio.run(answer())  # the wrapper's placeholder forwards to the real module
out["same"] = runner.asyncio.run is sys.modules["asyncio"].run and not _defer.is_deferred("asyncio")
"""
    )
    assert out == {
        "deferred_after_boot": True,
        "in_modules": "_Placeholder",
        "after_settle": False,
        "run": 42,
        "same": True,
    }


def test_a_kept_placeholder_of_a_package_gives_the_real_path_once_settled() -> None:
    out = _run(
        """
import pkgutil
_defer.defer(("asyncio",))
import sandbox_wrapper._runner as runner
try:
    import asyncio.subprocess  # before it is settled: refused loudly, never run twice
except ModuleNotFoundError as exc:
    out["before"] = "not a package" in str(exc)
_defer.settle()
out["path"] = any(m.name == "subprocess" for m in pkgutil.iter_modules(runner.asyncio.__path__))
"""
    )
    assert out == {"before": True, "path": True}


def test_a_settled_top_level_module_is_still_the_one_found_when_it_was_settled(tmp_path: Path) -> None:
    shadow = tmp_path / "root"
    shadow.mkdir()
    (shadow / "asyncio.py").write_text("raise ImportError('the shadow')\n")
    out = _run(
        f"""
_defer.defer(("asyncio",))
import sandbox_wrapper._runner as runner
_defer.settle()
sys.path.insert(0, {str(shadow)!r})  # as the pack's import root goes first after the wrapper's boot
import asyncio
async def answer():
    return 7
out["file"] = asyncio.__file__
out["run"] = runner.asyncio.run(answer())
out["finders"] = [type(f).__name__ for f in sys.meta_path]
"""
    )
    assert not out["file"].startswith(str(shadow)), out["file"]
    assert out["run"] == 7
    assert "_DeferringFinder" not in out["finders"]  # gone once its last name was imported
