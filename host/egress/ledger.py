"""One run's egress account: caps on connections and bytes shared by every sandbox of the run, and the
sanitized counts its audit record, metrics and trace are made of (granted rules and fixed reasons only).

The agent's sandbox and each of its tool sandboxes have an egress listener of their own (their own grant),
and all of them draw on the run's ledger: a run that opens its connections from four tool sandboxes gets
no more than one that opens them from one. Nothing here ever holds a name a sandbox asked for: allowed
connections are counted under the rule that granted them (operator- and pack-written text), refused ones
under a fixed reason.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from host.core.calltrace import CallTrace
from host.spec.egress import EgressLimits

REFUSALS = (
    "bad_request",  # not an HTTP/1.1 request head h11 reads, or framing it refuses
    "head_too_large",  # a request head (or its header count) over the bounds
    "slow_request",  # no full request head (or ClientHello) in time
    "bad_target",  # not CONNECT host:port or absolute-form http://host[:port]/...
    "name_not_granted",  # a name the run's grant does not cover (never looked up)
    "port_not_granted",  # a granted name, a port the grant does not hold
    "address_not_granted",  # an IP literal the grant does not name
    "resolve_failed",  # the granted name has no address
    "private_address",  # it resolves only to loopback, private, link-local, ... addresses
    "metadata_address",  # it resolves to a cloud metadata endpoint
    "connect_failed",  # the origin did not accept in time
    "too_many_connections",  # the run's concurrent-connection cap
    "connection_cap",  # the run's total-connection cap
    "run_ended",  # the run is over (or its listener is closing)
    "not_tls",  # a CONNECT tunnel whose first bytes are no TLS ClientHello
    "sni_mismatch",  # the ClientHello names another server than the CONNECT did
    "tls_refused",  # a ClientHello the reader refuses (host/egress/tls.py names why in its own counter)
)
"""Why a connection never reached its origin: the only words a refusal is recorded with."""

CUTS = ("bytes_out_cap", "bytes_in_cap", "lifetime", "idle", "run_ended", "bad_response")
"""Why an established connection was closed by the host (beyond its ends closing it)."""


class EgressLedger:
    """The run's counters and caps; thread-safe. `admit` takes a connection slot (or says why not),
    `release` gives it back; byte counts are taken before bytes are passed on."""

    def __init__(self, limits: EgressLimits | None = None) -> None:
        self.limits = limits or EgressLimits()
        self._lock = threading.Lock()
        self._active = 0
        self._total = 0
        self._ended = False
        self.bytes_out = 0
        self.bytes_in = 0
        self._rules: dict[str, list[int]] = {}  # rule text -> [connections, bytes out, bytes in]
        self.refused: dict[str, int] = {}
        self.cut: dict[str, int] = {}
        self.trace = CallTrace()
        """One span per connection that was admitted (attributes: rule, outcome, byte counts)."""

    def admit(self) -> str | None:
        """Take a connection slot: None, or the refusal (already counted)."""
        with self._lock:
            if self._ended:
                reason = "run_ended"
            elif self._total >= self.limits.max_connections:
                reason = "connection_cap"
            elif self._active >= self.limits.max_concurrent:
                reason = "too_many_connections"
            else:
                self._active += 1
                self._total += 1
                return None
            self.refused[reason] = self.refused.get(reason, 0) + 1
            if reason == "too_many_connections":  # an attempt like any other: it counts toward the total
                self._total += 1
            return reason

    def release(self) -> None:
        with self._lock:
            self._active -= 1

    def refuse(self, reason: str) -> None:
        assert reason in REFUSALS, reason
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def cut_off(self, reason: str) -> None:
        assert reason in CUTS, reason
        with self._lock:
            self.cut[reason] = self.cut.get(reason, 0) + 1

    def connected(self, rule: str) -> None:
        """A connection granted by `rule` (its text) reached its origin."""
        with self._lock:
            self._rules.setdefault(rule, [0, 0, 0])[0] += 1

    def take_out(self, rule: str, n: int) -> bool:
        """Count `n` bytes toward an origin; False (nothing counted) when they would pass the run's cap."""
        with self._lock:
            if self.bytes_out + n > self.limits.max_bytes_out:
                return False
            self.bytes_out += n
            self._rules.setdefault(rule, [0, 0, 0])[1] += n
            return True

    def take_in(self, rule: str, n: int) -> bool:
        """Count `n` bytes from an origin; False (nothing counted) when they would pass the run's cap."""
        with self._lock:
            if self.bytes_in + n > self.limits.max_bytes_in:
                return False
            self.bytes_in += n
            self._rules.setdefault(rule, [0, 0, 0])[2] += n
            return True

    def end(self) -> None:
        """The run is over: no connection is admitted from now on."""
        with self._lock:
            self._ended = True

    @property
    def active(self) -> int:
        with self._lock:
            return self._active

    @property
    def used(self) -> bool:
        """Whether any connection was attempted (a run without egress traffic records none)."""
        with self._lock:
            return self._total > 0 or bool(self.refused)

    def summary(self) -> dict[str, Any]:
        """The audit record's `egress` section: per granting rule, connections and bytes each way; refusals
        and cuts by fixed reason; the caps."""
        with self._lock:
            return {
                "attempts": self._total,
                "bytes_out": self.bytes_out,
                "bytes_in": self.bytes_in,
                "rules": {
                    rule: {"connections": c, "bytes_out": out, "bytes_in": inn}
                    for rule, (c, out, inn) in sorted(self._rules.items())
                },
                "refused": dict(sorted(self.refused.items())),
                "cut": dict(sorted(self.cut.items())),
                "limits": {
                    "max_connections": self.limits.max_connections,
                    "max_concurrent": self.limits.max_concurrent,
                    "max_bytes_out": self.limits.max_bytes_out,
                    "max_bytes_in": self.limits.max_bytes_in,
                },
            }

    def span(self, start: float, *, rule: str, outcome: str, sent: int, received: int) -> None:
        """One connection's span for the run's trace (rule text and fixed words only)."""
        self.trace.add("agentnode.egress", start, {
            "agentnode.egress.rule": rule, "agentnode.egress.outcome": outcome,
            "agentnode.egress.bytes_out": sent, "agentnode.egress.bytes_in": received,
        })  # fmt: skip

    @staticmethod
    def now() -> float:
        return time.monotonic()


__all__ = ["CUTS", "REFUSALS", "EgressLedger"]
