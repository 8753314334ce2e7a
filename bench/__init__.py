"""Benchmarks that state where agentnode-sandbox stands as ratios to floors measured in the same run."""
