"""A Kubernetes API server stand-in for the controller and node agent tests (no cluster runs here).

It speaks the real REST protocol over real HTTP on 127.0.0.1 from a background thread with its own event
loop, so the sync `kubernetes` client, `kubernetes.watch.Watch` and kopf (aiohttp, another loop) all talk
to it as to an API server: discovery, create/get/list with label and field selectors, watch streams from a
resourceVersion (with a 410 Gone once compacted), merge/JSON patches, PUT, the `status` subresource,
finalizers, owner-reference garbage collection, and `kind: Status` error bodies.

Built on kmock, but only partly: `kmock.KubernetesScaffold` (subclassed as `_Discovery`) serves discovery
(/api, /apis, /apis/<group>/<version>, /version) from the declared resources. The stateful part is ours,
because kmock's `KubernetesEmulator` cannot be bent to the real semantics cleanly: it mutates its store in
`_handle` before any reaction with a plain dict merge (no uid, resourceVersion, generation, status
subresource, selectors, garbage collection, null-deletes or JSON patch), its watch always replays
everything (no watch from a resourceVersion, no 410, no timeoutSeconds), it only knows `watch=true` and
no PUT, and its path parser fails on the `namespaces` resource itself (`/api/v1/namespaces` raises,
`/api/v1/namespaces/x` parses as a namespace without a resource) before any subclass hook can intervene.
`kmock.Server` is not used either: it patches aiohttp's resolver process-wide, which kopf (aiohttp in the
same process) would go through. So resource URLs are routed to our store by a small aiohttp server, and
every other URL to the kmock handler.

Semantics kept from the real API: resourceVersion is one server-wide counter bumped on every change; a
no-op update changes nothing (no new resourceVersion, no event); `generation` starts at 1 and is bumped
when anything outside `metadata` and `status` changes (and when deletion starts); for resources with the
`status` subresource, `.status` is dropped on create (pods then get `phase: Pending`, namespaces
`Active`), ignored on updates of the main resource, and the only thing `/status` updates change; a
`metadata.resourceVersion` sent with an update or patch is a precondition (409 Conflict); a watch with a
selector sees ADDED when an object starts matching and DELETED when it stops; deleting an owner deletes
every object whose `ownerReferences` name it and no other live owner (background propagation; `Orphan`
is honoured when the owner goes at once).

Known gaps (tests must not rely on them): strategic merge patch is a JSON merge patch (lists are replaced,
not merged by key; no `$patch` directives) and, as on a real cluster, refused (415) for custom resources;
no server-side apply, no admission, no schema validation or defaulting, no list pagination (`limit` is
ignored, everything comes in one page), no watch bookmarks except the `sendInitialEvents` one, no
`/watch/` legacy paths; namespaces need not exist; pods are deleted at once (no kubelet grace period) and
nothing runs them: `schedule()` and `set_status()` play the scheduler and the kubelet; creating a
CustomResourceDefinition serves nothing new (resources come from the constructor); core/v1 and
events.k8s.io/v1 events are separate stores; deleting a namespace deletes its objects (their finalizers
honoured) and the namespace at once; the watch history is never trimmed except by `compact()`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import pytest

if TYPE_CHECKING:
    import kopf
    import kubernetes.client

Obj = dict[str, Any]

# fmt: off
POD_FIELDS = frozenset({
    "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
    "status.phase", "status.podIP", "status.nominatedNodeName",
})
"""The pod fields the real API accepts in a fieldSelector (besides metadata.name and metadata.namespace)."""
EVENT_FIELDS = frozenset({
    "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
    "involvedObject.apiVersion", "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
})
# fmt: on


@dataclass(frozen=True)
class Resource:
    """A served resource: what discovery lists, the URLs route to, and a store of its own."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: frozenset[str] = frozenset()
    custom: bool = False  # served by a CRD: no strategic merge patch, as on a real cluster
    field_labels: frozenset[str] = frozenset()  # fieldSelector fields beyond metadata.name/namespace
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`plural.group` as kubectl names it (just the plural for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


# fmt: off
DEFAULT_RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "pods", "Pod", subresources=frozenset({"status", "binding", "eviction"}),
             field_labels=POD_FIELDS, short_names=("po",)),
    Resource("", "v1", "events", "Event", field_labels=EVENT_FIELDS, short_names=("ev",)),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False, subresources=frozenset({"status"}),
             field_labels=frozenset({"status.phase"}), short_names=("ns",)),
    Resource("events.k8s.io", "v1", "events", "Event"),
    Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
             namespaced=False, subresources=frozenset({"status"}), short_names=("crd", "crds")),
    Resource("sandbox.agentnode.net", "v1alpha1", "agentruns", "AgentRun", subresources=frozenset({"status"}),
             custom=True, short_names=("arun",)),
)
# fmt: on
"""What our components use: core pods/events/namespaces, events.k8s.io events (kopf posts events),
CRDs (kopf looks them up) and our AgentRun custom resource."""

