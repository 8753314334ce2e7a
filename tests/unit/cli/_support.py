"""What the CLI's tests share: a private environment without an engine, packs, hostile text and its checks.

The subprocess tests run the installed console script from .venv with their own state directory and
DOCKER_HOST pointing at nothing, so no test here can touch a real engine. The --json outputs are checked
against the schema tables of docs/cli.md (parsed by tests/support/schema.py, also used by the integration
tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from host.core.errors import EngineError
from host.engine.errors import classify_engine_exception
from tests.support.packs import write_agent as write_pack

NO_ENGINE = "unix:///nonexistent/docker.sock"


def cli_env(root: Path, **extra: str) -> dict[str, str]:
    """A private environment: its own config dir and home, and no engine."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "LANG": "C.UTF-8",
        "AGENTNODE_CONFIG": str(root / "state"),
        "DOCKER_HOST": NO_ENGINE,
    }
    env.update(extra)
    return env


def write_agent(root: Path, slug: str, extra: str = "", source: str | None = None) -> Path:
    """An agent pack under `root` (by default it returns its goal); `extra` goes under `agent:`."""
    source = source or "def run(context, **kwargs):\n    return {'goal': context.goal}\n"
    return write_pack(root, slug, source, agent=extra)


def engine_error() -> EngineError:
    """What connecting to NO_ENGINE raises: the socket file does not exist."""
    return classify_engine_exception(FileNotFoundError(2, "No such file or directory"))


SPOOF_VERSION = "1.0.0 (agent, trust curated)\r\x1b[2K"
"""A version that, printed raw, makes an unverified pack read as curated."""


HOSTILE = "\x1b[2K\x1b[1A\x1b]0;pwned\x07\rok: fake (agent_sandbox)\x9b31m\u202etxt.exe\u2066\n\x00"
"""Erase the line, cursor up, retitle the window, overwrite with a fake ok:, 8-bit CSI, bidi, a newline."""
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e", "\u2066", "\x00")


def assert_terminal_safe(text: str, *, cr: bool = True) -> None:
    """No raw control, C1 or bidi character, and the hostile text is visible as escapes.

    `cr=False`: the text went through the wrapper's one-line summary of an exception, which already turned
    the CR (whitespace) into a space.
    """
    for ch in RAW:
        assert ch not in text, (ch, text)
    assert "\\x1b]0;pwned\\x07" in text and "\\u202e" in text and "\\x9b" in text
    assert ("\\rok: fake" if cr else "ok: fake") in text


def strict_json(text: str) -> Any:
    """Parse JSON as a strict reader would: NaN, Infinity and -Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)
