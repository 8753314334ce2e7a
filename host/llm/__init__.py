"""LLM calls made on the host under a run's grant and budgets; the only package with API keys."""
