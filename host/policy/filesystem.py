"""A pack's filesystem grant: the level it declares (`permissions.filesystem.level`) as far as the operator's
`agent_sandbox.filesystem.allow` grants it. A level the config does not grant refuses the run, naming the key;
a pack that declares none gets no workspace and no scratch beyond what every sandbox has."""

from __future__ import annotations

from dataclasses import dataclass

from host.spec.files import FS_LEVELS, FilesConfig

ALLOW_KEY = "agent_sandbox.filesystem.allow"


@dataclass(frozen=True)
class FilesystemGrant:
    """What a sandbox running one pack's code gets of a run's files."""

    level: str
    """The level the pack declared (`any` included), as its manifest says it."""
    workspace: str = "none"
    """The run's workspace: "none", "read" (the snapshot, read-only) or "write" (the run's own copy)."""
    temp: bool = False
    """A private writable scratch of bounded size."""

    @property
    def needed(self) -> str | None:
        """The grantable level this grant stands for (what `allow` must hold), None for none."""
        if self.workspace == "write":
            return "workspace_write"
        if self.workspace == "read":
            return "workspace_read"
        return "temp" if self.temp else None


NO_FILES = FilesystemGrant("none")


class FilesystemRefused(ValueError):
    """The declared level is not granted by the operator's config; `message` and `hint` say so."""

    def __init__(self, level: str) -> None:
        self.level = level
        self.message = f"the pack declares permissions.filesystem {level}, which {ALLOW_KEY} does not grant"
        self.hint = f"add {_granting(level)} to {ALLOW_KEY} in the host config if packs may have it"
        super().__init__(self.message)


def _granting(level: str) -> str:
    return "workspace_write" if level == "any" else level


def filesystem_grant(level: str, config: FilesConfig) -> FilesystemGrant:
    """The grant for a pack declaring `level` (FS_LEVELS; anything else is read as none, which the manifest
    reader already refuses); FilesystemRefused when the operator's config does not grant it."""
    if level not in FS_LEVELS or level == "none":
        return NO_FILES
    if level == "temp":
        grant = FilesystemGrant(level, temp=True)
    elif level == "workspace_read":
        grant = FilesystemGrant(level, workspace="read")
    else:  # workspace_write, and `any`: the most this host gives is the run's own writable copy
        grant = FilesystemGrant(level, workspace="write", temp=True)
    if grant.needed not in config.allow:
        raise FilesystemRefused(level)
    return grant


__all__ = ["ALLOW_KEY", "NO_FILES", "FilesystemGrant", "FilesystemRefused", "filesystem_grant"]
