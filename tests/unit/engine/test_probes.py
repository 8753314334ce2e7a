"""The cgroup probes: a container's cgroup found by its id in every driver layout, and the pids counter
read from it without ever going down."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from host.engine.probes import PidsProbe, container_cgroup_dir

# --- container_cgroup_dir -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [
        "pids/docker/{id}",
        "pids/system.slice/docker-{id}.scope",
        "docker/{id}",
        "system.slice/docker-{id}.scope",
    ],
)
def test_a_containers_cgroup_is_found_by_its_id_in_every_driver_layout(tmp_path: Path, layout: str) -> None:
    cid = "ab" * 32
    where = tmp_path / layout.format(id=cid)
    where.mkdir(parents=True)
    (where / "pids.events").write_text("max 0\n")
    assert container_cgroup_dir(cid, "pids", "pids.events", root=tmp_path) == where
    assert container_cgroup_dir(cid, "pids", "pids.max", root=tmp_path) is None  # the marker must be there
    assert container_cgroup_dir("cd" * 32, "pids", "pids.events", root=tmp_path) is None


@pytest.mark.parametrize("bad", ["", "../../etc", "AB" * 32, "ab" * 31, "ab" * 32 + "/..", "docker"])
def test_only_a_full_container_id_is_looked_up(tmp_path: Path, bad: str) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "pids.events").write_text("max 0\n")
    assert container_cgroup_dir(bad, "pids", "pids.events", root=tmp_path) is None


# --- PidsProbe ---------------------------------------------------------------------------------------------


def test_pids_probe_reads_max_events_and_never_goes_down(tmp_path: Path) -> None:
    probe = PidsProbe(os.getpid())
    events = tmp_path / "pids.events"
    probe.path = events
    events.write_text("max 7\n")
    assert probe.poll() == 7
    events.write_text("max 3\n")
    assert probe.poll() == 7  # a counter only grows; a smaller reading is not news
    events.write_text("max 12\n")
    assert probe.poll() == 12 and probe.hits == 12
    events.write_text("other 99\nmax notanumber\n")
    assert probe.poll() == 12
    events.unlink()
    assert probe.poll() == 12  # the cgroup went away with the container: the last count stands


def test_pids_probe_without_a_cgroup_reports_zero(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    probe = PidsProbe(proc.pid)  # no /proc/<pid>/cgroup any more
    assert probe.path is None and probe.poll() == 0
    probe.path = tmp_path / "absent"
    assert probe.poll() == 0


def test_pids_probe_finds_a_pids_events_file_for_a_live_process() -> None:
    probe = PidsProbe(os.getpid())
    if probe.path is None:
        pytest.skip("this host exposes no pids controller for the test process")
    assert probe.path.name == "pids.events" and probe.path.is_file()
    assert probe.poll() >= 0
