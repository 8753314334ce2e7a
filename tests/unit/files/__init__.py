"""Unit tests for host/files/ (no engine): snapshots of real trees on the local disk."""
