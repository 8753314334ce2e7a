"""Privilege attacks: setuid binaries, uid 0, capabilities, namespaces, mounts, ptrace, chroot, devices."""

from __future__ import annotations

import pytest

from tests.hostile.conftest import Lab, Ledger, brief

pytestmark = [pytest.mark.docker, pytest.mark.podman]

DENIED = ("EPERM", "EACCES")
"""The kernel (or gVisor) refused: any other outcome, an unknown errno included, is not evidence of that."""

AGENT = r'''
import ctypes, errno, os, platform, stat, subprocess, time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def c(name, *args):
    """Call a libc function; the errno name when it fails, "ok" when the kernel said yes."""
    ctypes.set_errno(0)
    rc = getattr(libc, name)(*args)
    return "ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), str(rc))

def py(fn, *args):
    try:
        fn(*args)
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)

def status(key):
    for line in open("/proc/self/status").read().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None

class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

class CapData(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

def capset_all():
    header = CapHeader(0x20080522, 0)
    full = 0xFFFFFFFF
    data = (CapData * 2)(CapData(full, full, full), CapData(full, full, full))
    return c("capset", ctypes.byref(header), ctypes.byref(data))

def ptrace_init():
    attached = c("ptrace", 16, 1, None, None)  # PTRACE_ATTACH
    tracer = None
    if attached == "ok":
        time.sleep(0.2)
        for line in open("/proc/1/status").read().splitlines():
            if line.startswith("TracerPid:"):
                tracer = int(line.split()[1])
        c("ptrace", 17, 1, None, None)  # PTRACE_DETACH
    pid1 = {k: v.split()[0] for k, v in (l.split(":", 1) for l in open("/proc/1/status").read().splitlines())
            if k in ("Uid", "CapEff", "CapPrm")}
    return {"attach": attached, "tracer_of_pid1": tracer, "me": os.getpid(), "pid1": pid1}

def mknods():
    out = {}
    for name, kind, dev in (("block_sda", stat.S_IFBLK, (8, 0)), ("char_mem", stat.S_IFCHR, (1, 1)),
                            ("char_null", stat.S_IFCHR, (1, 3)), ("char_tun", stat.S_IFCHR, (10, 200))):
        path = "/tmp/" + name
        made = py(os.mknod, path, 0o666 | kind, os.makedev(*dev))
        if made == "ok":
            try:
                os.close(os.open(path, os.O_RDWR))
                made = "created, opens"
            except OSError as exc:
                made = "created, open " + errno.errorcode.get(exc.errno or 0, "?")
        out[name] = made
    return out

MOUNT_IN_NS = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.unshare(0x00020000); "
    "print('mounted' if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0 else 'refused')"
)

def userns():
    """CLONE_NEWUSER needs a single-threaded caller, so try it in a forked child, then via unshare(1)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, c("unshare", 0x10000000).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    out = {"unshare_newuser": os.read(read_end, 64).decode()}
    tool = subprocess.run(["unshare", "-Ur", "id", "-u"], capture_output=True, text=True)
    out["unshare_tool_uid"] = tool.stdout.strip() or "exit %d" % tool.returncode
    inner = subprocess.run(["unshare", "-Ur", "python3", "-c", MOUNT_IN_NS], capture_output=True, text=True)
    out["mount_as_userns_root"] = inner.stdout.strip() or "exit %d" % inner.returncode
    # the control: the same script without unshare runs to its end and reports (here: refused)
    plain = subprocess.run(["python3", "-c", MOUNT_IN_NS], capture_output=True, text=True)
    out["mount_control"] = plain.stdout.strip() or "exit %d" % plain.returncode
    return out

FINIT_MODULE = {"x86_64": 313, "aarch64": 273}

def run(context, **kwargs):
    out = {}
    query = ["find", "/", "-xdev", "(", "-perm", "-4000", "-o", "-perm", "-2000", ")", "-type", "f"]
    found = subprocess.run(query, capture_output=True, text=True)
    out["setuid_files"] = found.stdout.split()
    out["find_exit"] = found.returncode
    # the control: the same query finds a setuid file where one exists (set on a file of our own in /tmp)
    with open("/tmp/suid-control", "w") as fh:
        fh.write("#")
    os.chmod("/tmp/suid-control", 0o4755)
    control = subprocess.run(["find", "/tmp"] + query[3:], capture_output=True, text=True)
    out["setuid_control"] = control.stdout.split()
    out["setuid_root"] = {"setuid": py(os.setuid, 0), "setgid": py(os.setgid, 0),
                          "setresuid": py(os.setresuid, 0, 0, 0), "setgroups": py(os.setgroups, [0]),
                          "uid_after": os.getuid(), "euid_after": os.geteuid()}
    out["capset"] = {"capset": capset_all(), "cap_eff_after": status("CapEff"),
                     "cap_prm_after": status("CapPrm")}
    out["userns"] = userns()
    out["mount"] = {"tmpfs": c("mount", b"none", b"/tmp", b"tmpfs", 0, None),
                    "bind_pack": c("mount", b"/tmp", b"/pack", None, 4096, None),
                    "proc": c("mount", b"proc", b"/tmp", b"proc", 0, None)}
    if c("unshare", 0x00020000) == "ok":  # a new mount namespace alone must not grant mounting
        out["mount"]["tmpfs_after_unshare_newns"] = c("mount", b"none", b"/tmp", b"tmpfs", 0, None)
    out["ptrace"] = ptrace_init()
    out["chroot"] = py(os.chroot, "/tmp")
    out["mknod"] = mknods()
    number = FINIT_MODULE.get(platform.machine())
    out["kernel_module"] = "unknown arch" if number is None else (
        "ok" if libc.syscall(number, 0, b"", 0) == 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
    return out
'''


