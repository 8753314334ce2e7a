"""`python -m sandbox_wrapper`: the agent process the host starts in the container (or on the host path)."""

from __future__ import annotations

from sandbox_wrapper._runner import main

if __name__ == "__main__":
    raise SystemExit(main())
