"""Unit tests for audit (no engine, no daemon)."""
