"""Unit tests for k8s (no engine, no daemon)."""
