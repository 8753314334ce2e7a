"""Per-run socket directories: fresh and private, handed to the container uid, swept only when orphaned."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from host.core.owner import owner_token
from host.engine.contract import SANDBOX_GID, SANDBOX_UID, SOCKET_NAME
from host.runtime.rundir import RunDir, make_run_dir, run_root, sweep_run_dirs

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"AGENTNODE_RUN_DIR": str(tmp_path / "runs")}


def dead_token() -> str:
    proc = subprocess.Popen(["sleep", "30"])
    token = owner_token(proc.pid)
    proc.kill()
    proc.wait()
    return token


@pytest.fixture
def bound_socket() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def bind(rundir: RunDir, opened: list[socket.socket]) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(rundir.socket_path))
    opened.append(sock)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_run_root_honours_the_override_and_is_private(env: dict[str, str]) -> None:
    root = run_root(env)
    assert root == Path(env["AGENTNODE_RUN_DIR"]) and root.is_dir() and mode(root) == 0o700
    os.chmod(root, 0o755)
    assert mode(run_root(env)) == 0o700  # tightened again, even if someone loosened it


@pytest.mark.skipif(not AS_ROOT, reason="the default root differs for non-root users")
def test_default_root_keeps_socket_paths_short() -> None:
    root = run_root({})
    assert root == Path("/run/agentnode-sandbox")
    longest = root / f"run-{uuid.uuid4().hex}" / SOCKET_NAME
    assert len(str(longest).encode()) < 108  # sun_path


def test_non_root_default_is_per_user(tmp_path: Path) -> None:
    if AS_ROOT:
        pytest.skip("root uses /run/agentnode-sandbox")
    root = run_root({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert root == tmp_path / f"agentnode-sandbox-{os.geteuid()}" and mode(root) == 0o700


def test_make_run_dir_is_fresh_private_and_records_its_owner(env: dict[str, str]) -> None:
    rundir = make_run_dir("abc123", "4242:99", env)
    assert rundir.path == run_root(env) / "run-abc123"
    assert mode(rundir.path) == 0o700
    assert rundir.owner_file.read_text() == "4242:99"
    assert rundir.owner_file.parent == rundir.path.parent  # never inside what the container sees
    assert os.listdir(rundir.path) == []
    assert rundir.socket_path == rundir.path / SOCKET_NAME
    with pytest.raises(FileExistsError):
        make_run_dir("abc123", "4242:99", env)  # a run never reuses a directory


@pytest.mark.skipif(not AS_ROOT, reason="handing the directory over needs root")
def test_grant_hands_dir_and_socket_to_the_container_uid_only(
    env: dict[str, str], bound_socket: list[socket.socket]
) -> None:
    rundir = make_run_dir("granted", "1:1", env)
    bind(rundir, bound_socket)
    rundir.grant(SANDBOX_UID, SANDBOX_GID)
    d, s = rundir.path.stat(), rundir.socket_path.stat()
    assert (d.st_uid, d.st_gid, stat.S_IMODE(d.st_mode)) == (SANDBOX_UID, SANDBOX_GID, 0o700)
    assert (s.st_uid, s.st_gid, stat.S_IMODE(s.st_mode)) == (SANDBOX_UID, SANDBOX_GID, 0o600)
    assert stat.S_ISSOCK(s.st_mode)


@pytest.mark.skipif(not AS_ROOT, reason="needs root to act as another user")
def test_other_users_cannot_list_or_connect(bound_socket: list[socket.socket]) -> None:
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="rd-"))
    try:
        _check_other_users(base, bound_socket)
    finally:
        shutil.rmtree(base)


def _check_other_users(base: Path, bound_socket: list[socket.socket]) -> None:
    env = {"AGENTNODE_RUN_DIR": str(base / "runs")}
    rundir = make_run_dir("private", "1:1", env)
    bind(rundir, bound_socket)
    bound_socket[0].listen()
    rundir.grant(SANDBOX_UID, SANDBOX_GID)
    os.chmod(base, 0o755)  # only the run directory itself stands in the way
    os.chmod(run_root(env), 0o755)
    probe = (
        "import os, socket, sys\n"
        "results = []\n"
        "try:\n    os.listdir(sys.argv[1]); results.append('listed')\n"
        "except PermissionError: results.append('no-list')\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1] + '/sandbox.sock'); results.append('connected')\n"
        "except PermissionError: results.append('no-connect')\n"
        "print(' '.join(results))\n"
    )

    def as_user(uid: int) -> str:
        out = subprocess.run(
            ["python3", "-c", probe, str(rundir.path)],
            user=uid,
            group=uid,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return out.stdout.strip()

    assert as_user(SANDBOX_UID) == "listed connected"
    assert as_user(SANDBOX_UID + 1) == "no-list no-connect"


@pytest.mark.skipif(AS_ROOT, reason="root hands the directory over instead")
def test_grant_without_root_leaves_the_dir_unlistable(
    env: dict[str, str], bound_socket: list[socket.socket]
) -> None:
    rundir = make_run_dir("nonroot", "1:1", env)
    bind(rundir, bound_socket)
    rundir.grant(SANDBOX_UID, SANDBOX_GID)
    assert mode(rundir.path) == 0o711 and mode(rundir.socket_path) == 0o666


def test_grant_before_the_socket_exists_is_fine(env: dict[str, str]) -> None:
    rundir = make_run_dir("early", "1:1", env)
    rundir.grant(SANDBOX_UID, SANDBOX_GID)
    assert not rundir.socket_path.exists()


def test_remove_is_idempotent(env: dict[str, str]) -> None:
    rundir = make_run_dir("gone", "1:1", env)
    rundir.remove()
    rundir.remove()
    assert not rundir.path.exists() and not rundir.owner_file.exists()


def test_sweep_removes_only_orphaned_run_dirs(env: dict[str, str]) -> None:
    root = run_root(env)
    live = make_run_dir("live", owner_token(), env)
    dead = make_run_dir("dead", dead_token(), env)
    garbage = make_run_dir("garbage", "not-a-token", env)
    fresh = root / "run-fresh"  # no owner file yet: another host may be creating it right now
    fresh.mkdir()
    stale = root / "run-stale"
    stale.mkdir()
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    bystander_dir = root / "other"
    bystander_dir.mkdir()
    os.utime(bystander_dir, (an_hour_ago, an_hour_ago))
    bystander_file = root / "run-file"
    bystander_file.write_text(dead_token())

    removed = sweep_run_dirs(env)

    assert sorted(removed) == ["run-dead", "run-garbage", "run-stale"]
    assert not dead.path.exists() and not garbage.path.exists() and not stale.exists()
    assert not dead.owner_file.exists() and live.owner_file.exists()
    assert live.path.is_dir() and fresh.is_dir() and bystander_dir.is_dir() and bystander_file.is_file()
    assert sweep_run_dirs(env) == []
