"""The LLM credential broker: the only module that reads provider API keys, so they never leave the host.

A sandboxed agent sends messages; the broker checks them against the run's `LlmPolicy`, calls the
host-chosen provider and model, and answers with text, a finish reason and token counts. Every refusal and
provider failure becomes an `LlmRefusal` with a fixed, generic message: provider error text can carry the
key, URLs or the prompt, so it is never relayed, logged or chained.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from host._config import LlmHostConfig
from host._errors import CallRefusal
from host._policy import LlmPolicy
from host._vocab import WireReason

if TYPE_CHECKING:
    import anthropic
    import openai

logger = logging.getLogger("agentnode.sandbox.broker")

# provider -> (API key variable, base URL variable, default base URL, default model). An
# openai_compatible server (Ollama, vLLM) has no default URL and may need no key.
_PROVIDERS: dict[str, tuple[str, str, str | None, str]] = {
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "https://api.openai.com/v1", "gpt-4o-mini"),
    "openai_compatible": ("OPENAI_API_KEY", "OPENAI_BASE_URL", None, "gpt-4o-mini"),
    "anthropic": (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "https://api.anthropic.com",
        "claude-3-5-haiku-latest",
    ),
}
_KEYLESS = "not-needed"  # the SDK insists on a key; local openai_compatible servers ignore it
_ROLES = frozenset({"system", "user", "assistant"})
MAX_MESSAGES = 256
"""Messages one call may carry; more is LLM_INPUT_TOO_LARGE, refused before any message is looked at."""
MESSAGE_OVERHEAD_CHARS = 4
"""What each message adds to the input size besides its role and content: the structure around it (the
"\\n\\n" that joins system messages for Anthropic, 4 bytes once JSON-escaped, is paid by these and the
6 of "system"). Empty messages are not free, so many of them can never add up to a large request under a
small cap."""
FRAMING_BYTES_PER_MESSAGE = 16
"""Upper bound on one message's encoding overhead (field tags, length prefixes) in a request."""
_CHARS_PER_TOKEN = 3  # conservative: real text averages ~4 chars/token, so the char cap is what bites
_MAX_TOKENS_CEILING = 16384
_FINISH_REASONS = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "content_filter": "content_filter",
    "refusal": "content_filter",
}

# Fixed wording per wire reason: a refusal can never carry provider text, a key, a URL or the model name.
_REFUSAL_MESSAGES: dict[WireReason, str] = {
    WireReason.LLM_NOT_GRANTED: "LLM access is not granted to this run (llm_access.enabled is not declared "
    "or the host disabled it)",
    WireReason.INVALID_REQUEST: "messages must be a non-empty list of {role, content} with role system, user "
    "or assistant and string content",
    WireReason.LLM_INPUT_TOO_LARGE: "LLM request exceeds the allowed input size",
    WireReason.LLM_MODEL_NOT_ALLOWED: "the host-configured LLM model is not allowed for this agent",
    WireReason.LLM_CALL_LIMIT: "LLM call limit reached for this run",
    WireReason.LLM_OUTPUT_TOO_LARGE: "LLM response exceeds the allowed output size",
    WireReason.LLM_RATE_LIMITED: "the LLM provider is rate-limiting the host; try again later",
    WireReason.LLM_TIMEOUT: "the LLM provider did not answer in time",
    WireReason.LLM_UNAVAILABLE: "the host's LLM provider is unavailable",
}


class LlmRefusal(CallRefusal):
    """A refused or failed LLM call; `message` is a fixed generic text per reason, so nothing leaks."""

    def __init__(self, reason: WireReason) -> None:
        super().__init__(reason, _REFUSAL_MESSAGES[reason])


@dataclass(frozen=True)
class Completion:
    """One completion as the sandbox may see it: no model name, no provider metadata."""

    content: str
    finish_reason: str  # "stop" | "length" | "content_filter" | "other" | "" (provider did not say)
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class _Binding:
    """The provider the host resolved; the key is kept out of repr so it cannot reach a log by accident."""

    provider: str
    model: str
    base_url: str
    api_key: str = field(repr=False)


class _Adapter(Protocol):
    """One provider SDK behind the two calls the broker needs."""

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> Completion: ...

    def stream(
        self, messages: list[dict[str, str]], max_tokens: int
    ) -> Generator[str | Completion, None, None]:
        """Text pieces as they come, then one Completion with content ""; closing it ends the HTTP stream."""
        ...

    def reason_for(self, exc: Exception) -> WireReason: ...


