"""One run's files, end to end: what its caller hands in (a workspace, inputs) made into the run's area before
any agent code sees it, and what comes back once the sandbox is gone (the workspace's change set, applied or
exported only on request, and the artifacts the agent left), each bounded and verified by SHA-256.

Nothing of the caller's is written unless asked (`apply`, `output_dir`, an export path), and then only
through per-file, descriptor-relative, verified writes (host/files/changes.py); what goes into the audit
record is counts, bytes and digests, never a name.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host.core.errors import AuditReason, FilesError
from host.engine.contract import FilesMounts
from host.files.area import FilesArea
from host.files.changes import ApplyReport, ChangeSet, apply_changes, changes_of
from host.files.export import export_patch, export_tar
from host.files.snapshot import SnapshotReport, over_bound, read_through, snapshot, tree_digest
from host.policy.filesystem import FilesystemGrant, FilesystemRefused, filesystem_grant
from host.spec.files import FileLimits, FilesConfig, name_refusal

WORKSPACE_PATH = "/workspace"
INPUTS_PATH = "/inputs"
OUTPUTS_PATH = "/outputs"
MAX_INPUTS = 1000
"""Inputs one run may be handed (each also counts against max_files_in)."""


def _request_error(message: str, hint: str) -> FilesError:
    return FilesError(message, reason=AuditReason.WORKSPACE_INVALID, hint=hint)


@dataclass(frozen=True)
class FilesRequest:
    """What a caller hands a run and wants back; all optional. Paths are the caller's, read (and written,
    only where named) by the host as its own user."""

    workspace: Path | None = None
    """A directory whose snapshot the run gets at /workspace (the pack must declare a workspace level)."""
    apply: bool = False
    """Apply a workspace_write run's change set to `workspace` when it ends (per file, conflicts refused)."""
    export_tar: Path | None = None
    """Write the change set as a tar here instead (a new file)."""
    export_patch: Path | None = None
    """Write the change set's text changes as a unified patch here (a new file)."""
    inputs: tuple[tuple[str, Path | bytes], ...] = ()
    """(name, a file's path or its bytes): read-only at /inputs/<name>."""
    output_dir: Path | None = None
    """Where the artifacts the agent leaves in /outputs are written (created if missing; nothing replaced)."""

    @property
    def empty(self) -> bool:
        return self.workspace is None and not self.inputs and self.output_dir is None

    @property
    def exports(self) -> bool:
        return self.export_tar is not None or self.export_patch is not None

    def check(self, limits: FileLimits | None = None) -> None:
        """Refuse a request that cannot be right whatever the pack (before any work): FilesError. `limits`
        are the host's (its name bounds); a caller without them (the CLI, the admin server) checks the
        request's shape under the defaults, and the host checks it again under its own."""
        limits = limits or FileLimits()
        if (self.apply or self.exports) and self.workspace is None:
            raise _request_error("--apply and --export-* need a workspace", "pass --workspace DIR as well")
        if self.apply and self.exports:
            raise _request_error("a change set is applied or exported, not both",
                                 "drop --apply or the --export-* option")  # fmt: skip
        for out in (self.export_tar, self.export_patch):
            if out is not None and os.path.lexists(out):
                raise _request_error("an export path already exists (nothing is replaced)",
                                     "name a new file for --export-tar/--export-patch")  # fmt: skip
        if len(self.inputs) > MAX_INPUTS:
            raise _request_error(f"more than {MAX_INPUTS} inputs", "pass a workspace directory instead")
        names = [name for name, _ in self.inputs]
        if len(set(names)) != len(names):
            raise _request_error("two inputs have the same name", "give each --input its own NAME")
        for name in names:
            why = name_refusal(name, limits)
            if why is not None or "/" in name:
                raise _request_error(f"an input name is refused ({why or 'name_has_slash'})",
                                     "name each input with a plain file name (--input NAME=PATH)")

    def fit(self, grant: FilesystemGrant) -> None:
        """Refuse a workspace the pack cannot take: none declared, or a change set from a read-only one."""
        if self.workspace is not None and grant.workspace == "none":
            raise FilesError(
                f"the pack declares permissions.filesystem {grant.level}: it gets no workspace",
                reason=AuditReason.FILESYSTEM_REFUSED,
                hint="run it without --workspace (hand single files in with --input NAME=PATH)",
            )
        if (self.apply or self.exports) and grant.workspace != "write":
            raise FilesError(
                "the pack only reads its workspace (workspace_read): no change set to apply or export",
                reason=AuditReason.FILESYSTEM_REFUSED, hint="drop --apply and --export-*",
            )  # fmt: skip


