"""Packs on the host: install (hash, copy into a volume, record), their Python requirements, and scaffolds."""
