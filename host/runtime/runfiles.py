"""A run's files as the runner sees them: the caller's request judged against the pack and the host before
anything is built, the area made before the sandbox, read back after it (host/files/run.py does the work)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from host.core.errors import AuditReason, FilesError, SandboxError
from host.engine.contract import SANDBOX_GID, SANDBOX_UID, FilesMounts
from host.files.area import area_of
from host.files.run import FilesRequest, RunFiles
from host.policy.admission import Admission
from host.policy.filesystem import FilesystemGrant, FilesystemRefused, filesystem_grant
from host.runtime.backends.container import DockerBackend
from host.runtime.result import RunResult, from_error
from host.runtime.runaudit import RunFacts
from host.runtime.rundir import run_dir_of
from host.runtime.workload import Workload
from host.spec.config import HostConfig

SEAL_RETRY_SECONDS = 0.005
"""Between two attempts to seal a run's area (while its container is still going)."""
FILES_EXIT_SECONDS = 2.0
"""How long a run with files waits for its container to end by itself (its wrapper exits once it reported)
before it is removed: the run's files are read back only once no process of it is left to write them."""


def files_for(
    a: Admission, files: FilesRequest | None, config: HostConfig, *, local: bool
) -> tuple[FilesRequest, FilesystemGrant] | None:
    """The caller's files request checked against what the run can take, with the pack's grant; None when
    it hands nothing. A pack whose declared filesystem level the operator's config does not grant is
    refused, files or not (FILESYSTEM_REFUSED, naming the key). `local`: the host's sandboxes run on its
    own engine (not a cluster's), which is where a files area can be mounted."""
    given = files is not None and not files.empty
    if a.manifest is None or not a.sandboxed:
        if given:
            raise FilesError("files cross into sandboxed runs only, and this run is not one",
                             reason=AuditReason.FILESYSTEM_REFUSED,
                             hint="run a community (sandboxed) agent, or hand the data over as --arg "
                                  "JSON instead")  # fmt: skip
        return None
    try:
        grant = filesystem_grant(a.manifest.permissions.get("filesystem", "none"),
                                 config.agent_sandbox.filesystem)  # fmt: skip
    except FilesystemRefused as exc:
        raise FilesError(exc.message, reason=AuditReason.FILESYSTEM_REFUSED, hint=exc.hint) from None
    if files is None or files.empty:
        return None
    if not local:
        raise FilesError("this host's sandbox backend takes no files yet (see docs/kubernetes.md)",
                         reason=AuditReason.FILESYSTEM_REFUSED,
                         hint="run it on a host with a local engine")  # fmt: skip
    files.check(config.agent_sandbox.filesystem.limits)
    files.fit(grant)
    return files, grant


def member_fits(backend: object, docker: DockerBackend, a: Admission) -> bool:
    """May a run handed files take a warm member of `a`'s pool? Only on this host's engine, and only where
    the pack's members carry a files area to fill (host/runtime/backends/container.py `member_workspace`)."""
    return backend is docker and a.entry is not None and docker.member_workspace(a.slug) is not None


def prepare_files(
    run: RunFacts,
    wanted: tuple[FilesRequest, FilesystemGrant],
    config: HostConfig,
    env: Mapping[str, str],
    *,
    owner: str,
    claimed: Workload | None = None,
) -> FilesMounts:
    """The run's files area made and filled before its sandbox exists (or, for a `claimed` warm member,
    the member's own area filled and taken over from it); what that sandbox mounts."""
    files, grant = wanted
    area = area_of(run_dir_of(run.run_id, env).path)
    run.files = RunFiles(files, grant, config.agent_sandbox.filesystem.limits, area,
                         uid=SANDBOX_UID, gid=SANDBOX_GID, owner=owner)  # fmt: skip
    if claimed is not None:
        claimed.files_area = None  # the run's now: removed when the run has read it back
    run.files.prepare(made=claimed is not None)
    run.mark("files_in")
    return run.files.mounts()


def read_back(
    run: RunFacts, result: RunResult, work: Workload, teardown: Callable[[Workload], None]
) -> tuple[RunResult, Workload | None]:
    """The run's files read back once no sandbox of it can write them: its area sealed read-only under every
    mount at once, or else its tool sandboxes closed and its container ended by itself (its wrapper exits
    once it reported) or, past FILES_EXIT_SECONDS, torn down here (then None is the workload left to tear
    down)."""
    assert run.files is not None
    if run.gate is not None:
        run.gate.close()
    if not result.success:  # nothing is read back from a failed run: no reason to wait for its sandbox
        return result, work
    deadline = time.monotonic() + FILES_EXIT_SECONDS
    # gVisor closes the files its sandbox held a moment after the agent did: the seal is tried again
    # while the container is still going, and whichever comes first (sealed, or gone) lets the host read.
    while not run.files.seal() and not work.wait_gone(SEAL_RETRY_SECONDS):
        if time.monotonic() >= deadline:
            teardown(work)
            return collect_files(run, result), None
    return collect_files(run, result), work


def release_files(run: RunFacts) -> None:
    """The run's area removed: after its result when work follows the result (a background teardown),
    else now."""
    files = run.files
    assert files is not None
    prior = run.after_result
    if prior is None:
        files.close()
        return

    def after() -> None:
        try:
            prior()
        finally:
            files.close()

    run.after_result = after


def collect_files(run: RunFacts, result: RunResult) -> RunResult:
    """A succeeded run's files read back (applied, exported, written out as asked); a bound, or a file that
    is not what was read, fails it with its own reason (its logs kept)."""
    assert run.files is not None
    try:
        result.files = run.files.collect().to_json()
    except SandboxError as exc:
        failed = from_error(exc)
        failed.logs = result.logs
        return failed
    finally:
        run.mark("files_out")
    return result


__all__ = ["FILES_EXIT_SECONDS", "collect_files", "files_for", "member_fits", "prepare_files", "read_back",
           "release_files"]
