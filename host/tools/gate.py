"""The host's tool gate: every tool call an agent asks for is decided here, one ToolGate per run.

It owns the run's decisions: allowlist, call cap, argument limits and schema (host/tools/arguments.py), trust
and the time budget; nothing in a request can change how, where or how long a tool runs. Allowed calls of
trusted packs go to the host's ToolRunner (host/tools/workers.py), community packs' to the run's tool
sandboxes.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from host.core.calltrace import CallTrace
from host.core.vocab import HOST_TRUST, WireReason
from host.tools.arguments import checked_arguments
from host.tools.calls import (
    DEFAULT_TOOL_TIMEOUT,
    MAX_MESSAGE,
    MAX_REQUEST_BYTES,
    MODE_HOST_WORKER,
    MODE_TOOL_SANDBOX,
    InstalledToolpack,
    ResolvedTool,
    ToolOutcome,
    ToolpackLookup,
    ToolRefusal,
    resolve_tool,
)
from host.tools.workers import ToolRunner

PARSE_SLOTS = 2
"""Arguments one run's gate parses at once: a parse allocates up to ~25x its bytes (1 MiB of `[]`s is
~25 MB of lists), so concurrent calls of one run wait for a slot instead of multiplying that."""
RESOLVED_PER_RUN = 64
"""Tool names a run's gate remembers how to resolve (ToolGate._resolve)."""
PARSE_SLOT_MIN_CHARS = 4096
"""Arguments up to this long are parsed without a slot: what they can allocate (~100 KB) costs less than
waiting for one."""

_SLUG = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class SandboxRunner(Protocol):
    """What the gate needs of a run's tool sandboxes (host/runtime/toolsandbox.ToolSandboxes, one layer up):
    community packs' calls go there, and the gate owns neither their containers nor their engine."""

    started: int
    """Tool sandboxes started in this run (replacements included)."""

    def run(
        self, pack: InstalledToolpack, tool: ResolvedTool, arguments: dict[str, Any], *, timeout: float
    ) -> ToolOutcome:
        """Run one admitted call in the pack's sandbox; every failure is a failed outcome of this call."""
        ...

    def close(self) -> None:
        """The run ended: destroy every tool sandbox."""
        ...


