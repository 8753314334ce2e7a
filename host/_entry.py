"""The `agentnode-sandbox` console script (and `python -m host`): a cold run's head start, then the CLI.

Only `os`, `sys` and the head start's own light modules are imported before a known `run` command's
container is asked for (host/runtime/headstart.py); the CLI's imports follow while the engine starts it.
"""

from __future__ import annotations

import os
import sys

from host.runtime.headstart import begin


def entry() -> None:
    early = begin(sys.argv[1:], os.environ)
    try:
        from sandbox_wrapper.protocol import defer  # noqa: PLC0415 (as below)

        defer()  # what grpc and protobuf import and no command uses (sandbox_wrapper/_defer.py)
        from host.cli.main import entry as run_cli  # noqa: PLC0415 (after the head start: the point of it)
    except BaseException:
        if early is not None:
            early.discard()
        raise
    run_cli(headstart=early)


__all__ = ["entry"]
