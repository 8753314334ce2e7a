"""A lockfile's record of a pack's wheels, where a host copy keeps them, and what a volume holding them is
named by: read by every run, so apart from the resolver (host.packs.requirements), which a run never
imports."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+!-]{0,250}\.whl")
_SHA256 = re.compile(r"[0-9a-f]{64}")

VENV_DIR = ".agentnode-venv"
"""Under a trusted toolpack's host copy: its own virtual environment (the run path starts its python)."""


@dataclass(frozen=True)
class Wheel:
    """One resolved wheel as the lockfile records it."""

    filename: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"filename": self.filename, "sha256": self.sha256}


def identity(artifact_hash: str, wheels: Iterable[Wheel]) -> str:
    """What a volume or host copy holds: the pack's files plus these wheels (the artifact hash when none)."""
    ordered = sorted(wheels, key=lambda w: w.filename)
    if not ordered:
        return artifact_hash
    h = hashlib.sha256(b"agentnode-requirements-v1\0" + artifact_hash.encode())
    for wheel in ordered:
        h.update(f"\0{wheel.filename}\0{wheel.sha256}".encode())
    return h.hexdigest()


def recorded_wheels(record: Any, key: str) -> tuple[Wheel, ...]:
    """The wheels a lockfile record lists for `key` ("sandbox" or "host"); () when there are none.

    Raises ValueError when the record is malformed (an edited lockfile): callers fail closed.
    """
    if record is None:
        return ()
    if not isinstance(record, dict):
        raise ValueError("requirements is not an object")
    part = record.get(key)
    if part is None:
        return ()
    wheels = part.get("wheels") if isinstance(part, dict) else None
    if not isinstance(wheels, list):
        raise ValueError(f"requirements.{key}.wheels is not a list")
    out: list[Wheel] = []
    for item in wheels:
        if not isinstance(item, dict):
            raise ValueError(f"requirements.{key}.wheels holds a non-object")
        filename, sha = item.get("filename"), item.get("sha256")
        if not (isinstance(filename, str) and _WHEEL_NAME.fullmatch(filename)):
            raise ValueError(f"requirements.{key}.wheels holds an invalid filename")
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            raise ValueError(f"requirements.{key}.wheels holds an invalid sha256")
        out.append(Wheel(filename, sha))
    return tuple(out)


__all__ = ["VENV_DIR", "Wheel", "identity", "recorded_wheels"]
