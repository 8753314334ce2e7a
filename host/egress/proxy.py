"""The host's end of one sandbox's egress path: a Unix socket in the sandbox's run directory, on which every
connection is one proxy request decided here, never in the sandbox.

Each connection, in order: a slot from the run's ledger (caps on concurrent and total connections); one
request head (host/egress/request.py); its target held to the grant before anything is looked up (a
refused name never reaches a resolver: DNS is a channel too); the name resolved by the host (`hosts` from
the config first), every address judged by address_refusal, the connection made to the address judged
(no second lookup, so no rebinding); then either a tunnel, whose first bytes must be a TLS ClientHello
naming the very host the CONNECT named, or one plain request re-sent in origin form with
`Connection: close` and its response passed back until h11 says it ended. Bytes both ways are counted
against the run's caps before they pass, and a connection is cut when idle, when it outlives its
lifetime, or when the run ends (`stop`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h11

from host.egress.ledger import EgressLedger
from host.egress.request import Refused, Target, origin_request, read_head, receive, target_of
from host.egress.tls import read_hello
from host.policy.egress import EgressGrant
from host.spec.egress import EgressConfig, IpAddress, Rule, address_refusal

logger = logging.getLogger("agentnode.sandbox.egress")

Resolver = Callable[[str, int], list[IpAddress]]
"""A name and port to the addresses the host may connect to (the system resolver by default)."""

CHUNK = 256 * 1024
_MAX_RESPONSE_HEAD = 64 * 1024
_BACKLOG = 64

_STATUS = {
    "bad_request": b"400 Bad Request", "bad_target": b"400 Bad Request",
    "head_too_large": b"431 Request Header Fields Too Large", "slow_request": b"408 Request Timeout",
    "resolve_failed": b"502 Bad Gateway", "connect_failed": b"502 Bad Gateway",
    "too_many_connections": b"429 Too Many Requests", "connection_cap": b"429 Too Many Requests",
    "run_ended": b"503 Service Unavailable",
}  # fmt: skip
"""A refusal's status line; every other refusal (the policy's) is 403."""


def refusal_response(reason: str) -> bytes:
    """The host-written answer to a refused request: its status, and the fixed reason in a header and body."""
    status = _STATUS.get(reason, b"403 Forbidden")
    body = b"agentnode egress refused: " + reason.encode("ascii") + b"\n"
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain\r\nconnection: close\r\n"
            b"x-agentnode-egress: " + reason.encode("ascii") + b"\r\ncontent-length: "
            + str(len(body)).encode("ascii") + b"\r\n\r\n" + body)  # fmt: skip


_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"


def system_resolve(name: str, port: int) -> list[IpAddress]:
    """The host's resolver's addresses for `name` (TCP), in its order; [] when it has none."""
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    found: list[IpAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
            if address not in found:
                found.append(address)
    return found


@dataclass(frozen=True)
class EgressRoute:
    """What one sandbox's egress listener decides with: its grant, the operator's `hosts` and
    `private_cidrs`, the run's ledger, and the resolver."""

    grant: EgressGrant
    config: EgressConfig
    ledger: EgressLedger
    resolve: Resolver = field(default=system_resolve)

    def serve(self, path: str) -> EgressProxy:
        """The listener on `path`, built but not started."""
        return EgressProxy(path, self)


