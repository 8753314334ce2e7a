"""Files across the boundary: workspace snapshots, change sets, inputs and artifacts, each bounded."""
