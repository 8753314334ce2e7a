"""A run from admission to its audit record: the runner, its backends, the session, pools, the cold path."""
