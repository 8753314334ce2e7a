"""Compatibility packages for pack code, importable by their own names (not as `sandbox_wrapper._compat.*`).

This directory is appended to sys.path, after the pack's import root and its requirements, by the agent
wrapper, the tool sandbox and the host's tool worker (`sandbox_wrapper._tool_exec.add_compat_path`). Only
the standard library is used here. This file exists so packaging and the type checker include the directory.
"""