_OMIT_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences")
_SERVER_FIELDS = (
    "name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
    "generation", "resourceVersion",
)  # fmt: skip
"""The metadata an update cannot change (the server's; name and namespace come from the URL)."""
_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


class Request(NamedTuple):
    """One request as the server saw it, for assertions: `("GET", "/api/v1/pods", {"watch": "true"})`."""

    method: str
    path: str
    query: dict[str, str]


class StatusError(Exception):
    """A refusal as the real API words it: the HTTP code and the `kind: Status` body's reason.

    The HTTP layer answers with `status()`; the test hooks raise it as it is.
    """

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _not_found(res: Resource, name: str) -> StatusError:
    details = {"name": name, "group": res.group, "kind": res.plural}
    return StatusError(404, "NotFound", f'{res.qualified} "{name}" not found', details)


def _conflict(res: Resource, name: str, why: str) -> StatusError:
    details = {"name": name, "group": res.group, "kind": res.plural}
    return StatusError(
        409, "Conflict", f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}', details
    )


def _invalid(res: Resource, name: str, why: str) -> StatusError:
    details = {"name": name, "group": res.group, "kind": res.kind}
    return StatusError(422, "Invalid", f'{res.kind} "{name}" is invalid: {why}', details)


def _bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, `null` deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- selectors --------------------------------------------------------------------------------------------

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_TERM = re.compile(
    rf"(?:!\s*(?P<absent>{_KEY})|(?P<key>{_KEY})\s*(?:(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)"
    rf"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)"
)
_FIELD_TERM = re.compile(r"(?P<path>[A-Za-z0-9_.]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)")


def _label_predicates(selector: str) -> list[Callable[[dict[str, str]], bool]]:
    """`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`, comma-joined (all must hold)."""
    preds: list[Callable[[dict[str, str]], bool]] = []
    for term in (t.strip() for t in re.split(r",(?![^()]*\))", selector)):
        if not term:
            continue
        m = _LABEL_TERM.fullmatch(term)
        if m is None:
            raise _bad_request(f"unable to parse requirement: {term!r}")
        key, op, value, values = m["key"], m["op"], m["value"], m["values"]
        if m["absent"]:
            preds.append(lambda labels, k=m["absent"]: k not in labels)
        elif op in ("=", "=="):
            preds.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            preds.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif m["set"]:
            choices = frozenset(v.strip() for v in values.split(",") if v.strip())
            if m["set"] == "in":
                preds.append(lambda labels, k=key, c=choices: labels.get(k) in c)
            else:
                preds.append(lambda labels, k=key, c=choices: labels.get(k) not in c)
        else:
            preds.append(lambda labels, k=key: k in labels)
    return preds


