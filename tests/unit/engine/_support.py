"""Recorded answers (trimmed to the fields read) of the two engines on one Debian 12 machine, shared by the
engine facts tests and the runtime check."""

from __future__ import annotations

DOCKERD_INFO = {
    "Architecture": "x86_64", "OSType": "linux", "CgroupVersion": "1", "CgroupDriver": "cgroupfs",
    "SecurityOptions": ["name=seccomp,profile=default"], "MemoryLimit": True, "SwapLimit": True,
    "PidsLimit": True, "ServerVersion": "20.10.24+dfsg1", "DefaultRuntime": "runc",
    "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"},
                 "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]}},
}  # fmt: skip
DOCKERD_PING = {"Api-Version": "1.41", "Docker-Experimental": "false", "Ostype": "linux",
                "Server": "Docker/20.10.24+dfsg1 (linux)"}  # fmt: skip
PODMAN_PING = {"Api-Version": "1.41", "Docker-Experimental": "true", "Libpod-Api-Version": "4.3.1",
               "Libpod-Buildah-Version": "1.28.2", "Server": "Libpod/4.3.1 (linux)"}  # fmt: skip
PODMAN_INFO = {
    "Architecture": "amd64", "OSType": "linux", "CgroupVersion": "1", "CgroupDriver": "cgroupfs",
    "SecurityOptions": ["name=seccomp,profile=default"], "MemoryLimit": True, "SwapLimit": True,
    "PidsLimit": True, "ServerVersion": "4.3.1", "DefaultRuntime": "crun",
    "Runtimes": {"crun": {"path": "/usr/bin/crun"}, "kata": {"path": "/usr/bin/kata-runtime"},
                 "runc": {"path": "/usr/bin/runc"}, "runsc": {"path": "/usr/bin/runsc"}},
}  # fmt: skip
PODMAN_LIBPOD = {"host": {
    "security": {"rootless": False, "seccompProfilePath": "/usr/share/containers/seccomp.json"},
    "cgroupVersion": "v1", "cgroupControllers": ["cpuset", "cpu", "cpuacct", "blkio", "memory", "devices",
                                                 "freezer", "pids"],
}}  # fmt: skip
# A rootless service on the same cgroup v1 host: its compatible /info says exactly what the rootful one says
# (limits, no rootless option), though it can enforce no limit at all; its own /libpod/info tells.
ROOTLESS_V1_LIBPOD = {
    "host": {"security": {"rootless": True}, "cgroupVersion": "v1", "cgroupControllers": []}
}
PODMAN_VERSION = {
    "Components": [{"Name": "Podman Engine"}, {"Name": "Conmon"}, {"Name": "OCI Runtime (crun)"}]
}
