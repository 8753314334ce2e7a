"""The suite's optional extras are required, not half-present: pytest refuses to start without them, with
one error naming what is missing and the fix (tests/support/extras.py), and that list is pyproject's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support import extras
from tests.support.paths import REPO


def test_the_needed_extras_are_the_ones_the_dev_extra_brings() -> None:
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    (self_ref,) = [line for line in dev if line.startswith("agentnode-sandbox[")]
    brought = set(re.fullmatch(r"agentnode-sandbox\[(.*)\]", self_ref).group(1).split(","))  # type: ignore[union-attr]
    assert set(extras.NEEDED.values()) - {"dev"} == brought
    direct = {re.split(r"[<>=\[ ]", line)[0].replace("-", "_") for line in dev}
    assert {name for name, extra in extras.NEEDED.items() if extra == "dev"} <= direct


def test_this_environment_has_them_all() -> None:
    assert extras.missing() == []
    assert extras.problem() is None


def test_a_missing_one_is_named_with_its_extra_and_the_fix() -> None:
    message = extras.problem(lambda name: name not in ("openai", "kopf"))
    assert message is not None
    assert "missing: openai (llm), kopf (kubernetes)" in message
    assert "scripts/test" in message and "pip install -e '.[dev]'" in message


BLOCK = """\
import sys
class _Gone:
    def find_spec(self, name, path=None, target=None):
        if name == "kopf" or name.startswith("kopf."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, _Gone())
"""


def test_pytest_stops_at_once_with_that_message(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/unit/core"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error: nothing was collected or run
    assert "missing: kopf (kubernetes)" in out.stderr
    assert "collected" not in out.stdout
