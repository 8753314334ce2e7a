"""What an operator and a pack author write, read and validated: host config, pack manifests, the lockfile."""
