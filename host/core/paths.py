"""Where the host's config file is, from the environment with `os.path` alone: `config_paths` derives every
other path from it, and a cold run finds its head start's record with it before its other imports."""

from __future__ import annotations

import os
from collections.abc import Mapping

CONFIG_ENV = "AGENTNODE_CONFIG"
"""A config directory, or a `.json` file; absent: `~/.agentnode/config.json`."""
ADMIN_SOCKET_NAME = "agentnode-admin.sock"
"""A `serve` host's admin socket, beside the config: with one there, `run` submits to it."""


def config_file_location(env: Mapping[str, str]) -> str:
    """The config file's path: AGENTNODE_CONFIG (a directory, or a file ending in .json), else
    `$HOME/.agentnode/config.json`."""
    override = env.get(CONFIG_ENV, "").strip()
    if override:
        target = os.path.expanduser(override)
        return target if os.path.basename(target).endswith(".json") else os.path.join(target, "config.json")
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".agentnode", "config.json")


__all__ = ["ADMIN_SOCKET_NAME", "CONFIG_ENV", "config_file_location"]
