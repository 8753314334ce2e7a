"""Terminal-safe rendering of agent- or pack-written text: controlling and invisible characters escaped."""

from __future__ import annotations

import re
import unicodedata

LINE_LIMIT = 4096
"""Default cap, in output characters, of one escaped single-line field (an error, a hint, a version)."""

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})
"""Controls (C0, DEL, C1), format characters (bidi overrides and isolates, zero-width, tags), surrogates,
unassigned code points (a later Unicode may make them format characters) and the line/paragraph separators.

Why categories and not a list: a terminal acts on, or hides, more code points than any list remembers;
Cc and Cf are exactly the classes that carry no glyph of their own.
"""

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@/-]{0,127}")
"""What a slug, version, trust level, reason code or image id looks like when it is not up to tricks."""


_SUSPECT = re.compile(r"[^\x20-\x7e]")
"""Anything but printable ASCII: the only characters that need a closer look."""

_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    cp = ord(ch)
    if cp <= 0xFF:
        return f"\\x{cp:02x}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def _is_unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _piece(ch: str, keep: str) -> str:
    return ch if ch in keep or not _is_unsafe(ch) else _escaped(ch)


def _render(text: str, keep: str, limit: int | None) -> str:
    # Printable ASCII is never looked up: a multi-megabyte JSON result costs one regex pass.
    rendered = _SUSPECT.sub(lambda m: _piece(m.group(), keep), text)
    if limit is None or len(rendered) <= limit:
        return rendered
    size = 0  # the rendering is the pieces in order, so rendered[:size] is the first i characters' part
    for i, ch in enumerate(text):
        width = len(_piece(ch, keep))
        if size + width > limit:
            return rendered[:size] + f"... [{len(text) - i} more characters]"
        size += width
    return rendered  # unreachable: the rendering is longer than the limit


def safe_line(text: object, *, limit: int | None = LINE_LIMIT) -> str:
    """One field shown on one line: every control (newline, tab and CR too), format and bidi character is
    escaped as `\\x1b` / `\\u202e`, so agent text can neither move the cursor, retitle the window, reorder
    or hide the text around it, nor start a line of its own that passes for the host's.

    Nothing is dropped silently: past `limit` output characters the rest is cut with a note saying how much.
    Backslashes are kept as they are, so escaping twice changes nothing.
    """
    return _render(str(text), "", limit)


def safe_block(text: object, *, limit: int | None = None) -> str:
    """Multi-line text (agent logs, a traceback, a finished block of CLI output): like `safe_line`, but
    newlines and tabs are kept, since on their own they only move the cursor forward, never back over text.
    """
    return _render(str(text), "\n\t", limit)


def safe_token(text: object) -> str:
    """A field that should be one token (slug, version, trust level, code): bare when it is one; otherwise
    quoted and escaped, so a version like `1.0 (agent, trust curated)` cannot pass for the text around it.
    """
    value = str(text)
    if _TOKEN.fullmatch(value):
        return value
    return '"' + safe_line(value, limit=256).replace('"', '\\"') + '"'


__all__ = ["LINE_LIMIT", "safe_block", "safe_line", "safe_token"]
