"""The sdist and wheel work on their own: the wheel, built from the sdist alone and installed into a fresh
virtual environment outside the checkout, builds the pinned image from the inputs it ships and runs an agent
sandboxed with its console script."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import docker
import pytest

from tests.support.packs import write_agent
from tests.support.paths import LOCK, REPO

AGENT = """
    import sys

    def run(context, **kwargs):
        return {"goal": context.goal, "python": sys.executable}
"""


def _run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 900.0) -> str:
    proc = subprocess.run(args, check=False, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args[:3]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.docker
def test_an_installed_wheel_builds_the_image_and_runs_a_sandboxed_agent(
    tmp_path: Path, pinned_image: str, docker_client: docker.DockerClient
) -> None:
    dist, env_dir, config, work = (tmp_path / d for d in ("dist", "venv", "config", "work"))
    work.mkdir()
    # A clean environment: nothing of the checkout on sys.path, the host state in the temp directory.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "AGENTNODE_CONFIG": str(config), "AGENTNODE_AGENT_SANDBOX": "1"}  # fmt: skip
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "DOCKER_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    # The sdist first, then the wheel built from the sdist alone: both must stand without the checkout.
    build_sdist = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    sdist = dist / _run([sys.executable, "-c", build_sdist], env={**env, "HOME": str(tmp_path)},
                        cwd=REPO).strip().splitlines()[-1]  # fmt: skip
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (source,) = (tmp_path / "unpacked").iterdir()
    assert (source / "host" / "_image_inputs" / "Dockerfile").is_file()  # real files, not the symlink
    # Built with the locked setuptools (an isolated build would fetch the index's newest), and installed
    # with the locked versions of its dependencies (hash-checked: the lock's hashes make pip require them),
    # pip itself included, by the locked pip: nothing here floats with the index.
    pip_env = {**env, "HOME": os.environ.get("HOME", str(tmp_path))}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
          str(source)], env={**pip_env, "PYTHONWARNINGS": "ignore"}, cwd=work)  # fmt: skip
    (wheel,) = dist.glob("agentnode_sandbox-*.whl")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, cli = env_dir / "bin" / "python", env_dir / "bin" / "agentnode-sandbox"
    wanted = work / "wanted.txt"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    wanted.write_text(f"agentnode-sandbox @ {wheel.as_uri()} --hash=sha256:{digest}\npip\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--only-binary=:all:",
          "-r", str(wanted), "-c", str(LOCK)], env=pip_env, cwd=work)  # fmt: skip

    probe = "import host, sandbox_wrapper; print(host.__file__, sandbox_wrapper.__file__)"
    where = _run([str(python), "-c", probe], env=env, cwd=work)
    assert all(p.startswith(str(env_dir)) for p in where.split()), where  # the wheel's code, not ours
    assert _run([str(cli), "--version"], env=env, cwd=work).startswith("agentnode-sandbox ")
    meta = _run([str(python), "-c", "import importlib.metadata as m; "
                 "print(m.metadata('agentnode-sandbox').as_string())"], env=env, cwd=work)  # fmt: skip
    assert "Project-URL: Homepage, https://agentnode.net" in meta
    assert "Classifier: Typing :: Typed" in meta and "Provides-Extra: anthropic" in meta

    built = _run([str(cli), "image", "build", "--json"], env=env, cwd=work)
    image = json.loads(built)
    # The wheel ships the very inputs of the checkout: the same image, found up to date, not rebuilt.
    assert image["image_id"] == pinned_image, built

    pack = write_agent(work, "wheel-probe", AGENT, goal="from the wheel")
    slug = "wheel-probe"
    _run([str(cli), "install", str(pack), "--trust", "unverified", "--json"], env=env, cwd=work)
    try:
        out = json.loads(_run([str(cli), "run", slug, "--json"], env=env, cwd=work))
        assert out["success"] is True and out["mode_used"] == "agent_sandbox", out
        assert out["result"] == {"goal": "from the wheel", "python": "/usr/bin/python3"}  # inside the image
    finally:
        _run([str(cli), "uninstall", slug, "--json"], env=env, cwd=work)
