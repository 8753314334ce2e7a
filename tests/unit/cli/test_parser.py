"""The command line (host/cli/parser.py): `--help` names every command."""

from __future__ import annotations

from tests.support.cli import cli


def test_help_exits_0_and_names_every_command(env: dict[str, str]) -> None:
    proc = cli(env, "--help")
    assert proc.returncode == 0
    for command in ("run", "install", "uninstall", "list", "init", "image", "doctor", "policy", "audit"):
        assert command in proc.stdout
