"""Archives uploaded to the engine end at their end marker: nothing after it for Podman's reader to refuse."""

from __future__ import annotations

import io
import tarfile

import pytest

from host.engine.tararchive import END_OF_ARCHIVE, upload_tar
from tests.support.tars import assert_ends_at_marker, end_of_members


def _write(tar: tarfile.TarFile, name: str, body: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    tar.addfile(info, io.BytesIO(body))


@pytest.mark.parametrize("sizes", [[], [0], [1], [511, 512, 513], [10 * 1024 - 1536]])
def test_an_upload_tar_stops_at_its_end_marker_and_reads_back_whole(sizes: list[int]) -> None:
    buf = io.BytesIO()
    with upload_tar(buf) as tar:
        for i, size in enumerate(sizes):
            _write(tar, f"f{i}", bytes([65 + i]) * size)
    assert buf.tell() == 0  # rewound, ready to upload
    assert_ends_at_marker(buf)
    with tarfile.open(fileobj=buf, mode="r:") as tar:
        got = {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar}
    assert got == {f"f{i}": bytes([65 + i]) * size for i, size in enumerate(sizes)}


def test_plain_tarfile_pads_past_the_marker_which_is_what_the_check_catches() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _write(tar, "f", b"x")
    assert len(buf.getvalue()) == tarfile.RECORDSIZE > end_of_members(buf) + END_OF_ARCHIVE
    with pytest.raises(AssertionError):
        assert_ends_at_marker(buf)
