"""The CLI tests' fixtures: a private environment for the console script, or for main() in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli._support import cli_env


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path)


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """main() in this process, with a private state directory and no engine; returns the state dir."""
    for key, value in cli_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    return Path(cli_env(tmp_path)["AGENTNODE_CONFIG"])
