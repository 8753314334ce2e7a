"""`completion bash|zsh` (host/cli/completion.py): what bash completes with the generated script."""

from __future__ import annotations

from pathlib import Path

import pytest


def _complete(script: str, words: list[str], env: dict[str, str] | None = None) -> list[str]:
    """What bash completes for `words` (the last one being typed) with the generated script."""
    import shlex
    import subprocess

    line = " ".join(shlex.quote(w) for w in words)
    program = f"""{script}
COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}
_agentnode_sandbox
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, env=env)
    return sorted(w for w in out.stdout.split("\n") if w)


def test_the_completion_script_completes_commands_options_and_installed_slugs(
    in_process: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "run" in _complete(script, ["agentnode-sandbox", "r"])
    assert _complete(script, ["agentnode-sandbox", "image", "b"]) == ["build"]
    assert "--max-tool-calls" in _complete(script, ["agentnode-sandbox", "run", "--max-t"])
    assert _complete(script, ["agentnode-sandbox", "policy", "e"]) == ["explain"]
    # Slugs come from `list --json`, asked when completing: a fake command on PATH stands in for it.
    fake = tmp_path / "bin"
    fake.mkdir()
    listing = '[{"slug": "hello-agent"}, {"slug": "word-tools"}]'
    (fake / "agentnode-sandbox").write_text(f"#!/bin/sh\necho '{listing}'\n")
    (fake / "agentnode-sandbox").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    assert _complete(script, ["agentnode-sandbox", "run", "hel"], env) == ["hello-agent"]
    assert _complete(script, ["agentnode-sandbox", "serve", "hel"], env) == []  # serve takes no slug
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out.startswith("autoload -U +X bashcompinit && bashcompinit\n")
