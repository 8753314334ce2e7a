"""The agentnode-sandbox command: its parser, commands and output; nothing below it imports it."""