def test_privileges_cannot_be_raised(lab: Lab, ledger: Ledger) -> None:
    lab.agent("priv-attacker", AGENT)
    result = lab.run("priv-attacker")
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result

    ledger.attack(
        "priv.setuid_binaries",
        expected="no setuid/setgid file exists (find / -perm -4000/-2000 completes; the same query finds a "
        "setuid file in /tmp)",
        observed=brief(
            {"found": out["setuid_files"], "find_exit": out["find_exit"], "control": out["setuid_control"]}
        ),
        ok=out["setuid_files"] == []
        and out["find_exit"] in (0, 1)  # 1: some directory was unreadable to uid 65532
        and out["setuid_control"] == ["/tmp/suid-control"],
    )
    su = out["setuid_root"]
    ledger.attack(
        "priv.setuid_root",
        expected="setuid(0)/setgid(0)/setresuid/setgroups fail; uid stays 65532",
        observed=brief(su),
        ok=all(su[k] in DENIED for k in ("setuid", "setgid", "setresuid", "setgroups"))
        and su["uid_after"] == su["euid_after"] == 65532,
    )
    cap = out["capset"]
    ledger.attack(
        "priv.capset",
        expected="capset(all caps) fails; CapEff and CapPrm stay 0",
        observed=brief(cap),
        ok=cap["capset"] in DENIED
        and int(cap["cap_eff_after"], 16) == 0
        and int(cap["cap_prm_after"], 16) == 0,
    )
    ns = out["userns"]
    gvisor = lab.runtime == "runsc"
    ledger.attack(
        "priv.user_namespace",
        expected="no namespace root that can mount; under runc unshare(CLONE_NEWUSER) and `unshare -Ur` fail "
        "(under gVisor a user namespace is the sandbox kernel's own, so only the mount is checked); the "
        "mount script, run without unshare, completes and reports `refused`",
        observed=brief(ns),
        ok=ns["mount_as_userns_root"] != "mounted"
        and ns["mount_control"] == "refused"
        and (gvisor or (ns["unshare_newuser"] != "ok" and ns["unshare_tool_uid"] != "0")),
    )
    ledger.attack(
        "priv.mount",
        expected="mount(tmpfs/bind/proc) fails (EPERM), also after unshare(CLONE_NEWNS)",
        observed=brief(out["mount"]),
        ok=all(v in DENIED for v in out["mount"].values()),
    )
    pt = out["ptrace"]
    ledger.attack(
        "priv.ptrace_pid1",
        expected="ptrace gains nothing: attaching to pid 1 fails, or pid 1 is the sandbox's own init with "
        "the same uid 65532 and no capabilities (Docker's seccomp profile permits same-uid ptrace)",
        observed=brief(pt),
        ok=(pt["attach"] != "ok" and pt["tracer_of_pid1"] in (None, 0))
        or (pt["pid1"].get("Uid") == "65532" and int(pt["pid1"].get("CapEff", "1"), 16) == 0
            and int(pt["pid1"].get("CapPrm", "1"), 16) == 0),
    )
    ledger.attack(
        "priv.chroot",
        expected="chroot fails (EPERM)",
        observed=brief(out["chroot"]),
        ok=out["chroot"] in DENIED,
    )
    mk = out["mknod"]
    ledger.attack(
        "priv.mknod",
        expected="no device node reaches a host device: mknod fails under runc (no CAP_MKNOD); under gVisor "
        "the nodes belong to the sandbox kernel and disk/memory devices do not open",
        observed=brief(mk),
        ok=all(v != "ok" and not v.startswith("created") for v in mk.values())
        or (gvisor and all(not mk[k].startswith("created, opens") for k in ("block_sda", "char_mem"))),
    )
    ledger.attack(
        "priv.kernel_module",
        expected="finit_module fails (EPERM, or ENOSYS where the kernel has no such call)",
        observed=brief(out["kernel_module"]),
        ok=out["kernel_module"] in (*DENIED, "ENOSYS"),
    )
