"""The Markdown reports and their verdicts, pure functions of the JSON: one module per section."""
