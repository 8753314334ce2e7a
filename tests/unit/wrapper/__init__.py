"""Unit tests for wrapper (no engine, no daemon)."""
