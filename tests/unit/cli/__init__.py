"""Unit tests for cli (no engine, no daemon)."""
