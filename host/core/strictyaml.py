"""Strict YAML for pack manifests: PyYAML's SafeLoader without anchors, aliases or deep nesting.

Its own module so that only what reads a manifest file (install, init, doctor) imports PyYAML: a run reads
the manifest the lockfile recorded, already validated, as JSON.
"""

from __future__ import annotations

from typing import Any

import yaml
import yaml.nodes

YamlError = yaml.YAMLError
"""Any YAML failure (YamlRefused included)."""


class YamlRefused(yaml.MarkedYAMLError):
    """YAML this host does not accept even though it is valid YAML."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses anchors, aliases and deep nesting.

    A few hundred bytes of aliases expand to gigabytes once constructed (and then into the lockfile), so an
    anchor is refused where it is declared, before anything is built; no real manifest needs one.
    """

    def __init__(self, stream: str, *, max_depth: int) -> None:
        super().__init__(stream)
        self._depth = 0
        self._max_depth = max_depth

    def compose_node(self, parent: yaml.nodes.Node | None, index: int) -> yaml.nodes.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        mark = event.start_mark if isinstance(event.start_mark, yaml.Mark) else None
        if isinstance(event, yaml.AliasEvent):
            raise YamlRefused(problem="aliases (*name, <<: *name) are not allowed", problem_mark=mark)
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise YamlRefused(problem="anchors (&name) are not allowed", problem_mark=mark)
        if self._depth >= self._max_depth:
            raise YamlRefused(problem=f"nesting deeper than {self._max_depth} levels", problem_mark=mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, *, max_depth: int) -> Any:
    """Parse one YAML document with StrictLoader; raises YamlError (or ValueError for a bad value); nesting
    deeper than `max_depth` is refused while composing, before anything is built."""
    loader = StrictLoader(text, max_depth=max_depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_location(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    if not isinstance(problem, str):
        return ""
    return " (" + "".join(c if c.isprintable() else "?" for c in problem)[:100] + ")"
