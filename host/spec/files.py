"""Files in and out of a run (`agent_sandbox.filesystem`): which filesystem levels the operator grants, the
bounds every snapshot, input, artifact and change set is held to, and the one check of a path's name.

A name comes from a caller's directory or from a hostile agent; either way it is judged before any work is
done on it, as bytes: one that is not a relative path of UTF-8 components free of control characters (or
longer, deeper, or made of `.`/`..`) is refused with a fixed reason and never printed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from host.spec.sections import Fail, numbers, section

FS_LEVELS = ("none", "temp", "workspace_read", "workspace_write", "any")
"""`permissions.filesystem.level` as packs declare it (agentnode-format.md §1.6)."""
GRANTABLE_LEVELS = ("workspace_read", "workspace_write", "temp")
"""What the operator may grant; `any` asks for the most this host gives, `workspace_write`."""

MAX_NAME_BYTES = 255
"""One path component, as on every Linux filesystem."""


@dataclass(frozen=True)
class FileLimits:
    """Bounds of what crosses the boundary in one run (`agent_sandbox.filesystem.limits`)."""

    max_files_in: int = 20_000
    """Entries (files, directories, links) a workspace snapshot and the inputs may carry in."""
    max_bytes_in: int = 1 << 30
    """Bytes of file content carried in."""
    max_files_out: int = 10_000
    """Entries a change set and the artifacts may bring back."""
    max_bytes_out: int = 512 << 20
    """Bytes of file content brought back."""
    max_file_bytes: int = 256 << 20
    """One file, either way (a sparse file counts its apparent size)."""
    max_path_bytes: int = 1024
    """A relative path, in UTF-8 bytes."""
    max_depth: int = 32
    """Directories a path may pass through."""


@dataclass(frozen=True)
class FilesConfig:
    """`agent_sandbox.filesystem`: the levels granted (default all three: nothing of the host's reaches a run
    unless its caller passes it, and nothing comes back unless the caller applies it) and the bounds."""

    allow: tuple[str, ...] = GRANTABLE_LEVELS
    limits: FileLimits = field(default_factory=FileLimits)


_SECTION_KEYS = ("allow", "limits")
_LIMIT_RANGES: dict[str, tuple[float, float]] = {
    "max_files_in": (0, 10_000_000), "max_bytes_in": (0, 2**40), "max_files_out": (0, 10_000_000),
    "max_bytes_out": (0, 2**40), "max_file_bytes": (0, 2**40), "max_path_bytes": (16, 4096),
    "max_depth": (1, 256),
}  # fmt: skip


def files_config(value: Any, key: str, fail: Fail) -> FilesConfig:
    """The `agent_sandbox.filesystem` section read and checked (`key` is its path, for errors)."""
    value = section(value, key, _SECTION_KEYS, fail)
    allow = value.get("allow")
    levels: tuple[str, ...]
    if allow is None:
        levels = GRANTABLE_LEVELS
    elif not isinstance(allow, list) or any(level not in GRANTABLE_LEVELS for level in allow):
        raise fail(f"{key}.allow", f"expected a list of {', '.join(GRANTABLE_LEVELS)}", allow)
    else:
        levels = tuple(level for level in GRANTABLE_LEVELS if level in allow)
    limits = FileLimits(**numbers(value.get("limits"), f"{key}.limits", _LIMIT_RANGES, fail))  # type: ignore[arg-type]
    return FilesConfig(allow=levels, limits=limits)


NAME_REFUSALS = (
    "name_empty",  # "" or a path ending in "/" where a file is meant
    "name_absolute",  # starts with "/"
    "name_dot",  # a "." or ".." component
    "name_nul",  # a NUL byte
    "name_not_utf8",  # bytes that are not UTF-8
    "name_control",  # a control, format (bidi, zero-width) or line-separator character
    "name_too_long",  # the whole path or one component over its bound
    "name_too_deep",  # more directories than max_depth
)
"""Why a path's name was refused (fixed; the name itself is never recorded)."""


def _bad_char(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in text)


_PLAIN = re.compile(rb"[\x20-\x7e]+")
"""Printable ASCII: most names, judged without a per-character Unicode lookup."""


def name_refusal(path: bytes | str, limits: FileLimits) -> str | None:
    """Why `path` (relative, `/`-separated) may not cross the boundary, or None when it may."""
    raw = path.encode("utf-8", "surrogateescape") if isinstance(path, str) else path
    if not raw:
        return "name_empty"
    if _PLAIN.fullmatch(raw) and not raw.startswith(b"/") and len(raw) <= limits.max_path_bytes:
        plain = raw.split(b"/")
        if b"" in plain:
            return "name_empty"
        if b"." in plain or b".." in plain:
            return "name_dot"
        if any(len(part) > MAX_NAME_BYTES for part in plain):
            return "name_too_long"
        return "name_too_deep" if len(plain) - 1 > limits.max_depth else None
    if raw.startswith(b"/"):
        return "name_absolute"
    if b"\0" in raw:
        return "name_nul"
    if len(raw) > limits.max_path_bytes:
        return "name_too_long"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "name_not_utf8"
    parts = text.split("/")
    if any(part == "" for part in parts):
        return "name_empty"
    if any(part in (".", "..") for part in parts):
        return "name_dot"
    if _bad_char(text):
        return "name_control"
    if any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        return "name_too_long"
    if len(parts) - 1 > limits.max_depth:
        return "name_too_deep"
    return None


__all__ = [
    "FS_LEVELS",
    "GRANTABLE_LEVELS",
    "MAX_NAME_BYTES",
    "NAME_REFUSALS",
    "FileLimits",
    "FilesConfig",
    "files_config",
    "name_refusal",
]
