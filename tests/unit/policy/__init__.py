"""Unit tests for policy (no engine, no daemon)."""
