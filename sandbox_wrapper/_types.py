"""The values AgentContext hands an agent and takes from it (results, tool context, retry settings), apart
from the context so naming them imports neither gRPC nor the context.

Standard library only, and nothing of sandbox_wrapper: where the wrapper is not loaded (the host's tool
worker), the agentnode_sdk compatibility package loads this file by its path for ToolContext and RetryConfig
(sandbox_wrapper/_compat/agentnode_sdk/_runtime.py), so they have one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

# --- results: attributes (the agentnode runtime) and a dict (the seed sandbox) at once -------------------


class _Record(dict[str, Any]):
    """A dict whose known keys are also attributes, so `r.success`, `r["success"]`, `r.get("success")`,
    `"success" in r`, `dict(r)` and `json.dumps(r)` all work, as both runtimes' agents expect."""

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self[name] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={self.get(k)!r}' for k in self._FIELDS)})"


class ToolResult(_Record):
    """The outcome of one tool call: agentnode's RunToolResult, readable as attributes and as a mapping.

    `mode_used` is where the host ran the tool (`host_worker` for a trusted pack, `tool_sandbox` for a
    community one), `circuit_breaker` when the call was held back, or "" when the host refused it (then
    `error` starts with the reason). `run_id` is always None (the runtime sets it only for nested agent
    runs, which never happen here).
    """

    __slots__ = ()
    _FIELDS = ("success", "result", "error", "mode_used", "duration_ms", "timed_out", "run_id")

    def __init__(
        self,
        success: bool,
        result: Any = None,
        error: str | None = None,
        mode_used: str = "",
        *,
        duration_ms: float = 0.0,
        timed_out: bool = False,
        run_id: str | None = None,
    ) -> None:
        super().__init__(
            success=success, result=result, error=error, mode_used=mode_used,
            duration_ms=duration_ms, timed_out=timed_out, run_id=run_id,
        )

    @property
    def success(self) -> bool:
        return bool(self.get("success"))

    @property
    def result(self) -> Any:
        return self.get("result")

    @property
    def error(self) -> str | None:
        return cast("str | None", self.get("error"))

    @property
    def mode_used(self) -> str:
        return cast(str, self.get("mode_used", ""))

    @property
    def duration_ms(self) -> float:
        return cast(float, self.get("duration_ms", 0.0))

    @property
    def timed_out(self) -> bool:
        return bool(self.get("timed_out"))

    @property
    def run_id(self) -> str | None:
        return cast("str | None", self.get("run_id"))


class LlmResult(_Record):
    """One completion: agentnode's LLMResult, readable as attributes and as a mapping.

    As a mapping it is also an assistant message, `{"role": "assistant", "content": ..., "tool_calls":
    ...}` (the seed sandbox's completion), so it can be appended to the messages of the next call, tool
    calls included. `tool_calls` is None when the model called no tool, else a list of `{"id", "name",
    "arguments", "refused"}`: `name` is `<slug>:<tool>` as offered, `arguments` the JSON text of an object
    (as OpenAI-style clients give it, whichever provider the host uses; `json.loads` it), `refused` True
    when the model named a tool it was not offered (the host ran nothing). `finish_reason` is "stop",
    "length", "tool_calls", "content_filter", "other" or "". `model` is always "" (the host never reveals
    its model). `usage` carries the runtime's `prompt_tokens`/`completion_tokens` and this wrapper's
    earlier `input_tokens`/`output_tokens`, and `tokens_remaining` (the run's max_total_tokens left after
    this call) only when the run has such a cap.
    """

    __slots__ = ()
    _FIELDS = ("role", "content", "tool_calls", "usage", "model", "finish_reason")

    def __init__(
        self,
        content: str,
        finish_reason: str = "",
        usage: dict[str, int] | None = None,
        model: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(
            role="assistant", content=content, tool_calls=tool_calls,
            usage={} if usage is None else usage, model=model, finish_reason=finish_reason,
        )

    @property
    def role(self) -> str:
        return cast(str, self.get("role", "assistant"))

    @property
    def content(self) -> str:
        return cast(str, self.get("content", ""))

    @property
    def tool_calls(self) -> list[dict[str, Any]] | None:
        return cast("list[dict[str, Any]] | None", self.get("tool_calls"))

    @property
    def usage(self) -> dict[str, int]:
        return cast("dict[str, int]", self.get("usage"))

    @property
    def model(self) -> str:
        return cast(str, self.get("model", ""))

    @property
    def finish_reason(self) -> str:
        return cast(str, self.get("finish_reason", ""))


RunToolResult = ToolResult
"""The agentnode runtime's name for ToolResult."""
LLMResult = LlmResult
"""The agentnode runtime's name for LlmResult."""


@dataclass
class ToolContext:
    """The tools an LLM may be offered (from `AgentContext.allowed_tool_context()`): the allowlist, and a
    spec `{"name": "<slug>:<tool>", "description", "input_schema"}` for each tool the host lists for the
    run. An agent may pass a filtered copy to call_llm; the host offers only tools of its own list."""

    allowed_packages: list[str] = field(default_factory=list)
    tool_specs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def has_tools(self) -> bool:
        return len(self.tool_specs) > 0


@dataclass
class RetryConfig:
    """Retry settings with the agentnode runtime's defaults (used by `run_tool(..., retry=True)`)."""

    max_retries: int = 2
    backoff_base: float = 1.0
    backoff_max: float = 10.0
    enabled: bool = True
