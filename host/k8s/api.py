"""The Kubernetes API as plain JSON: the official client's auth and transport, our own bounds on what we read.

The generated models are not used: the node agent and controller compare and bound raw objects, and a
cluster's objects are input like any other (one object is read to at most MAX_OBJECT_BYTES).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import urllib3.exceptions
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from host.core.errors import AuditReason, EngineError
from host.k8s.objects.agentrun import GROUP, PLURAL, VERSION

logger = logging.getLogger("agentnode.sandbox.kubernetes")

MAX_OBJECT_BYTES = 4 * 1024 * 1024
"""The most one response or one watch event may hold (the API server itself stores at most ~1.5 MiB)."""
REQUEST_TIMEOUT = 30.0
MERGE_PATCH = "application/merge-patch+json"
LIST_PAGE = 100
"""Pods per list page (an object may be ~1.5 MiB; a page of small run pods stays far below the cap)."""
MAX_LIST_PAGES = 1000


class KubeError(EngineError):
    """The API server refused or failed a request; `status` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, *, status: int, reason: str = "") -> None:
        super().__init__(
            message,
            reason=AuditReason.ENGINE_UNAVAILABLE,
            hint="check the cluster (kubectl get --raw /readyz) and the service account's RBAC (deploy/)",
            check="kubernetes",
        )
        self.status = status
        self.k8s_reason = reason


class WatchExpired(KubeError):
    """410 Gone: the watch's resourceVersion is too old; list again."""


def unusable_configuration(exc: BaseException) -> KubeError:
    """No cluster configuration works: the error names only the exception's type (a kubeconfig is the
    user's file) and says where to look."""
    error = KubeError(f"no usable Kubernetes cluster configuration ({type(exc).__name__})", status=0)
    error.hint = (
        "check --kubeconfig (or KUBECONFIG, ~/.kube/config) and --context: kubectl config view --minify"
    )
    return error


@dataclass(frozen=True)
class Ref:
    """A namespaced object's address."""

    namespace: str
    name: str


def _status_of(data: bytes) -> str:
    """The `reason` of an API `Status` body (a fixed CamelCase word such as NotFound), never its message."""
    try:
        body = json.loads(data[:65536])
    except ValueError:
        return ""
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason if isinstance(reason, str) and reason.isalpha() and len(reason) < 64 else ""


