"""`agent_sandbox.filesystem` (host/spec/files.py): the levels an operator may grant, the bounds with their
ranges, and the one check every path's name passes before any work is done on it."""

from __future__ import annotations

from typing import Any

import pytest

from host.spec.files import (
    GRANTABLE_LEVELS,
    NAME_REFUSALS,
    FileLimits,
    FilesConfig,
    files_config,
    name_refusal,
)


def _config(value: Any) -> FilesConfig:
    def fail(key: str, expected: str, got: Any) -> Exception:
        return ValueError(f"{key}: {expected}")

    return files_config(value, "agent_sandbox.filesystem", fail)


def test_the_default_grants_all_three_levels_with_safe_bounds() -> None:
    assert _config(None) == _config({}) == FilesConfig()
    assert FilesConfig().allow == GRANTABLE_LEVELS == ("workspace_read", "workspace_write", "temp")
    limits = FileLimits()
    assert limits.max_file_bytes <= limits.max_bytes_in and limits.max_files_out <= limits.max_files_in


def test_allow_and_limits_are_read() -> None:
    cfg = _config({"allow": ["temp", "workspace_read"], "limits": {"max_files_in": 10, "max_depth": 4}})
    assert cfg.allow == ("workspace_read", "temp")
    assert (cfg.limits.max_files_in, cfg.limits.max_depth) == (10, 4)
    assert _config({"allow": []}).allow == ()


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"allow": ["any"]}, "allow"),
        ({"allow": "temp"}, "allow"),
        ({"alow": []}, "expected only the keys allow, limits"),
        ({"limits": {"max_files": 3}}, "limits"),
        ({"limits": {"max_depth": 0}}, "limits.max_depth"),
        ({"limits": {"max_bytes_in": 1.5}}, "limits.max_bytes_in"),
        ({"limits": {"max_files_in": True}}, "limits.max_files_in"),
        ([], "expected an object"),
    ],
)
def test_a_bad_section_names_its_key(value: Any, key: str) -> None:
    with pytest.raises(ValueError, match=r"agent_sandbox\.filesystem") as caught:
        _config(value)
    assert key in str(caught.value)


LIMITS = FileLimits(max_path_bytes=64, max_depth=3)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("src/main.py", None),
        ("docs/übersicht \u2013 2024.md", None),  # letters and an en dash: printable text
        ("a/b/c/d.txt", None),
        ("", "name_empty"),
        ("a//b", "name_empty"),
        ("a/", "name_empty"),
        ("/etc/passwd", "name_absolute"),
        ("../x", "name_dot"),
        ("a/../../x", "name_dot"),
        ("./x", "name_dot"),
        ("a\0b", "name_nul"),
        (b"caf\xe9.txt", "name_not_utf8"),
        ("line\nbreak", "name_control"),
        ("\x1b[2Jclear", "name_control"),
        ("evil\u202etxt.exe", "name_control"),
        ("zero\u200bwidth", "name_control"),
        ("sep\u2028line", "name_control"),
        ("x" * 65, "name_too_long"),
        ("a/b/c/d/e.txt", "name_too_deep"),
    ],
)
def test_a_name_is_judged_as_bytes_before_anything_is_done_with_it(
    name: str | bytes, reason: str | None
) -> None:
    assert name_refusal(name, LIMITS) == reason
    assert reason is None or reason in NAME_REFUSALS


def test_one_component_is_at_most_255_bytes() -> None:
    wide = FileLimits(max_path_bytes=4096)
    assert name_refusal("d/" + "x" * 255, wide) is None
    assert name_refusal("d/" + "x" * 256, wide) == "name_too_long"
