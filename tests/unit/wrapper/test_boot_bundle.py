"""The wrapper's boot bundle (sandbox_wrapper/_boot.py) with this interpreter: the modules it serves are the
ones their files would give (same file, package path, resources), it steps aside when asked, and anything
that is not a bundle by this interpreter is ignored. The image's own is proven in tests/integration."""

from __future__ import annotations

import json
import marshal
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_wrapper import _boot

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import json, sys
from sandbox_wrapper import _boot
finder = _boot.install(sys.argv[1])
import grpc, sandbox_wrapper._runner
import importlib.resources
seen = {
    "installed": finder is not None,
    "grpc_loader": type(grpc.__spec__.loader).__name__,
    "grpc_file": grpc.__file__,
    "grpc_path": list(grpc.__path__),
    "runner_loader": type(sandbox_wrapper._runner.__spec__.loader).__name__,
    "resources": sorted(p.name for p in importlib.resources.files("grpc").iterdir())[:3],
}
_boot.uninstall(finder)
seen["after"] = [type(f).__name__ for f in sys.meta_path]
print(json.dumps(seen))
"""


def _probe(bundle: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-s", "-c", PROBE, str(bundle)], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("boot") / "_boot.bundle"
    done = subprocess.run([sys.executable, "-s", "-m", "sandbox_wrapper._boot", str(out)], cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    assert "modules in" in done.stdout
    return out


def test_the_boot_modules_come_from_the_bundle_as_their_files_would_give_them(bundle: Path) -> None:
    seen = _probe(bundle)
    plain = _probe(bundle.with_name("absent.bundle"))
    assert seen["installed"] and not plain["installed"]
    assert seen["grpc_loader"] == seen["runner_loader"] == "_BundledLoader"
    assert plain["grpc_loader"] == "SourceFileLoader"
    for same in ("grpc_file", "grpc_path", "resources"):
        assert seen[same] == plain[same], same
    assert "_BundleFinder" not in seen["after"]  # put away: the pack's imports are found as usual


def test_the_bundle_holds_the_wrapper_and_grpc(bundle: Path) -> None:
    version, modules = marshal.loads(bundle.read_bytes())
    assert version == sys.version
    for name in ("grpc", "grpc._channel", "google.protobuf.descriptor", "sandbox_wrapper._runner",
                 "sandbox_wrapper._context", "sandbox_wrapper._toolcalls", "sandbox_wrapper._llmcalls",
                 "sandbox_wrapper._types", "sandbox_wrapper._strictjson", "sandbox_wrapper._tool_server",
                 "typing"):  # fmt: skip
        assert name in modules, name
    origin, package, _ = modules["grpc"]
    assert package and origin.endswith("grpc/__init__.py")


@pytest.mark.parametrize("content", [b"", b"\x00garbage", marshal.dumps(("3.0.0 (other)", {})),
                                     marshal.dumps(("just", "wrong", "shape")), marshal.dumps([1, 2])])
def test_anything_but_a_bundle_by_this_interpreter_is_ignored(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "_boot.bundle"
    path.write_bytes(content)
    before = list(sys.meta_path)
    assert _boot.install(str(path)) is None
    assert sys.meta_path == before
    assert _boot.install(str(tmp_path / "missing")) is None
