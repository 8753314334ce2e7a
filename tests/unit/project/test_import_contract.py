"""The import contract (pyproject.toml's [tool.importlinter], run by scripts/lint) holds for the tree, and
breaks when a change adds an upward import, a circle, a Docker import in k8s or a reach into the wrapper:
each edit below is made to a copy of host/ and sandbox_wrapper/, never to the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy, before the checkout's editable install
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("host", "sandbox_wrapper"):
        shutil.copytree(REPO / name, tmp_path / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _add_import(root: Path, module: str, line: str) -> None:
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    text = path.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text
    path.write_text(text.replace(marker, marker + line + "\n", 1))


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    done = _lint(tree)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout and str(tree) not in done.stdout  # (the copy, under its own names)


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("host.core.vocab", "import host.cli.main", "host/'s packages import downward only"),
    ("host.spec.lockfile", "import host.packs.requirements", "host/'s packages import downward only"),
    ("host.engine.volumes", "import host.packs.install", "host/'s packages import downward only"),
    ("host.api.client", "import host.k8s.api", "host/'s packages import downward only"),
    ("host.core.vocab", "import host.core.errors", "no import circles"),
    ("host.k8s.objects.pod", "import host.engine.engine", "the Kubernetes backend never imports"),
    ("host.k8s.objects.pod", "import docker", "the Kubernetes backend never imports"),
    ("host.tools.gate", "import sandbox_wrapper._tool_exec", "only through sandbox_wrapper.protocol"),
    ("sandbox_wrapper._llm", "import host.core.vocab", "the in-container package never imports the host"),
])  # fmt: skip
def test_a_forbidden_edge_breaks_its_contract(tree: Path, module: str, line: str, broken: str) -> None:
    if "circles" in broken:  # a circle needs its other half: errors imports vocab
        assert "from host.core.vocab import" in (tree / "host" / "core" / "errors.py").read_text()
    _add_import(tree, module, line)
    done = _lint(tree)
    assert done.returncode == 1, done.stdout[-3000:]  # (an upward import also closes a circle: 2 broken)
    summary = " ".join(done.stdout.split("Broken contracts")[0].split())  # rows rich may have wrapped
    assert re.search(re.escape(broken) + r"(?:(?!KEPT).)*? BROKEN", summary), done.stdout[-3000:]
