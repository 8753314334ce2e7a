"""What a tool call is, for the gate that decides it and for the workers and tool sandboxes that run it:
the installed pack, the resolved function, the refusal and the outcome, and the call's bounds."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host.core.errors import CallRefusal
from host.core.strictjson import JsonRejected, loads_strict
from host.core.vocab import WireReason
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from sandbox_wrapper.protocol import MAX_RESULT_BYTES

logger = logging.getLogger("host.tools.gate")

MAX_ARGUMENTS_BYTES = 1 << 20
MAX_REQUEST_BYTES = MAX_ARGUMENTS_BYTES + 4096
"""The most a tool request may take encoded: its arguments plus slug, tool name and framing. The RPC layer
refuses anything larger as TOO_LARGE before decoding it."""
DEFAULT_TOOL_TIMEOUT = 60.0
MODE_HOST_WORKER = "host_worker"
MODE_TOOL_SANDBOX = "tool_sandbox"
"""ToolOutcome.mode_used of a community pack's call, run in one of the run's tool sandboxes."""


_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,79}")
MAX_MESSAGE = 200
"""The longest refusal or outcome message the host writes."""


@dataclass(frozen=True)
class InstalledToolpack:
    """A toolpack installed on this host, as the gate needs it (`root` is the import root; `interpreter`
    the python of the pack's own environment when it has requirements, else None: the host's)."""

    slug: str
    version: str
    trust: str
    root: Path
    manifest: ToolpackManifest
    interpreter: Path | None = None


ToolpackLookup = Callable[[str], InstalledToolpack | None]


class ToolRefusal(CallRefusal):
    """The gate refused a call before anything ran; the message is capped."""

    def __init__(self, reason: WireReason, message: str) -> None:
        super().__init__(reason, message[:MAX_MESSAGE])

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class ToolOutcome:
    """The outcome of a call that was allowed to run; `error` is short and host-written."""

    success: bool
    result: Any
    error: str
    mode_used: str = MODE_HOST_WORKER
    result_json: str | None = None
    """`result` as the strict JSON text it was checked as, when the runner has it (so the RPC layer sends
    it on without serializing the value again); None: serialize `result`."""
    missing: bool = False
    """The pack defines no function for this call (the worker's ImportError): the gate then tells the agent
    which tools the pack has."""


def failed(error: str) -> ToolOutcome:
    """An unsuccessful outcome with a host-written error."""
    return ToolOutcome(success=False, result=None, error=error)


@dataclass(frozen=True)
class ResolvedTool:
    """What one call runs: the function to import (`module:function`), the function to fall back to when the
    pack does not define that one ("" for none), and the declared tool whose input schema applies (if any)."""

    entrypoint: str
    fallback: str = ""
    spec: ToolSpec | None = None


def _default_function(pack_entrypoint: str) -> tuple[str, str]:
    """A package entrypoint as (module, function): `module` means `module.run`, `module:fn` means `fn`."""
    module, sep, function = pack_entrypoint.rpartition(":")
    return (module, function) if sep else (pack_entrypoint, "run")


def resolve_tool(slug: str, manifest: ToolpackManifest, tool_name: str) -> ResolvedTool:
    """Pick the function a call runs, as agentnode-format §3.3 does (`tool_name` "" is the format's None).

    No name: the package entrypoint's default function; there is no fallback to a first tool. A name: the
    declared tool of exactly that name with its own entrypoint; else the package module's function of that
    name, falling back to the default function (the format's 0.5.1 rule: an unknown name runs `run`); else
    TOOL_NOT_FOUND. Packs in this host's own manifest form (no manifest_version) keep one convenience: with
    no name, a pack without a package entrypoint runs its only tool.
    """
    declared = next((tool for tool in manifest.tools if tool.name == tool_name), None) if tool_name else None
    if declared is not None and declared.entrypoint:
        return ResolvedTool(declared.entrypoint, spec=declared)
    if manifest.entrypoint:
        module, default = _default_function(manifest.entrypoint)
        if not tool_name:
            return ResolvedTool(f"{module}:{default}")
        # Only a public Python name can be a module's function; anything else runs the default (§3.3).
        public = tool_name.isidentifier() and not tool_name.startswith("_")
        return ResolvedTool(f"{module}:{tool_name if public else default}", fallback=default, spec=declared)
    names = ", ".join(tool.name for tool in manifest.tools) or "(none)"
    if not tool_name:
        only = manifest.tools[0] if len(manifest.tools) == 1 else None
        if only is not None and not manifest.manifest_version and only.entrypoint:
            return ResolvedTool(only.entrypoint, spec=only)
        raise ToolRefusal(
            WireReason.TOOL_NOT_FOUND,
            f"package '{slug}' has no package entrypoint to run without a tool name; name one of: {names}",
        )
    raise ToolRefusal(WireReason.TOOL_NOT_FOUND, f"package '{slug}' has no such tool; available: {names}")


def reply_outcome(reply: dict[str, Any]) -> ToolOutcome:
    """Turn a worker reply into an outcome with a host-written error; exception text never crosses."""
    if reply.get("ok") is True:
        # The worker is trusted code running a trusted tool, but its result goes back into the sandbox and
        # into `run --json`: only strict JSON (finite numbers, bounded size and depth) gets through.
        text = str(reply.get("result_json", ""))
        try:
            result = loads_strict(text, max_bytes=MAX_RESULT_BYTES)
        except JsonRejected:
            return failed("tool result is not JSON-serializable")
        return ToolOutcome(success=True, result=result, error="", result_json=text)
    failure = reply.get("failure")
    error_type = str(reply.get("error_type", ""))
    error_type = error_type if _TYPE_NAME.fullmatch(error_type) else "an exception"
    if failure == "raised":
        logger.info("tool raised %s", error_type)
        return failed(f"tool raised {error_type}")
    if failure == "load":
        return failed(f"tool entrypoint could not be loaded ({error_type})")
    if failure == "too_large":
        return failed("tool result too large")
    if failure == "missing":  # the gate names the pack's tools instead (ToolGate.call)
        return ToolOutcome(success=False, result=None, error="tool not found (ImportError)", missing=True)
    return failed("tool result is not JSON-serializable")
