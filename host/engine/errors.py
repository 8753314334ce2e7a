"""The engine boundary: every engine client, SDK or connection failure becomes one classified EngineError."""

from __future__ import annotations

import contextlib
import errno
import http.client
import sys
from collections.abc import Iterator
from typing import Any

from host.core.errors import AuditReason, EngineError, EngineImageNotFound, EngineNotFound, EngineRejected
from host.engine.http import EngineApiError

ENGINE_FAILURES: tuple[type[Exception], ...] = (EngineApiError, OSError, http.client.HTTPException)
"""What an engine call of `EngineClient` raises when the engine fails or refuses: classified by
`engine_errors` (which also classifies the docker SDK's failures, where the SDK is in use)."""

_FIX_ENGINE = (
    "start the engine (as root on Debian: scripts/provision-engine), or point DOCKER_HOST at a "
    "Docker-compatible socket (Podman: unix:///run/podman/podman.sock); check with: agentnode-sandbox doctor"
)


def _diagnosis(exc: BaseException) -> tuple[str, AuditReason, str]:
    """Message, reason and hint of an engine failure, from its exception chain (never from its text)."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for item in chain:
        if isinstance(item, PermissionError) or (
            isinstance(item, OSError) and item.errno in (errno.EACCES, errno.EPERM)
        ):
            return (
                "not permitted to use the container engine socket",
                AuditReason.ENGINE_PERMISSION_DENIED,
                "run as a user allowed to use the engine (root, or the docker group), "
                "or set DOCKER_HOST to a socket you may use; check with: agentnode-sandbox doctor",
            )
    # The SDK wraps a refused version probe (`from_env`) in a plain DockerException: look down the chain.
    if any((_answer(item) or (0, "", False))[0] in (401, 403) for item in chain):
        return (
            "the container engine refused the request",
            AuditReason.ENGINE_PERMISSION_DENIED,
            "check the engine's authorization plugins; check with: agentnode-sandbox doctor",
        )
    return "no container engine answers", AuditReason.ENGINE_UNAVAILABLE, _FIX_ENGINE


def _sdk_errors() -> Any:
    """The docker SDK's error module where the SDK is in use (a run never imports it), else None."""
    return sys.modules.get("docker.errors")


def _answer(exc: BaseException) -> tuple[int, str, bool] | None:
    """(status, the engine's explanation, whether the 404 names an image) of an answer with an error
    status, from our client (EngineApiError) or the SDK (APIError); None for any other failure."""
    if isinstance(exc, EngineApiError):
        return exc.status, exc.explanation, exc.image_missing
    sdk = _sdk_errors()
    if sdk is not None and isinstance(exc, sdk.APIError):
        status = int(exc.status_code) if exc.status_code is not None else 0
        return status, str(exc.explanation or "").strip(), isinstance(exc, sdk.ImageNotFound)
    return None


def container_vanished(exc: BaseException) -> bool:
    """The engine's answer says the container does not exist: Docker's and Podman's 404, or the 500 Podman
    gives once for a container removed while it is asked ("... does not exist in database: no such
    container"), which is the same fact and must not read as a failing engine."""
    answer = _answer(exc)
    if answer is None:
        return False
    status, explanation, _ = answer
    return status == 404 or (status == 500 and explanation.rstrip().endswith("no such container"))


def classify_engine_exception(exc: BaseException) -> EngineError:
    """The one classification of engine failures: a client, SDK or connection exception in, its
    EngineError out.

    The reason (permission denied or unavailable) and the way out are fixed; the exception's text is never
    copied. An answer with an error status comes back as EngineRejected carrying the status, as
    EngineNotFound for a 404 and as EngineImageNotFound when the 404 names an image, so a caller can tell
    "absent" from "failing"; uncaught, each reads like any other engine failure.
    """
    message, reason, hint = _diagnosis(exc)
    answer = _answer(exc)
    if answer is None:
        return EngineError(message, reason=reason, hint=hint, check="engine")
    status, explanation, image_missing = answer
    kind = (
        EngineImageNotFound
        if image_missing
        else EngineNotFound
        if container_vanished(exc)
        else EngineRejected
    )
    return kind(message, status=status or None, explanation=explanation, reason=reason, hint=hint)


def _engine_failure(exc: BaseException) -> bool:
    if isinstance(exc, ENGINE_FAILURES):
        return True
    sdk = _sdk_errors()
    urllib3_errors = sys.modules.get("urllib3.exceptions")
    return (sdk is not None and isinstance(exc, sdk.DockerException)) or (
        # a streamed SDK answer (pull, build) cut off mid-read
        urllib3_errors is not None and isinstance(exc, urllib3_errors.HTTPError)
    )


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """The engine boundary: an engine client, SDK or connection failure raised in the block leaves it as
    its classified EngineError, without the chain. The host's own errors pass unchanged, and so does any
    other exception: that is a bug, not an engine failure."""
    try:
        yield
    except Exception as exc:
        if not _engine_failure(exc):
            raise
        raise classify_engine_exception(exc) from None


__all__ = [
    "ENGINE_FAILURES",
    "classify_engine_exception",
    "container_vanished",
    "engine_errors",
]
