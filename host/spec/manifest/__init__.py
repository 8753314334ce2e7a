"""agentnode.yaml parsing for agent packs and toolpacks: its data, its reading, and its parser by part."""
