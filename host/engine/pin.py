"""The pinned sandbox image as a run checks it: present, ours, speaking our protocol. Apart from the image
builder (host.engine.image), so that a run does not import it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from host.core.errors import AuditReason, EngineError, EngineRejected
from host.engine.errors import engine_errors
from host.engine.http import EngineClient
from host.engine.labels import LABEL_PROTOCOL
from sandbox_wrapper.protocol import PROTOCOL_VERSION

if TYPE_CHECKING:
    import docker

AnyClient: TypeAlias = "EngineClient | docker.DockerClient"
"""Image lookups serve the run path (our client) and the build and pull commands (the SDK's)."""

LABEL_INPUTS_HASH = "io.agentnode.sandbox.inputs-hash"
BUILD_HINT = "run `agentnode-sandbox image build` (it records the new pin)"

_ID_PIN = re.compile(r"sha256:[0-9a-f]{64}")
_DIGEST_PIN = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Image:
    """An image as the engine describes it: its inspect answer."""

    attrs: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.attrs.get("Id", ""))


def _get_image(client: AnyClient, ref: str) -> Image | None:
    """The local image for `ref`, or None when absent (or `ref` is not a valid reference); never pulls."""
    try:
        with engine_errors():
            if isinstance(client, EngineClient):
                attrs = client.inspect_image(ref)
            else:
                attrs = client.api.inspect_image(ref)
    except EngineRejected as exc:
        if exc.status in (400, 404):
            return None
        raise
    return Image(dict(attrs))


def _labels(image: Image) -> dict[str, str]:
    return dict((image.attrs.get("Config") or {}).get("Labels") or {})


def _matches_pin(image: Image, pin: str) -> bool:
    if _ID_PIN.fullmatch(pin):
        return bool(image.id == pin)
    return pin in (image.attrs.get("RepoDigests") or [])


def _protocol(labels: dict[str, str]) -> int | None:
    value = labels.get(LABEL_PROTOCOL, "")
    return int(value) if value.isdigit() else None


def pinned_image_missing(pin: str) -> EngineError:
    """The refusal for a pinned image the engine does not have, found at verification or at create."""
    return EngineError(
        f"the pinned sandbox image {pin} is not present in the engine",
        reason=AuditReason.IMAGE_MISSING, hint=BUILD_HINT, check="image",
    )  # fmt: skip


def verify_pinned_image(client: AnyClient, pin: str | None) -> Image:
    """The pinned image, or an EngineError saying why a sandboxed run cannot use it; never pulls."""
    if not pin:
        raise EngineError(
            "no sandbox image is pinned (agent_sandbox.image is not set)",
            reason=AuditReason.IMAGE_NOT_PINNED, hint=BUILD_HINT, check="image",
        )  # fmt: skip
    if not (_ID_PIN.fullmatch(pin) or _DIGEST_PIN.fullmatch(pin)):
        raise EngineError(
            f"agent_sandbox.image must be 'sha256:<image id>' or '<repo>@sha256:<digest>', got {pin!r}",
            reason=AuditReason.IMAGE_NOT_PINNED, hint=BUILD_HINT, check="image",
        )  # fmt: skip
    image = _get_image(client, pin)
    if image is None:
        raise pinned_image_missing(pin)
    labels = _labels(image)
    if not _matches_pin(image, pin) or LABEL_INPUTS_HASH not in labels:
        raise EngineError(
            f"the image found for {pin} is not the pinned agentnode-sandbox image",
            reason=AuditReason.IMAGE_MISMATCH, hint=BUILD_HINT, check="image",
        )  # fmt: skip
    protocol = _protocol(labels)
    if protocol != PROTOCOL_VERSION:
        raise EngineError(
            f"the pinned image speaks sandbox protocol {protocol}, this host speaks {PROTOCOL_VERSION}",
            reason=AuditReason.PROTOCOL_MISMATCH, hint=BUILD_HINT, check="image",
        )  # fmt: skip
    return image


__all__ = [
    "BUILD_HINT",
    "LABEL_INPUTS_HASH",
    "AnyClient",
    "Image",
    "pinned_image_missing",
    "verify_pinned_image",
]
