"""The host path and the Docker path start the wrapper alike: one environment builder, the same arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from host.engine.contract import SOCKET_NAME
from host.engine.spec import container_spec
from host.runtime.backends.hostproc import HostSpec, host_command, host_wrapper_env
from host.runtime.rundir import RunDir

LOCATIONS = {"HOME", "PATH", "PYTHONPATH", "AGENTNODE_SOCKET", "AGENTNODE_IMPORT_ROOT"}
"""The only keys whose values may differ between backends: where things are."""


def _both(tmp_path: Path) -> tuple[dict[str, str], dict[str, str], list[str], list[str]]:
    spec = container_spec(
        image="sha256:" + "0" * 64, run_id="r" * 32, name="n", owner="o", slug="s", runtime="runc",
        pack_volume="v", import_root="/pack/sub", socket_dir=str(tmp_path),
    )  # fmt: skip
    rundir = RunDir(tmp_path)
    host = host_wrapper_env(
        rundir, HostSpec(slug="s", import_root="/packs/s/sub"), {"PATH": "/x/bin", "SECRET": "k"}
    )
    return spec["environment"], host, [*spec["entrypoint"], *spec["command"]], host_command()


def test_both_backends_build_the_same_environment(tmp_path: Path) -> None:
    docker_env, host_env, _, _ = _both(tmp_path)
    assert set(docker_env) == set(host_env)
    assert LOCATIONS <= set(host_env)
    same = {k: v for k, v in docker_env.items() if k not in LOCATIONS}
    assert same == {k: host_env[k] for k in same}
    assert same["AGENTNODE_FETCH_TIMEOUT"] == "0"  # the host alone bounds a run's time, on both paths
    assert "SECRET" not in host_env  # nothing of the host's own environment leaks in
    assert host_env["AGENTNODE_SOCKET"] == str(tmp_path / SOCKET_NAME)
    assert (docker_env["AGENTNODE_IMPORT_ROOT"], host_env["AGENTNODE_IMPORT_ROOT"]) == (
        "/pack/sub",
        "/packs/s/sub",
    )


def test_both_backends_run_the_wrapper_with_the_same_arguments(tmp_path: Path) -> None:
    _, _, docker_cmd, host_cmd = _both(tmp_path)
    assert docker_cmd[1:] == host_cmd[1:] == ["-s", "-m", "sandbox_wrapper"]
    assert host_cmd[0] == sys.executable


def test_the_host_environment_imports_the_wrapper(tmp_path: Path) -> None:
    """Not just equal dicts: the host environment really finds this checkout's wrapper package."""
    _, host_env, _, _ = _both(tmp_path)
    probe = "import os, sandbox_wrapper; print(os.path.dirname(sandbox_wrapper.__file__))"
    out = subprocess.run(
        [sys.executable, "-s", "-c", probe],
        env=host_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(out.stdout.strip()) == Path(__file__).resolve().parents[3] / "sandbox_wrapper"
