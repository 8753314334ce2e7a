"""The Kubernetes backend: AgentRun objects, the controller, the node agent and the run client."""
