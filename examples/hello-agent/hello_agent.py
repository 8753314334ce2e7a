"""hello-agent: a tool call, then one the model chooses; refusals are recorded instead of failing the run."""

from __future__ import annotations

import json
from typing import Any

from sandbox_wrapper import AgentContext, AgentLimitExceeded, LlmAccessError

MAX_ROUNDS = 2
"""LLM calls of the model-driven part: one that may call tools, one that answers with their results."""


def run(context: AgentContext, name: str = "world", **_: Any) -> dict[str, Any]:
    """Count the goal's words with word-tools, let the model greet and use the tools it is offered, and
    report what happened."""
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

    # The model chooses: it is offered the tools this run may call (the host's own list, built from the
    # allowlist), and any call it makes is run through the host's gate like the one above.
    tools = context.allowed_tool_context()
    summary["offered_tools"] = [spec["name"] for spec in tools.tool_specs]
    summary["model_tool_calls"] = []
    messages: list[Any] = [
        {"role": "user", "content": f"Greet {name}, then count the words of this goal: {context.goal}"}
    ]
    try:
        for round_ in range(MAX_ROUNDS):
            answer = context.call_llm(messages, tool_context=tools)
            if not answer.tool_calls or round_ == MAX_ROUNDS - 1:
                summary["greeting"] = answer.content
                break
            messages.append(answer)  # the assistant message with its tool calls
            for call in answer.tool_calls:
                output = _run_model_call(context, call, summary)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    except LlmAccessError as exc:
        summary["refusals"].append({"step": "llm", "reason": exc.reason})

    summary["tool_calls_made"] = context.tool_calls_made
    summary["tools_remaining"] = context.tools_remaining
    return summary


def _run_model_call(context: AgentContext, call: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Run one tool call the model made; what the model gets back (a result or an error), recorded."""
    done: dict[str, Any] = {"tool": call["name"], "arguments": call["arguments"]}
    summary["model_tool_calls"].append(done)
    if call["refused"]:  # the model named a tool it was not offered: the host ran nothing, nor do we
        done["error"] = "not offered"
        return {"error": done["error"]}
    slug, _, tool = call["name"].partition(":")
    try:
        result = context.run_tool(slug, tool, **json.loads(call["arguments"]))
    except (PermissionError, AgentLimitExceeded) as exc:
        summary["refusals"].append({"step": "model_tool", "error": str(exc)})
        done["error"] = str(exc)
        return {"error": done["error"]}
    if not result.success:
        done["error"] = result.error
        return {"error": result.error}
    done["result"] = result.result
    return result.result
