"""One run's tool sandboxes: each community tool pack the run calls gets a container of its own, started on
its first call, reused for the run's later calls of that pack, and destroyed with the run.

A tool sandbox is the Docker backend's container (host/runtime/backends/container.py ToolSandbox: the agent's
hardened profile, the run's runtime and image pin, the tool pack's own verified volume, its own socket)
running the wrapper's tool-server mode; its calls cross a ToolLink (host/tools/link.py). The run's ToolGate
decides every call as for a trusted pack and hands community ones here; replies become ToolOutcomes through
the same `reply_outcome` (host/tools/calls.py) as the host worker's, so results, errors, size caps and
timeouts read the same on both paths.

Rules: one call at a time per sandbox (later calls of that pack queue, within their own timeout); a call's
timeout covers a start it needs; a call that times out, or whose sandbox dies or breaks the protocol, fails
alone and its sandbox is destroyed, and the pack's next call starts a fresh one, at most
MAX_STARTS_PER_PACK starts per pack per run (then its calls fail at once); at most MAX_LIVE_SANDBOXES at once
and MAX_STARTS_PER_RUN in all.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from host.core.errors import ConfigError
from host.core.strictjson import JsonRejected, dumps_strict
from host.files.run import RunFiles
from host.runtime.backends.container import DockerBackend, ToolSandbox
from host.runtime.egress import RunEgress
from host.runtime.workload import Teardowns
from host.spec.config import HostConfig, sandbox_enabled
from host.spec.files import FilesConfig
from host.spec.lockfile import Lockfile
from host.tools.calls import (
    MODE_TOOL_SANDBOX,
    InstalledToolpack,
    ResolvedTool,
    ToolOutcome,
    reply_outcome,
)
from host.tools.link import LinkBroken, LinkTimeout

logger = logging.getLogger("agentnode.sandbox.toolsandbox")

MAX_STARTS_PER_PACK = 3
"""Tool sandboxes one pack may start in one run (the first, and replacements after timeouts or crashes)."""
MAX_LIVE_SANDBOXES = 4
"""Tool sandboxes one run may have at once (each is a container with the agent's memory and pids limits)."""
MAX_STARTS_PER_RUN = 16
"""Tool sandboxes one run may start in all: each start is engine work, whatever its packs do."""
CLOSE_WAIT_SECONDS = 120.0
"""How long a run's end waits for a tool sandbox start under way (engine calls) before it gives up."""
STAGE_PREFIX = "tool_sandbox_"
"""The run's stages of its first tool sandbox start, in ms from the call that needed it: verified (engine,
image pin, volume), socket_ready, created, started, connected (the tool server said hello), first_reply."""


def _failed(error: str) -> ToolOutcome:
    return ToolOutcome(success=False, result=None, error=error, mode_used=MODE_TOOL_SANDBOX)


class _NotReady(Exception):
    """No sandbox for this call; the message is the call's host-written error."""


@dataclass
class _Slot:
    """One tool pack's place in the run: its sandbox (if one is up) and how often it was started."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    box: ToolSandbox | None = None
    starting: bool = False
    starts: int = 0


class ToolSandboxes:
    """The tool sandboxes of one run, keyed by tool pack; thread-safe (calls of a pack are serialized).

    `dispose` destroys a sandbox (the runner hands it to its teardowns, so it goes like any workload);
    `stages` is the run's stage dict, which gets the first start's timeline.
    """

    def __init__(
        self,
        backend: DockerBackend,
        *,
        lockfile: Lockfile,
        run_id: str,
        runtime: str,
        dispose: Callable[[ToolSandbox], None],
        stages: dict[str, float] | None = None,
        egress: RunEgress | None = None,
        files: RunFiles | None = None,
        files_config: FilesConfig | None = None,
    ) -> None:
        self._backend = backend
        self._egress = egress
        self._files, self._files_config = files, files_config
        self._lockfile = lockfile
        self._run_id = run_id
        self._runtime = runtime
        self._dispose = dispose
        self._stages = stages if stages is not None else {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a start ended
        self._slots: dict[str, _Slot] = {}
        self._closed = False
        self._timed: ToolSandbox | None = None
        """The sandbox whose start the run's stages show (its first)."""
        self.started = 0
        """Tool sandboxes started in this run (replacements included)."""

    @property
    def stages(self) -> dict[str, float]:
        return self._stages

    def run(
        self, pack: InstalledToolpack, tool: ResolvedTool, arguments: dict[str, Any], *, timeout: float
    ) -> ToolOutcome:
        """Run one admitted call in the pack's sandbox; every failure is a failed outcome of this call."""
        deadline = time.monotonic() + timeout
        try:
            arguments_json = dumps_strict(arguments)
        except (JsonRejected, TypeError):
            return _failed("tool arguments are not strict JSON")
        slot = self._slot(pack.slug)
        if not slot.lock.acquire(timeout=timeout):  # the pack's earlier call still runs
            return _failed(f"tool timed out after {timeout:.1f} s")
        try:
            try:
                box = self._ready(slot, pack, deadline)
            except _NotReady as not_ready:
                return _failed(str(not_ready))
            try:
                reply = box.link.call(tool.entrypoint, tool.fallback, arguments_json, deadline)
            except LinkTimeout:
                self._retire(slot, box)
                return _failed(f"tool timed out after {timeout:.1f} s")
            except LinkBroken:
                self._retire(slot, box)
                return _failed("tool sandbox crashed")
            if box is self._timed and box.link.calls == 1:
                box.mark("first_reply")
                self._note_stage(box, "first_reply")
            return dataclasses.replace(reply_outcome(reply), mode_used=MODE_TOOL_SANDBOX)
        finally:
            slot.lock.release()

    def close(self) -> None:
        """The run ended: destroy every tool sandbox; a call in flight fails, none starts. A start under
        way is cut short (it stops waiting for the sandbox's hello) and destroys what it started before
        this returns, so nothing outlives the run. Idempotent."""
        with self._lock:
            self._closed = True
            boxes = [slot.box for slot in self._slots.values() if slot.box is not None]
            for slot in self._slots.values():
                slot.box = None
        for box in boxes:
            self._destroy(box)
        with self._lock:
            if not self._changed.wait_for(lambda: not any(s.starting for s in self._slots.values()),
                                          timeout=CLOSE_WAIT_SECONDS):  # fmt: skip
                logger.warning("a tool sandbox start did not end within %s s of its run", CLOSE_WAIT_SECONDS)

    # -- internals ---------------------------------------------------------------------------------

    def _slot(self, slug: str) -> _Slot:
        with self._lock:
            return self._slots.setdefault(slug, _Slot())

    def _ready(self, slot: _Slot, pack: InstalledToolpack, deadline: float) -> ToolSandbox:
        """The pack's sandbox, healthy and idle; started (or replaced) when needed. Holds the slot's lock."""
        box = slot.box
        if box is not None and not box.exited and box.link.idle_ok():
            return box
        if box is not None:  # it died or spoke out of turn between calls: replace it
            self._retire(slot, box)
        with self._lock:
            if self._closed:
                raise _NotReady("the run has ended")
            if slot.starts >= MAX_STARTS_PER_PACK:
                raise _NotReady(f"this tool pack's sandbox failed {slot.starts} times in this run")
            if self.started >= MAX_STARTS_PER_RUN:
                raise _NotReady(f"this run started {MAX_STARTS_PER_RUN} tool sandboxes already")
            live = sum(1 for s in self._slots.values() if s.box is not None or s.starting)
            if live >= MAX_LIVE_SANDBOXES:
                raise _NotReady(f"this run already has {MAX_LIVE_SANDBOXES} tool sandboxes")
            slot.starting = True
            slot.starts += 1
            self.started += 1
        try:
            box = self._start(pack, deadline)  # a failed start leaves nothing behind
            with self._lock:
                closed = self._closed
                if not closed:
                    slot.box = box
            if closed:  # the run ended while this one started: it never serves a call
                self._destroy(box)
                raise _NotReady("the run has ended")
        finally:
            with self._lock:  # only now: `close` waits for this, so nothing outlives the run
                slot.starting = False
                self._changed.notify_all()
        return box

    def _start(self, pack: InstalledToolpack, deadline: float) -> ToolSandbox:
        entry = self._lockfile.get(pack.slug)
        if entry is None or entry.package_type != "toolpack" or entry.version != pack.version:
            raise _NotReady("the tool pack was replaced or removed during this run")
        t0 = time.monotonic()
        try:
            route = self._egress.route_for_entry(entry) if self._egress is not None else None
            mounts = None
            if self._files is not None and self._files_config is not None:
                level = entry.parsed_manifest().permissions.get("filesystem", "none")
                mounts = self._files.tool_mounts(level, self._files_config)
            box = self._backend.launch_tool_sandbox(entry, self._runtime, tool_for=self._run_id, egress=route,
                                                    files=mounts)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 (a start that fails is this call's failure, named in the log)
            why = getattr(exc, "reason", type(exc).__name__)
            logger.warning("tool sandbox of %s failed to start: %s", pack.slug, why)
            raise _NotReady("tool sandbox failed to start") from None
        box.stages["verified"] = round((box.launched_at - t0) * 1000, 2)
        try:
            box.link.connect(deadline, alive=lambda: not (box.exited or self._closed))
        except LinkTimeout:
            self._destroy(box)
            raise _NotReady("tool sandbox did not start in time") from None
        except LinkBroken:
            self._destroy(box)
            raise _NotReady("tool sandbox failed to start") from None
        box.mark("connected")
        with self._lock:
            timed = self._timed is None
            if timed:
                self._timed = box
        if timed:
            for stage in ("verified", "socket_ready", "created", "started", "connected"):
                self._note_stage(box, stage)
        return box

    def _note_stage(self, box: ToolSandbox, stage: str) -> None:
        """A stage of the run's first start, in ms from the call that needed it (verification first)."""
        if stage in box.stages:
            offset = 0.0 if stage == "verified" else box.stages["verified"]
            self._stages[f"{STAGE_PREFIX}{stage}"] = round(offset + box.stages[stage], 2)

    def _retire(self, slot: _Slot, box: ToolSandbox) -> None:
        with self._lock:
            if slot.box is box:
                slot.box = None
        self._destroy(box)

    def _destroy(self, box: ToolSandbox) -> None:
        try:
            self._dispose(box)
        except Exception as exc:  # noqa: BLE001 (logged; the startup sweep removes what is left)
            logger.warning("teardown of tool sandbox %s failed: %s", box.name, type(exc).__name__)


class ToolSandboxLauncher:
    """Host-wide: each run's ToolSandboxes, or None while the host's sandbox is off, and then the gate
    refuses community tool packs (TOOL_PACK_UNTRUSTED, with the hint to turn it on): without the sandbox
    the host has no verified engine, runtime and image to run them in, and they never run on the host."""

    def __init__(
        self, backend: DockerBackend, teardowns: Teardowns, config: HostConfig, env: Mapping[str, str]
    ) -> None:
        self.backend = backend
        try:
            self.enabled = sandbox_enabled(config, env)
        except ConfigError:  # an unreadable flag is not "on" (admission refuses the runs it decides)
            self.enabled = False
        self._teardowns = teardowns
        self._runtime = config.agent_sandbox.runtime
        self._files_config = config.agent_sandbox.filesystem

    def for_run(
        self,
        run_id: str,
        runtime: str | None,
        stages: dict[str, float],
        egress: RunEgress | None = None,
        *,
        files: RunFiles | None = None,
    ) -> ToolSandboxes | None:
        """A run's tool sandboxes: the run's runtime (the host's for a run that has none, as on the host
        path), its stage dict, its egress (each pack's own grant, on the run's ledger), its workspace (as
        each pack's own level grants it), teardown like any workload's (in the background under serve)."""
        if not self.enabled:
            return None
        return ToolSandboxes(
            self.backend,
            lockfile=self.backend.lockfile,
            run_id=run_id,
            runtime=runtime or self._runtime,
            dispose=lambda box: self._teardowns.submit(self.backend, box, lambda: None, inline=False),
            stages=stages,
            egress=egress,
            files=files,
            files_config=self._files_config,
        )


__all__ = [
    "MAX_LIVE_SANDBOXES",
    "MAX_STARTS_PER_PACK",
    "MAX_STARTS_PER_RUN",
    "STAGE_PREFIX",
    "ToolSandboxLauncher",
    "ToolSandboxes",
]
