"""The labels that mark the engine objects this host made (containers, pack volumes, images): what the
sweep, doctor and the pin checks find them by."""

from __future__ import annotations

LABEL_RUN = "io.agentnode.sandbox.run-id"
LABEL_OWNER = "io.agentnode.sandbox.owner"
LABEL_SLUG = "io.agentnode.sandbox.slug"
LABEL_PROTOCOL = "io.agentnode.sandbox.protocol"
LABEL_ARTIFACT = "io.agentnode.sandbox.artifact-hash"
LABEL_WARM = "io.agentnode.sandbox.warm"
LABEL_TOOL_FOR = "io.agentnode.sandbox.tool-for"
"""On a tool sandbox: the id of the run whose tool calls it serves (its own id is LABEL_RUN)."""


__all__ = [
    "LABEL_ARTIFACT",
    "LABEL_OWNER",
    "LABEL_PROTOCOL",
    "LABEL_RUN",
    "LABEL_SLUG",
    "LABEL_TOOL_FOR",
    "LABEL_WARM",
]
