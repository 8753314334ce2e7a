"""The wrapper's environment and command, built once for every backend so no backend starts it differently."""

from __future__ import annotations

WRAPPER_ARGS: tuple[str, ...] = ("-s", "-m", "sandbox_wrapper")
"""After the interpreter: no user site directory, run the wrapper package."""
TOOL_SERVER_ARGS: tuple[str, ...] = (*WRAPPER_ARGS, "tool-server")
"""The same package in a tool sandbox's mode (sandbox_wrapper/_tool_server.py): it serves tool calls."""


SOCKET_WAIT_ENV = "AGENTNODE_SOCKET_WAIT_SECONDS"
"""How long the wrapper waits for its socket to appear (sandbox_wrapper/_runner.py); absent: it must be
there when the wrapper starts."""


def wrapper_env(
    *, home: str, path: str, pythonpath: str, socket: str, import_root: str, preload: str = "",
    socket_wait: float = 0.0,
) -> dict[str, str]:
    """The whole environment of a wrapper process: nothing of the host's leaks in, and only where things
    are differs between backends (home, PATH, the wrapper's code, the socket, the pack's import root).

    `preload` is the agent's entrypoint module ("" for none): the wrapper imports it while it waits for
    its task, so a warm member has done its imports before a run claims it. `socket_wait` > 0 (seconds) lets
    the wrapper wait for the socket to appear: a workload started before its host serves the socket."""
    waits = {SOCKET_WAIT_ENV: f"{socket_wait:g}"} if socket_wait > 0 else {}
    return {
        "HOME": home,
        "PATH": path,
        "LANG": "C.UTF-8",
        "PYTHONPATH": pythonpath,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "AGENTNODE_SOCKET": socket,
        "AGENTNODE_IMPORT_ROOT": import_root,
        # The host alone bounds a run's time (deadline, idle limit, cancellation), so the wrapper waits
        # for its task as long as the host keeps it: a fixed wrapper-side deadline turns a busy host
        # (many workloads starting on few cores) into a spurious exited_before_result.
        "AGENTNODE_FETCH_TIMEOUT": "0",
        "AGENTNODE_PRELOAD": preload,
        **waits,
    }


__all__ = ["SOCKET_WAIT_ENV", "TOOL_SERVER_ARGS", "WRAPPER_ARGS", "wrapper_env"]
