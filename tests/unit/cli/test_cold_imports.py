"""What a command imports: commands that need no engine, no RPC and no provider load none of their
libraries, so `--help`, `--version` and `audit` answer at interpreter speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # a new interpreter per case

HEAVY = ("docker", "grpc", "google.protobuf", "openai", "anthropic", "prometheus_client", "yaml",
         "requests", "sandbox_wrapper._context", "importlib.metadata")

PROBE = """
import contextlib, io, json, sys
from host.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(json.loads(sys.argv[1]))
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def _loaded(args: list[str], config: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(config), "AGENTNODE_CONFIG": str(config)},
    )  # fmt: skip
    loaded: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (["--help"], ()),
        (["run", "--help"], ()),
        (["--version"], ("importlib.metadata",)),  # the version is the installed distribution's metadata
        (["audit", "--last", "1"], ()),
        (["audit", "verify"], ()),
        (["list"], ()),  # the lockfile alone: no engine, no YAML
        (["list", "--json"], ()),
    ],
)
def test_commands_load_only_what_they_use(args: list[str], allowed: tuple[str, ...], tmp_path: Path) -> None:
    assert set(_loaded(args, tmp_path)) <= set(allowed)


def test_the_probe_sees_a_heavy_import(tmp_path: Path) -> None:
    """The probe can fail: `uninstall` needs the engine (to remove the pack's volume), so loads its SDK."""
    assert "docker" in _loaded(["uninstall", "nothing-here"], tmp_path)
