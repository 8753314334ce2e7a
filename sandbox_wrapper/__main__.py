"""`python -m sandbox_wrapper`: the agent process the host starts in the container (or on the host path).

`python -m sandbox_wrapper tool-server` is a tool sandbox's process instead (sandbox_wrapper/_tool_server.py).
Its boot imports come from the image's bundle where there is one (sandbox_wrapper/_boot.py), which is put
away before any of the pack's code is imported.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from sandbox_wrapper import _boot

    bundle = _boot.install()
    if sys.argv[1:] == ["tool-server"]:
        from sandbox_wrapper._tool_server import main as serve_tools

        _boot.uninstall(bundle)
        raise SystemExit(serve_tools())
    from sandbox_wrapper._runner import leave, main

    leave(main(before_pack=lambda: _boot.uninstall(bundle)))
