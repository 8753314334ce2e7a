"""The engine boundary: every client, SDK and connection failure classified (`classify_engine_exception`),
its text never copied, and everything else passed through `engine_errors` unchanged."""

from __future__ import annotations

import errno

import docker
import docker.errors
import pytest
import requests
import requests.exceptions
import urllib3.exceptions

from host.core.errors import (
    AuditReason,
    EngineError,
    EngineImageNotFound,
    EngineNotFound,
    EngineRejected,
    PackError,
)
from host.engine.errors import classify_engine_exception, engine_errors
from host.engine.http import EngineApiError

# --- classify_engine_exception -------------------------------------------------------------------------


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    """`outer` raised from `inner`, with real tracebacks, as the SDK does."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


class FakeResponse(requests.Response):
    def __init__(self, status: int) -> None:
        super().__init__()
        self.status_code = status
        self.reason = "Forbidden"


@pytest.mark.parametrize(
    "exc",
    [
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.EPERM, "Operation not permitted"),
        chained(
            requests.exceptions.ConnectionError("Connection aborted."),
            PermissionError(errno.EACCES, "Permission denied"),
        ),
        chained(
            docker.errors.DockerException("Error while fetching server API version"),
            chained(requests.exceptions.ConnectionError("aborted"), PermissionError(errno.EACCES, "no")),
        ),
        docker.errors.APIError("denied", response=FakeResponse(403)),
        chained(
            docker.errors.DockerException("Error while fetching server API version: 403"),
            docker.errors.APIError("denied", response=FakeResponse(403)),
        ),
    ],
)
def test_permission_problems_are_classified(exc: BaseException) -> None:
    err = classify_engine_exception(exc)
    assert err.reason is AuditReason.ENGINE_PERMISSION_DENIED and err.check == "engine"
    assert "agentnode-sandbox doctor" in err.hint


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        chained(
            requests.exceptions.ConnectionError("Connection aborted."),
            FileNotFoundError(errno.ENOENT, "No such file or directory"),
        ),
        requests.exceptions.ReadTimeout("read timed out"),
        docker.errors.APIError("boom", response=FakeResponse(500)),
        docker.errors.DockerException("Error while fetching server API version"),
        RuntimeError("anything else"),
    ],
)
def test_everything_else_is_engine_unavailable(exc: BaseException) -> None:
    err = classify_engine_exception(exc)
    assert err.reason is AuditReason.ENGINE_UNAVAILABLE and err.check == "engine"
    assert "DOCKER_HOST" in err.hint and "agentnode-sandbox doctor" in err.hint


def test_classifier_never_copies_the_exception_text() -> None:
    err = classify_engine_exception(
        chained(RuntimeError("secret-token-abc at /srv/x"), PermissionError(errno.EACCES, "secret"))
    )
    assert "secret" not in err.message + err.hint


def test_a_cyclic_chain_terminates() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify_engine_exception(a).reason is AuditReason.ENGINE_UNAVAILABLE


def api_error(kind: type[docker.errors.APIError], status: int | None, explanation: str = "") -> BaseException:
    response = FakeResponse(status) if status is not None else None
    return kind("engine said no", response=response, explanation=explanation or None)


UNAVAILABLE = ("no container engine answers", AuditReason.ENGINE_UNAVAILABLE)
SOCKET_DENIED = ("not permitted to use the container engine socket", AuditReason.ENGINE_PERMISSION_DENIED)
REFUSED = ("the container engine refused the request", AuditReason.ENGINE_PERMISSION_DENIED)


@pytest.mark.parametrize(
    ("exc", "kind", "status", "expected"),
    [
        # no answer: the connection failed somewhere below the SDK
        (FileNotFoundError(errno.ENOENT, "gone"), EngineError, None, UNAVAILABLE),
        (requests.exceptions.ConnectionError("aborted"), EngineError, None, UNAVAILABLE),
        (urllib3.exceptions.ProtocolError("Connection broken"), EngineError, None, UNAVAILABLE),
        (docker.errors.DockerException("fetching server API version"), EngineError, None, UNAVAILABLE),
        (PermissionError(errno.EACCES, "denied"), EngineError, None, SOCKET_DENIED),
        (
            chained(docker.errors.DockerException("version probe"), api_error(docker.errors.APIError, 403)),
            EngineError, None, REFUSED,
        ),
        # an answer with an error status: the status is kept, 404s are told apart
        (api_error(docker.errors.NotFound, 404, "no such volume: v"), EngineNotFound, 404, UNAVAILABLE),
        (api_error(docker.errors.ImageNotFound, 404, "No such image"), EngineImageNotFound, 404, UNAVAILABLE),
        (api_error(docker.errors.APIError, 409, "removal in progress"), EngineRejected, 409, UNAVAILABLE),
        (api_error(docker.errors.APIError, 500, "boom"), EngineRejected, 500, UNAVAILABLE),
        # Podman's answer for a container removed while it was asked is "absent", not "failing"
        (api_error(docker.errors.APIError, 500, "container 5a does not exist in database: no such container"),
         EngineNotFound, 500, UNAVAILABLE),
        (api_error(docker.errors.APIError, 500, "no such container?"), EngineRejected, 500, UNAVAILABLE),
        (api_error(docker.errors.APIError, 409, "no such container"), EngineRejected, 409, UNAVAILABLE),
        (api_error(docker.errors.APIError, 403, "authorization denied"), EngineRejected, 403, REFUSED),
        (api_error(docker.errors.APIError, 401), EngineRejected, 401, REFUSED),
        (api_error(docker.errors.APIError, None), EngineRejected, None, UNAVAILABLE),
        # the same answers through the host's own client
        (EngineApiError(404, "no such container: 5a"), EngineNotFound, 404, UNAVAILABLE),
        (EngineApiError(404, "No such image: sha256:ab"), EngineImageNotFound, 404, UNAVAILABLE),
        (EngineApiError(500, "container 5a does not exist in database: no such container"),
         EngineNotFound, 500, UNAVAILABLE),
        (EngineApiError(409, "removal in progress"), EngineRejected, 409, UNAVAILABLE),
        (EngineApiError(403, "authorization denied"), EngineRejected, 403, REFUSED),
    ],
)  # fmt: skip
def test_the_classifier_as_data(
    exc: BaseException, kind: type[EngineError], status: int | None, expected: tuple[str, AuditReason]
) -> None:
    err = classify_engine_exception(exc)
    assert type(err) is kind
    assert (err.message, err.reason, err.check) == (*expected, "engine")
    assert "agentnode-sandbox doctor" in err.hint
    if isinstance(err, EngineRejected):
        assert err.status == status
        assert err.explanation == str(getattr(exc, "explanation", None) or "").strip()
        assert not err.explanation or err.explanation not in err.message + err.hint  # kept, never quoted


def test_uncaught_a_rejection_reads_like_any_engine_failure() -> None:
    """Telling "absent" from "failing" is the caller's choice; left alone, a 404 is just a failing engine."""
    plain = classify_engine_exception(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    missing = classify_engine_exception(api_error(docker.errors.NotFound, 404, "no such container"))
    assert (missing.message, missing.reason, missing.hint) == (plain.message, plain.reason, plain.hint)


@pytest.mark.parametrize(
    "exc",
    [
        requests.exceptions.ConnectionError("aborted"),
        api_error(docker.errors.NotFound, 404),
        docker.errors.DockerException("x"),
        OSError(errno.EIO, "io"),
        urllib3.exceptions.ReadTimeoutError(None, "/x", "read timed out"),
    ],
)
def test_the_boundary_classifies_every_engine_failure_without_its_chain(exc: BaseException) -> None:
    with pytest.raises(EngineError) as info, engine_errors():
        raise exc
    assert type(info.value) is type(classify_engine_exception(exc))
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(
    "exc",
    [
        PackError("the host's own error"),
        classify_engine_exception(api_error(docker.errors.NotFound, 404)),  # an inner boundary's answer
        KeyError("a bug is not an engine failure"),
    ],
)
def test_the_boundary_passes_everything_else_unchanged(exc: Exception) -> None:
    with pytest.raises(type(exc)) as info, engine_errors():
        raise exc
    assert info.value is exc


def test_callers_tell_absent_from_failing() -> None:
    def lookup(exc: BaseException) -> str | None:
        try:
            with engine_errors():
                raise exc
        except EngineNotFound:
            return None
        return "found"

    assert lookup(api_error(docker.errors.NotFound, 404)) is None
    with pytest.raises(EngineRejected) as info:
        lookup(api_error(docker.errors.APIError, 500))
    assert info.value.reason is AuditReason.ENGINE_UNAVAILABLE
