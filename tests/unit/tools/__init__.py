"""Unit tests for tools (no engine, no daemon)."""
