"""`python -m host` is the same command as `agentnode-sandbox`."""

from __future__ import annotations

import sys

from host._cli import main

if __name__ == "__main__":
    sys.exit(main())
