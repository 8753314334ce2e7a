"""Unit tests for project (no engine, no daemon)."""
