"""`python -m sandbox_wrapper`: the agent process the host starts in the container (or on the host path).

`python -m sandbox_wrapper tool-server` is a tool sandbox's process instead (sandbox_wrapper/_tool_server.py).
Its boot imports come from the image's bundle where there is one (sandbox_wrapper/_boot.py), which is put
away before any of the pack's code is imported. What gRPC and protobuf import but few runs use is deferred
until first use (sandbox_wrapper/_defer.py).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from sandbox_wrapper import _boot, _defer

    bundle = _boot.install()
    _defer.defer(_defer.WRAPPER_DEFERRED)

    def before_pack() -> None:
        _boot.uninstall(bundle)
        _defer.settle()

    if sys.argv[1:] == ["tool-server"]:
        from sandbox_wrapper._tool_server import main as serve_tools

        before_pack()
        raise SystemExit(serve_tools())
    from sandbox_wrapper._runner import leave, main

    leave(main(before_pack=before_pack))
