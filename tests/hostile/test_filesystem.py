"""Filesystem attacks: writing outside /tmp and HOME, and reading what belongs to the host."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest

from tests.hostile.conftest import Lab, Ledger, brief

pytestmark = [pytest.mark.docker, pytest.mark.podman]

WRITER = r'''
import errno, os, stat, subprocess

def _err(exc):
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)

def write(path, mode="w"):
    try:
        with open(path, mode) as fh:
            fh.write("owned\n")
        return "written"
    except OSError as exc:
        return _err(exc)

def attempt(fn, *args):
    try:
        fn(*args)
        return "done"
    except OSError as exc:
        return _err(exc)

def writable_dirs():
    """Every directory (outside /proc and /sys) where this uid can create a file."""
    found = []
    for top, dirs, _files in os.walk("/", topdown=True):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys")]
        probe = os.path.join(top, ".owned-probe")
        try:
            fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            continue
        os.close(fd)
        os.unlink(probe)
        found.append(top)
    return found

def run(context, mode="attack", **kwargs):
    if mode == "verify":
        return {"pack": sorted(os.listdir("/pack")), "tmp": sorted(os.listdir("/tmp")),
                "site_owned": os.path.exists("/opt/agentnode/site/owned")}
    out = {}
    out["root"] = write("/owned")
    out["etc"] = {"new": write("/etc/owned"), "passwd": write("/etc/passwd", "a"),
                  "hosts": write("/etc/hosts", "a"), "resolv": write("/etc/resolv.conf", "a")}
    out["pack"] = {"new": write("/pack/owned"), "agent": write("/pack/agent.py", "a"),
                   "manifest": write("/pack/agentnode.yaml", "a")}
    out["site"] = {"new": write("/opt/agentnode/site/owned"),
                   "wrapper": write("/opt/agentnode/site/sandbox_wrapper/__init__.py", "a"),
                   "grpc": write("/opt/agentnode/site/grpc/__init__.py", "a")}
    sock = "/run/agentnode/sandbox.sock"
    out["socket_dir"] = {"new": write("/run/agentnode/owned"), "unlink": attempt(os.unlink, sock),
                         "rename": attempt(os.rename, sock, "/run/agentnode/moved"),
                         "chmod": attempt(os.chmod, "/run/agentnode", 0o777)}
    out["usr"] = {"bin": write("/usr/bin/owned"), "python": write("/usr/bin/python3", "a"),
                  "var": write("/var/owned")}
    out["proc_sys"] = {"sysrq": write("/proc/sysrq-trigger"), "hostname": write("/proc/sys/kernel/hostname"),
                       "core_pattern": write("/proc/sys/kernel/core_pattern"),
                       "uevent_helper": write("/sys/kernel/uevent_helper")}
    try:
        os.symlink("/pack/agent.py", "/tmp/link")
        out["symlink"] = write("/tmp/link", "a")
    except OSError as exc:
        out["symlink"] = "symlink " + _err(exc)
    try:  # the control: the same write through a symlink to a writable file does get through
        os.symlink("/tmp/target", "/tmp/link-control")
        out["symlink_control"] = write("/tmp/link-control")
        out["symlink_control"] += ":" + open("/tmp/target").read().strip()
    except OSError as exc:
        out["symlink_control"] = "symlink " + _err(exc)
    with open("/tmp/tool.sh", "w") as fh:
        fh.write("#!/bin/sh\necho ran\n")
    os.chmod("/tmp/tool.sh", 0o755)
    try:
        ran = subprocess.run(["/tmp/tool.sh"], capture_output=True, text=True)
        out["exec_tmp"] = ran.stdout or "no output"
    except OSError as exc:
        out["exec_tmp"] = _err(exc)
    # the control: the script itself is fine and /bin/sh runs it when it is read, not executed
    via_sh = subprocess.run(["/bin/sh", "/tmp/tool.sh"], capture_output=True, text=True)
    out["exec_tmp_control"] = via_sh.stdout
    out["writable"] = writable_dirs()
    out["tmp_ok"] = write("/tmp/fine") == "written" and write(os.environ["HOME"] + "/fine") == "written"
    return out
'''

READER = r"""
import errno, hashlib, os, stat

SKIP = ("/proc", "/sys", "/dev")

def _err(exc):
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)

def read(path, limit=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError as exc:
        return _err(exc)

def walk_files():
    for top, dirs, files in os.walk("/", topdown=True):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in SKIP]
        for name in files:
            yield os.path.join(top, name)

