"""hello-agent: one tool call and one LLM call, with every refusal recorded instead of failing the run."""

from __future__ import annotations

from typing import Any

from sandbox_wrapper import AgentContext, AgentLimitExceeded, LlmAccessError


def run(context: AgentContext, name: str = "world", **_: Any) -> dict[str, Any]:
    """Count the goal's words with word-tools, ask the LLM for a greeting, and report what happened."""
    summary: dict[str, Any] = {"run_id": context.run_id, "goal": context.goal, "refusals": []}
    try:
        context.next_iteration()
        counted = context.run_tool("word-tools", "count_words", text=context.goal)
        if counted.success:
            summary["word_count"] = counted.result["count"]
        else:
            summary["tool_error"] = counted.error
    except (PermissionError, AgentLimitExceeded) as exc:
        summary["refusals"].append({"step": "tool", "error": str(exc)})

    try:
        summary["greeting"] = context.call_llm_text(f"Greet {name} and mention this goal: {context.goal}")
    except LlmAccessError as exc:
        summary["refusals"].append({"step": "llm", "reason": exc.reason})

    summary["tool_calls_made"] = context.tool_calls_made
    summary["tools_remaining"] = context.tools_remaining
    return summary
