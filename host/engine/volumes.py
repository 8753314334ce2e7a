"""Pack volumes as a run stands on them: their names and the check that the one a run mounts is the installed
pack's. Apart from the install machinery (host.packs.install), so that a run does not import it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from host.core.errors import AuditReason, EngineNotFound, PackError
from host.engine.errors import engine_errors
from host.engine.http import EngineClient
from host.engine.labels import LABEL_ARTIFACT
from host.spec.lockfile import LockEntry

if TYPE_CHECKING:
    import docker


def volume_name(slug: str, version: str, digest: str) -> str:
    """Per-version volume name: slug + version + artifact hash prefix (the full hash is a label)."""
    safe_version = re.sub(r"[^A-Za-z0-9_.-]", "-", version)[:40]
    return f"agentnode-pack-{slug}-{safe_version}-{digest[:16]}"


def _volume_attrs(client: EngineClient | docker.DockerClient, name: str) -> dict[str, Any] | None:
    """The engine's description of volume `name` (from either client), or None when it has none."""
    try:
        with engine_errors():
            if isinstance(client, EngineClient):
                return client.inspect_volume(name)
            return dict(client.api.inspect_volume(name))
    except EngineNotFound:
        return None


def verify_volume(client: EngineClient | docker.DockerClient, entry: LockEntry) -> str:
    """Return the run's pack volume only if it exists and its label matches the lockfile; never create one.

    The label is what the volume holds: the artifact, plus the wheels the lockfile records for it
    (LockEntry.volume_digest), so a volume filled with other wheels, or an edited record, is stale.
    """
    digest = entry.volume_digest
    expected = volume_name(entry.slug, entry.version, digest)
    if not digest or not entry.sandbox_volume or entry.sandbox_volume != expected:
        raise PackError(
            f"the sandbox volume of {entry.slug} is missing or stale in the lockfile",
            reason=AuditReason.VOLUME_STALE if entry.sandbox_volume else AuditReason.VOLUME_MISSING,
            hint=f"reinstall it: agentnode-sandbox install <path-to-{entry.slug}>",
        )
    vol = _volume_attrs(client, expected)
    if vol is None:
        raise PackError(
            f"the sandbox volume of {entry.slug} is missing",
            reason=AuditReason.VOLUME_MISSING,
            hint=f"reinstall it: agentnode-sandbox install <path-to-{entry.slug}>",
        )
    if (vol.get("Labels") or {}).get(LABEL_ARTIFACT) != digest:
        raise PackError(
            f"the sandbox volume of {entry.slug} does not match the installed artifact",
            reason=AuditReason.VOLUME_STALE,
            hint=f"reinstall it: agentnode-sandbox install <path-to-{entry.slug}>",
        )
    return expected


__all__ = ["verify_volume", "volume_name"]
