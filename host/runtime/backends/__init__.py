"""Where a run's agent runs: a hardened container, a host process (trusted packs), or the host (pipelines)."""
