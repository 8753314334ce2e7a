"""The files section (issue 38): a workspace snapshot against `tar c | tar x` of the same tree on the same
disk, a change set of 100 modified files against hashing those files, and a warm run handed a 1 MiB input
that leaves a 1 MiB artifact against a warm run of the same agent with no files; each pair interleaved."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._state import BenchState
from bench._stats import med, ratio, summary
from bench.measure.shared import since, succeeded
from host.files.changes import changes_of
from host.files.run import FilesRequest
from host.files.snapshot import snapshot
from host.runtime.pool import PoolSettings
from host.runtime.runner import SandboxHost
from host.spec.files import FileLimits

ROUNDS = 3
"""Interleaved rounds of each pair per repetition."""
MODIFIED = 100
"""Files the change set's run modifies."""
LIMITS = FileLimits(max_files_in=1_000_000, max_bytes_in=1 << 40, max_files_out=1_000_000,
                    max_bytes_out=1 << 40, max_file_bytes=1 << 40)  # fmt: skip
MIB = 1 << 20

AGENT = """
import os

def run(context, **kwargs):
    if context.inputs_dir and os.path.exists(os.path.join(context.inputs_dir, "in.bin")):
        data = open(os.path.join(context.inputs_dir, "in.bin"), "rb").read()
        context.write_artifact("out.bin", data)
    return {"ok": True}
"""


def _tree(state: BenchState, files: int, mib: int) -> Path:
    """The workspace: `files` files of `mib` MiB in all, in 50 directories (made once per state)."""
    tree = state.root / f"files-tree-{files}-{mib}"
    if tree.is_dir():
        return tree
    size = max(1, (mib * MIB) // files)
    block = os.urandom(size)
    for i in range(files):
        sub = tree / f"d{i % 50:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:05d}.bin").write_bytes(block[i % 997:] + block[: i % 997])
    return tree


def _tar(src: Path, dst: Path) -> float:
    dst.mkdir()
    t = time.perf_counter()
    subprocess.run(f"tar -C {src} -cf - . | tar -C {dst} -xf -", shell=True, check=True)
    return time.perf_counter() - t


def _snap(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    snapshot(src, dst, LIMITS)
    return time.perf_counter() - t


def _snapshots(tree: Path, scratch: Path, total: int) -> dict[str, Any]:
    """MiB/s of each way, in interleaved rounds (page cache warm for both: the tree is read first)."""
    _snap(tree, scratch / "warmup")
    shutil.rmtree(scratch / "warmup")
    tar_rate: list[float] = []
    snap_rate: list[float] = []
    for i in range(ROUNDS):
        for name, way, rates in (("tar", _tar, tar_rate), ("snap", _snap, snap_rate))[:: 1 if i % 2 else -1]:
            dst = scratch / f"{name}-{i}"
            rates.append(total / MIB / way(tree, dst))
            shutil.rmtree(dst)
    tar, snap = summary(tar_rate), summary(snap_rate)
    return {"tar_mib_s": tar, "snapshot_mib_s": snap, "snapshot_over_tar": ratio(med(snap), med(tar))}


def _change_set(tree: Path, scratch: Path) -> dict[str, Any]:
    """The change set of a copy with MODIFIED files rewritten, against reading and hashing those files."""
    copy = scratch / "copy"
    base = snapshot(tree, copy, LIMITS)
    changed = sorted(base.entries)[:: max(1, len(base.entries) // MODIFIED)]
    changed = [p for p in changed if base.entries[p][0] == "file"][:MODIFIED]
    for path in changed:
        target = copy / path
        data = target.read_bytes()
        target.write_bytes(data[::-1])
    changes_ms: list[float] = []
    hash_ms: list[float] = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        found = changes_of(base, copy, LIMITS, link_root="/workspace")
        changes_ms.append(since(t))
        assert len(found.changes) == len(changed), (len(found.changes), len(changed))
        t = time.perf_counter()
        for path in changed:
            with (copy / path).open("rb") as f:
                hashlib.file_digest(f, "sha256")
        hash_ms.append(since(t))
    shutil.rmtree(copy)
    changes, hashed = summary(changes_ms), summary(hash_ms)
    return {"modified": len(changed), "changes_ms": changes, "hash_ms": hashed,
            "changes_over_hash": ratio(med(changes), med(hashed))}  # fmt: skip


def _wait_member(host: SandboxHost, slug: str, timeout: float = 120.0) -> None:
    """Until the pack's pool has a member whose wrapper waits for its task."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = getattr(host.pools, "ready_counts", None)
        if counts is not None and sum(n for p, n in counts().items() if p.startswith(f"{slug}/")) >= 1:
            return
        time.sleep(0.02)
    raise RuntimeError("no warm member became ready")


def _warm_runs(state: BenchState, runtime: str, n: int, scratch: Path) -> dict[str, Any]:
    """Server-side ms of warm runs (request to result) with and without a 1 MiB input and artifact."""
    slug = f"bench-files-{state.tag}"
    if slug not in state.installed:
        state.install_agent(slug, AGENT, extra="permissions:\n  filesystem:\n    level: workspace_read\n")
    payload = os.urandom(MIB)
    host = SandboxHost(env=state.env, pool=PoolSettings(size=1, idle_ttl_seconds=3600), async_teardown=True)
    plain_ms: list[float] = []
    files_ms: list[float] = []
    try:
        host.prewarm(slug, runtime)
        for i in range(n * 2):
            _wait_member(host, slug)
            time.sleep(0.2)  # the filler's own work settles
            with_files = i % 2 == 1
            out = scratch / f"out-{i}"
            files = FilesRequest(inputs=(("in.bin", payload),), output_dir=out) if with_files else None
            result = succeeded(host.run(slug, runtime=runtime, files=files))
            if not result.warm:
                continue
            (files_ms if with_files else plain_ms).append(result.stages["done"])
            if with_files:
                assert (out / "out.bin").read_bytes() == payload
                shutil.rmtree(out)
    finally:
        host.close()
    plain, handed = summary(plain_ms), summary(files_ms)
    return {"plain_ms": plain, "files_ms": handed, "files_over_plain": ratio(med(handed), med(plain))}


def files(state: BenchState, runtime: str, *, count: int, mib: int, warm: int) -> dict[str, Any]:
    """One repetition of the files section on `runtime` (the snapshot and change set are the host's own
    work and measured again on each runtime, as a cross-check)."""
    tree = _tree(state, count, mib)
    total = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    scratch = Path(tempfile.mkdtemp(prefix="files-", dir=state.root))
    try:
        return {"tree": {"files": count, "mib": round(total / MIB, 1)}, **_snapshots(tree, scratch, total),
                **_change_set(tree, scratch), **_warm_runs(state, runtime, warm, scratch)}  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["files"]
