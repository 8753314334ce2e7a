"""raw-stubs-agent: RunTool and CallLlm through the generated stubs, reading refusal reasons by hand."""

from __future__ import annotations

import json
import os
from typing import Any

import grpc

from sandbox_wrapper.protocol import llm_pb2, llm_pb2_grpc, tools_pb2, tools_pb2_grpc


def reason_of(err: grpc.RpcError) -> str:
    """The refusal reason: trailing metadata `agentnode-reason`, e.g. TOOL_NOT_ALLOWED ("" if none)."""
    return next((value for key, value in err.trailing_metadata() or () if key == "agentnode-reason"), "")


def refused(err: grpc.RpcError) -> dict[str, str]:
    """Status code and reason; map reasons, never the details text, to behaviour."""
    return {"status": err.code().name, "reason": reason_of(err), "details": err.details() or ""}


def run(context: Any, **_: Any) -> dict[str, Any]:
    """Reverse the goal's words with word-tools, then ask the LLM; report each call's outcome."""
    # The wrapper still passes its AgentContext; this agent uses only the goal from it. The run's socket
    # is the run's identity, so a second channel to it is the same run with the same caps.
    socket_path = os.environ.get("AGENTNODE_SOCKET", "/run/agentnode/sandbox.sock")
    outcome: dict[str, Any] = {}
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        tools = tools_pb2_grpc.ToolServiceStub(channel)
        llm = llm_pb2_grpc.LlmServiceStub(channel)
        request = tools_pb2.RunToolRequest(
            package_slug="word-tools",
            tool_name="reverse_words",
            arguments_json=json.dumps({"text": context.goal}),
        )
        try:
            answer = tools.RunTool(request)
            outcome["tool"] = {
                "success": answer.success,
                "result": json.loads(answer.result_json) if answer.result_json else None,
                "error": answer.error,
                "tools_remaining": answer.tools_remaining,
            }
        except grpc.RpcError as err:
            outcome["tool"] = refused(err)

        try:
            reply = llm.CallLlm(
                llm_pb2.CallLlmRequest(messages=[llm_pb2.ChatMessage(role="user", content=context.goal)])
            )
            outcome["llm"] = {"content": reply.content, "calls_remaining": reply.calls_remaining}
        except grpc.RpcError as err:
            outcome["llm"] = refused(err)
    return outcome