def _text(value: object) -> str:
    """Provider text, or an error when the response is not what the SDK promised (garbage in, refusal out)."""
    if not isinstance(value, str):
        raise TypeError("provider returned non-text content")
    return value


def _tokens(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _finish(value: object) -> str:
    if not value:
        return ""
    return _FINISH_REASONS.get(str(value), "other")


def _finished(value: object) -> str:
    """A streamed finish reason; a stream without one was cut off or was never a real stream."""
    if not value:
        raise ValueError("stream ended without a finish reason")
    return _finish(value)


class _OpenAiAdapter:
    """OpenAI and OpenAI-compatible servers through the openai SDK's chat completions."""

    def __init__(self, binding: _Binding, timeout: float) -> None:
        import httpx2  # noqa: PLC0415  SDKs load on first call: startup stays fast, a missing SDK only refuses
        import openai  # noqa: PLC0415

        self._client = openai.OpenAI(
            api_key=binding.api_key, base_url=binding.base_url, timeout=timeout, max_retries=0
        )
        self._model = binding.model
        # OpenAI deprecated max_tokens; compatible servers (Ollama, vLLM) reliably understand only max_tokens.
        self._completion_bound = binding.provider == "openai"
        self._timeouts: tuple[type[Exception], ...] = (openai.APITimeoutError, httpx2.TimeoutException)
        self._rate_limited = openai.RateLimitError

    def _bounds(self, max_tokens: int) -> dict[str, Any]:
        return {"max_completion_tokens": max_tokens} if self._completion_bound else {"max_tokens": max_tokens}

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> Completion:
        resp = self._client.chat.completions.create(
            model=self._model, messages=_as_any(messages), **self._bounds(max_tokens)
        )
        choice = resp.choices[0]
        return Completion(
            content=_text(choice.message.content or ""),
            finish_reason=_finish(choice.finish_reason),
            input_tokens=_tokens(resp.usage.prompt_tokens) if resp.usage else 0,
            output_tokens=_tokens(resp.usage.completion_tokens) if resp.usage else 0,
        )

    def stream(
        self, messages: list[dict[str, str]], max_tokens: int
    ) -> Generator[str | Completion, None, None]:
        usage: openai.types.CompletionUsage | None = None
        finish: str | None = None
        with self._client.chat.completions.create(
            model=self._model,
            messages=_as_any(messages),
            stream=True,
            stream_options={"include_usage": True},
            **self._bounds(max_tokens),
        ) as chunks:
            for chunk in chunks:
                usage = chunk.usage or usage
                for choice in chunk.choices[:1]:
                    if choice.delta.content:
                        yield _text(choice.delta.content)
                    finish = choice.finish_reason or finish
        yield Completion(
            content="",
            finish_reason=_finished(finish),
            input_tokens=_tokens(usage.prompt_tokens) if usage else 0,
            output_tokens=_tokens(usage.completion_tokens) if usage else 0,
        )

    def reason_for(self, exc: Exception) -> WireReason:
        if isinstance(exc, self._timeouts):
            return WireReason.LLM_TIMEOUT
        if isinstance(exc, self._rate_limited):
            return WireReason.LLM_RATE_LIMITED
        return WireReason.LLM_UNAVAILABLE


class _AnthropicAdapter:
    """Anthropic through the anthropic SDK's messages API; system messages go to `system=`."""

    def __init__(self, binding: _Binding, timeout: float) -> None:
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
        self._timeouts: tuple[type[Exception], ...] = (anthropic.APITimeoutError, httpx2.TimeoutException)
        self._rate_limited = anthropic.RateLimitError

    def _request(self, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        # Empty system messages add nothing but separators, so they are dropped, not joined.
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system" and m["content"])
        request: dict[str, Any] = {
            "model": self._model,
            "max_tokens": max_tokens,
            "messages": [m for m in messages if m["role"] != "system"],
        }
        if system:
            request["system"] = system
        return request

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> Completion:
        resp: anthropic.types.Message = self._client.messages.create(**self._request(messages, max_tokens))
        return Completion(
            content="".join(_text(block.text) for block in resp.content if block.type == "text"),
            finish_reason=_finish(resp.stop_reason),
            input_tokens=_tokens(resp.usage.input_tokens),
            output_tokens=_tokens(resp.usage.output_tokens),
        )

    def stream(
        self, messages: list[dict[str, str]], max_tokens: int
    ) -> Generator[str | Completion, None, None]:
        finish: str | None = None
        input_tokens = output_tokens = 0
        events: anthropic.Stream[anthropic.types.RawMessageStreamEvent] = self._client.messages.create(
            **self._request(messages, max_tokens), stream=True
        )
        with events:
            for event in events:
                if event.type == "message_start":
                    input_tokens = _tokens(event.message.usage.input_tokens)
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    yield _text(event.delta.text)
                elif event.type == "message_delta":
                    finish = event.delta.stop_reason or finish
                    output_tokens = _tokens(event.usage.output_tokens)
        yield Completion("", _finished(finish), input_tokens, output_tokens)

    def reason_for(self, exc: Exception) -> WireReason:
        if isinstance(exc, self._timeouts):
            return WireReason.LLM_TIMEOUT
        if isinstance(exc, self._rate_limited):
            return WireReason.LLM_RATE_LIMITED
        return WireReason.LLM_UNAVAILABLE


def _as_any(messages: list[dict[str, str]]) -> Any:
    """Our validated {role, content} dicts are exactly the SDKs' message TypedDicts."""
    return messages


def _resolve(host: LlmHostConfig, env: Mapping[str, str]) -> _Binding | None:
    """The host's provider binding: config first, else OpenAI then Anthropic from the environment."""
    provider = host.provider
    if provider is None:
        provider = next((p for p in ("openai", "anthropic") if env.get(_PROVIDERS[p][0])), None)
    if provider not in _PROVIDERS:
        return None
    key_var, url_var, default_url, default_model = _PROVIDERS[provider]
    key = env.get(key_var) or (_KEYLESS if provider == "openai_compatible" else "")
    url = host.base_url or env.get(url_var) or default_url
    if not key or not url:
        return None
    return _Binding(provider=provider, model=host.model or default_model, base_url=url, api_key=key)


class LlmBroker:
    """One per host process: resolves the provider once and builds its SDK client once, on first use."""

    def __init__(self, host: LlmHostConfig, env: Mapping[str, str] | None = None) -> None:
        self._host = host
        self._binding = _resolve(host, os.environ if env is None else env)
        self._adapter: _Adapter | None = None
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        """Provider, model and whether calls can be made, for doctor output; never the key or URL."""
        if self._binding is None:
            return {"provider": self._host.provider, "model": self._host.model, "configured": False}
        return {"provider": self._binding.provider, "model": self._binding.model, "configured": True}

    def session(self, policy: LlmPolicy) -> LlmSession:
        """A fresh budget for one run."""
        return LlmSession(self, policy)

    def _client(self, binding: _Binding) -> _Adapter:
        """The provider adapter for this broker's binding, built once; raises when the SDK cannot load."""
        with self._lock:
            if self._adapter is None:
                build = _AnthropicAdapter if binding.provider == "anthropic" else _OpenAiAdapter
                self._adapter = build(binding, self._host.timeout_seconds)
            return self._adapter


class LlmSession:
    """One run's LLM budget; thread-safe. Checks run before any spend, and a call slot is reserved before
    the provider is called, so concurrent calls can never exceed `max_calls`.

    Order: granted → message count → well-formed → input size → provider configured → model allowed →
    call slot. Only the last consumes a call: a request refused earlier cost nothing and is not charged.
    The RPC layer runs `screen` first, on a request it has not even decoded yet.
    """

    def __init__(self, broker: LlmBroker, policy: LlmPolicy) -> None:
        self._broker = broker
        self._policy = policy
        self._lock = threading.Lock()
        self._usage: dict[str, Any] = {
            "requests": 0,
            "calls": 0,
            "ok": 0,
            "refused_disabled": 0,
            "refused_limit": 0,
            "refused_input": 0,
            "refused_output": 0,
            "refused_model": 0,
            "provider_errors": 0,
            "model": None,
        }

    @property
    def max_request_bytes(self) -> int:
        """The most bytes an admissible input can take encoded: `input_chars` counts every role and content
        at least as its UTF-8 bytes (what protobuf carries), and each of at most MAX_MESSAGES messages adds
        at most FRAMING_BYTES_PER_MESSAGE of framing."""
        if not self._policy.enabled:
            return 0
        return self._policy.max_input_chars + FRAMING_BYTES_PER_MESSAGE * MAX_MESSAGES + 256

    def screen(self, *, request_bytes: int | None = None, message_count: int | None = None) -> None:
        """The checks that need no message at all, so a request that cannot pass costs nothing to refuse.

        Granted, a call left, an encoded size that could fit the input cap (`max_request_bytes`), at most
        MAX_MESSAGES messages. A refusal counts exactly as it would in `call`; passing counts nothing.
        """
        if not self._policy.enabled:
            self._refuse_request(WireReason.LLM_NOT_GRANTED, "refused_disabled")
        if self.calls_remaining == 0:
            self._refuse_request(WireReason.LLM_CALL_LIMIT, "refused_limit")
        too_many_bytes = request_bytes is not None and request_bytes > self.max_request_bytes
        if too_many_bytes or (message_count is not None and message_count > MAX_MESSAGES):
            self._refuse_request(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")

    def call(
        self, messages: Sequence[Mapping[str, str]], *, on_admit: Callable[[], None] | None = None
    ) -> Completion:
        """One completion; raises LlmRefusal. `on_admit` runs once every check passed and a call was
        reserved, before the provider is called (the RPC layer counts the run as active from there)."""
        adapter, wire, max_tokens = self._admit(messages, on_admit)
        try:
            completion = adapter.complete(wire, max_tokens)
        except Exception as exc:  # noqa: BLE001  any provider failure becomes a generic refusal
            reason = self._provider_failed(adapter.reason_for(exc), exc)
        else:
            if len(completion.content) > self._policy.max_output_chars:
                self._refuse(WireReason.LLM_OUTPUT_TOO_LARGE, "refused_output")
            self._count("ok")
            return completion
        raise LlmRefusal(reason)  # outside the handler: the provider exception is not chained

    def stream(
        self, messages: Sequence[Mapping[str, str]], *, on_admit: Callable[[], None] | None = None
    ) -> Iterator[str | Completion]:
        """Text chunks as they arrive, then one Completion with content "" (the text was already sent).

        At the output cap it yields text up to exactly `max_output_chars`, closes the provider stream and
        raises LlmRefusal(LLM_OUTPUT_TOO_LARGE). Closing this generator closes the provider stream. As a
        generator, it checks and sends nothing until the first `next()`; `on_admit` is as for `call`.
        """
        adapter, wire, max_tokens = self._admit(messages, on_admit)
        sent = 0
        with contextlib.closing(adapter.stream(wire, max_tokens)) as chunks:
            while True:
                try:
                    item = next(chunks)
                except Exception as exc:  # noqa: BLE001  any provider failure becomes a generic refusal
                    reason = self._provider_failed(adapter.reason_for(exc), exc)
                    break
                if isinstance(item, Completion):
                    self._count("ok")
                    yield item
                    return
                room = self._policy.max_output_chars - sent
                if len(item) > room:
                    chunks.close()  # stop the spend now, even if the consumer never asks for more
                    self._count("refused_output")
                    if room:
                        yield item[:room]
                    raise LlmRefusal(WireReason.LLM_OUTPUT_TOO_LARGE)
                sent += len(item)
                yield item
        raise LlmRefusal(reason)

    def usage(self) -> dict[str, Any]:
        """Counters and the host-side model name, for the audit record only (never sent to the sandbox)."""
        with self._lock:
            return dict(self._usage)

    @property
    def calls_remaining(self) -> int:
        """Provider calls this run may still make."""
        if not self._policy.enabled:
            return 0
        with self._lock:
            return max(0, self._policy.max_calls - int(self._usage["calls"]))

    def _admit(
        self, messages: Sequence[Mapping[str, str]], on_admit: Callable[[], None] | None
    ) -> tuple[_Adapter, list[dict[str, str]], int]:
        """Run every check, reserve a call slot and return what the provider call needs."""
        self._count("requests")
        if not self._policy.enabled:
            self._refuse(WireReason.LLM_NOT_GRANTED, "refused_disabled")
        if isinstance(messages, Sequence) and len(messages) > MAX_MESSAGES:
            # before looking at a single message
            self._refuse(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
        wire = _validated(messages)
        if input_chars(wire) > self._policy.max_input_chars:
            self._refuse(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
        binding = self._broker._binding
        if binding is None:
            logger.warning("LLM call refused: no LLM provider is configured on the host")
            self._refuse(WireReason.LLM_UNAVAILABLE, "provider_errors")
        with self._lock:
            self._usage["model"] = binding.model
        allowed = self._policy.allowed_models
        if allowed is not None and binding.model not in allowed:
            logger.warning("LLM call refused: the host model is outside the run's allowed_models")
            self._refuse(WireReason.LLM_MODEL_NOT_ALLOWED, "refused_model")
        adapter: _Adapter | None = None
        try:
            adapter = self._broker._client(binding)
        except Exception as exc:  # noqa: BLE001  e.g. the SDK is missing; nothing was spent
            self._provider_failed(WireReason.LLM_UNAVAILABLE, exc)
        if adapter is None:
            raise LlmRefusal(WireReason.LLM_UNAVAILABLE)
        with self._lock:
            if self._usage["calls"] >= self._policy.max_calls:
                self._usage["refused_limit"] += 1
                raise LlmRefusal(WireReason.LLM_CALL_LIMIT)
            self._usage["calls"] += 1
        if on_admit is not None:
            on_admit()
        max_tokens = max(1, math.ceil(self._policy.max_output_chars / _CHARS_PER_TOKEN))
        return adapter, wire, min(_MAX_TOKENS_CEILING, max_tokens)

    def _count(self, counter: str) -> None:
        with self._lock:
            self._usage[counter] += 1

    def _refuse(self, reason: WireReason, counter: str) -> NoReturn:
        self._count(counter)
        raise LlmRefusal(reason)

    def _refuse_request(self, reason: WireReason, counter: str) -> NoReturn:
        """A refusal from `screen`: the request is counted here because it never reaches `_admit`."""
        with self._lock:
            self._usage["requests"] += 1
            self._usage[counter] += 1
        raise LlmRefusal(reason)

    def _provider_failed(self, reason: WireReason, exc: Exception) -> WireReason:
        """Count and log a provider failure by exception type only: its text may hold the key or prompt."""
        self._count("provider_errors")
        logger.warning("LLM provider call failed (%s): %s", reason, type(exc).__name__)
        return reason


_TWO_BYTE_ESCAPES = b'"\\\b\f\n\r\t'
"""Characters JSON writes as a backslash and one letter."""
_SIX_BYTE_ESCAPES = bytes(c for c in range(0x20) if c not in _TWO_BYTE_ESCAPES)
"""The other control characters, which JSON writes as \\u00XX."""


def json_string_bytes(text: str) -> int:
    """The bytes `text` takes inside a JSON string as both SDKs send it: `json.dumps(text,
    ensure_ascii=False)[1:-1]` encoded as UTF-8 (openai and anthropic serialize request bodies with
    `ensure_ascii=False` and send UTF-8, as httpx does), so a control character counts 6 (or 2 for
    \\b \\f \\n \\r \\t), `"` and `\\` 2, any other character its UTF-8 length (1 to 4).

    Computed without building the escaped text: one UTF-8 encode and two byte deletions, all in C and O(n).
    Control characters, `"` and `\\` are single bytes in UTF-8 and never occur inside a multi-byte one.
    """
    raw = text.encode("utf-8", "surrogatepass")
    two = len(raw) - len(raw.translate(None, _TWO_BYTE_ESCAPES))
    six = len(raw) - len(raw.translate(None, _SIX_BYTE_ESCAPES))
    return len(raw) + two + 5 * six


def input_chars(messages: Sequence[Mapping[str, str]]) -> int:
    """The input size a call is capped on (`max_input_chars`): every role and every content as the bytes it
    takes in the request body (`json_string_bytes`: JSON-escaped, UTF-8), plus MESSAGE_OVERHEAD_CHARS per
    message. For plain ASCII text without quotes, backslashes or control characters that is one per
    character; text that escaping or UTF-8 makes longer on the wire counts what it sends, so no content
    shape can make a request several times the cap.

    It bounds what either adapter sends of roles and contents: OpenAI gets each as counted; Anthropic gets
    the non-system messages as counted plus the non-empty system contents joined by "\\n\\n" (4 bytes
    escaped), which is less than their roles, contents and overheads together. The rest of the body is
    JSON structure: at most a fixed ~25 bytes a message besides what is counted, and a few fields.
    """
    return sum(
        json_string_bytes(m["role"]) + json_string_bytes(m["content"]) + MESSAGE_OVERHEAD_CHARS
        for m in messages
    )


def _validated(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """Plain {role, content} dicts, or LlmRefusal(INVALID_REQUEST); other message keys are dropped."""
    wire: list[dict[str, str]] = []
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise LlmRefusal(WireReason.INVALID_REQUEST)
    for message in messages:
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(role, str) or role not in _ROLES or not isinstance(content, str):
            raise LlmRefusal(WireReason.INVALID_REQUEST)
        wire.append({"role": role, "content": content})
    if not wire:
        raise LlmRefusal(WireReason.INVALID_REQUEST)
    return wire


__all__ = [
    "FRAMING_BYTES_PER_MESSAGE",
    "MAX_MESSAGES",
    "MESSAGE_OVERHEAD_CHARS",
    "Completion",
    "LlmBroker",
    "LlmRefusal",
    "LlmSession",
    "input_chars",
    "json_string_bytes",
]
