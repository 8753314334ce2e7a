"""word-tools: two tiny pure tools, enough to exercise a toolpack end to end."""

from __future__ import annotations


def count_words(text: str) -> dict[str, int]:
    """The number of whitespace-separated words in `text`."""
    return {"count": len(text.split())}


def reverse_words(text: str) -> dict[str, str]:
    """`text` with its words in reverse order, joined by single spaces."""
    return {"text": " ".join(reversed(text.split()))}
