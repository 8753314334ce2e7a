"""A pack's filesystem grant (host/policy/filesystem.py): its declared level, as far as the operator's
`agent_sandbox.filesystem.allow` grants it; a level not granted refuses the run naming the key."""

from __future__ import annotations

import pytest

from host.policy.filesystem import ALLOW_KEY, NO_FILES, FilesystemGrant, FilesystemRefused, filesystem_grant
from host.spec.files import FilesConfig


@pytest.mark.parametrize(
    ("level", "workspace", "temp"),
    [
        ("none", "none", False),
        ("temp", "none", True),
        ("workspace_read", "read", False),
        ("workspace_write", "write", True),
        ("any", "write", True),  # the most this host gives: the run's own copy, never the host's tree
    ],
)
def test_each_declared_level_gets_its_grant_under_the_default_config(
    level: str, workspace: str, temp: bool
) -> None:
    grant = filesystem_grant(level, FilesConfig())
    assert (grant.workspace, grant.temp) == (workspace, temp)
    assert grant.level == level


def test_an_unknown_level_gets_nothing() -> None:
    assert filesystem_grant("full", FilesConfig()) is NO_FILES
    assert NO_FILES.needed is None


@pytest.mark.parametrize(
    ("level", "allow", "needed"),
    [
        ("workspace_write", ("workspace_read", "temp"), "workspace_write"),
        ("any", ("workspace_read", "temp"), "workspace_write"),
        ("workspace_read", ("temp",), "workspace_read"),
        ("temp", (), "temp"),
    ],
)
def test_a_level_the_config_does_not_grant_refuses_naming_the_key(
    level: str, allow: tuple[str, ...], needed: str
) -> None:
    with pytest.raises(FilesystemRefused) as caught:
        filesystem_grant(level, FilesConfig(allow=allow))
    assert ALLOW_KEY in caught.value.message and level in caught.value.message
    assert caught.value.hint == f"add {needed} to {ALLOW_KEY} in the host config if packs may have it"


def test_none_needs_no_grant_at_all() -> None:
    assert filesystem_grant("none", FilesConfig(allow=())) == FilesystemGrant("none")