def run(context, marker, host_paths, host_pid, **kwargs):
    out = {}
    out["host_paths"] = {p: os.path.exists(p) for p in host_paths}
    control = "/tmp/marker-control.txt"  # the control: the scan must find the marker where it is
    with open(control, "w") as fh:
        fh.write(marker)
    out["control"] = control
    hits, sockets, scanned, total = [], [], 0, 0
    needle = marker.encode()
    for path in walk_files():
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            sockets.append(path)
            continue
        if not stat.S_ISREG(st.st_mode) or total > (256 << 20) or scanned > 40000:
            continue
        data = read(path)
        if isinstance(data, bytes):
            scanned += 1
            total += len(data)
            if needle in data:
                hits.append(path)
    out["marker_hits"], out["sockets"], out["scanned"] = hits, sockets, scanned
    shadow = read("/etc/shadow")
    out["shadow"] = hashlib.sha256(shadow).hexdigest() if isinstance(shadow, bytes) else shadow
    out["mounts"] = [line.split()[4] for line in open("/proc/self/mountinfo").read().splitlines()]
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    out["pids"] = {pid: read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode("utf-8", "replace")
                   if isinstance(read(f"/proc/{pid}/cmdline"), bytes) else "?" for pid in pids}
    out["host_pid_visible"] = os.path.exists(f"/proc/{host_pid}")
    engines = ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
               "/run/podman/podman.sock", "/var/run/crio/crio.sock")
    out["engine_sockets"] = [p for p in engines if os.path.exists(p)]
    kcore = read("/proc/kcore", 4096)
    syms = read("/proc/kallsyms", 4096)
    out["kernel"] = {
        "kcore_bytes": len(kcore) if isinstance(kcore, bytes) else kcore,
        "dev_mem": os.path.exists("/dev/mem"), "dev_kmem": os.path.exists("/dev/kmem"),
        "kmsg": os.path.exists("/dev/kmsg"),
        "kallsyms_addresses": sorted({line.split()[0] for line in syms.decode().splitlines()})[:3]
        if isinstance(syms, bytes) else syms,
    }
    return out
"""

# Mount points an agent may see outside /proc, /sys and /dev: the image, its tmpfs, the pack volume, the
# run's socket directory, the engine's init binary (Docker's, Podman's) and the engine's per-container name
# files (read-only); on Podman also the empty read-only tmpfs that seal /run and /var/tmp (the write walk
# proves them unwritable).
ALLOWED_MOUNTS = {
    "/",
    "/tmp",
    "/home/sandbox",
    "/pack",
    "/run/agentnode",
    "/usr/sbin/docker-init",
    "/run/podman-init",
    "/run",
    "/var/tmp",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
}
INITS = {"docker-init": "/sbin/docker-init", "podman-init": "/run/podman-init"}
"""The engines' init processes (pid 1 of every run: `init: True`), by name and by how pid 1 shows it."""
ALLOWED_WRITABLE = ("/tmp", "/home/sandbox")
DENIED = {"EROFS", "EACCES", "EPERM"}
"""What a refused write is: the filesystem or the kernel said no. Anything else (ENOENT: the target is not
there; another error: the probe broke) is not evidence of containment."""


def test_writes_outside_tmp_and_home_fail(lab: Lab, ledger: Ledger) -> None:
    lab.agent("fs-attacker", WRITER)
    host = lab.host()
    result = lab.run("fs-attacker", host=host)
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    after = lab.run("fs-attacker", host=host, kwargs={"mode": "verify"})
    assert after.success, (after.error_code, after.error)
    out, seen = result.result, after.result
    assert out["tmp_ok"] is True  # the allowed places work, so every refusal below is the boundary

    def refused(value: object, *, absent_ok: bool = False) -> bool:
        """Every attempt denied (absent_ok: or the target does not exist, e.g. a masked /proc file)."""
        values = value.values() if isinstance(value, dict) else [value]
        return all(v in DENIED or (absent_ok and v == "ENOENT") for v in values)

    ledger.attack(
        "fs.write_root",
        expected="creating /owned fails (read-only root)",
        observed=brief(out["root"]),
        ok=refused(out["root"]),
    )
    ledger.attack(
        "fs.write_etc",
        expected="creating or appending to /etc files fails",
        observed=brief(out["etc"]),
        ok=refused(out["etc"]),
    )
    ledger.attack(
        "fs.write_pack",
        expected="the pack volume is read-only; a later run sees it unchanged",
        observed=brief({"attempts": out["pack"], "later_run_pack": seen["pack"]}),
        ok=refused(out["pack"]) and seen["pack"] == ["agent.py", "agentnode.yaml"],
    )
    ledger.attack(
        "fs.write_wrapper_site",
        expected="/opt/agentnode/site (wrapper, grpc) cannot be modified",
        observed=brief(out["site"]),
        ok=refused(out["site"]) and not seen["site_owned"],
    )
    ledger.attack(
        "fs.write_socket_dir",
        expected="/run/agentnode is read-only: no new file, the socket cannot be unlinked/renamed",
        observed=brief(out["socket_dir"]),
        ok=refused(out["socket_dir"]),
    )
    ledger.attack(
        "fs.write_usr_var",
        expected="/usr/bin and /var cannot be modified",
        observed=brief(out["usr"]),
        ok=refused(out["usr"]),
    )
    ledger.attack(
        "fs.write_proc_sys",
        expected="sysrq-trigger, kernel sysctls and uevent_helper not writable (denied, or absent: masked)",
        observed=brief(out["proc_sys"]),
        ok=refused(out["proc_sys"], absent_ok=True),
    )
    ledger.attack(
        "fs.symlink_into_pack",
        expected="a /tmp symlink to /pack/agent.py cannot be written through (denied), while the same write "
        "through a /tmp symlink to a /tmp file works",
        observed=brief({"into_pack": out["symlink"], "control": out["symlink_control"]}),
        ok=refused(out["symlink"]) and out["symlink_control"] == "written:owned",
    )
    ledger.attack(
        "fs.exec_from_tmp",
        expected="a script written to /tmp cannot be executed (noexec: denied), though /bin/sh runs it",
        observed=brief({"exec": out["exec_tmp"], "via_sh": out["exec_tmp_control"]}),
        ok=refused(out["exec_tmp"]) and out["exec_tmp_control"] == "ran\n",
    )
    stray = [d for d in out["writable"] if not d.startswith(ALLOWED_WRITABLE)]
    ledger.attack(
        "fs.any_writable_dir",
        expected="no directory outside /tmp and HOME accepts a new file (the walk finds /tmp and HOME)",
        observed=brief({"writable_outside": stray, "found": out["writable"], "later_run_tmp": seen["tmp"]}),
        ok=not stray and {"/tmp", "/home/sandbox"} <= set(out["writable"]) and seen["tmp"] == [],
    )


