"""The host-process backend: trusted and curated agents run the wrapper as a local process (not isolated)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from host.core.vocab import HOST_TRUST, Trust
from host.engine.wrapper_env import WRAPPER_ARGS, wrapper_env
from host.policy.admission import Admission, host_copy_error
from host.runtime.rundir import RunDir
from host.runtime.session import RunSession
from host.runtime.workload import UnpooledBackend, Workload

_WRAPPER_CODE = str(Path(__file__).resolve().parents[3])
"""Where the host's own copy of sandbox_wrapper is importable from."""


def host_command() -> list[str]:
    """The wrapper's command on the host: this interpreter, the container's arguments."""
    return [sys.executable, *WRAPPER_ARGS]


def host_wrapper_env(rundir: RunDir, spec: HostSpec, env: Mapping[str, str]) -> dict[str, str]:
    """The wrapper's whole environment on the host: the shared builder, with the host's locations."""
    return wrapper_env(
        home=str(rundir.path),
        path=env.get("PATH", "/usr/bin:/bin"),
        pythonpath=_WRAPPER_CODE,
        socket=str(rundir.socket_path),
        import_root=spec.import_root,
        preload=spec.preload,
    )


@dataclass(frozen=True)
class HostSpec:
    """What a host-process run needs: the pack's installed host copy."""

    slug: str
    import_root: str
    preload: str = ""
    """The agent's entrypoint module, imported by the wrapper before its task."""


@dataclass(kw_only=True)
class HostProcess(Workload):
    """The wrapper as a child process in its own session, killed as a group when the run ends."""

    proc: subprocess.Popen[bytes] | None = None
    reads_output: ClassVar[bool] = True

    def _kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.settle_logs(5)
        if proc.stdout is not None:
            proc.stdout.close()


def _read_to_end(fd: int) -> Iterator[tuple[int, bytes]]:
    """The chunks of a pipe until its end, as stdout frames (stderr goes to the same pipe); the descriptor
    is closed when the reading ends."""
    try:
        while chunk := os.read(fd, 65536):
            yield 1, chunk
    finally:
        os.close(fd)


class HostBackend(UnpooledBackend):
    """Starts host-process workloads (one per run, nothing warm); they share the runner's sockets, gates
    and audit with sandboxes."""

    def prepare(self, admission: Admission) -> HostSpec:
        """The agent's installed host copy; a host-routed agent installed without one cannot run here."""
        entry = admission.entry
        if entry is None or Trust.parse(entry.trust_level) not in HOST_TRUST or not entry.host_path:
            raise host_copy_error(admission.slug)
        preload = admission.manifest.entrypoint_module if admission.manifest is not None else ""
        return HostSpec(slug=admission.slug, import_root=str(Path(entry.host_path) / entry.import_subdir),
                        preload=preload)  # fmt: skip

    def launch(
        self,
        spec: HostSpec,
        *,
        run_id: str,
        session: RunSession | None = None,
        run_info: Mapping[str, object] | None = None,
    ) -> HostProcess:
        session = session or RunSession()
        rundir, server = HostProcess.open_socket(run_id, self.owner, self.env, session, run_info)
        work = HostProcess(
            run_id=run_id, name=f"agentnode-host-{run_id[:20]}", session=session, rundir=rundir, server=server
        )
        try:
            server.start()
            work.mark("socket_ready")
            work.proc = proc = subprocess.Popen(
                host_command(),
                env=host_wrapper_env(rundir, spec, self.env),
                cwd=rundir.path,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            work.mark("started")
            assert proc.stdout is not None
            fd = os.dup(
                proc.stdout.fileno()
            )  # the drain's own: closing proc.stdout cannot hand its number on
            work.start_drain(lambda: _read_to_end(fd))
            threading.Thread(target=lambda: work.exited_with(proc.wait()), daemon=True).start()
        except BaseException:
            work.destroy()
            raise
        return work

    def teardown(self, workload: Workload) -> None:
        workload.destroy()


__all__ = ["HostBackend", "HostProcess", "HostSpec"]
