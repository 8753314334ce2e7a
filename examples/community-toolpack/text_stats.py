"""community-text-stats: small pure tools, run in a tool sandbox when installed as community code."""

from __future__ import annotations

import collections
import re

_CALLS = 0
"""Module state lives as long as the pack's tool sandbox: one run (a fresh sandbox after a crash)."""


def _count() -> int:
    global _CALLS  # noqa: PLW0603 (the point of the example: state for one run, gone after it)
    _CALLS += 1
    return _CALLS


def word_frequencies(text: str, top: int = 5) -> dict[str, object]:
    """The `top` most frequent words of `text` (case-folded), most frequent first, ties alphabetical."""
    _count()
    counts = collections.Counter(re.findall(r"[^\W\d_]+(?:'[^\W\d_]+)?", text.casefold()))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
    return {"words": [{"word": word, "count": count} for word, count in ranked], "distinct": len(counts)}


def calls_in_this_run() -> dict[str, int]:
    """How many calls this sandbox has served, this one included."""
    return {"calls": _count()}
