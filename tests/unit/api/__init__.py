"""Unit tests for api (no engine, no daemon)."""
