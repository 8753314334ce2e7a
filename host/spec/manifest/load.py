"""Reading agentnode.yaml (bytes, YAML) and the entry points: load, parse, check, and the lockfile's form."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from host.core.errors import ManifestError
from host.spec.manifest.model import (
    _FILE_HINT,
    _HINT,
    _STRICT_HINT,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_YAML_DEPTH,
    PERMISSION_LEVELS,
    AgentManifest,
    ManifestWarnings,
    OrchestrationStep,
    ToolpackManifest,
)
from host.spec.manifest.parser import _Parser


def _read_manifest_bytes(path: Path) -> bytes:
    """The manifest bytes: links and non-regular files refused before opening, big files before reading."""
    try:
        before = os.lstat(path)
        if not stat.S_ISREG(before.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(before.st_mode) else "not a regular file"
            raise ManifestError(f"{path}: the manifest is {what}", hint=_FILE_HINT)
        if before.st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES} bytes", hint=_HINT)
        # O_NOFOLLOW and O_NONBLOCK: a link or FIFO swapped in after lstat can neither redirect nor block us.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ManifestError(f"{path}: the manifest is a symbolic link", hint=_FILE_HINT) from None
        raise ManifestError(f"{path}: cannot read manifest ({type(exc).__name__})", hint=_HINT) from exc
    with os.fdopen(fd, "rb") as fh:
        now = os.fstat(fh.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            raise ManifestError(f"{path}: the manifest changed while it was read", hint=_FILE_HINT)
        raw = fh.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES} bytes", hint=_HINT)
    return raw


def load_manifest(
    pack_dir: Path, *, warnings: ManifestWarnings | None = None
) -> AgentManifest | ToolpackManifest:
    """Read and validate `<pack_dir>/agentnode.yaml`; every problem is a ManifestError.

    What is tolerated but probably wrong (unknown or misspelled keys, ignored dependencies) goes to
    `warnings` when given.
    """
    path = pack_dir / MANIFEST_NAME
    raw = _read_manifest_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: manifest is not UTF-8", hint=_HINT) from exc
    from host.core.strictyaml import YamlError, YamlRefused, load_yaml, yaml_location, yaml_problem  # noqa: PLC0415

    try:
        data = load_yaml(text, max_depth=MAX_YAML_DEPTH)
    except YamlRefused as exc:
        where = f"{path}{yaml_location(exc)}"
        raise ManifestError(f"{where}: YAML not accepted: {exc.problem}", hint=_STRICT_HINT) from None
    except YamlError as exc:
        where = f"{path}{yaml_location(exc)}"
        raise ManifestError(f"{where}: invalid YAML{yaml_problem(exc)}", hint=_HINT) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an integer of 5,000 digits, a bad date
        raise ManifestError(f"{path}: a value cannot be read ({type(exc).__name__})", hint=_HINT) from None
    return parse_manifest(data, source=str(path), warnings=warnings)


def parse_manifest(
    data: Any, *, source: str, warnings: ManifestWarnings | None = None
) -> AgentManifest | ToolpackManifest:
    """Validate parsed YAML (or a lockfile's stored form); unknown keys are tolerated and reported as
    `warnings` (when given), because the publisher tolerates them and authoring tools add their own."""
    return _Parser(source, warnings).manifest(data)


def check_llm_access(block: Any, *, source: str = "") -> None:
    """Reject a malformed `agent.llm_access` block rather than silently ignoring a cap or model list."""
    _Parser(source).llm_access(block)


def manifest_data(manifest: AgentManifest | ToolpackManifest) -> dict[str, Any]:
    """The validated manifest as JSON data that parse_manifest reads back to an equal manifest.

    This, not the pack's YAML, is what the lockfile stores: unknown keys (where an alias bomb or a README
    would sit) never reach it, and every run reads only what was validated at install. A 0.1/0.2 manifest
    is stored as a manifest of its version (so it is validated by the same rules when read back).
    """
    data: dict[str, Any] = {}
    if manifest.manifest_version:
        data["manifest_version"] = manifest.manifest_version
    data.update(package_id=manifest.slug, version=manifest.version, name=manifest.name)
    if manifest.publisher:
        data["publisher"] = manifest.publisher
    if manifest.summary:
        data["summary"] = manifest.summary
    if manifest.manifest_version:  # the only combinations this host installs
        data.update(runtime="python", install_mode="package", hosting_type="agentnode_hosted")
    data["permissions"] = {
        name: {key: manifest.permissions[name]} for name, (key, _) in PERMISSION_LEVELS.items()
    }
    if manifest.network_domains:
        data["permissions"]["network"]["allowed_domains"] = list(manifest.network_domains)
    data["dependencies"] = [
        {"package_slug": d.slug, "role": d.role, "required": d.required, "min_version": d.min_version}
        for d in manifest.pack_dependencies
    ]
    if isinstance(manifest, AgentManifest):
        llm = dict(manifest.llm_access)
        if "allowed_models" in llm:
            llm["allowed_models"] = list(llm["allowed_models"])
        agent: dict[str, Any] = {
            "goal": manifest.goal,
            "system_prompt": manifest.system_prompt,
            "limits": {
                "max_tool_calls": manifest.max_tool_calls,
                "max_runtime_seconds": manifest.max_runtime_seconds,
                "max_iterations": manifest.max_iterations,
            },
            "termination": {"stop_on_consecutive_errors": manifest.stop_on_consecutive_errors},
            "llm_access": llm,
        }
        if manifest.entrypoint:
            agent["entrypoint"] = manifest.entrypoint
        if manifest.tier:
            agent["tier"] = manifest.tier
        if manifest.llm_required:
            agent["llm"] = {"required": True}
        if manifest.allowed_packages is not None:
            agent["tool_access"] = {"allowed_packages": list(manifest.allowed_packages)}
        if manifest.orchestration is not None:
            agent["orchestration"] = {
                "mode": "sequential",
                "steps": [_step_data(step) for step in manifest.orchestration],
            }
        return {**data, "package_type": "agent", "agent": agent}
    tools: list[dict[str, Any]] = []
    for tool in manifest.tools:
        item: dict[str, Any] = {"name": tool.name, "description": tool.description}
        if tool.entrypoint:
            item["entrypoint"] = tool.entrypoint
        if tool.capability_id:
            item["capability_id"] = tool.capability_id
        if tool.input_schema is not None:
            item["input_schema"] = tool.input_schema
        tools.append(item)
    data = {**data, "package_type": "toolpack", "capabilities": {"tools": tools}}
    if manifest.entrypoint:
        data["entrypoint"] = manifest.entrypoint
    return data


def _step_data(step: OrchestrationStep) -> dict[str, Any]:
    item: dict[str, Any] = {"tool": step.tool, "input_mapping": dict(step.input_mapping)}
    if step.name is not None:
        item["name"] = step.name
    if step.when is not None:
        item["when"] = step.when
    return item


__all__ = [
    "check_llm_access",
    "load_manifest",
    "manifest_data",
    "parse_manifest",
]
