"""Tar archives for the engine's archive upload, ending exactly at their end marker (no record padding).

Python's tarfile pads an archive to a 10 KiB record after the two zero blocks that end it. Podman's archive
upload (PUT /containers/{id}/archive) hands the body to a subprocess that stops reading at the end marker
and exits; the padding still being written then fails the whole upload with a 500 ("passing bulk input to
subprocess: write |1: broken pipe", containers/buildah#6573), at random and more often under load. An
archive with no padding after the marker is a valid tar for every reader, so every archive we upload is
written through here.
"""

from __future__ import annotations

import contextlib
import tarfile
from collections.abc import Iterator
from typing import IO

__all__ = ["END_OF_ARCHIVE", "upload_tar"]

#: The end-of-archive marker: two zero blocks (POSIX.1-2001 ustar).
END_OF_ARCHIVE = 2 * tarfile.BLOCKSIZE


@contextlib.contextmanager
def upload_tar(archive: IO[bytes]) -> Iterator[tarfile.TarFile]:
    """Write a tar into `archive` (seekable, empty, positioned at 0); on a clean exit cut the record padding
    tarfile adds after the end marker and rewind, ready to upload."""
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        yield tar
    # tar.offset counts every block written, the end marker included, and not the padding after it.
    archive.truncate(tar.offset)
    archive.seek(0)
