"""Unit tests for llm (no engine, no daemon)."""
