"""The lock and the generated code agree with what runs them: generated gRPC and protobuf code never demands a
newer runtime than the sandbox image ships or pyproject.toml lets a user install, and the lock pins every
package exactly, with hashes, covering every range pyproject.toml asks for."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterable

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.paths import LOCK, REPO

GENERATED = (REPO / "sandbox_wrapper" / "_proto", REPO / "host" / "_proto")
IMAGE_PINS = REPO / "docker" / "requirements.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", re.MULTILINE)
_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.MULTILINE)


def pins(text: str) -> dict[str, Version]:
    """`name==version` lines of a requirements file (hashed or not), by canonical name."""
    return {canonicalize_name(name): Version(version) for name, version in _PIN.findall(text)}


def grpc_stamp(source: str) -> Version:
    """The grpcio version a generated *_pb2_grpc.py refuses to import below."""
    found = _GRPC_STAMP.findall(source)
    assert len(found) == 1, "a generated *_pb2_grpc.py has one GRPC_GENERATED_VERSION"
    return Version(found[0])


def protobuf_stamp(source: str) -> Version:
    """The protobuf runtime version a generated *_pb2.py validates against at import."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "ValidateProtobufRuntimeVersion"):  # fmt: skip
            major, minor, patch = (arg.value for arg in node.args[1:4] if isinstance(arg, ast.Constant))
            return Version(f"{major}.{minor}.{patch}")
    raise AssertionError("a generated *_pb2.py validates its protobuf runtime version")


def floor(project: dict[str, object], name: str) -> Version:
    """The lowest version of `name` that pyproject.toml's dependencies allow (its `>=` bound)."""
    deps = project["dependencies"]
    assert isinstance(deps, list)
    for line in deps:
        req = Requirement(line)
        if canonicalize_name(req.name) == name:
            lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
            assert lows, f"{name} in pyproject.toml has a lower bound"
            return min(lows)
    raise AssertionError(f"{name} is a dependency in pyproject.toml")


def too_new(stamps: dict[str, Version], available: dict[str, Version]) -> list[str]:
    """Each generated module whose stamp exceeds a runtime it must import under, said in one line."""
    return [f"{module} needs {stamp}, {where} provides {version}"
            for module, stamp in sorted(stamps.items())
            for where, version in sorted(available.items()) if stamp > version]  # fmt: skip


def _stamps(suffix: str, read: object) -> dict[str, Version]:
    assert callable(read)
    files = [path for root in GENERATED for path in sorted(root.rglob(f"*{suffix}"))]
    assert files, f"generated {suffix} files exist"
    return {str(path.relative_to(REPO)): read(path.read_text()) for path in files}


def _pyproject() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as fh:
        project: dict[str, object] = tomllib.load(fh)["project"]
    return project


@pytest.mark.parametrize("runtime, suffix, read", [
    ("grpcio", "_pb2_grpc.py", grpc_stamp),
    ("protobuf", "_pb2.py", protobuf_stamp),
])  # fmt: skip
def test_generated_code_never_demands_a_newer_runtime_than_the_image_or_pyproject_provides(
    runtime: str, suffix: str, read: object
) -> None:
    available = {"docker/requirements.txt": pins(IMAGE_PINS.read_text())[runtime],
                 "pyproject.toml's floor": floor(_pyproject(), runtime)}  # fmt: skip
    assert too_new(_stamps(suffix, read), available) == []


def test_a_stamp_above_either_runtime_is_named() -> None:
    stamps = {"x_pb2_grpc.py": Version("1.85.4"), "y_pb2_grpc.py": Version("1.85.1")}
    found = too_new(stamps, {"docker/requirements.txt": Version("1.85.3"),
                             "pyproject.toml's floor": Version("1.85.1")})
    assert found == ["x_pb2_grpc.py needs 1.85.4, docker/requirements.txt provides 1.85.3",
                     "x_pb2_grpc.py needs 1.85.4, pyproject.toml's floor provides 1.85.1"]  # fmt: skip


def test_the_stamps_are_read_from_generated_source() -> None:
    assert grpc_stamp("import grpc\nGRPC_GENERATED_VERSION = '1.90.0'\nGRPC_VERSION = grpc.__version__\n") \
        == Version("1.90.0")
    source = ("from google.protobuf import runtime_version as _runtime_version\n"
              "_runtime_version.ValidateProtobufRuntimeVersion(\n"
              "    _runtime_version.Domain.PUBLIC,\n    8,\n    1,\n    2,\n    '',\n    'x.proto'\n)\n")
    assert protobuf_stamp(source) == Version("8.1.2")


def test_the_locked_generator_made_the_committed_code() -> None:
    # scripts/codegen --check regenerates with the locked grpcio-tools; this says which pin to look at.
    locked = pins(LOCK.read_text())["grpcio-tools"]
    assert set(_stamps("_pb2_grpc.py", grpc_stamp).values()) == {locked}


def test_the_host_runs_the_grpc_and_protobuf_the_image_ships() -> None:
    lock, image = pins(LOCK.read_text()), pins(IMAGE_PINS.read_text())
    assert {name: lock[name] for name in image} == image


def _entries(text: str) -> Iterable[tuple[str, str]]:
    """(first line, whole entry) of each requirement in a pip-compile output."""
    for block in re.split(r"\n(?=\S)", text):
        head = block.split("\n", 1)[0]
        if head and not head.startswith("#"):
            yield head, block


def test_every_locked_package_is_pinned_exactly_with_a_hash() -> None:
    entries = list(_entries(LOCK.read_text()))
    assert len(entries) > 20
    for head, block in entries:
        assert _PIN.match(head), f"not an exact pin: {head}"
        assert "--hash=sha256:" in block, f"no hash: {head}"
    names = {canonicalize_name(_PIN.match(head)[1]) for head, _ in entries}  # type: ignore[index]
    assert {"pip", "setuptools", "pip-tools", "grpcio-tools"} <= names  # the installers are locked too
    assert "agentnode-sandbox" not in names  # the checkout itself is installed from source


def test_the_lock_satisfies_every_range_pyproject_asks_for() -> None:
    project, locked = _pyproject(), pins(LOCK.read_text())
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict) and isinstance(project["dependencies"], list)
    lines = [*project["dependencies"], *(line for group in extras.values() for line in group)]
    wanted = [Requirement(line) for line in lines]
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == "agentnode-sandbox":
            continue  # [dev] names the other extras through the project itself
        assert name in locked, f"{req} is not in {LOCK.name}: run scripts/lock"
        assert req.specifier.contains(locked[name], prereleases=True), \
            f"{LOCK.name} pins {name}=={locked[name]}, outside {req}: run scripts/lock"
