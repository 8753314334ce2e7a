"""What an archive bound for the engine's upload must look like: its last bytes are the end marker."""

from __future__ import annotations

import tarfile
from typing import IO

from host.engine.tararchive import END_OF_ARCHIVE


def end_of_members(archive: IO[bytes]) -> int:
    """Where the last member ends (the end marker's offset), as tarfile reads it; the archive is rewound."""
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        for _ in tar:
            pass
        end = tar.offset
    archive.seek(0)
    return end


def assert_ends_at_marker(archive: IO[bytes]) -> None:
    """Nothing after the two zero blocks: Podman's upload fails at random on padding (buildah#6573)."""
    archive.seek(0)
    data = archive.read()
    end = end_of_members(archive)
    assert len(data) == end + END_OF_ARCHIVE, (len(data), end)
    assert data[end:] == b"\0" * END_OF_ARCHIVE
