"""The parser's checks of publisher-only metadata (0.1/0.2): validated as the publisher does, not stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from host.spec.manifest.model import _TOOL_KEYS, MAX_VERIFICATION_CASES
from host.spec.manifest.reader import _describe, _describe_text, _Reader


class _MetadataParser(_Reader):
    """The publisher's checks of what this host neither runs nor keeps; a part of `_Parser`."""

    # --- publisher-only metadata (0.1/0.2): validated, not stored ----------------------------------------

    def tools_described(self, items: Any) -> None:
        """An agent's capabilities.tools (0.1/0.2): descriptive only, checked as the publisher checks them."""
        for i, item in enumerate(self.listing(items, "capabilities.tools")):
            key = f"capabilities.tools[{i}]"
            tool = self.item(item, key)
            self.keys(tool, _TOOL_KEYS, key)
            for required in ("name", "capability_id"):
                if not tool.get(required):
                    got = _describe_text(tool.get(required))
                    raise self.fail(f"{key}.{required}", f"required, got {got}")
            self.schema(tool.get("input_schema"), f"{key}.input_schema")
            self.schema(tool.get("output_schema"), f"{key}.output_schema")

    def discovery(self, capabilities: Mapping[str, Any]) -> None:
        """capabilities.prompts and .resources: discovery-only (never run), checked, not stored."""
        for kind, needed in (("prompts", ("name", "capability_id", "template")),
                             ("resources", ("name", "capability_id", "uri"))):  # fmt: skip
            items = capabilities.get(kind)
            if not items:
                continue
            for i, item in enumerate(self.listing(items, f"capabilities.{kind}")):
                key = f"capabilities.{kind}[{i}]"
                entry = self.item(item, key)
                for name in needed:
                    if not entry.get(name):
                        raise self.fail(f"{key}.{name}", f"required, got {_describe_text(entry.get(name))}")
                for executable in ("entrypoint", "input_schema"):
                    if executable in entry:
                        raise self.fail(f"{key}.{executable}", f"not allowed: {kind} are not executable")
                if kind == "prompts":
                    for j, arg in enumerate(self.listing(entry.get("arguments"), f"{key}.arguments")):
                        if not self.item(arg, f"{key}.arguments[{j}]").get("name"):
                            raise self.fail(f"{key}.arguments[{j}].name", "required")
                    continue
                uri = entry["uri"]
                if not isinstance(uri, str) or not uri.startswith(("resource://", "https://")):
                    raise self.fail(f"{key}.uri", "expected a URI starting with resource:// or https://")
                path = entry.get("content_path")
                if path is not None and (
                    not isinstance(path, str) or not path or ".." in path or path.startswith("/")
                ):
                    raise self.fail(f"{key}.content_path", "expected a relative path without '..'")

    def metadata(self, data: Mapping[str, Any]) -> None:
        """The publisher's checks of connector, compatibility, verification and the enrichment fields."""
        if data.get("connector") is not None and data.get("package_type") == "toolpack":
            self.connector(data["connector"])
        self.mapping(data.get("compatibility"), "compatibility")
        for i, req in enumerate(self.listing(data.get("env_requirements"), "env_requirements")):
            if not self.item(req, f"env_requirements[{i}]").get("name"):
                raise self.fail(f"env_requirements[{i}].name", "required")
        for i, case in enumerate(self.listing(data.get("use_cases"), "use_cases")):
            if not isinstance(case, str):
                raise self.fail(f"use_cases[{i}]", f"expected a string, got {_describe(case)}")
        for i, example in enumerate(self.listing(data.get("examples"), "examples")):
            entry = self.item(example, f"examples[{i}]")
            for name in ("title", "code"):
                if not entry.get(name):
                    raise self.fail(f"examples[{i}].{name}", "required")
        for key in ("homepage_url", "docs_url", "source_url"):
            url = data.get(key)
            if url is not None and (not isinstance(url, str) or (url and not url.startswith(
                ("http://", "https://")
            ))):  # fmt: skip
                raise self.fail(key, "expected a URL starting with http:// or https://")
        if data.get("package_type") == "toolpack" and data.get("verification") is not None:
            self.toolpack_verification(data["verification"])

    def connector(self, value: Any) -> None:
        block = self.item(value, "connector")
        if not block.get("provider"):
            raise self.fail("connector.provider", "required when connector is present")
        if block.get("auth_type") is not None:
            self.choice(block["auth_type"], "connector.auth_type", ("api_key", "oauth2"))
        self.strings(block.get("scopes"), "connector.scopes")
        if block.get("token_refresh") is not None and not isinstance(block["token_refresh"], bool):
            got = _describe(block["token_refresh"])
            raise self.fail("connector.token_refresh", f"expected true or false, got {got}")
        for name, needed, number in (("health_check", "endpoint", "interval_seconds"),
                                     ("rate_limits", None, "requests_per_minute")):  # fmt: skip
            if block.get(name) is None:
                continue
            sub = self.item(block[name], f"connector.{name}")
            if needed and not sub.get(needed):
                raise self.fail(f"connector.{name}.{needed}", "required")
            count = sub.get(number)
            if count is not None and (not isinstance(count, int) or count < 1):
                got = _describe(count)
                raise self.fail(f"connector.{name}.{number}", f"expected a positive integer, got {got}")

    def toolpack_verification(self, value: Any) -> None:
        """A toolpack's `verification.cases` (server verification only): checked, not stored."""
        block = self.item(value, "verification")
        cases = self.listing(block.get("cases"), "verification.cases")
        if len(cases) > MAX_VERIFICATION_CASES:
            most = MAX_VERIFICATION_CASES
            raise self.fail("verification.cases", f"expected at most {most} cases, got {len(cases)}")
        seen: set[str] = set()
        for i, item in enumerate(cases):
            key = f"verification.cases[{i}]"
            case = self.item(item, key)
            name = self.sized(case.get("name"), f"{key}.name", 3)
            if name in seen:
                raise self.fail(f"{key}.name", "duplicate case name")
            seen.add(name)
            if not isinstance(case.get("input"), dict):
                what = _describe_text(case.get("input"))
                raise self.fail(f"{key}.input", f"expected a mapping, got {what}")
            if case.get("tool") is not None:
                self.text(case["tool"], f"{key}.tool")
            cassette = case.get("cassette")
            if cassette is not None and (
                not isinstance(cassette, str)
                or not cassette.startswith("fixtures/cassettes/")
                or ".." in cassette
            ):
                raise self.fail(f"{key}.cassette", "expected a path under fixtures/cassettes/")
            self.mapping(case.get("expected"), f"{key}.expected")


__all__ = [
    "_MetadataParser",
]
