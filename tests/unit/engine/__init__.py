"""Unit tests for engine (no engine, no daemon)."""