class ToolGate:
    """One run's tool gate: decides every call, then hands allowed ones to the host's ToolRunner.

    Every refusal happens before a call is reserved, so refusals never use up the cap; the cap check and
    the reservation are one atomic step, so concurrent calls can never run more tools than the cap.
    A call that was reserved counts even when the tool then fails. Checks run cheapest first: whatever
    needs no arguments (allowlist, cap, pack, trust, tool, time) before the arguments are parsed, and the
    schema last, so a refused call costs at most one bounded parse.
    """

    def __init__(
        self,
        *,
        allowed_packages: Iterable[str] | None,
        max_tool_calls: int,
        lookup: ToolpackLookup,
        runner: ToolRunner,
        deadline: float,
        tool_timeout: float = DEFAULT_TOOL_TIMEOUT,
        sandboxes: SandboxRunner | None = None,
    ) -> None:
        self._allowed = None if allowed_packages is None else frozenset(allowed_packages)
        self._max_tool_calls = max_tool_calls
        self._lookup = lookup
        self._runner = runner
        self._sandboxes = sandboxes  # community packs' calls; None: refused (the host's sandbox is off)
        self._placed: dict[str, int] = {}
        self._deadline = deadline
        self._tool_timeout = tool_timeout
        self._lock = threading.Lock()
        # each decided call's timing, for the run's trace (host/runtime/telemetry/tracing.py)
        self.trace = CallTrace()
        self._parsing = threading.BoundedSemaphore(PARSE_SLOTS)
        self._resolved: dict[tuple[str, str], tuple[InstalledToolpack, ResolvedTool]] = {}
        self._calls_made = 0
        self._refusals = 0

    @property
    def calls_made(self) -> int:
        """Calls reserved (and run) so far."""
        return self._calls_made

    @property
    def refusals(self) -> int:
        """Calls refused so far."""
        return self._refusals

    @property
    def remaining(self) -> int:
        """Calls the run may still make."""
        return max(0, self._max_tool_calls - self._calls_made)

    @property
    def deadline(self) -> float:
        """The run's deadline (time.monotonic) that bounds every call."""
        return self._deadline

    def calls_in(self, mode: str) -> int:
        """Calls run (or running) in `mode` (MODE_HOST_WORKER, MODE_TOOL_SANDBOX), failed ones included."""
        return self._placed.get(mode, 0)

    @property
    def sandboxes_started(self) -> int:
        """Tool sandboxes this run started."""
        return self._sandboxes.started if self._sandboxes is not None else 0

    def close(self) -> None:
        """The run ended: its tool sandboxes are destroyed (host workers are the host's, and stay)."""
        if self._sandboxes is not None:
            self._sandboxes.close()

    def refused(self, refusal: ToolRefusal) -> ToolRefusal:
        """Count a refusal decided outside `call` (the RPC layer's checks on the raw request)."""
        with self._lock:
            self._refusals += 1
        return refusal

    def screen(self, request_bytes: int) -> None:
        """The checks that need no request at all, run by the RPC layer before it decodes one: a run with
        no allowlist or no calls left, or a request larger than MAX_REQUEST_BYTES, is refused (counted)."""
        if self._allowed is not None and not self._allowed:
            raise self.refused(ToolRefusal(WireReason.TOOL_NOT_ALLOWED, "this run's tool allowlist is empty"))
        if self.remaining == 0:
            raise self.refused(_call_limit())
        if request_bytes > MAX_REQUEST_BYTES:
            too_large = f"the request exceeds {MAX_REQUEST_BYTES} bytes"
            raise self.refused(ToolRefusal(WireReason.TOO_LARGE, too_large))

    def call(
        self,
        slug: str,
        tool_name: str,
        arguments_json: str,
        *,
        on_admit: Callable[[], None] | None = None,
    ) -> ToolOutcome:
        """Decide one call and run it if allowed; raises ToolRefusal (counted) when refused.

        `on_admit` runs once the call passed every check and was reserved, before the tool runs.
        """
        start = time.monotonic()
        try:
            pack, tool, arguments, timeout = self._admit(slug, tool_name, arguments_json)
        except ToolRefusal as refusal:
            self.trace.add("agentnode.tool_call", start, {"agentnode.outcome": str(refusal.reason)})
            raise self.refused(refusal) from None
        if on_admit is not None:
            on_admit()
        runner: ToolRunner | SandboxRunner = self._runner
        mode = MODE_HOST_WORKER
        if pack.trust not in HOST_TRUST:
            assert self._sandboxes is not None  # else refused in _admit
            runner, mode = self._sandboxes, MODE_TOOL_SANDBOX
        with self._lock:  # counted where it runs as it starts, like the reservation itself
            self._placed[mode] = self._placed.get(mode, 0) + 1
        outcome = runner.run(pack, tool, arguments, timeout=timeout)
        if outcome.missing:  # name what the agent can call instead (§3.3's ImportError)
            names = ", ".join(t.name for t in pack.manifest.tools) or "(none)"
            error = f"tool not found: package '{slug}' defines no function for this call; its tools: {names}"
            outcome = ToolOutcome(False, None, error[:MAX_MESSAGE], outcome.mode_used)
        self.trace.add("agentnode.tool_call", start, {
            "agentnode.outcome": "ok" if outcome.success else "failed",
            "agentnode.tool.package": pack.slug,  # a slug that passed its pattern and the lookup
            "agentnode.tool.name": tool.spec.name if tool.spec is not None else "",  # the lockfile's
            "agentnode.tool.mode": mode,
        })  # fmt: skip
        return outcome

    def _admit(
        self, slug: str, tool_name: str, arguments_json: str
    ) -> tuple[InstalledToolpack, ResolvedTool, dict[str, Any], float]:
        if not _SLUG.fullmatch(slug):
            raise ToolRefusal(WireReason.INVALID_REQUEST, "package_slug is empty or not a package slug")
        if self._allowed is not None and slug not in self._allowed:
            raise ToolRefusal(
                WireReason.TOOL_NOT_ALLOWED, f"package '{slug}' is not on this run's tool allowlist"
            )
        if self.remaining == 0:
            raise _call_limit()
        pack = self._lookup(slug)
        if pack is None:
            raise ToolRefusal(WireReason.TOOL_NOT_FOUND, f"package '{slug}' is not installed on this host")
        if pack.trust not in HOST_TRUST and self._sandboxes is None:
            raise ToolRefusal(
                WireReason.TOOL_PACK_UNTRUSTED,
                "community tool packs run only in tool sandboxes, and this host's sandbox is off "
                "(AGENTNODE_AGENT_SANDBOX=1 turns it on)",
            )
        tool = self._resolve(pack, tool_name)
        if self._deadline - time.monotonic() <= 0:
            raise ToolRefusal(WireReason.RUN_DEADLINE, "the run's time budget is spent")
        schema = tool.spec.input_schema if tool.spec is not None else None
        if len(arguments_json) <= PARSE_SLOT_MIN_CHARS:
            arguments = checked_arguments(arguments_json, schema)
        else:
            with self._parsing:  # the first step whose cost grows with the request
                arguments = checked_arguments(arguments_json, schema)
        timeout = min(self._tool_timeout, self._deadline - time.monotonic())
        if timeout <= 0:
            raise ToolRefusal(WireReason.RUN_DEADLINE, "the run's time budget is spent")
        with self._lock:
            if self._calls_made >= self._max_tool_calls:
                raise _call_limit()
            self._calls_made += 1
        return pack, tool, arguments, timeout

    def _resolve(self, pack: InstalledToolpack, tool_name: str) -> ResolvedTool:
        """resolve_tool, remembered per (pack, name) for the run: a loop calling one tool resolves it once.
        At most RESOLVED_PER_RUN names are kept (an agent chooses them); others are resolved every time."""
        key = (pack.slug, tool_name)
        known = self._resolved.get(key)
        if known is not None and known[0] is pack:
            return known[1]
        tool = resolve_tool(pack.slug, pack.manifest, tool_name)
        if len(self._resolved) < RESOLVED_PER_RUN:
            self._resolved[key] = (pack, tool)
        return tool


def _call_limit() -> ToolRefusal:
    return ToolRefusal(WireReason.TOOL_CALL_LIMIT, "this run's tool-call cap is used up")


__all__ = ["PARSE_SLOTS", "SandboxRunner", "ToolGate"]
