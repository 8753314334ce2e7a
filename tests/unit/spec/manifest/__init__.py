"""Unit tests for host/spec/manifest/ (agentnode.yaml, both forms)."""