def test_host_files_are_not_visible(lab: Lab, ledger: Ledger, tmp_path: Path) -> None:
    marker = f"host-only-marker-{uuid.uuid4().hex}"
    canary_file = tmp_path / "host-secret.txt"
    canary_file.write_text(marker)
    host_shadow = hashlib.sha256(Path("/etc/shadow").read_bytes()).hexdigest()
    host_paths = [
        str(canary_file),
        str(lab.state.dir),
        "/var/lib/docker",
        "/etc/docker/daemon.json",
        str(Path(__file__).resolve()),
        str(lab.run_root),
    ]
    lab.agent("read-attacker", READER)
    result = lab.run(
        "read-attacker", kwargs={"marker": marker, "host_paths": host_paths, "host_pid": os.getpid()}
    )
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result

    ledger.attack(
        "read.host_marker_file",
        expected="a file on the host is not reachable by path nor by content scan of every file (the scan "
        "finds the marker only in the agent's own control copy)",
        observed=brief(
            {
                "paths_visible": [p for p, v in out["host_paths"].items() if v],
                "hits": out["marker_hits"],
                "files_scanned": out["scanned"],
            }
        ),
        ok=not any(out["host_paths"].values())
        and out["marker_hits"] == [out["control"]]
        and out["scanned"] > 100,
    )
    ledger.attack(
        "read.host_shadow",
        expected="the host's /etc/shadow bytes are not obtainable",
        observed=brief(out["shadow"] if len(out["shadow"]) < 20 else "read image's own shadow"),
        ok=out["shadow"] != host_shadow,
    )
    extra = sorted({m for m in out["mounts"] if not m.startswith(("/proc", "/sys", "/dev"))} - ALLOWED_MOUNTS)
    ledger.attack(
        "read.host_mounts",
        expected="no host directory mounted beyond the pack volume and socket dir (the mount table lists /, "
        "/pack and /tmp)",
        observed=brief({"unexpected_mounts": extra}),
        ok=not extra and {"/", "/pack", "/tmp"} <= set(out["mounts"]),
    )
    pids = out["pids"]
    foreign = {
        pid: cmd
        for pid, cmd in pids.items()
        if not any(init in cmd for init in INITS) and "sandbox_wrapper" not in cmd and cmd != "?"
    }
    ledger.attack(
        "read.host_proc",
        expected="/proc shows only the sandbox: pid 1 is its init, host pids are absent",
        observed=brief({"pids": pids, "host_pid_visible": out["host_pid_visible"]}),
        ok=pids.get("1", "").startswith(tuple(INITS.values()))
        and not foreign
        and not out["host_pid_visible"]
        and len(pids) <= 8,
    )
    ledger.attack(
        "read.engine_socket",
        expected="no engine socket exists; the only socket is the run's own",
        observed=brief({"engine": out["engine_sockets"], "sockets": out["sockets"]}),
        ok=not out["engine_sockets"] and out["sockets"] == ["/run/agentnode/sandbox.sock"],
    )
    kernel = out["kernel"]
    addresses = kernel["kallsyms_addresses"]
    ledger.attack(
        "read.kernel_memory",
        expected="no kernel memory or symbol addresses readable",
        observed=brief(kernel),
        ok=kernel["kcore_bytes"] in (0, "EACCES", "EPERM", "ENOENT")
        and not kernel["dev_mem"]
        and not kernel["dev_kmem"]
        and not kernel["kmsg"]
        and (not isinstance(addresses, list) or set(addresses) <= {"0000000000000000"}),
    )
