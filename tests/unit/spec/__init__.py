"""Unit tests for spec (no engine, no daemon)."""
