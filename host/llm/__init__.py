"""LLM calls made on the host under a run's grant and budgets; llm/broker is the only code with API keys."""
