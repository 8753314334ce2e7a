"""Unit tests for core (no engine, no daemon)."""
