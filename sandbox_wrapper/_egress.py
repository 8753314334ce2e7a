"""The sandbox's end of its egress path: a proxy listener on the container's loopback, relayed byte for byte
to the host's egress socket, and the proxy variables that point standard clients at it.

Nothing is decided here: the host reads every request and holds it to the run's grant (host/egress/). The
listener exists only when the host put an egress socket beside the run's socket; without one no variable
is set and the container, whose only interface is `lo`, has no way out at all. A client that ignores the
variables finds no route either way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

EGRESS_SOCKET_NAME = "egress.sock"
"""The egress socket beside the run's socket, present only when the host grants the sandbox egress."""
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
"""Both spellings: curl reads only the lowercase `http_proxy`, Python's clients read either."""
_CHUNK = 256 * 1024
_BACKLOG = 64


def egress_socket(run_socket: str) -> str:
    """Where the host puts this sandbox's egress socket, when it grants one."""
    return os.path.join(os.path.dirname(run_socket), EGRESS_SOCKET_NAME)


def open_egress(run_socket: str) -> str:
    """Start the relay if the host granted egress, and set the proxy variables: the proxy's URL, or ""."""
    path = egress_socket(run_socket)
    if not os.path.exists(path):
        return ""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(_BACKLOG)
    except OSError:
        listener.close()
        return ""
    port = listener.getsockname()[1]
    threading.Thread(target=_accept, args=(listener, path), daemon=True, name="agentnode-egress").start()
    url = f"http://127.0.0.1:{port}"
    for name in PROXY_VARIABLES:
        os.environ[name] = url
    for name in ("NO_PROXY", "no_proxy"):
        os.environ.pop(name, None)
    return url


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        relay = threading.Thread(target=_relay, args=(client, path), daemon=True, name="egress-conn")
        relay.start()


def _relay(client: socket.socket, path: str) -> None:
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        host.connect(path)
    except OSError:
        host.close()
        client.close()
        return
    with contextlib.suppress(OSError):
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_copy, args=(host, client), daemon=True, name="agentnode-egress-back")
    back.start()
    _copy(client, host)
    back.join()
    host.close()
    client.close()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    """One direction until its end (then the other side learns it: a half close), or either side fails."""
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    try:
        while True:
            n = src.recv_into(buffer)
            if not n:
                break
            dst.sendall(view[:n])
    except OSError:  # stop reading only: what the other direction still carries (a refusal) goes through
        with contextlib.suppress(OSError):
            src.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


__all__ = ["EGRESS_SOCKET_NAME", "PROXY_VARIABLES", "egress_socket", "open_egress"]