class KubeApi:
    """A small JSON client over the official client's transport (in-cluster, kubeconfig or a given host)."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self.api = api_client
        self.in_cluster = False
        """Connected with the pod's own service account (KubeApi.connect)."""
        self._watches: set[Any] = set()
        self._watch_lock = threading.Lock()

    def abort_watches(self) -> None:
        """End every open watch now (from any thread): a stopping node agent does not wait out a watch."""
        with self._watch_lock:
            open_now = list(self._watches)
        for raw in open_now:
            with contextlib.suppress(Exception):
                raw.shutdown()

    @classmethod
    def connect(
        cls, *, host: str | None = None, kubeconfig: str | None = None, context: str | None = None
    ) -> KubeApi:
        """`host` as given; a kubeconfig or context named explicitly, as given; otherwise the pod's service
        account when running in one, else KUBECONFIG or ~/.kube/config (as kubectl). `in_cluster` says
        which. Raises KubeError when none works."""
        configuration = k8s_client.Configuration()
        in_cluster = False
        try:
            if host:
                configuration.host = host
            else:
                if kubeconfig is None and context is None:
                    with contextlib.suppress(k8s_config.ConfigException):  # not in a pod: a kubeconfig
                        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                        in_cluster = True
                if not in_cluster:
                    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                        config_file=kubeconfig, context=context, client_configuration=configuration
                    )
        except Exception as exc:  # noqa: BLE001 (a kubeconfig is user input: any failure is "not usable")
            raise unusable_configuration(exc) from None
        api = cls(k8s_client.ApiClient(configuration))
        api.in_cluster = in_cluster
        return api

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # -- transport --------------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = REQUEST_TIMEOUT,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, payload, _ = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self.api.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=timeout)
        except k8s_client.ApiException as exc:
            raise KubeError(
                f"the API server refused {method} ({exc.status})", status=exc.status or 0
            ) from None
        except Exception as exc:  # noqa: BLE001 (urllib3/transport failures: the API is unreachable)
            raise KubeError(
                f"the API server did not answer {method} ({type(exc).__name__})", status=0
            ) from None

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._send(method, path, **kwargs)
        try:
            data = response.response.read(MAX_OBJECT_BYTES + 1, decode_content=True)
        finally:
            response.response.release_conn()
        if response.status >= 400:
            raise KubeError(
                f"the API server answered {method} with {response.status}",
                status=int(response.status),
                reason=_status_of(data),
            )
        if len(data) > MAX_OBJECT_BYTES:
            raise KubeError(f"the API server's answer to {method} is too large", status=int(response.status))
        try:
            obj = json.loads(data)
        except ValueError:
            raise KubeError(
                f"the API server's answer to {method} is not JSON", status=int(response.status)
            ) from None
        if not isinstance(obj, dict):
            raise KubeError(
                f"the API server's answer to {method} is not an object", status=int(response.status)
            )
        return obj

    # -- objects ----------------------------------------------------------------------------------

    @staticmethod
    def _agentruns(namespace: str, name: str = "") -> str:
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}"
        return f"{base}/{quote(name, safe='')}" if name else base

    @staticmethod
    def _pods(namespace: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        return f"{base}/{quote(name, safe='')}" if name else base

    def get_agentrun(self, ref: Ref) -> dict[str, Any] | None:
        return self._get_or_none(self._agentruns(ref.namespace, ref.name))

    def create_agentrun(self, body: Mapping[str, Any]) -> dict[str, Any]:
        namespace = str(body["metadata"]["namespace"])
        return self._json("POST", self._agentruns(namespace), body=dict(body))

    def delete_agentrun(self, ref: Ref) -> bool:
        return self._delete(self._agentruns(ref.namespace, ref.name))

    def patch_agentrun_status(self, ref: Ref, status: Mapping[str, Any]) -> dict[str, Any]:
        """A merge patch of the status subresource only (spec is the requester's, never ours to change)."""
        path = self._agentruns(ref.namespace, ref.name) + "/status"
        return self._json("PATCH", path, body={"status": dict(status)}, content_type=MERGE_PATCH)

    def get_pod(self, ref: Ref) -> dict[str, Any] | None:
        return self._get_or_none(self._pods(ref.namespace, ref.name))

    def create_pod(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """The pod, and whether this call created it (False: one of that name already existed)."""
        namespace = str(body["metadata"]["namespace"])
        try:
            return self._json("POST", self._pods(namespace), body=dict(body)), True
        except KubeError as exc:
            if exc.status != 409:
                raise
        existing = self.get_pod(Ref(namespace, str(body["metadata"]["name"])))
        if existing is None:
            raise KubeError("the run pod vanished while it was being created", status=409)
        return existing, False

    def delete_pod(self, ref: Ref, *, uid: str | None = None, grace_seconds: int = 0) -> bool:
        """Delete the pod (only this `uid` when given: never a later pod of the same name); False: gone."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": grace_seconds,
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        return self._delete(self._pods(ref.namespace, ref.name), body=body)

    def list_pods(self, *, label_selector: str, field_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """Pods of every namespace matching the selectors, and the list's resourceVersion (to watch from)."""
        query = {"labelSelector": label_selector, "limit": str(LIST_PAGE)}
        if field_selector:
            query["fieldSelector"] = field_selector
        items: list[dict[str, Any]] = []
        for _ in range(MAX_LIST_PAGES):  # pages: one answer stays within MAX_OBJECT_BYTES however many pods
            listed = self._json("GET", "/api/v1/pods", query=query)
            items += [i for i in listed.get("items") or [] if isinstance(i, dict)]
            meta = listed.get("metadata") or {}
            token = meta.get("continue") if isinstance(meta, dict) else None
            if not isinstance(token, str) or not token:
                return items, str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
            query = {**query, "continue": token}
        raise KubeError("the pod list has more pages than a node agent reads", status=0)

    def watch_pods(
        self, *, label_selector: str, field_selector: str, resource_version: str, timeout_seconds: int = 300
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, pod) for each change after `resource_version` until the server ends the watch; raises
        WatchExpired on 410 (list again). Each event line is bounded like any object."""
        query = {
            "watch": "true",
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        yield from self._watch("/api/v1/pods", query, timeout_seconds)

    def watch_agentrun(self, ref: Ref, *, timeout_seconds: int = 300) -> Iterator[tuple[str, dict[str, Any]]]:
        """Changes of one AgentRun (by name), current state first."""
        query = {
            "watch": "true",
            "fieldSelector": f"metadata.name={ref.name}",
            "timeoutSeconds": str(timeout_seconds),
        }
        yield from self._watch(self._agentruns(ref.namespace), query, timeout_seconds)

    def _watch(
        self, path: str, query: Mapping[str, str], timeout: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        response = self._send("GET", path, query=query, timeout=timeout + 15)
        raw = response.response
        with self._watch_lock:
            self._watches.add(raw)
        try:
            if response.status >= 400:
                data = raw.read(65536)
                if response.status == 410:
                    raise WatchExpired("the watch expired", status=410)
                status = int(response.status)
                raise KubeError(f"the API server refused the watch ({status})", status=status,
                                reason=_status_of(data))  # fmt: skip
            buffer = b""
            for chunk in raw.stream(65536, decode_content=True):
                buffer += chunk
                if len(buffer) > MAX_OBJECT_BYTES and b"\n" not in buffer:
                    raise KubeError("a watch event is too large", status=int(response.status))
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    event = _event(line)
                    if event is not None:
                        yield event
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
            raise KubeError(f"the watch broke ({type(exc).__name__})", status=0) from None
        finally:
            with self._watch_lock:
                self._watches.discard(raw)
            raw.release_conn()

    def _get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self._json("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, path: str, body: Mapping[str, Any] | None = None) -> bool:
        try:
            self._json("DELETE", path, body=dict(body) if body is not None else None)
        except KubeError as exc:
            if exc.status in (404, 409):  # gone, or (precondition) a different object holds the name now
                return False
            raise
        return True


def _event(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """One watch line as (type, object); an ERROR event with 410 raises WatchExpired; noise is skipped."""
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        return None
    kind = str(event.get("type") or "")
    if kind == "ERROR":
        code = event["object"].get("code")
        if code == 410:
            raise WatchExpired("the watch expired", status=410)
        raise KubeError(
            "the API server ended the watch with an error",
            status=int(code or 0) if isinstance(code, int) else 0,
        )
    if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        return None
    return kind, event["object"]


__all__ = ["MAX_OBJECT_BYTES", "KubeApi", "KubeError", "Ref", "WatchExpired", "unusable_configuration"]