class _Cut(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EgressProxy:
    """Listens on one sandbox's egress socket; a thread per admitted connection (the ledger bounds them)."""

    def __init__(self, path: str, route: EgressRoute) -> None:
        self.path = path
        self.route = route
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closing = False
        self._threads: set[threading.Thread] = set()

    # -- lifetime ----------------------------------------------------------------------------------

    def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)
            listener.listen(_BACKLOG)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        threading.Thread(target=self._accept_loop, daemon=True, name="egress-accept").start()

    def stop(self, grace: float | None = None) -> None:
        """Close the listener and every connection of this sandbox (the run ended, or the sandbox went)."""
        with self._lock:
            self._closing = True
            listener, self._listener = self._listener, None
            live = list(self._open)
            threads = list(self._threads)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        end = time.monotonic() + (grace if grace is not None else 2.0)
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    # -- connections -------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        ledger = self.route.ledger
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed by stop
            reason = "run_ended" if self._closing else ledger.admit()
            if reason is not None:
                if self._closing:
                    ledger.refuse(reason)
                _answer_and_close(conn, refusal_response(reason))
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True, name="egress-conn")
            with self._lock:
                self._threads.add(thread)
                self._open.add(conn)
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: this connection is refused, its slot given back
                self._finish(conn)
                ledger.release()

    def _serve(self, conn: socket.socket) -> None:
        ledger = self.route.ledger
        start = time.monotonic()
        upstream: socket.socket | None = None
        relay: _Relay | None = None
        rule_text, outcome, answered = "", "refused", False
        try:
            h, request = read_head(conn, start + ledger.limits.head_seconds)
            target = target_of(request)
            rule_text = _rule_key(self._granting_rule(target), target.port)
            upstream = self._connect(target)
            with self._lock:
                if self._closing:
                    raise Refused("run_ended")
                self._open.add(upstream)
            relay = _Relay(conn, upstream, ledger, rule_text, start, lambda: self._closing)
            if target.tunnel:
                conn.sendall(_ESTABLISHED)
                answered = True
                first = _client_hello(conn, h, target, start + ledger.limits.head_seconds)
                ledger.connected(rule_text)
                outcome = "closed"
                relay.send(first, inbound=False)
                relay.pump()
            else:
                ledger.connected(rule_text)
                outcome, answered = "closed", True
                relay.forward(h, request, target)
        except Refused as refused:
            outcome = "run_ended" if self._closing else refused.reason
            ledger.refuse(outcome)
            if not answered:
                with contextlib.suppress(OSError):
                    conn.settimeout(1.0)
                    conn.sendall(refusal_response(outcome))
        except _Cut as cut:
            outcome = "run_ended" if self._closing else cut.reason
            ledger.cut_off(outcome)
        except OSError:
            outcome = "closed"  # either end went away, or the run ended under it
            if self._closing and relay is not None:
                outcome = "run_ended"
                ledger.cut_off(outcome)
        except Exception as exc:  # noqa: BLE001 (a fault here closes this connection, never the host)
            logger.warning("egress connection failed: %s", type(exc).__name__)
            outcome = "host_error"
        finally:
            self._finish(conn, upstream)
            ledger.release()
            if rule_text:
                sent, received = relay.counts if relay is not None else (0, 0)
                ledger.span(start, rule=rule_text, outcome=outcome, sent=sent, received=received)

    def _finish(self, *socks: socket.socket | None) -> None:
        for sock in socks:
            if sock is None:
                continue
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock:
            self._threads.discard(threading.current_thread())

    def _granting_rule(self, target: Target) -> Rule:
        """The grant's rule that allows the target, checked before any lookup; Refused otherwise."""
        for rule in self.route.grant.rules:
            if rule.allows(target.host, target.port):
                return rule
        if target.host.address is not None:
            raise Refused("address_not_granted")
        if any(rule.covers(target.host) for rule in self.route.grant.rules):
            raise Refused("port_not_granted")
        raise Refused("name_not_granted")

    def _connect(self, target: Target) -> socket.socket:
        """A connection to the first address of the granted target that may be reached."""
        config = self.route.config
        if target.host.address is not None:
            addresses = [target.host.address]
        elif target.host.name in config.hosts:
            addresses = [config.hosts[target.host.name]]
        else:
            addresses = self.route.resolve(target.host.name, target.port)
        if not addresses:
            raise Refused("resolve_failed")
        refusal = ""
        for address in addresses:
            why = address_refusal(address, config.private_cidrs)
            if why is None:
                break
            refusal = refusal if refusal == "metadata_address" else why
        else:
            raise Refused(refusal)
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.route.ledger.limits.connect_seconds)
            sock.connect((str(address), target.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            raise Refused("connect_failed") from None
        return sock


def _rule_key(rule: Rule, port: int) -> str:
    shown = f"*.{rule.host}" if rule.wildcard else str(rule.host)
    return f"{shown}:{port}"


def _answer_and_close(conn: socket.socket, data: bytes) -> None:
    """A refusal without a thread: one non-blocking send (a peer that does not read loses it), then close."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(data)
    conn.close()


def _client_hello(conn: socket.socket, h: h11.Connection, target: Target, deadline: float) -> bytes:
    """The tunnel's first bytes, up to a whole ClientHello whose server name is the CONNECT's host (an
    address CONNECT: no server name); Refused otherwise."""
    data, _closed = h.trailing_data
    buffered = bytes(data)
    while True:
        hello = read_hello(buffered)
        if not hello.more:
            break
        more = receive(conn, deadline)
        if not more:
            raise Refused("not_tls")
        buffered += more
    if hello.refusal:
        raise Refused("not_tls" if hello.refusal in ("not_tls", "not_client_hello") else "tls_refused")
    expected = None if target.host.address is not None else target.host
    if hello.host != expected:
        raise Refused("sni_mismatch")
    return buffered


@dataclass
class _Relay:
    """One admitted connection's two ends once its origin is reached: every byte counted against the run's
    caps before it is sent, and the connection cut when idle, too old, over a cap, or the run ended."""

    client: socket.socket
    upstream: socket.socket
    ledger: EgressLedger
    rule: str
    start: float
    closing: Callable[[], bool]
    counts: list[int] = field(default_factory=lambda: [0, 0])
    """Bytes sent to the origin, bytes passed back from it."""

    @property
    def lifetime_end(self) -> float:
        return self.start + self.ledger.limits.connection_seconds

    def send(self, data: bytes | memoryview, *, inbound: bool) -> None:
        """Send `data` on (to the client when `inbound`) once the run's cap has room; _Cut when it has not."""
        if not data:
            return
        take = self.ledger.take_in if inbound else self.ledger.take_out
        if not take(self.rule, len(data)):
            raise _Cut("bytes_in_cap" if inbound else "bytes_out_cap")
        self.counts[1 if inbound else 0] += len(data)
        try:
            (self.client if inbound else self.upstream).sendall(data)
        except TimeoutError:
            raise _Cut("idle") from None

    def pump(self) -> None:
        """Pass bytes both ways until both ends closed (each end's close passed on as a half close)."""
        limits = self.ledger.limits
        ends = {self.client.fileno(): (self.client, self.upstream, False),
                self.upstream.fileno(): (self.upstream, self.client, True)}  # fmt: skip
        for sock in (self.client, self.upstream):
            sock.settimeout(limits.idle_seconds)  # a send the other end does not read is idle too
        poller = select.poll()
        for fd in ends:
            poller.register(fd, select.POLLIN)
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        open_ends, last = len(ends), time.monotonic()
        while open_ends:
            now = time.monotonic()
            wait = min(last + limits.idle_seconds, self.lifetime_end) - now
            if wait <= 0:
                raise _Cut("lifetime" if now >= self.lifetime_end else "idle")
            events = poller.poll(wait * 1000)
            if self.closing():
                raise _Cut("run_ended")
            for fd, _mask in events:
                src, dst, inbound = ends[fd]
                try:
                    n = src.recv_into(buffer)
                except (ConnectionResetError, TimeoutError):
                    n = 0
                if n == 0:
                    poller.unregister(fd)
                    open_ends -= 1
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    continue
                self.send(view[:n], inbound=inbound)
                last = time.monotonic()

    def forward(self, h: h11.Connection, request: h11.Request, target: Target) -> None:
        """One plain request to the origin (its body read through h11, bounded like a tunnel's bytes), then
        the origin's response passed back as it came, up to the end h11 reads for it; nothing the client
        sent after its request's end is ever read."""
        limits = self.ledger.limits
        origin = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_RESPONSE_HEAD)
        self.upstream.settimeout(limits.idle_seconds)
        if h.they_are_waiting_for_100_continue:
            with contextlib.suppress(OSError):
                self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.send(origin.send(origin_request(request, target)) or b"", inbound=False)
        while True:  # the request's body, if any
            try:
                event = h.next_event()
            except h11.RemoteProtocolError:
                raise Refused("bad_request") from None
            if event is h11.NEED_DATA:
                data = receive(self.client, min(time.monotonic() + limits.idle_seconds, self.lifetime_end))
                if not data:
                    raise _Cut("idle")  # the client closed mid-body: nothing complete to send
                h.receive_data(data)
            elif isinstance(event, h11.Data | h11.EndOfMessage):
                self.send(origin.send(event) or b"", inbound=False)
                if isinstance(event, h11.EndOfMessage):
                    break
            else:
                raise Refused("bad_request")
        self.client.settimeout(limits.idle_seconds)
        buffer = bytearray(CHUNK)
        while True:  # the response, passed on as it came, read only as far as its end
            if self.closing():
                raise _Cut("run_ended")
            if time.monotonic() >= self.lifetime_end:
                raise _Cut("lifetime")
            try:
                n = self.upstream.recv_into(buffer)
            except TimeoutError:
                raise _Cut("idle") from None
            except ConnectionResetError:
                n = 0
            chunk = bytes(buffer[:n])
            origin.receive_data(chunk)
            ended = _response_ended(origin)
            self.send(chunk, inbound=True)
            if ended or n == 0:
                return


def _response_ended(origin: h11.Connection) -> bool:
    """Whether the response fed to `origin` so far is complete (h11 read its end); _Cut if it is not HTTP."""
    try:
        while (event := origin.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return True
    except h11.RemoteProtocolError:
        raise _Cut("bad_response") from None
    return False


__all__ = ["CHUNK", "EgressProxy", "EgressRoute", "Resolver", "refusal_response", "system_resolve"]
