"""Where the benchmark's code comes from: this checkout's `bench`, and the `host` it measures (this checkout,
or under `--compare` one revision's tree), with the probe for a revision from before the package move."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""This checkout: where `bench` itself always comes from."""

CODE_ROOT = Path(os.environ.get("AGENTNODE_BENCH_CODE_ROOT") or REPO)
"""Where the child processes the benchmark starts (`python -m host serve`, a concurrency level) import
`host` and `sandbox_wrapper` from: this checkout, or under `--compare` one revision's tree
(bench/_compare)."""

IMAGE_ROOT = Path(os.environ.get("AGENTNODE_BENCH_IMAGE_ROOT") or REPO)
"""The tree whose docker/ and sandbox_wrapper/ the pinned image is built from (`build_image(repo_root=)`)."""


def flat_layout() -> bool:
    """Is the revision measured from before host/ became sub-packages (host/_cli.py, host/_runner.py, ...)?
    A --compare against such a revision names its modules by their old, flat names."""
    return (CODE_ROOT / "host" / "_cli.py").is_file()


__all__ = ["CODE_ROOT", "IMAGE_ROOT", "REPO", "flat_layout"]
