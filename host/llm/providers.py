"""The provider SDKs (openai, anthropic) behind the two calls a session makes, each response read into the
contract's shape: text, tool calls (host/llm/toolcalls.py), a finish reason and token counts.

An adapter is built from the `Binding` host/llm/credentials.py resolved and holds its key inside the SDK
client; nothing here reads a key or relays provider text.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from host.core.strictjson import check_finite
from host.core.vocab import WireReason
from host.llm.credentials import Binding
from host.llm.toolcalls import MAX_TOOL_CALLS, RESPONSE_TOOL, ModelToolCall, Prepared, canonical_json
from host.llm.translate import (
    CallDelta,
    CallStream,
    TooManyToolCalls,
    anthropic_request,
    model_call,
    openai_request,
)

if TYPE_CHECKING:
    import anthropic
    import openai

_FINISH_REASONS = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "content_filter": "content_filter",
    "refusal": "content_filter",
    "tool_calls": "tool_calls",
    "tool_use": "tool_calls",
}


@dataclass(frozen=True)
class Completion:
    """One completion as the sandbox may see it: no model name, no provider metadata."""

    content: str
    finish_reason: str  # "stop" | "length" | "content_filter" | "tool_calls" | "other" | "" (did not say)
    input_tokens: int
    output_tokens: int
    tool_calls: tuple[ModelToolCall, ...] = ()
    """The model's tool calls, in its order (host/llm/toolcalls.py normalizes both APIs to this shape)."""

    @property
    def output_chars(self) -> int:
        """What max_output_chars bounds: the text plus every tool call's arguments."""
        return len(self.content) + sum(len(c.arguments_json) for c in self.tool_calls)


StreamItem = str | CallDelta | Completion
"""What a stream yields: text pieces, tool-call pieces, then one final Completion."""


class Adapter(Protocol):
    """One provider SDK behind the two calls the broker needs."""

    def complete(self, request: Prepared, max_tokens: int) -> Completion: ...

    def stream(self, request: Prepared, max_tokens: int) -> Generator[StreamItem, None, None]:
        """Text and tool-call pieces as they come, then one Completion with content "" and the completed
        tool calls; closing it ends the HTTP stream."""
        ...

    def reason_for(self, exc: Exception) -> WireReason: ...


def _text(value: object) -> str:
    """Provider text, or an error when the response is not what the SDK promised (garbage in, refusal out)."""
    if not isinstance(value, str):
        raise TypeError("provider returned non-text content")
    return value


