"""What a pack declares it needs: its pyproject.toml `[project].dependencies` read as data (agentnode format
§2.1), each refused unless it is a plain PEP 508 requirement (no URL, no pip option), and the names the host
reserves in a pack's tree."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from host.core.errors import PackError
from host.core.terminal import safe_line

if TYPE_CHECKING:
    from packaging.requirements import Requirement


PYPROJECT = "pyproject.toml"
MAX_PYPROJECT_BYTES = 256 * 1024
MAX_REQUIREMENTS = 64
MAX_REQUIREMENT_CHARS = 200
RESERVED_PREFIX = ".agentnode-"
"""Names the host places into a pack's copies; a pack may not bring its own (at its root or under src/)."""
HOST_RUNTIME_NAMES = frozenset({"agentnode-sdk"})
"""Distributions the host stands in for (the agentnode runtime): never resolved, a warning instead."""


# --- what the pack declares ----------------------------------------------------------------------------


def _refused(what: str, problem: str, hint: str) -> PackError:
    return PackError(f"{PYPROJECT}: {what} {problem}", hint=hint)


def _shown(text: str) -> str:
    """A requirement as the pack wrote it, for an error line: escaped (once) and short, in quotes."""
    return f"'{safe_line(text, limit=80)}'"


_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".egg")


def validate_requirement(text: object, index: int) -> Requirement:
    """`[project].dependencies[index]` as a plain PEP 508 requirement, or a PackError saying why not.

    Refused: anything that is not a string, longer than MAX_REQUIREMENT_CHARS or not printable ASCII;
    anything that starts with `-` (a pip option, `-e`, `-r`, `--index-url`, ...); what packaging cannot
    parse as PEP 508 (which includes `--hash` and other per-line options); direct references (`name @ URL`).
    """
    where = f"[project].dependencies[{index}]"
    if not isinstance(text, str):
        raise _refused(where, "is not a string", "list requirements as strings, e.g. \"requests>=2.31\"")
    if len(text) > MAX_REQUIREMENT_CHARS:
        raise _refused(
            where, f"is longer than {MAX_REQUIREMENT_CHARS} characters", "shorten the requirement"
        )
    if not all(" " <= ch <= "~" for ch in text):
        raise _refused(
            where,
            f"{_shown(text)} holds characters other than printable ASCII",
            "write the requirement in plain ASCII (PEP 508)",
        )
    if text.strip().startswith("-"):
        raise _refused(
            where,
            f"{_shown(text)} looks like a pip option; only PEP 508 requirements are installed",
            "remove it; the host decides where packages come from (install --offline --find-links DIR)",
        )
    from packaging.requirements import InvalidRequirement, Requirement  # noqa: PLC0415  (install only)

    try:
        req = Requirement(text)
    except InvalidRequirement:
        raise _refused(
            where,
            f"{_shown(text)} is not a PEP 508 requirement",
            "write it as NAME[extras] SPECIFIERS [; marker], e.g. \"requests>=2.31\"",
        ) from None
    if req.name.lower().endswith(_ARCHIVE_SUFFIXES):
        # pip reads such a name as a local file to unpack (and build), whatever --only-binary says
        raise _refused(
            where,
            f"{_shown(text)} names an archive file, not a package",
            "list the package by its name; for a wheel that is on no index, install with --offline "
            "--find-links DIR holding it",
        )
    if req.url:
        raise _refused(
            where,
            f"{_shown(text)} is a direct URL reference ({req.name} @ ...); only requirements resolved "
            "from an index are installed",
            f"use a version specifier for {req.name}; for a wheel that is on no index, install with "
            "--offline --find-links DIR holding it",
        )
    return req


@dataclass(frozen=True)
class Declared:
    """A pack's requirements, validated: what goes to pip (normalized text), and what installs but is odd."""

    requirements: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        from packaging.requirements import Requirement  # noqa: PLC0415  (install only)

        return frozenset(canonicalize_name(Requirement(r).name) for r in self.requirements)


def read_requirements(pyproject: bytes | None, pack_refs: Iterable[str] = ()) -> Declared:
    """`[project].dependencies` of a pack's pyproject.toml (None: the pack has none), validated.

    Optional dependencies are never installed (as by the agentnode SDK); `agentnode-sdk` is left to the
    host (a warning); so is a requirement naming an agentnode pack in `pack_refs` (the manifest's
    `dependencies` and the packs installed here): real packs list other packs there, which are no PyPI
    projects (a warning). Dependencies declared `dynamic` cannot be known without building the pack (a
    warning: nothing is installed).
    """
    packs = frozenset(canonicalize_name(ref) for ref in pack_refs)
    if pyproject is None:
        return Declared()
    if len(pyproject) > MAX_PYPROJECT_BYTES:
        raise _refused("", f"is larger than {MAX_PYPROJECT_BYTES // 1024} KiB", "shorten pyproject.toml")
    try:
        data = tomllib.loads(pyproject.decode("utf-8"))
    except UnicodeDecodeError:
        raise _refused("", "is not UTF-8", "save pyproject.toml as UTF-8") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        problem = "nests too deep" if isinstance(exc, RecursionError) else safe_line(str(exc), limit=120)
        raise _refused("", f"is not valid TOML ({problem})", "fix it, then install again") from None
    project = data.get("project")
    if project is None:
        return Declared()
    if not isinstance(project, dict):
        raise _refused("[project]", "is not a table", "fix pyproject.toml, then install again")
    warnings: list[str] = []
    dynamic = project.get("dynamic")
    if isinstance(dynamic, list) and "dependencies" in dynamic:
        warnings.append(
            f"{PYPROJECT} declares [project].dependencies dynamic: the host never builds a pack, so none "
            "are installed (list them in [project].dependencies)"
        )
    raw = project.get("dependencies")
    if raw is None:
        return Declared(warnings=tuple(warnings))
    if not isinstance(raw, list):
        raise _refused("[project].dependencies", "is not a list", "make it a list of requirement strings")
    if len(raw) > MAX_REQUIREMENTS:
        raise _refused(
            "[project].dependencies",
            f"lists {len(raw)} requirements, more than the {MAX_REQUIREMENTS} this host installs",
            "trim the list to what the pack imports",
        )
    requirements: list[str] = []
    for index, text in enumerate(raw):
        req = validate_requirement(text, index)
        if canonicalize_name(req.name) in HOST_RUNTIME_NAMES:
            warnings.append(
                f"requirement {req.name} is not installed: this host provides the agentnode runtime "
                "(AgentContext) itself"
            )
            continue
        if canonicalize_name(req.name) in packs:
            warnings.append(
                f"requirement {req.name} names an agentnode pack, not a Python package: it is not installed "
                "with pip (install the pack itself; agents call it with run_tool)"
            )
            continue
        requirements.append(str(req))
    return Declared(tuple(requirements), tuple(warnings))


def reserved_name(paths: Iterable[str]) -> str | None:
    """The first pack path that uses a name the host reserves (at the root, or directly under src/)."""
    for rel in paths:
        parts = rel.split("/")
        if parts[0].startswith(RESERVED_PREFIX) or (
            parts[0] == "src" and len(parts) > 1 and parts[1].startswith(RESERVED_PREFIX)
        ):
            return rel
    return None