def _field_value(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""  # as the real API: an unset field selects as the empty string (`spec.nodeName=`)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _selector(res: Resource, namespace: str, labels: str, fields: str) -> Callable[[Obj], bool]:
    """The predicate a list or watch applies: namespace ("" = all), labelSelector, fieldSelector."""
    label_preds = _label_predicates(labels)
    field_terms: list[tuple[str, bool, str]] = []
    for term in (t.strip() for t in fields.split(",")):
        if not term:
            continue
        m = _FIELD_TERM.fullmatch(term)
        if m is None:
            raise _bad_request(f"invalid field selector: {term!r}")
        if m["path"] not in {"metadata.name", "metadata.namespace"} | res.field_labels:
            raise _bad_request(f"field label not supported: {m['path']}")
        field_terms.append((m["path"], m["op"] != "!=", m["value"]))

    def selects(obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if namespace and meta.get("namespace") != namespace:
            return False
        object_labels = meta.get("labels") or {}
        return all(pred(object_labels) for pred in label_preds) and all(
            (_field_value(obj, path) == value) == equal for path, equal, value in field_terms
        )

    return selects


# --- changes and watchers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Change:
    """One committed change. `new` is the object after it (for DELETED: its last state, the new rv)."""

    rv: int
    resource: Resource
    type: str  # ADDED | MODIFIED | DELETED
    old: Obj | None
    new: Obj


@dataclass(eq=False)
class _Watcher:
    resource: Resource
    selects: Callable[[Obj], bool]
    queue: asyncio.Queue[_Change | None] = field(default_factory=asyncio.Queue)

    def event(self, change: _Change) -> Obj | None:
        """What this watcher sees of a change: as the real watch cache, selector transitions included."""
        now = self.selects(change.new)
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.new} if now else None
        before = change.old is not None and self.selects(change.old)
        if now:
            return {"type": "MODIFIED" if before else "ADDED", "object": change.new}
        if before:
            assert change.old is not None
            last = {**change.old, "metadata": {**change.old["metadata"], "resourceVersion": str(change.rv)}}
            return {"type": "DELETED", "object": last}  # it stopped matching: gone for this watcher
        return None


def _line(event: Obj) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _json(body: Obj, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.json_response(body, status=status)


@attrs.define(kw_only=True)
class _Discovery(kmock.KubernetesScaffold):
    """kmock's discovery documents, with what they get wrong for clients put right."""

    async def _serve_api(self, request: kmock.Request) -> kmock.Payload:
        doc = cast(Obj, await super()._serve_api(request))
        return {**doc, "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        doc = cast(Obj, await super()._serve_version(request))
        return {**doc, "groupVersion": doc["groupVersion"].lstrip("/")}  # kmock says "/v1" for core

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        code = exc.status if isinstance(exc, kmock.KubernetesError) else 500
        reason = "NotFound" if code == 404 else "InternalError"
        message = "the server could not find the requested resource" if code == 404 else repr(exc)
        return _json(StatusError(code, reason, message).status(), code)


# --- the server -------------------------------------------------------------------------------------------


class KubeAPI:
    """The API server stand-in: `with KubeAPI() as server:` serves on `server.url` until the block ends.

    Test hooks (thread-safe, any thread) act as the rest of a cluster would: `create`, `patch`, `delete`,
    `set_status` (the kubelet), `schedule` (the scheduler), `drop_watches` (an API server restart),
    `compact` (etcd compaction: old resourceVersions answer 410 Gone). `objects`/`get` read the live state
    (copies); `requests` is the log of every request; `wait_for_watches` waits until clients watch.
    A hook refused as the API would refuse it raises `StatusError`.
    """

    def __init__(
        self, resources: tuple[Resource, ...] = DEFAULT_RESOURCES, *, host: str = "127.0.0.1"
    ) -> None:
        self.resources = resources
        self._host = host
        self._by_path = {(r.group, r.version, r.plural): r for r in resources}
        self._lock = threading.RLock()
        self._store: dict[Resource, dict[tuple[str, str], Obj]] = {r: {} for r in resources}
        self._rv = 0
        self._compacted = 0  # watches from a resourceVersion below this one get 410 Gone
        self._history: list[_Change] = []
        self._watchers: set[_Watcher] = set()
        self._requests: list[Request] = []
        self._clients: list[kubernetes.client.ApiClient] = []
        self._closing = False
        self._discovery = _Discovery()
        for res in resources:
            self._discovery.resources[kmock.resource(res.group, res.version, res.plural)] = (
                kmock.ResourceInfo(
                    kind=res.kind,
                    singular=res.kind.lower(),
                    namespaced=res.namespaced,
                    verbs=set(VERBS),
                    shortnames=set(res.short_names),
                    subresources=set(res.subresources),
                )
            )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._port = 0

    # --- lifecycle ----------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    def start(self) -> KubeAPI:
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(),), name="kube-api", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(10) or self._failure is not None:
            raise RuntimeError(f"the Kubernetes API stand-in did not start: {self._failure!r}")
        return self

    def stop(self) -> None:
        """Close every watch, stop serving, join the thread, close the clients `api_client()` made."""
        if self._thread is None:
            return
        with self._lock:
            self._closing = True
        self.drop_watches()
        if self._loop is not None and self._stop_event is not None:
            self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(10)
        self._thread = None
        for client in self._clients:
            client.close()

    def __enter__(self) -> KubeAPI:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def api_client(self) -> kubernetes.client.ApiClient:
        """A `kubernetes.client.ApiClient` for this server (no auth); closed when the server stops."""
        import kubernetes.client

        configuration = kubernetes.client.Configuration(host=self.url)
        client = kubernetes.client.ApiClient(configuration)
        self._clients.append(client)
        return client

    def connection_info(self) -> kopf.ConnectionInfo:
        """What a kopf `@kopf.on.login` handler returns to talk to this server."""
        import kopf

        return kopf.ConnectionInfo(server=self.url, insecure=True, default_namespace="default")

    async def _serve(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop_event = asyncio.Event()
            async with self._discovery:
                # handler_cancellation: a client that goes away cancels its watch handler (and unregisters it)
                server = aiohttp.web.Server(self._handle, handler_cancellation=True)
                runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
                await runner.setup()
                try:
                    site = aiohttp.web.TCPSite(runner, self._host, 0)
                    await site.start()
                    self._port = runner.addresses[0][1]
                    self._ready.set()
                    await self._stop_event.wait()
                finally:
                    await runner.cleanup()
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            self._ready.set()

    # --- test hooks ---------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion (what a list answers now)."""
        with self._lock:
            return str(self._rv)

    @property
    def watches(self) -> int:
        """How many watch streams are open."""
        with self._lock:
            return len(self._watchers)

    def wait_for_watches(self, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until at least `count` watch streams are open (a client connected before a test acts)."""
        deadline = time.monotonic() + timeout
        while self.watches < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.watches} watch stream(s) open, not {count}, after {timeout}s")
            time.sleep(0.01)

    def objects(self, resource: str | Resource, namespace: str | None = None) -> list[Obj]:
        """Copies of the live objects of a resource (`"pods"`, `"agentruns"`, `"events.events.k8s.io"`)."""
        res = self._resolve(resource)
        with self._lock:
            return [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._store[res].items())
                if namespace is None or ns == namespace
            ]

    def get(self, resource: str | Resource, namespace: str | None, name: str) -> Obj | None:
        """A copy of one live object, or None."""
        res = self._resolve(resource)
        with self._lock:
            obj = self._store[res].get((namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def create(self, resource: str | Resource, body: Obj, namespace: str | None = None) -> Obj:
        """Create as a POST would (namespace from the argument or the body)."""
        res = self._resolve(resource)
        return copy.deepcopy(self._create(res, namespace or "", body))

    def patch(self, resource: str | Resource, namespace: str | None, name: str, patch: Obj) -> Obj:
        """Merge-patch the main resource as a client would (`.status` changes ignored if a subresource)."""
        res = self._resolve(resource)
        return copy.deepcopy(self._update(res, namespace or "", name, lambda cur: merge_patch(cur, patch)))

    def set_status(
        self, resource: str | Resource, namespace: str | None, name: str, status_patch: Obj
    ) -> Obj:
        """Merge-patch `.status` as the kubelet or a controller would: `{"phase": "Running"}`."""
        res = self._resolve(resource)
        change = lambda cur: merge_patch(cur, {"status": status_patch})  # noqa: E731
        return copy.deepcopy(self._update(res, namespace or "", name, change, status=True))

    def delete(self, resource: str | Resource, namespace: str | None, name: str) -> Obj:
        """Delete as a DELETE would (finalizers and garbage collection included)."""
        res = self._resolve(resource)
        return copy.deepcopy(self._delete(res, namespace or "", name))

    def schedule(self, namespace: str, pod_name: str, node: str) -> Obj:
        """Bind a pod to a node as the scheduler does: `spec.nodeName` and `PodScheduled`, one MODIFIED."""
        return copy.deepcopy(self._bind(namespace, pod_name, node))

    def drop_watches(self) -> int:
        """End every open watch stream (as an API server restart does); returns how many were open."""
        with self._lock:
            dropped = list(self._watchers)
            self._watchers.clear()
        for watcher in dropped:
            self._wake(watcher, None)
        return len(dropped)

    def compact(self) -> str:
        """Compact the history as etcd does: a watch from any resourceVersion before now gets 410 Gone.

        Clients must relist (a list answers the current resourceVersion, which can be watched from).
        """
        with self._lock:
            self._compacted = self._rv
            self._history.clear()
            return str(self._rv)

    # --- the store (sync, under the lock; stored objects are never mutated, only replaced) -----------------

    def _resolve(self, resource: str | Resource) -> Resource:
        if isinstance(resource, Resource):
            if resource not in self._store:
                raise KeyError(f"not a served resource: {resource}")
            return resource
        candidates = [r for r in self.resources if resource in (r.qualified, r.plural, *r.short_names)]
        if not candidates:
            raise KeyError(f"not a served resource: {resource!r}")
        # the exact `plural.group` first; for a bare plural, core wins (`events`), as with kubectl
        return min(candidates, key=lambda r: (r.qualified != resource, r.group != ""))

    def _find(self, res: Resource, namespace: str, name: str) -> Obj:
        obj = self._store[res].get((namespace, name))
        if obj is None:
            raise _not_found(res, name)
        return obj

    def _wake(self, watcher: _Watcher, change: _Change | None) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(watcher.queue.put_nowait, change)

    def _emit(self, res: Resource, kind: str, old: Obj | None, new: Obj) -> None:
        change = _Change(self._rv, res, kind, old, new)
        self._history.append(change)
        for watcher in self._watchers:
            if watcher.resource == res:
                self._wake(watcher, change)

    def _create(self, res: Resource, namespace: str, body: Any) -> Obj:
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise _bad_request("the body of the request must be an object with an object `metadata`")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or meta.get("namespace") or ""
            if not namespace:
                raise _bad_request(f"a namespace is required to create {res.qualified}")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
            namespace = ""
        with self._lock:
            name = meta.get("name") or ""
            while not name and meta.get("generateName"):  # a fresh random suffix, as the real API's
                name = meta["generateName"] + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
                name = "" if (namespace, name) in self._store[res] else name
            if not name:
                raise _invalid(res, "", "metadata.name: Required value: name or generateName is required")
            if (namespace, name) in self._store[res]:
                raise StatusError(
                    409,
                    "AlreadyExists",
                    f'{res.qualified} "{name}" already exists',
                    {"name": name, "group": res.group, "kind": res.plural},
                )
            self._rv += 1
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(key, None)
            meta.update(
                name=name,
                uid=str(uuid.uuid4()),
                resourceVersion=str(self._rv),
                creationTimestamp=_now(),
                generation=1,
            )
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            if "status" in res.subresources:
                obj.pop("status", None)  # status is the status subresource's business
            if res.group == "" and res.plural == "pods":
                obj["status"] = {"phase": "Pending"}
            elif res.group == "" and res.plural == "namespaces":
                obj["status"] = {"phase": "Active"}
            for key in _OMIT_EMPTY:
                if key in meta and not meta[key]:
                    del meta[key]
            self._store[res][(namespace, name)] = obj
            self._emit(res, "ADDED", None, obj)
            return obj

    def _update(
        self, res: Resource, namespace: str, name: str, change: Callable[[Obj], Any], *, status: bool = False
    ) -> Obj:
        """Apply `change` to a copy of the object (a patch, or a PUT's body) and commit what is allowed."""
        with self._lock:
            cur = self._find(res, namespace, name)
            candidate = change(copy.deepcopy(cur))
            if not isinstance(candidate, dict) or not isinstance(candidate.get("metadata", {}), dict):
                raise _invalid(res, name, "the result is not an object with an object `metadata`")
            cmeta = candidate.get("metadata") or {}
            sent_rv = cmeta.get("resourceVersion")
            if sent_rv not in (None, "") and str(sent_rv) != cur["metadata"]["resourceVersion"]:
                raise _conflict(
                    res,
                    name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again",
                )
            if cmeta.get("name", name) != name or (
                res.namespaced and cmeta.get("namespace", namespace) != namespace
            ):
                raise _bad_request(f"the name or namespace of the object does not match the URL's ({name})")
            if status:
                new = copy.deepcopy(cur)
                new.pop("status", None)
                if candidate.get("status") is not None:
                    new["status"] = candidate["status"]
            else:
                new = candidate
                meta = new.setdefault("metadata", {})
                for key in _SERVER_FIELDS:
                    if key in cur["metadata"]:
                        meta[key] = cur["metadata"][key]
                    else:
                        meta.pop(key, None)
                new["apiVersion"], new["kind"] = cur["apiVersion"], cur["kind"]
                if "status" in res.subresources:
                    new.pop("status", None)
                    if "status" in cur:
                        new["status"] = cur["status"]
                added = set(meta.get("finalizers") or ()) - set(cur["metadata"].get("finalizers") or ())
                if cur["metadata"].get("deletionTimestamp") and added:
                    raise _invalid(
                        res,
                        name,
                        "metadata.finalizers: Forbidden: no new finalizers can be added if "
                        "the object is being deleted",
                    )
            return self._commit(res, cur, new)

    def _commit(self, res: Resource, cur: Obj, new: Obj) -> Obj:
        meta = new["metadata"]
        for key in _OMIT_EMPTY:
            if key in meta and not meta[key]:
                del meta[key]  # as Go's omitempty: an emptied map or list is gone, not `{}`
        if new == cur:
            return cur  # a no-op: no new resourceVersion, no event, as the real API
        outside = lambda obj: {k: v for k, v in obj.items() if k not in ("metadata", "status")}  # noqa: E731
        starts_deletion = meta.get("deletionTimestamp") and not cur["metadata"].get("deletionTimestamp")
        if outside(new) != outside(cur) or starts_deletion:
            meta["generation"] = int(meta.get("generation") or 0) + 1
        key = (meta.get("namespace") or "", meta["name"])
        self._store[res][key] = new
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # its last finalizer went: this update is its deletion (one DELETED event, as the real API)
            return self._remove(res, key)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._emit(res, "MODIFIED", cur, new)
        return new

    def _delete(
        self,
        res: Resource,
        namespace: str,
        name: str,
        *,
        orphan: bool = False,
        preconditions: Obj | None = None,
    ) -> Obj:
        with self._lock:
            cur = self._find(res, namespace, name)
            for key, value in (preconditions or {}).items():
                if value is not None and cur["metadata"].get(key) != value:
                    raise _conflict(res, name, f"Precondition failed: {key}: {value}")
            if not cur["metadata"].get("finalizers"):
                return self._remove(res, (namespace, name), orphan=orphan)
            if cur["metadata"].get("deletionTimestamp"):
                return cur  # already being deleted: it waits for its finalizers
            new = copy.deepcopy(cur)
            new["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
            return self._commit(res, cur, new)

    def _remove(self, res: Resource, key: tuple[str, str], *, orphan: bool = False) -> Obj:
        cur = self._store[res].pop(key)
        self._rv += 1
        last = {**cur, "metadata": {**cur["metadata"], "resourceVersion": str(self._rv)}}
        self._emit(res, "DELETED", cur, last)
        if res.group == "" and res.plural == "namespaces":
            for other, objects in self._store.items():
                for ns, name in [k for k in objects if k[0] == key[1]]:
                    if (ns, name) in objects:
                        self._delete(other, ns, name)
        if not orphan:
            self._collect_dependents(cur["metadata"]["uid"])
        return last

    def _collect_dependents(self, owner_uid: str) -> None:
        """Background propagation: delete what the gone owner held and no other live owner does."""
        live = {obj["metadata"]["uid"] for objects in self._store.values() for obj in objects.values()}
        for res, objects in self._store.items():
            for key, obj in list(objects.items()):
                uids = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
                if owner_uid in uids and not uids & live and key in objects:
                    self._delete(res, *key)  # its own dependents follow from its removal

    def _bind(self, namespace: str, name: str, node: str) -> Obj:
        res = self._resolve("pods")
        with self._lock:
            cur = self._find(res, namespace, name)
            assigned = (cur.get("spec") or {}).get("nodeName")
            if assigned:
                raise _conflict(res, name, f"pod {name} is already assigned to node {assigned!r}")
            new = copy.deepcopy(cur)
            new.setdefault("spec", {})["nodeName"] = node
            status = new.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status["conditions"] = [
                *conditions,
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
            ]
            return self._commit(res, cur, new)

    def _list(self, res: Resource, namespace: str, query: Any) -> Obj:
        selects = _selector(res, namespace, query.get("labelSelector", ""), query.get("fieldSelector", ""))
        with self._lock:
            items = [obj for _, obj in sorted(self._store[res].items()) if selects(obj)]
            rv = str(self._rv)
        return {
            "apiVersion": res.api_version,
            "kind": f"{res.kind}List",
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    # --- HTTP -------------------------------------------------------------------------------------------

    async def _handle(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        with self._lock:
            self._requests.append(Request(raw.method, raw.path, dict(raw.query)))
        try:
            route = self._route(raw.path)
            if route is None:
                if raw.path != "/" and raw.path.endswith("/"):  # the client asks `/api/`, kmock knows `/api`
                    raw = raw.clone(rel_url=raw.rel_url.with_path(raw.path.rstrip("/")))
                return await self._discovery(raw)
            return await self._serve_resource(raw, *route)
        except StatusError as exc:
            return _json(exc.status(), exc.code)

    def _route(self, path: str) -> tuple[Resource, str, str | None, str | None] | None:
        """(resource, namespace or "", name, subresource) of a resource URL; None for discovery URLs."""
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = ""
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), ("/".join(rest[2:]) or None)
        res = self._by_path.get((group, version, plural))
        missing = StatusError(404, "NotFound", "the server could not find the requested resource")
        if res is None or (namespace and not res.namespaced) or (res.namespaced and name and not namespace):
            raise missing
        if sub is not None and sub not in res.subresources:
            raise missing
        return res, namespace, name, sub

    async def _serve_resource(
        self, raw: aiohttp.web.BaseRequest, res: Resource, namespace: str, name: str | None, sub: str | None
    ) -> aiohttp.web.StreamResponse:
        query = raw.query
        if raw.method == "GET":
            if query.get("watch") in ("true", "1"):
                return await self._watch(raw, res, namespace, name)
            return _json(
                self._list(res, namespace, query) if name is None else self._find_locked(res, namespace, name)
            )
        body = await self._body(raw)
        if raw.method == "PATCH" and name is not None and sub in (None, "status"):
            patcher = self._patcher(raw.content_type, res, body)
            return _json(self._update(res, namespace, name, patcher, status=sub == "status"))
        if raw.method == "POST" and name is None:
            return _json(self._create(res, namespace, body), 201)
        if raw.method == "PUT" and name is not None and sub in (None, "status"):
            return _json(
                self._update(res, namespace, name, lambda _cur: copy.deepcopy(body), status=sub == "status")
            )
        if raw.method == "POST" and name is not None and sub == "binding":
            node = ((body or {}).get("target") or {}).get("name") or ""
            self._bind(namespace, name, node)
            return _json(_SUCCESS, 201)
        if raw.method == "POST" and name is not None and sub == "eviction":
            self._delete(res, namespace, name)
            return _json(_SUCCESS, 201)
        if raw.method == "DELETE" and name is not None and sub is None:
            options = body if isinstance(body, dict) else {}
            policy = options.get("propagationPolicy") or query.get("propagationPolicy")
            orphan = policy == "Orphan" or options.get("orphanDependents") is True
            return _json(
                self._delete(res, namespace, name, orphan=orphan, preconditions=options.get("preconditions"))
            )
        raise StatusError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )

    def _find_locked(self, res: Resource, namespace: str, name: str) -> Obj:
        with self._lock:
            return self._find(res, namespace, name)

    @staticmethod
    async def _body(raw: aiohttp.web.BaseRequest) -> Any:
        data = await raw.read()
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise _bad_request(f"the request body is not JSON: {exc}") from None

    @staticmethod
    def _patcher(content_type: str, res: Resource, patch: Any) -> Callable[[Obj], Any]:
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise _bad_request("a JSON patch must be a list of operations")

            def apply(cur: Obj) -> Any:
                try:
                    return jsonpatch.apply_patch(cur, patch)
                except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                    raise StatusError(422, "Invalid", f"the JSON patch could not be applied: {exc}") from None

            return apply
        merge = content_type == "application/merge-patch+json"
        if merge or (content_type == "application/strategic-merge-patch+json" and not res.custom):
            if not isinstance(patch, dict):
                raise _bad_request("a merge patch must be an object")
            return lambda cur: merge_patch(cur, patch)
        raise StatusError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format: "
            f"{content_type}; accepted: application/json-patch+json, application/merge-patch+json"
            + ("" if res.custom else ", application/strategic-merge-patch+json"),
        )

    async def _watch(
        self, raw: aiohttp.web.BaseRequest, res: Resource, namespace: str, name: str | None
    ) -> aiohttp.web.StreamResponse:
        query = raw.query
        fields = ",".join(
            filter(None, [query.get("fieldSelector", ""), f"metadata.name={name}" if name else ""])
        )
        watcher = _Watcher(res, _selector(res, namespace, query.get("labelSelector", ""), fields))
        try:
            timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        except ValueError:
            raise _bad_request(f"invalid timeoutSeconds: {query['timeoutSeconds']!r}") from None
        since = query.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise _bad_request(f"invalid resourceVersion: {since!r}")
        with self._lock:
            if since in ("", "0"):  # the current state as ADDED first, then the changes
                initial = [
                    {"type": "ADDED", "object": obj}
                    for _, obj in sorted(self._store[res].items())
                    if watcher.selects(obj)
                ]
                if query.get("sendInitialEvents") == "true":
                    end = {
                        "kind": res.kind,
                        "apiVersion": res.api_version,
                        "metadata": {
                            "resourceVersion": str(self._rv),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    }
                    initial.append({"type": "BOOKMARK", "object": end})
                live = True
            elif int(since) < self._compacted:
                gone = StatusError(410, "Expired", f"too old resource version: {since} ({self._compacted})")
                initial, live = [{"type": "ERROR", "object": gone.status()}], False
            else:  # the changes after that resourceVersion only
                initial = [
                    e
                    for ch in self._history
                    if ch.rv > int(since) and ch.resource == res
                    for e in [watcher.event(ch)]
                    if e is not None
                ]
                live = True
            live = live and not self._closing
            if live:
                self._watchers.add(watcher)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(raw)
            for event in initial:
                await response.write(_line(event))
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while live:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    change = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    break  # timeoutSeconds: the server ends the stream
                if change is None:
                    break  # drop_watches()
                event = watcher.event(change)
                if event is not None:
                    await response.write(_line(event))
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            with self._lock:
                self._watchers.discard(watcher)
        return response


@pytest.fixture
def kube_api() -> Iterator[KubeAPI]:
    """A running stand-in with the default resources; stopped (thread joined) after the test."""
    with KubeAPI() as server:
        yield server