@dataclass
class FilesOutcome:
    """What crossed the boundary in one run."""

    workspace: SnapshotReport | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    changes: ChangeSet | None = None
    applied: ApplyReport | None = None
    exported: str = ""
    artifacts: ChangeSet | None = None
    written: ApplyReport | None = None

    def summary(self) -> dict[str, Any]:
        """The audit record's `files` section: counts, bytes, digests and fixed words; never a name."""
        out: dict[str, Any] = {}
        if self.workspace is not None:
            out["workspace"] = self.workspace.summary()
        if self.inputs:
            out["inputs"] = dict(self.inputs)
        if self.changes is not None:
            out["changes"] = self.changes.summary()
        if self.applied is not None:
            out["applied"] = self.applied.summary()
        if self.exported:
            out["exported"] = self.exported
        if self.artifacts is not None:
            out["artifacts"] = {**self.artifacts.summary(),
                                **(self.written.summary() if self.written else {})}  # fmt: skip
        return out

    def to_json(self) -> dict[str, Any]:
        """The caller's view (a result's `files`): the summary, plus the paths of what changed and came back
        (the caller's and the run's names; a caller escapes them before a terminal, as `run` does)."""
        out = self.summary()
        if self.changes is not None:
            out["changes"] = {**out["changes"], "paths": [c.to_json() for c in self.changes.changes]}
        if self.applied is not None:
            out["applied"] = {**out["applied"], "conflicts_paths": list(self.applied.conflicts)}
        if self.artifacts is not None:
            out["artifacts"] = {**out["artifacts"], "paths": [c.to_json() for c in self.artifacts.changes]}
        return out


