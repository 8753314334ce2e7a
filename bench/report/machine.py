"""What the numbers were measured on (the one part of the reports that looks at the machine)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench._roots import REPO


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cmd(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO, check=False)
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_facts(client: Any) -> dict[str, Any]:
    """What the numbers were measured on; absolute times mean little without it."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                if ln.startswith("model name")), platform.processor())
    mem_kb = next((int(ln.split()[1]) for ln in _read("/proc/meminfo").splitlines()
                   if ln.startswith("MemTotal:")), 0)
    info = client.info()
    rev = _cmd("git", "rev-parse", "--short=12", "HEAD")
    if rev and _cmd("git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"):
        rev += "+dirty"
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_revision": rev or "unknown",
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker_server": str(client.version().get("Version", "")),
        "docker_runtimes": sorted((info.get("Runtimes") or {}).keys()),
        "runsc": (_cmd("runsc", "--version").splitlines() or [""])[0],
        "load_at_start": [round(x, 2) for x in os.getloadavg()],
    }


__all__ = ["machine_facts"]
