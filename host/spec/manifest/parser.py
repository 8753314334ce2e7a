"""The parser composed of its parts, with the top-level keys: agentnode.yaml validated with key paths.

Three forms are read (README "Pack format support" lists them and every deliberate difference):

- `manifest_version: "0.1"` and `"0.2"`: the agentnode format as its publisher validates it, with 0.2's
  defaults (runtime, install_mode, hosting_type, permissions) filled in when a key is absent;
- no `manifest_version`: this host's authoring form, read like 0.2 for every key the host uses (types,
  ranges, defaults), with the publisher-only metadata (publisher, summary, resources, prompts, connector,
  verification, enrichment fields) neither checked nor kept, and a few author-friendly relaxations
  (`name` defaults to the slug, `agent.goal` may be empty, a tool's `capability_id` is optional,
  entrypoints may have one module segment and capitals, a toolpack may declare no tools).

Unknown keys are tolerated, as the publisher tolerates them, but each is reported as a warning (with a
"did you mean" for a likely misspelling) so a typo like `limtis:` does not silently drop a limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from host.spec.egress import MAX_RULES, BadName, Rule, merge, parse_rule
from host.spec.manifest.agent import _AgentParser
from host.spec.manifest.metadata import _MetadataParser
from host.spec.manifest.model import (
    _DEPENDENCY_KEYS,
    _RUNTIME_HINT,
    _TOP_KEYS,
    _UPGRADE_HINT,
    _VALID_COMBINATIONS,
    DEFAULT_PERMISSIONS,
    MANIFEST_VERSIONS,
    MAX_VERSION_CHARS,
    PERMISSION_LEVELS,
    PUBLISHED_SLUG_RE,
    SLUG_RE,
    AgentManifest,
    PackDependency,
    ToolpackManifest,
)
from host.spec.manifest.reader import _describe, _describe_text
from host.spec.manifest.toolpack import _ToolpackParser


class _Parser(_AgentParser, _ToolpackParser, _MetadataParser):
    """Converts each key, naming `source` and the key path on failure.

    `form` is the manifest_version ("0.1", "0.2") or "" for this host's own form; `published` says the
    publisher's rules apply in full.
    """

    # --- top level -------------------------------------------------------------------------------------

    def manifest(self, data: Any) -> AgentManifest | ToolpackManifest:
        if not isinstance(data, dict):
            raise self.fail("(top level)", f"expected a mapping, got {_describe(data)}")
        self.form = self.manifest_version(data)
        self.keys(data, _TOP_KEYS, "")
        if self.published:
            slug = self.text(
                data.get("package_id"),
                "package_id",
                pattern=PUBLISHED_SLUG_RE,
                expected=f"a slug matching {PUBLISHED_SLUG_RE.pattern} (3 to 60 lower-case letters, "
                "digits and hyphens)",
            )
        else:
            slug = self.text(
                data.get("package_id"),
                "package_id",
                pattern=SLUG_RE,
                expected=f"a slug matching {SLUG_RE.pattern}",
            )
        version = self.version(data.get("version"))
        kind = data.get("package_type")
        if kind == "upgrade":
            raise self.fail(
                "package_type", "upgrade packages are not installed by this host", hint=_UPGRADE_HINT
            )
        if kind not in ("agent", "toolpack"):
            got = "nothing" if kind is None else _describe(kind)
            raise self.fail("package_type", f'expected "agent" or "toolpack", got {got}')
        if self.published:
            name = self.sized(data.get("name"), "name", 3, 100)
            publisher = self.text(data.get("publisher"), "publisher")
            summary = self.sized(data.get("summary"), "summary", 20, 200)
        else:  # this host's form: publisher and summary are catalogue metadata, neither read nor kept
            name = self.text(data.get("name"), "name", default=slug)
            publisher = summary = ""
        self.combination(data, kind)
        permissions = self.permissions(data)
        pack_dependencies = self.dependencies(data.get("dependencies"))
        capabilities = self.mapping(data.get("capabilities"), "capabilities")
        self.keys(capabilities, frozenset({"tools", "resources", "prompts"}), "capabilities")
        if self.published:
            self.discovery(capabilities)
            self.metadata(data)
            if "connector" in data and kind != "toolpack":
                raise self.fail("connector", "only toolpacks may declare a connector")
        common: dict[str, Any] = {
            "slug": slug,
            "version": version,
            "name": name,
            "dependencies": tuple(d.slug for d in pack_dependencies),
            "pack_dependencies": pack_dependencies,
            "manifest_version": self.form,
            "publisher": publisher,
            "summary": summary,
            "permissions": permissions,
            "network_domains": self.network_domains(data),
        }
        if kind == "agent":
            if self.published and capabilities.get("tools"):
                self.tools_described(capabilities["tools"])
            return self.agent(data, common)
        return self.toolpack(data, capabilities, common)

    def manifest_version(self, data: Mapping[str, Any]) -> str:
        if "manifest_version" not in data:
            return ""
        value = data["manifest_version"]
        if isinstance(value, str) and value in MANIFEST_VERSIONS:
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            got = f'the number {_describe(value)}; quote it: manifest_version: "0.2"'
        elif isinstance(value, str) and re.fullmatch(r"[0-9A-Za-z.]{1,10}", value):
            got = f'"{value}"'  # short and plain: safe to name
        else:
            got = _describe(value)
        raise self.fail("manifest_version", f'expected "0.1" or "0.2" (or no manifest_version), got {got}')

    def combination(self, data: Mapping[str, Any], kind: str) -> None:
        """runtime, install_mode and hosting_type: required in 0.1, defaulted in 0.2 and this host's form."""
        values: dict[str, str] = {}
        for key, allowed, default in (
            ("runtime", ("python", "mcp", "remote"), "python"),
            ("install_mode", ("package", "remote_endpoint"), "package"),
            ("hosting_type", ("agentnode_hosted",), "agentnode_hosted"),
        ):
            absent = key not in data or (data[key] is None and not self.published)
            if absent and self.form != "0.1":
                values[key] = default
            else:  # 0.2 keeps a key given as null (and then refuses it), as the publisher's defaults do
                values[key] = self.choice(data.get(key), key, allowed)
        combo = (kind, values["runtime"], values["install_mode"])
        if combo not in _VALID_COMBINATIONS:
            raise self.fail(
                "install_mode",
                f"package_type {kind} with runtime {combo[1]} takes install_mode "
                f"{'remote_endpoint' if combo[1] == 'remote' else 'package'}, got {combo[2]}",
            )
        if values["runtime"] != "python":
            raise self.fail(
                "runtime", f"{values['runtime']} toolpacks are not supported by this host", hint=_RUNTIME_HINT
            )

    def permissions(self, data: Mapping[str, Any]) -> dict[str, str]:
        """The five permission levels: required in 0.1; 0.2 (and this host's form) default absent ones."""
        required = "required in manifest_version 0.1: network, filesystem, code_execution, data_access and "
        required += "user_approval, each with its level"
        raw = data.get("permissions")
        if "permissions" not in data or (raw is None and not self.published):
            if self.form == "0.1":
                raise self.fail("permissions", required)
            return dict(DEFAULT_PERMISSIONS)
        if not isinstance(raw, dict):
            raise self.fail("permissions", f"expected a mapping, got {_describe(raw)}")
        if self.form == "0.1" and not raw:
            raise self.fail("permissions", required)
        self.keys(raw, frozenset({*PERMISSION_LEVELS, "external_integrations"}), "permissions")
        out: dict[str, str] = {}
        for name, (level_key, allowed) in PERMISSION_LEVELS.items():
            key = f"permissions.{name}"
            if self.form != "0.1" and (name not in raw or (raw[name] is None and not self.published)):
                out[name] = DEFAULT_PERMISSIONS[name]  # merged one level deep, as 0.2 normalizes
                continue
            block = raw.get(name, {})
            if not isinstance(block, dict):
                raise self.fail(key, f"expected a mapping with {level_key}, got {_describe(block)}")
            known = {level_key, "allowed_domains"} if name == "network" else {level_key}
            self.keys(block, frozenset(known), key)
            out[name] = self.choice(block.get(level_key), f"{key}.{level_key}", allowed)
        return out

    def network_domains(self, data: Mapping[str, Any]) -> tuple[str, ...]:
        """permissions.network.allowed_domains as egress rules (normalized text); what is not a NAME[:PORT],
        *.SUFFIX or IP literal is ignored with a warning, as is anything past MAX_RULES entries."""
        raw = data.get("permissions")
        block = raw.get("network") if isinstance(raw, dict) else None
        value = block.get("allowed_domains") if isinstance(block, dict) else None
        key = "permissions.network.allowed_domains"
        if value is None:
            return ()
        if not isinstance(value, list):
            self.warn(key, f"expected a list of domain names, got {_describe(value)}; ignored")
            return ()
        if len(value) > MAX_RULES:
            self.warn(key, f"more than {MAX_RULES} entries; the rest are ignored")
        found: list[Rule] = []
        for index, item in enumerate(value[:MAX_RULES]):
            try:
                found.append(parse_rule(item))
            except BadName as exc:
                self.warn(f"{key}[{index}]", f"not a domain name ({exc}); ignored")
        return tuple(text for rule in merge(found) for text in rule.texts())

    def dependencies(self, value: Any) -> tuple[PackDependency, ...]:
        """Pack references (strings or objects, both spellings); anything else is ignored with a warning."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.warn("dependencies", f"expected a list of pack references, got {_describe(value)}; ignored")
            return ()
        out: list[PackDependency] = []
        for i, item in enumerate(value):
            key = f"dependencies[{i}]"
            role, required, min_version = "", True, None
            if isinstance(item, str):
                slug: Any = item.strip()
            elif isinstance(item, dict):
                self.keys(item, _DEPENDENCY_KEYS, key)
                slug = item.get("package_slug")
                if slug is None:
                    slug = item.get("package_id")
                role = self.optional_text(item.get("role"), f"{key}.role", limit=100)
                flag = item.get("required", item.get("is_required"))
                required = True if flag is None else bool(flag)  # the publisher's reading: truthiness
                if item.get("min_version") is not None:
                    min_version = self.optional_text(item["min_version"], f"{key}.min_version",
                                                     limit=MAX_VERSION_CHARS) or None  # fmt: skip
            else:
                self.warn(key, f"expected a pack slug or a mapping, got {_describe(item)}; ignored")
                continue
            if not isinstance(slug, str) or not (
                SLUG_RE.fullmatch(slug) or PUBLISHED_SLUG_RE.fullmatch(slug)
            ):
                self.warn(
                    key,
                    f"expected a pack slug, got {_describe_text(slug)}; ignored (dependencies name other "
                    "packs; Python requirements belong in the pack's pyproject.toml)",
                )
                continue
            if any(d.slug == slug for d in out):
                self.warn(key, f"{slug} is listed again; the first entry is kept")
                continue
            out.append(PackDependency(slug=slug, role=role, required=required, min_version=min_version))
        return tuple(out)


__all__ = [
    "_Parser",
]
