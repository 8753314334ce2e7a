"""host/core/terminal.py: every character class that drives or deceives a terminal comes out escaped."""

from __future__ import annotations

import unicodedata

import pytest

from host.core.terminal import LINE_LIMIT, safe_block, safe_line, safe_token

# (input, what safe_line shows): one per class the red-team report (issue 12, finding 7) names, and more.
HOSTILE = [
    ("\x1b[2K\x1b[1Aok: done", "\\x1b[2K\\x1b[1Aok: done"),  # CSI: erase the line, cursor up
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # OSC: window title, BEL-terminated
    ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "\\x1b]8;;http://evil\\x1b\\link\\x1b]8;;\\x1b\\"),
    ("boom\rok: agent", "boom\\rok: agent"),  # CR: overwrite the line with a fake ok:
    ("boom\nok: agent", "boom\\nok: agent"),  # LF: a line of its own
    ("a\tb", "a\\tb"),
    ("\x9b2J", "\\x9b2J"),  # 8-bit CSI (C1)
    ("\x9d0;t\x9c", "\\x9d0;t\\x9c"),  # 8-bit OSC and ST
    ("\x85next", "\\x85next"),  # NEL (C1)
    ("\x00\x08\x7f", "\\x00\\x08\\x7f"),  # NUL, backspace, DEL
    ("txt\u202egpj.exe", "txt\\u202egpj.exe"),  # RLO
    ("\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"),  # LRE RLE PDF LRO
    ("\u2066a\u2067b\u2068c\u2069", "\\u2066a\\u2067b\\u2068c\\u2069"),  # isolates
    ("\u200b\u200e\u200f\u2060\ufeff", "\\u200b\\u200e\\u200f\\u2060\\ufeff"),  # zero-width, marks, BOM
    ("\u00ad", "\\xad"),  # soft hyphen (Cf)
    ("\U000e0041\U000e007f", "\\U000e0041\\U000e007f"),  # tag characters (Cf)
    ("\u2028\u2029", "\\u2028\\u2029"),  # line and paragraph separators
    ("\ud800x\udfff", "\\ud800x\\udfff"),  # lone surrogates (print would raise on them)
    ("\U000e01ef\U0010fffe", "\U000e01ef\\U0010fffe"),  # a variation selector stays; a noncharacter
]


@pytest.mark.parametrize(("text", "shown"), HOSTILE)
def test_safe_line_escapes_each_class_visibly(text: str, shown: str) -> None:
    assert safe_line(text) == shown


@pytest.mark.parametrize(("text", "_shown"), HOSTILE)
def test_nothing_a_terminal_acts_on_survives(text: str, _shown: str) -> None:
    for out in (safe_line(text), safe_block(text), safe_token(text)):
        bad = [ch for ch in out if ch not in "\n\t" and unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Cn"}]
        assert not bad, (text, out)
        assert "\x1b" not in out and "\r" not in out


def test_every_c0_c1_and_del_is_escaped() -> None:
    for cp in [*range(0x20), 0x7F, *range(0x80, 0xA0)]:
        out = safe_line(chr(cp))
        assert out.startswith("\\") and chr(cp) not in out, hex(cp)
    assert safe_block("\x1b") == "\\x1b" and safe_block("\x9b") == "\\x9b"


def test_every_format_character_is_escaped() -> None:
    for cp in range(0x110000):
        ch = chr(cp)
        if unicodedata.category(ch) == "Cf":
            assert safe_line(ch).startswith("\\"), hex(cp)


def test_safe_block_keeps_newlines_and_tabs_only() -> None:
    text = "line 1\n\tline 2\r\nline\x1b[31m 3\u202e\n"
    assert safe_block(text) == "line 1\n\tline 2\\r\nline\\x1b[31m 3\\u202e\n"
    assert safe_line(text) == "line 1\\n\\tline 2\\r\\nline\\x1b[31m 3\\u202e\\n"


@pytest.mark.parametrize(
    "text", ["hello", "é", "日本語", "naïve café", "emoji \U0001f600", "Ω ≤ ∞", "a b", "C:\\path\\x1b", ""]
)
def test_printable_text_is_kept_as_is(text: str) -> None:
    assert safe_line(text) == text and safe_block(text) == text


@pytest.mark.parametrize(("text", "_shown"), HOSTILE)
def test_escaping_twice_changes_nothing(text: str, _shown: str) -> None:
    once = safe_line(text)
    assert safe_line(once) == once and safe_block(once) == once
    assert safe_block(safe_block(text)) == safe_block(text)


def test_lines_are_bounded_and_say_how_much_was_cut() -> None:
    out = safe_line("x" * 10_000)
    assert out.startswith("x" * LINE_LIMIT) and out.endswith(f"... [{10_000 - LINE_LIMIT} more characters]")
    assert safe_line("ab\x1bcd", limit=6) == "ab\\x1b... [2 more characters]"
    assert safe_line("ab\x1bcd", limit=5) == "ab... [3 more characters]"  # an escape is never cut in half
    assert safe_line("abc", limit=3) == "abc"
    assert safe_line("y" * 10_000, limit=None) == "y" * 10_000
    assert safe_block("z\n" * 100_000) == "z\n" * 100_000  # blocks are unbounded unless asked


def test_non_strings_are_rendered_first() -> None:
    assert safe_line(42) == "42" and safe_line(None) == "None" and safe_token(7) == "7"


@pytest.mark.parametrize(
    "token", ["hello-agent", "1.0.0", "1.0.0-rc.1+build.5", "unverified", "agent_exception", "sha256:ab12"]
)
def test_a_plain_token_is_shown_bare(token: str) -> None:
    assert safe_token(token) == token


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("1.0 (agent, trust curated)", '"1.0 (agent, trust curated)"'),
        ("1.0\x1b[8m", '"1.0\\x1b[8m"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("", '""'),
        ("-x", '"-x"'),
    ],
)
def test_anything_else_is_quoted_so_it_cannot_pass_for_surrounding_text(value: str, shown: str) -> None:
    assert safe_token(value) == shown
