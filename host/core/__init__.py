"""The ground floor: vocabularies, errors, strict JSON and YAML, safe text, paths; no other host code."""
