"""`python -m sandbox_wrapper`: the agent process the host starts in the container (or on the host path).

`python -m sandbox_wrapper tool-server` is a tool sandbox's process instead (sandbox_wrapper/_tool_server.py).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    if sys.argv[1:] == ["tool-server"]:
        from sandbox_wrapper._tool_server import main as serve_tools

        raise SystemExit(serve_tools())
    from sandbox_wrapper._runner import leave, main

    leave(main())
