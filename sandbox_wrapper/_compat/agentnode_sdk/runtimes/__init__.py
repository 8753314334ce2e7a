"""The SDK's runtimes package; only `agent_runner` (AgentContext and its types) is provided here."""
