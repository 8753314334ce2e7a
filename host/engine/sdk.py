"""The docker SDK client, for the engine work the run path never does (pack volumes, image builds and pulls):
imported only there, so a run does not pay for the SDK's import."""

from __future__ import annotations

import os
import queue
from collections.abc import Mapping
from typing import Any

import docker
import docker.constants
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnectionPool

from host.engine.engine import (
    DEFAULT_DOCKER_HOST,
    ENGINE_POOL_SIZE,
    ENGINE_SHARED_POOL_SIZE,
    _reach_unix_socket,
)
from host.engine.errors import classify_engine_exception
from host.engine.facts import _header


class _IdleBoundedPool(UnixHTTPConnectionPool):  # type: ignore[misc]
    """docker-py's Unix socket pool keeping at most `maxsize` idle connections: more are opened while runs
    need them, and one returned to a full pool is closed quietly (urllib3 logs a warning for each)."""

    def _put_conn(self, conn: Any) -> None:
        try:
            self.pool.put(conn, block=False)  # AttributeError: the pool was closed (self.pool is None)
        except (AttributeError, queue.Full):
            if conn is not None:
                conn.close()


class _OneUnixPool(UnixHTTPAdapter):  # type: ignore[misc]
    """docker-py's Unix socket adapter with one connection pool for the socket. The SDK keys its pools by
    the whole request URL and keeps 10: every container's requests opened fresh connections through a
    fresh pool (filling a queue of `max_pool_size` slots each time), ~6 per run and more under concurrency,
    where the pools also evicted each other. All URLs reach the same socket, so one pool serves them all."""

    def get_connection(self, url: str, proxies: Any = None) -> Any:
        key = "http+docker://localhost"
        with self.pools.lock:
            pool = self.pools.get(key)
            if pool is None:
                pool = _IdleBoundedPool(key, self.socket_path, self.timeout, maxsize=self.max_pool_size)
                self.pools[key] = pool
        return pool


def _share_one_pool(client: docker.DockerClient, timeout: int) -> None:
    """Swap a Unix-socket client's adapter for `_OneUnixPool`, and stop the HTTP session from reading proxy
    settings from the environment on every request (a Unix socket goes through no proxy)."""
    api = client.api
    current: Any = getattr(api, "_custom_adapter", None)
    if type(current) is not UnixHTTPAdapter:  # a TCP, SSH or named-pipe engine keeps the SDK's own
        return
    shared = _OneUnixPool(
        "http+unix://" + current.socket_path, timeout=timeout, max_pool_size=ENGINE_SHARED_POOL_SIZE
    )
    api.mount("http+docker://", shared)
    api._custom_adapter = shared
    api.trust_env = False
    current.close()


def connect(env: Mapping[str, str] | None = None, *, timeout: int = 60) -> docker.DockerClient:
    """An SDK client of the engine named by DOCKER_HOST (or the default socket), proven to answer: for pack
    volumes, image builds and pulls (the run path opens host.engine.engine.open_engine, never this)."""
    environment = dict(os.environ if env is None else env)
    clients: list[docker.DockerClient] = []

    def client_for(version: str) -> docker.DockerClient:
        # A pool as large as the concurrency we serve: the default (10) overflows under parallel calls.
        opened = docker.DockerClient.from_env(
            environment=environment, version=version, timeout=timeout, max_pool_size=ENGINE_POOL_SIZE
        )
        clients.append(opened)
        return opened

    try:
        # The SDK leaves a socket open when a Unix connect fails, and its own version probe ("auto") cannot
        # be closed when it fails; so reach the socket and negotiate the version here, closing what we open.
        _reach_unix_socket(environment.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST, timeout)
        probe = client_for(docker.constants.MINIMUM_DOCKER_API_VERSION)
        api = probe.api
        response = api._get(api._url("/_ping", versioned_api=False))
        api._raise_for_status(response)
        api_version = _header(response.headers, "Api-Version")  # what `docker` itself negotiates with
        if not api_version:  # an engine older than API 1.25 does not say it there
            api_version = str(api.version(api_version=False)["ApiVersion"])
        client = client_for(api_version)
        _share_one_pool(client, timeout)
    except Exception as exc:  # noqa: BLE001 (the SDK raises many types; all are classified)
        for opened in clients:
            opened.close()
        raise classify_engine_exception(exc) from None
    clients[0].close()
    return client


__all__ = ["connect"]
