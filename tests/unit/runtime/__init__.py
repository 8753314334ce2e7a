"""Unit tests for runtime (no engine, no daemon)."""
