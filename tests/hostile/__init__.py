"""Hostile-agent and fault suite: attacks from inside real sandboxes, faults injected on the host."""
