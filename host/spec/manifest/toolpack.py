"""The parser's `package_type: toolpack` part: the package entrypoint and each tool it declares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from host.spec.manifest.model import (
    _ENTRYPOINT_RE,
    _MODULE_RE,
    _TOOL_KEYS,
    FORMAT_ENTRYPOINT_RE,
    FORMAT_MODULE_RE,
    ToolpackManifest,
    ToolSpec,
)
from host.spec.manifest.reader import _describe, _Reader


class _ToolpackParser(_Reader):
    """A toolpack's entrypoint and tools, read into a ToolpackManifest; a part of `_Parser`."""

    # --- toolpacks -------------------------------------------------------------------------------------

    def toolpack(
        self, data: Mapping[str, Any], capabilities: Mapping[str, Any], common: dict[str, Any]
    ) -> ToolpackManifest:
        raw = data.get("entrypoint")
        if self.form == "0.1" or (self.form == "0.2" and raw):
            entrypoint = self.text(
                raw,
                "entrypoint",
                pattern=FORMAT_MODULE_RE,
                expected='a module path like "package.tools" (lower case, at least two segments)',
            )
        elif self.form == "0.2":
            entrypoint = ""
        else:
            entrypoint = self.text(
                raw,
                "entrypoint",
                default="",
                pattern=_MODULE_RE,
                expected='a module path like "package.tools"',
            )
        items = self.listing(capabilities.get("tools"), "capabilities.tools")
        if self.published and not items:
            raise self.fail("capabilities.tools", "a toolpack declares at least one tool")
        tools: list[ToolSpec] = []
        for i, item in enumerate(items):
            key = f"capabilities.tools[{i}]"
            spec = self.tool(item, key, entrypoint, count=len(items))
            if any(t.name == spec.name for t in tools):
                self.warn(f"{key}.name", "duplicate tool name; only the first tool so named can be called")
                continue
            tools.append(spec)
        return ToolpackManifest(**common, entrypoint=entrypoint, tools=tuple(tools))

    def tool(self, item: Any, key: str, pack_entrypoint: str, *, count: int) -> ToolSpec:
        tool = self.item(item, key)
        self.keys(tool, _TOOL_KEYS, key)
        name = self.text(tool.get("name"), f"{key}.name")
        if self.published:
            capability_id = self.text(tool.get("capability_id"), f"{key}.capability_id")
        else:
            capability_id = self.optional_text(tool.get("capability_id"), f"{key}.capability_id", limit=100)
        description = tool.get("description")
        if description and not isinstance(description, str):
            self.warn(f"{key}.description", f"expected a string, got {_describe(description)}; ignored")
        schema = self.schema(tool.get("input_schema"), f"{key}.input_schema")
        if schema is not None:
            self.json_data(schema, f"{key}.input_schema")
        self.schema(tool.get("output_schema"), f"{key}.output_schema")
        raw = tool.get("entrypoint")
        entry = self.tool_entrypoint(raw, f"{key}.entrypoint", pack_entrypoint, count)
        own = entry if raw else ""  # a tool without its own is resolved by name at call time (§3.3)
        return ToolSpec(
            name=name,
            entrypoint=own if ":" in own or not own else f"{own}:run",
            description=description if isinstance(description, str) else "",
            input_schema=schema,
            capability_id=capability_id,
        )

    def tool_entrypoint(self, raw: Any, key: str, pack_entrypoint: str, count: int) -> str:
        """0.2: module.path:function, required with several tools or without a package entrypoint. 0.1 and
        this host's form: module[:function] (the publisher does not check 0.1's; this host imports it)."""
        if self.form == "0.2":
            if not raw:
                if count > 1:
                    raise self.fail(key, "required when the toolpack has more than one tool")
                if not pack_entrypoint:
                    raise self.fail(key, "required when the toolpack has no top-level entrypoint")
                return pack_entrypoint
            return self.text(
                raw,
                key,
                pattern=FORMAT_ENTRYPOINT_RE,
                expected='an entrypoint like "package.module:function" (lower case, at least two '
                "module segments)",
            )
        if raw is None and not pack_entrypoint:
            raise self.fail(key, "required when the toolpack has no top-level entrypoint")
        return self.text(
            raw,
            key,
            default=pack_entrypoint,
            pattern=_ENTRYPOINT_RE,
            expected='an entrypoint like "package.module:function"',
        )


__all__ = [
    "_ToolpackParser",
]
