"""Unit tests for host/egress/ (no engine, no network)."""