class RunFiles:
    """One run's files: `prepare` before its sandbox runs agent code, `collect` once no sandbox of the run
    is left, `close` always."""

    def __init__(
        self, request: FilesRequest, grant: FilesystemGrant, limits: FileLimits, area_path: Path,
        *, uid: int, gid: int, owner: str = "",
    ) -> None:  # fmt: skip
        self.request, self.grant, self.limits = request, grant, limits
        self.area_path, self.uid, self.gid, self.owner = area_path, uid, gid, owner
        self.area: FilesArea | None = None
        self.outcome = FilesOutcome()

    @property
    def workspace(self) -> str:
        """What the run's sandboxes mount at /workspace: "none", "read" or "write"."""
        return self.grant.workspace if self.request.workspace is not None else "none"

    def mounts(self) -> FilesMounts:
        """What the run's agent sandbox mounts: its workspace as granted, its inputs and outputs."""
        return FilesMounts(str(self.area_path), workspace=self.workspace, io=True)

    def tool_mounts(self, level: str, config: FilesConfig) -> FilesMounts | None:
        """What a tool sandbox of the run mounts, by its own pack's declared `level`: the run's workspace
        read-only for workspace_read, the run's writable copy for workspace_write (read-only when the run
        has only a snapshot), nothing for none, for a level the config does not grant, or with no workspace;
        never the agent's inputs or outputs."""
        if self.workspace == "none":
            return None
        try:
            own = filesystem_grant(level, config).workspace
        except FilesystemRefused:
            return None
        if own == "none":
            return None
        mode = "write" if own == "write" and self.workspace == "write" else "read"
        return FilesMounts(str(self.area_path), workspace=mode)

    def prepare(self, *, made: bool = False) -> FilesArea:
        """The area made and filled: the workspace's snapshot (owned by the run's user when it writes its
        copy), the inputs. `made`: a warm member's area, there since its start and still root's, filled here
        and then handed over. FilesError (with nothing left behind) when a bound or a path refuses it."""
        writable = self.workspace == "write"
        if made:
            self.area = FilesArea(self.area_path, os.path.ismount(self.area_path))
        else:
            self.area = FilesArea.make(self.area_path, self.limits, uid=self.uid, gid=self.gid,
                                       writable=writable, owner=self.owner)  # fmt: skip
        if self.request.workspace is not None:
            self.outcome.workspace = snapshot(
                self.request.workspace, self.area.workspace, self.limits,
                owner=(self.uid, self.gid) if writable else None,
            )  # fmt: skip
        if self.request.inputs:
            self.outcome.inputs = self._inputs(self.area.inputs)
        if made:
            self.area.hand_over(self.uid, self.gid, writable=writable)
        return self.area

    def _inputs(self, into: Path) -> dict[str, Any]:
        used = self.outcome.workspace.bytes if self.outcome.workspace else 0
        count = len(self.outcome.workspace.entries) if self.outcome.workspace else 0
        entries: dict[str, tuple[str, int, str, int]] = {}
        total = 0
        for name, source in self.request.inputs:
            count += 1
            if count > self.limits.max_files_in:
                raise over_bound("max_files_in", self.limits.max_files_in)
            size, sha = _write_input(into, name, source, self.limits, used + total)
            total += size
            entries[name] = ("file", size, sha, 0o644)
        return {"files": len(entries), "bytes": total, "digest": tree_digest(entries)}

    def collect(self) -> FilesOutcome:
        """What the run left, read once no sandbox of it can write (sealed, or gone): the change set (applied
        or exported when asked), the artifacts (written to `output_dir` when asked). FilesError on a bound or
        a file that is not what was read: nothing of the caller's is written then, except files applied."""
        area, req = self.area, self.request
        assert area is not None
        base, limits = self.outcome.workspace, self.limits
        if self.workspace == "write" and base is not None:
            self.outcome.changes = changes_of(base, area.workspace, limits, link_root=WORKSPACE_PATH)
        artifacts = changes_of(SnapshotReport(), area.outputs, limits, link_root=OUTPUTS_PATH)
        self.outcome.artifacts = artifacts
        changed = self.outcome.changes or ChangeSet()
        out_bytes = artifacts.bytes + changed.bytes
        out_files = len(artifacts.changes) + len(changed.changes)
        if out_bytes > self.limits.max_bytes_out:
            raise over_bound("max_bytes_out", self.limits.max_bytes_out)
        if out_files > self.limits.max_files_out:
            raise over_bound("max_files_out", self.limits.max_files_out)
        try:
            if self.outcome.changes is not None and req.workspace is not None:
                self._hand_back(self.outcome.changes, area, req.workspace)
            if req.output_dir is not None and artifacts.changes:
                req.output_dir.mkdir(parents=True, exist_ok=True)
                written = apply_changes(artifacts, area.outputs, req.output_dir, durable=False)  # new files
                self.outcome.written = written
                if written.mismatched or written.conflicts:
                    raise _incomplete("artifact", len(written.mismatched) + len(written.conflicts))
        except OSError as exc:  # the caller's side refused a write (a full disk, a permission)
            why = errno.errorcode.get(exc.errno or 0, "an OS error")
            raise FilesError(
                f"the run's files could not be written where the caller asked ({why})",
                reason=AuditReason.FILES_INCOMPLETE,
                hint="check the workspace, the export path and the output directory (space, permissions); "
                "a file written before the error stays written",
            ) from None
        return self.outcome

    def _hand_back(self, changes: ChangeSet, area: FilesArea, workspace: Path) -> None:
        req = self.request
        if req.apply:
            applied = apply_changes(changes, area.workspace, workspace)
            self.outcome.applied = applied
            if applied.mismatched:
                raise _incomplete("changed file", len(applied.mismatched))
        if req.export_tar is not None:
            export_tar(changes, area.workspace, req.export_tar)
            self.outcome.exported = "tar"
        if req.export_patch is not None:
            text = export_patch(changes, workspace, area.workspace)
            fd = os.open(req.export_patch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            self.outcome.exported = "patch"

    def seal(self) -> bool:
        """No sandbox of the run can write its area any more (host/files/area.py `seal`); False when that
        could not be had and the caller must wait for them to end."""
        return self.area is not None and self.area.seal()

    def close(self) -> None:
        """The area gone (its tmpfs detached), made or half-made; never raises."""
        FilesArea(self.area_path, True).remove()


def _incomplete(what: str, count: int) -> FilesError:
    return FilesError(
        f"{count} {what}(s) did not come back as the host read them (truncated, changed or missing)",
        reason=AuditReason.FILES_INCOMPLETE,
        hint="nothing else was written for them; run it again (a run that rewrites its own output as it "
        "ends races the host's read)",
    )


def _write_input(
    into: Path, name: str, source: Path | bytes, limits: FileLimits, used: int
) -> tuple[int, str]:
    """One input written under `into` as `name` (0644); (size, SHA-256). A path is read as a regular file
    within the per-file and total bounds (a sparse or growing file is judged by its stat, then its bytes)."""
    dir_fd = os.open(into, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    def judge(size: int) -> None:  # by its length or its stat, before a byte is copied
        if size > limits.max_file_bytes:
            raise over_bound("max_file_bytes", limits.max_file_bytes)
        if used + size > limits.max_bytes_in:
            raise over_bound("max_bytes_in", limits.max_bytes_in)

    try:
        if isinstance(source, bytes):
            judge(len(source))
            view = memoryview(source)
            while view:
                view = view[os.write(out, view):]
            return len(source), hashlib.sha256(source).hexdigest()
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            raise FilesError("an input is not a file the host can read", reason=AuditReason.WORKSPACE_INVALID,
                             hint="pass a readable regular file (--input NAME=PATH)") from None  # fmt: skip
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FilesError("an input is not a regular file", reason=AuditReason.WORKSPACE_INVALID,
                                 hint="pass a regular file (--input NAME=PATH)")  # fmt: skip
            judge(st.st_size)
            size, sha = read_through(fd, st.st_size, out)
            if size != st.st_size:
                raise FilesError("an input changed while it was read", reason=AuditReason.WORKSPACE_INVALID,
                                 hint="pass a file that is not being written")  # fmt: skip
            return size, sha
        finally:
            os.close(fd)
    finally:
        os.close(out)


__all__ = ["INPUTS_PATH", "MAX_INPUTS", "OUTPUTS_PATH", "WORKSPACE_PATH", "FilesOutcome", "FilesRequest",
           "RunFiles"]  # fmt: skip
