"""The files section's report: a snapshot against tar, a change set against hashing, a warm run with files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.report.format import TargetRows, mid, mp, show, table

_FILES = (
    "The host's own work on a run's files (host/files/). Snapshot: a workspace tree (its file count and MiB "
    "in the table) copied into a new directory on the same disk by the host's snapshot walk (lstat first, "
    "O_NOFOLLOW by descriptor, SHA-256 of every byte) against `tar -C SRC -cf - . | tar -C DST -xf -`, in "
    "interleaved rounds with the page cache warm, MiB/s. Change set: the run's copy with 100 files "
    "rewritten, `changes_of` against reading and hashing just those 100 files, ms. Warm run: a warm member "
    "of an agent declaring workspace_read, handed a 1 MiB input that it returns as a 1 MiB artifact "
    "(written to a new directory and compared), against the same agent's warm run with no files, "
    "alternating; server-side ms from request to result, median / p95."
)


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The files section's targets, per runtime (bench.report.format.TargetRows)."""
    row = TargetRows()
    for rt, f in results.get("files", {}).items():
        row("files: workspace snapshot / tar c | tar x (throughput)", rt, f.get("snapshot_over_tar"),
            goal=">= 0.7x", ok=lambda v: v >= 0.7, unit="x",
            floor=f"tar {mid(f, 'tar_mib_s')} MiB/s, snapshot {mid(f, 'snapshot_mib_s')} MiB/s")
        row("files: change set of 100 modified files / hashing them", rt, f.get("changes_over_hash"),
            goal="<= 1.2x", ok=lambda v: v <= 1.2, unit="x",
            floor=f"hashing {mid(f, 'hash_ms')} ms, change set {mid(f, 'changes_ms')} ms")
        row("files: warm run with a 1 MiB input and artifact / without files", rt, f.get("files_over_plain"),
            goal="<= 2x", ok=lambda v: v <= 2.0, unit="x",
            floor=f"without files {mid(f, 'plain_ms')} ms, with {mid(f, 'files_ms')} ms")
    return row.rows


def _tree(f: Mapping[str, Any]) -> str:
    tree = f.get("tree") or {}
    return f"{show(tree.get('files'))} files, {show(tree.get('mib'))} MiB"


def tables(results: Mapping[str, Any]) -> list[str]:
    """The files section's table, from the combined results."""
    return table("Files", _FILES,
                 ("runtime", "tree", "tar MiB/s", "snapshot MiB/s", "ratio", "hash 100 ms", "change set ms",
                  "ratio", "warm ms", "warm + files ms", "ratio"),
                 [(rt, _tree(f), show(f.get("tar_mib_s")), show(f.get("snapshot_mib_s")),
                   show(f.get("snapshot_over_tar"), "x"),
                   mp(f.get("hash_ms")), mp(f.get("changes_ms")), show(f.get("changes_over_hash"), "x"),
                   mp(f.get("plain_ms")), mp(f.get("files_ms")), show(f.get("files_over_plain"), "x"))
                  for rt, f in results.get("files", {}).items()])


__all__ = ["tables", "targets"]
