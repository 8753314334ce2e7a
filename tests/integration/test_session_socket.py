"""The per-run socket directory during a live run: private to the container uid, connectable by it, under
both runtimes; checked by mode and owner, and by effect as the container uid and as another user."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host.core.owner import owner_token
from host.engine.contract import SANDBOX_GID, SANDBOX_UID, SOCKET_NAME
from host.engine.labels import LABEL_OWNER, LABEL_RUN, LABEL_SLUG
from host.runtime.rundir import run_root
from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

OTHER_UID = SANDBOX_UID + 1

SLOW_AGENT = """
import os, socket, time

def run(context, **kwargs):
    path = os.environ["AGENTNODE_SOCKET"]
    d, s = os.stat(os.path.dirname(path)), os.stat(path)
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(path)  # the wrapper is connected already; a second, raw connect proves it again
    raw.close()
    time.sleep(6)  # the test inspects the host side meanwhile
    return {"uid": os.getuid(), "dir": [d.st_uid, d.st_mode & 0o7777], "sock": [s.st_uid, s.st_mode & 0o7777],
            "listing": sorted(os.listdir(os.path.dirname(path)))}
"""

# Run as a given uid with an O_PATH descriptor of the run dir: only the run dir's own permissions apply
# (its parent, private to root, is never traversed).
PROBE = """
import os, socket, sys
fd = int(sys.argv[1])
out = []
try:
    os.close(os.open(".", os.O_RDONLY, dir_fd=fd))
    out.append("list")
except PermissionError:
    out.append("no-list")
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(f"/proc/self/fd/{fd}/sandbox.sock")
    out.append("connect")
except PermissionError:
    out.append("no-connect")
print(" ".join(out))
"""


def probe_as(uid: int, run_dir: Path) -> str:
    fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        out = subprocess.run(
            ["/usr/bin/python3", "-I", "-S", "-c", PROBE, str(fd)],
            user=uid,
            group=uid,
            extra_groups=[],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    finally:
        os.close(fd)
    return out.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="inspecting and probing as other users needs root")
def test_run_socket_is_private_to_the_container_uid(
    host_state: HostState, make_agent: Callable[..., Path], runtime: str
) -> None:
    slug = "sock-probe"
    host_state.install(make_agent(slug, SLOW_AGENT))
    client = host_state.client
    seen: dict[str, Any] = {}

    def inspect_during_the_run() -> None:
        try:
            inspect()
        except Exception as exc:
            seen["error"] = exc

    def inspect() -> None:
        # This process's own running sandbox of the slug (an engine shared with other test runs may hold
        # someone else's), once its socket is there to be probed.
        labels = [f"{LABEL_SLUG}={slug}", f"{LABEL_OWNER}={owner_token()}"]
        root = run_root(host_state.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = client.api.containers(filters={"label": labels})
            run_dirs = [root / f"run-{c['Labels'][LABEL_RUN]}" for c in running]
            if run_dirs and (run_dirs[0] / SOCKET_NAME).exists():
                break
            time.sleep(0.1)
        else:
            return
        run_dir = run_dirs[0]
        seen["root"] = root.stat()
        seen["dir"] = run_dir.stat()
        seen["sock"] = (run_dir / SOCKET_NAME).stat()
        seen["as_sandbox"] = probe_as(SANDBOX_UID, run_dir)
        seen["as_other"] = probe_as(OTHER_UID, run_dir)

    watcher = threading.Thread(target=inspect_during_the_run)
    watcher.start()
    host = host_state.host()
    try:
        result = host.run(slug, runtime=runtime)
    finally:
        host.close()
        watcher.join()
    assert result.success, (result.error_code, result.error, result.logs)
    assert "error" not in seen, seen.get("error")

    root, d, s = seen["root"], seen["dir"], seen["sock"]
    assert (root.st_uid, stat.S_IMODE(root.st_mode)) == (0, 0o700)
    assert (d.st_uid, d.st_gid, stat.S_IMODE(d.st_mode)) == (SANDBOX_UID, SANDBOX_GID, 0o700)
    assert stat.S_ISSOCK(s.st_mode)
    assert (s.st_uid, s.st_gid, stat.S_IMODE(s.st_mode)) == (SANDBOX_UID, SANDBOX_GID, 0o600)
    assert seen["as_sandbox"] == "list connect"
    assert seen["as_other"] == "no-list no-connect"

    inside = result.result
    assert inside["uid"] == SANDBOX_UID
    assert inside["sock"] == [SANDBOX_UID, 0o600]
    assert inside["dir"][0] == SANDBOX_UID
    assert SOCKET_NAME in inside["listing"]
    assert not (run_root(host_state.env) / f"run-{result.run_id}").exists()  # cleaned with the run
