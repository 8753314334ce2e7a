"""The generated code's layout and the wire vocabulary it defines: the sandbox image carries no host-only
service, and the host's typed wire reasons are exactly errors.proto's."""

from __future__ import annotations

import re
from pathlib import Path

from host.core.vocab import WireReason
from sandbox_wrapper._proto.agentnode.sandbox.v1 import errors_pb2

REPO = Path(__file__).resolve().parents[3]


def _sources(package: str) -> list[Path]:
    """The package's files as they would ship (bytecode caches are never copied into the image)."""
    root = REPO / package
    return [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.relative_to(root).parts]


def test_no_runner_module_under_sandbox_wrapper() -> None:
    """runner.proto is the host's admin service: its generated code must never ship in the sandbox image,
    which copies the sandbox_wrapper package."""
    files = _sources("sandbox_wrapper")
    named = [p.relative_to(REPO).as_posix() for p in files if p.name.startswith("runner_pb2")]
    assert named == []
    texts = {p: p.read_text() for p in files if p.suffix in (".py", ".pyi")}
    mentions = [p.relative_to(REPO).as_posix() for p, text in texts.items() if "RunnerService" in text]
    assert mentions == []


def test_runner_modules_live_in_the_host_package() -> None:
    from host._proto.agentnode.sandbox.v1 import runner_pb2, runner_pb2_grpc

    assert runner_pb2.DESCRIPTOR.services_by_name["RunnerService"].full_name == (
        "agentnode.sandbox.v1.RunnerService"
    )
    assert hasattr(runner_pb2_grpc, "RunnerServiceStub")


def test_wire_reason_is_exactly_the_generated_error_reason() -> None:
    generated = {name.removeprefix("ERROR_REASON_") for name in errors_pb2.ErrorReason.keys()}
    assert {reason.value for reason in WireReason} == generated - {"UNSPECIFIED"}
    assert all(reason.name == reason.value for reason in WireReason)


def test_the_host_status_table_is_typed_and_total() -> None:
    from host.runtime import rpcwire as _rpcwire

    assert set(_rpcwire._STATUS) == set(WireReason)
    assert all(type(reason) is WireReason for reason in _rpcwire._STATUS)
    assert all(type(reason) is WireReason for reason in _rpcwire._UNMETERED)


def test_examples_import_only_public_modules() -> None:
    """Examples are what pack authors copy: no private module (a leading underscore) may appear in them."""
    examples = Path(__file__).resolve().parents[3] / "examples"
    sources = sorted(examples.rglob("*.py"))
    assert sources, "no example sources found"
    private = re.compile(r"^\s*(?:from|import)\s+(?:host|sandbox_wrapper)(?:\.\w+)*\._", re.M)
    offenders = {str(p.relative_to(examples)): private.findall(p.read_text()) for p in sources}
    assert not {k: v for k, v in offenders.items() if v}
    assert private.search("from sandbox_wrapper._proto.x import y")  # the check itself can fail
