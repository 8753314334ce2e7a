"""Unit tests for packs (no engine, no daemon)."""
