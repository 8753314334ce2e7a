"""`python -m host` is the same command as `agentnode-sandbox`."""

from __future__ import annotations

from host._entry import entry

if __name__ == "__main__":
    entry()
