"""Where the repository, its installed console script, its CLI reference and its dependency lock live."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin" / "agentnode-sandbox"
CLI_DOC = REPO / "docs" / "cli.md"
LOCK = REPO / "requirements" / "lock.txt"