def _tokens(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _finish(value: object, calls: bool = False) -> str:
    """The contract's finish reason; a completion with tool calls that says it stopped stopped for them
    (some OpenAI-compatible servers answer `stop`)."""
    if not value:
        return "tool_calls" if calls else ""
    reason = _FINISH_REASONS.get(str(value), "other")
    return "tool_calls" if calls and reason == "stop" else reason


def _finished(value: object, calls: bool = False) -> str:
    """A streamed finish reason; a stream without one was cut off or was never a real stream."""
    if not value:
        raise ValueError("stream ended without a finish reason")
    return _finish(value, calls)


def _json_answer(value: object) -> str:
    """An Anthropic response tool's input as the completion's JSON text."""
    check_finite(value)
    if not isinstance(value, dict):
        raise TypeError("the response tool's input is not an object")
    return canonical_json(value)


def _bounded(calls: Sequence[Any]) -> Sequence[Any]:
    if len(calls) > MAX_TOOL_CALLS:
        raise TooManyToolCalls
    return calls


class _SdkAdapter:
    """What both adapters share: the SDK's exceptions that mean a timeout or a rate limit, set by each."""

    _timeouts: tuple[type[Exception], ...]
    _rate_limited: type[Exception]

    def reason_for(self, exc: Exception) -> WireReason:
        if isinstance(exc, self._timeouts):
            return WireReason.LLM_TIMEOUT
        if isinstance(exc, self._rate_limited):
            return WireReason.LLM_RATE_LIMITED
        return WireReason.LLM_UNAVAILABLE


class _OpenAiAdapter(_SdkAdapter):
    """OpenAI and OpenAI-compatible servers through the openai SDK's chat completions."""

    def __init__(self, binding: Binding, timeout: float) -> None:
        import httpx2  # noqa: PLC0415  SDKs load on first call: startup stays fast, a missing SDK only refuses
        import openai  # noqa: PLC0415

        self._client = openai.OpenAI(
            api_key=binding.api_key, base_url=binding.base_url, timeout=timeout, max_retries=0
        )
        self._model = binding.model
        # OpenAI deprecated max_tokens; compatible servers (Ollama, vLLM) reliably understand only max_tokens.
        self._completion_bound = binding.provider == "openai"
        self._timeouts = (openai.APITimeoutError, httpx2.TimeoutException)
        self._rate_limited = openai.RateLimitError

    def _body(self, request: Prepared, max_tokens: int) -> dict[str, Any]:
        """The request's fields as sent, passed as `extra_body`: the SDK's `create` walks every typed argument
        against its parameter TypedDicts (for aliases and formats) before sending, ~0.35 ms for one message,
        ~0.8 ms for 8 tools and a 2 KiB schema and ~2.4 ms for a 12-message tool loop, on every call. What
        openai_request builds is plain JSON that walk leaves as it is (tests/unit/llm/test_toolcalls.py checks
        it against the installed SDK), so skipping it sends the same body. `messages` is a required
        argument: it is given empty and the body's own replaces it (extra_body wins over typed fields)."""
        bound = "max_completion_tokens" if self._completion_bound else "max_tokens"
        return {**openai_request(request), bound: max_tokens}

    def complete(self, request: Prepared, max_tokens: int) -> Completion:
        resp = self._client.chat.completions.create(
            model=self._model, messages=[], extra_body=self._body(request, max_tokens)
        )
        choice = resp.choices[0]
        taken: set[str] = set()
        calls = tuple(_openai_call(request, c, taken) for c in _bounded(choice.message.tool_calls or ()))
        return Completion(
            content=_text(choice.message.content or ""),
            finish_reason=_finish(choice.finish_reason, bool(calls)),
            input_tokens=_tokens(resp.usage.prompt_tokens) if resp.usage else 0,
            output_tokens=_tokens(resp.usage.completion_tokens) if resp.usage else 0,
            tool_calls=calls,
        )

    def stream(self, request: Prepared, max_tokens: int) -> Generator[StreamItem, None, None]:
        usage: openai.types.CompletionUsage | None = None
        finish: str | None = None
        calls = CallStream(request)
        with self._client.chat.completions.create(
            model=self._model,
            messages=[],
            stream=True,
            stream_options={"include_usage": True},
            extra_body=self._body(request, max_tokens),
        ) as chunks:
            for chunk in chunks:
                usage = chunk.usage or usage
                for choice in chunk.choices[:1]:
                    if choice.delta.content:
                        yield _text(choice.delta.content)
                    for piece in choice.delta.tool_calls or ():
                        fn = piece.function
                        yield calls.piece(piece.index, piece.id, fn and fn.name, fn and fn.arguments)
                    finish = choice.finish_reason or finish
        done = calls.calls()
        yield Completion(
            content="",
            finish_reason=_finished(finish, bool(done)),
            input_tokens=_tokens(usage.prompt_tokens) if usage else 0,
            output_tokens=_tokens(usage.completion_tokens) if usage else 0,
            tool_calls=done,
        )


def _openai_call(request: Prepared, call: Any, taken: set[str]) -> ModelToolCall:
    """A function call (a `custom` tool call names nothing the request defined: refused); `taken`: the ids
    of the completion's calls so far."""
    function = getattr(call, "function", None) if getattr(call, "type", None) == "function" else None
    if function is None:
        custom = getattr(call, "custom", None)
        return model_call(request, getattr(call, "id", None), getattr(custom, "name", ""), None, taken)
    return model_call(request, call.id, function.name, function.arguments, taken)


class _AnthropicAdapter(_SdkAdapter):
    """Anthropic through the anthropic SDK's messages API; system messages go to `system=`, tool calls are
    tool_use blocks, a JSON response format is a forced response tool (host/llm/translate.py)."""

    def __init__(self, binding: Binding, timeout: float) -> None:
        import anthropic  # noqa: PLC0415  see _OpenAiAdapter
        import httpx2  # noqa: PLC0415

        self._client = anthropic.Anthropic(
            api_key=binding.api_key,
            base_url=binding.base_url,
            timeout=timeout,
            max_retries=0,
            open_telemetry=False,  # its content mode would copy prompts into traces
        )
        # Its DEBUG records dump request bodies (prompts); cap the SDK's loggers at INFO, process-wide.
        sdk_logger = logging.getLogger("anthropic")
        sdk_logger.setLevel(max(logging.INFO, sdk_logger.getEffectiveLevel()))
        self._model = binding.model
        # The SDK wraps a timeout while connecting, but a stalled stream raises httpx2's own timeout.
        self._timeouts = (anthropic.APITimeoutError, httpx2.TimeoutException)
        self._rate_limited = anthropic.RateLimitError

    def _request(self, request: Prepared, max_tokens: int) -> dict[str, Any]:
        return {"model": self._model, "max_tokens": max_tokens, **anthropic_request(request)}

    def complete(self, request: Prepared, max_tokens: int) -> Completion:
        resp: anthropic.types.Message = self._client.messages.create(**self._request(request, max_tokens))
        texts: list[str] = []
        answer: str | None = None
        calls: list[ModelToolCall] = []
        taken: set[str] = set()
        for block in resp.content:
            if block.type == "text":
                texts.append(_text(block.text))
            elif block.type == "tool_use":
                if request.json_mode and block.name == RESPONSE_TOOL and answer is None:
                    answer = _json_answer(block.input)
                else:
                    calls.append(model_call(request, block.id, block.name, block.input, taken))
        _bounded(calls)
        # JSON mode: the content is the response tool's input only (a forced tool writes no text beside it).
        content = (answer or "") if request.json_mode else "".join(texts)
        stop = resp.stop_reason
        if request.json_mode and not calls and stop == "tool_use":
            stop = "end_turn"  # the model answered through the response tool
        return Completion(
            content=content,
            finish_reason=_finish(stop, bool(calls)),
            input_tokens=_tokens(resp.usage.input_tokens),
            output_tokens=_tokens(resp.usage.output_tokens),
            tool_calls=tuple(calls),
        )

    def stream(self, request: Prepared, max_tokens: int) -> Generator[StreamItem, None, None]:
        finish: str | None = None
        input_tokens = output_tokens = 0
        calls = CallStream(request)
        blocks: dict[int, str] = {}  # content block index -> "call" or "answer"
        answer_chars = 0
        events: anthropic.Stream[anthropic.types.RawMessageStreamEvent] = self._client.messages.create(
            **self._request(request, max_tokens), stream=True
        )
        with events:
            for event in events:
                if event.type == "message_start":
                    input_tokens = _tokens(event.message.usage.input_tokens)
                elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                    block = event.content_block
                    if request.json_mode and block.name == RESPONSE_TOOL and "answer" not in blocks.values():
                        blocks[event.index] = "answer"
                    else:
                        blocks[event.index] = "call"
                        yield calls.piece(event.index, block.id, block.name, None)
                elif event.type == "content_block_delta":
                    delta = event.delta
                    kind = blocks.get(event.index)
                    if delta.type == "text_delta" and not request.json_mode:
                        yield _text(delta.text)
                    elif delta.type == "input_json_delta" and kind == "call":
                        yield calls.piece(event.index, arguments=_text(delta.partial_json))
                    elif delta.type == "input_json_delta" and kind == "answer" and delta.partial_json:
                        answer_chars += len(delta.partial_json)
                        yield _text(delta.partial_json)
                elif event.type == "content_block_stop" and blocks.get(event.index) == "answer":
                    if not answer_chars:
                        yield "{}"  # an empty input streams no JSON at all
                elif event.type == "message_delta":
                    finish = event.delta.stop_reason or finish
                    output_tokens = _tokens(event.usage.output_tokens)
        done = calls.calls()
        if request.json_mode and not done and finish == "tool_use":
            finish = "end_turn"  # the model answered through the response tool
        yield Completion("", _finished(finish, bool(done)), input_tokens, output_tokens, done)


def adapter_for(binding: Binding, timeout: float) -> Adapter:
    """The adapter of `binding`'s provider (openrouter and compatible servers speak OpenAI's API); raises when
    the SDK cannot load."""
    build = _AnthropicAdapter if binding.provider == "anthropic" else _OpenAiAdapter
    return build(binding, timeout)


__all__ = ["Adapter", "Completion", "StreamItem", "adapter_for"]
