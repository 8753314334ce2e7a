"""The tool gate: each tool call an agent asks for is checked, then run out of process or in a sandbox."""
