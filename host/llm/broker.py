"""The LLM credential broker: the only module that reads provider API keys, so they never leave the host.

Keys come from the process environment or, where it has none, from the `.env` beside the host config
(read here and nowhere else: parsed, never executed, never put into `os.environ` or a child's environment).
Which provider and model serve a run: the host config's `agent_sandbox.llm` pins win, then the agent's
entry in `agent-config.json`, then auto-detection (OPENAI_API_KEY, then ANTHROPIC_API_KEY).

A sandboxed agent sends messages (and, optionally, the names of tools from its run's catalog, a tool choice
and a response format: host/llm/toolcalls.py); the broker checks them against the run's `LlmPolicy`, calls the
host-chosen provider and model with the host's own tool definitions, and answers with text, tool calls, a
finish reason and token counts. Every refusal and provider failure becomes an `LlmRefusal` with a fixed,
generic message: provider error text can carry the key, URLs or the prompt, so it is never relayed, logged
or chained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from host.core.calltrace import CallTrace
from host.core.errors import CallRefusal, ConfigError
from host.core.strictjson import check_finite
from host.core.vocab import WireReason
from host.llm.budget import (
    UNPRICED_HINT,
    BudgetRefusal,
    LlmBudget,
    Reservation,
    RetryCounts,
    RetryPolicy,
    Transient,
    call_with_retries,
    estimate_tokens,
    may_have_reached_provider,
    transient_kind,
)
from host.llm.toolcalls import (
    EMPTY_CATALOG,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    RESPONSE_TOOL,
    CallDelta,
    CallStream,
    LlmCall,
    ModelToolCall,
    Prepared,
    Rejected,
    ToolCatalog,
    TooManyToolCalls,
    anthropic_request,
    canonical_json,
    check_tools,
    json_string_bytes,
    model_call,
    openai_request,
    prepare,
)
from host.policy.rules import LlmPolicy
from host.spec.config import AgentLlmConfig, LlmHostConfig

if TYPE_CHECKING:
    import anthropic
    import openai

logger = logging.getLogger("agentnode.sandbox.broker")
_T = TypeVar("_T")

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
    # OpenAI-compatible, with its own key and base URL.
    "openrouter": (
        "OPENROUTER_API_KEY",
        "OPENROUTER_BASE_URL",
        "https://openrouter.ai/api/v1",
        "openai/gpt-4o-mini",
    ),
}
_AUTO_DETECT = ("openai", "anthropic")  # the agentnode SDK's order, by which key is set
MAX_ENV_FILE_BYTES = 64 * 1024
"""A larger `.env` is refused: it is a handful of KEY=VALUE lines, never a data file."""
_KEYLESS = "not-needed"  # the SDK insists on a key; local openai_compatible servers ignore it
MAX_MESSAGES = 256
"""Messages one call may carry; more is LLM_INPUT_TOO_LARGE, refused before any message is looked at."""
MESSAGE_OVERHEAD_CHARS = 4
"""What each message adds to the input size besides its role and content: the structure around it (the
"\\n\\n" that joins system messages for Anthropic, 4 bytes once JSON-escaped, is paid by these and the
6 of "system"). Empty messages are not free, so many of them can never add up to a large request under a
small cap."""
FRAMING_BYTES_PER_MESSAGE = 16
"""Upper bound on the encoding overhead (field tags, length prefixes) of one message, one tool definition
or one tool call in a request."""
_CHARS_PER_TOKEN = 3  # conservative: real text averages ~4 chars/token, so the char cap is what bites
_MAX_TOKENS_CEILING = 16384
_CATALOG_FAILED = "the run's tool definitions cannot be read; the operator's host log says why"
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

# Fixed wording per wire reason: a refusal can never carry provider text, a key, a URL or the model name.
_REFUSAL_MESSAGES: dict[WireReason, str] = {
    WireReason.LLM_NOT_GRANTED: "LLM access is not granted to this run (llm_access.enabled is not declared "
    "or the host disabled it)",
    WireReason.INVALID_REQUEST: "the LLM request is malformed: messages must be a non-empty list of {role, "
    "content} with role system, user, assistant or tool and string content; tool calls only on assistant "
    "messages (unique ids, tools this request defines, arguments a JSON object), each answered by a tool "
    "message with its tool_call_id right after; tool_choice required needs tools; a response format is "
    "text, a JSON object or an object JSON schema with a name of [A-Za-z0-9_-]",
    WireReason.LLM_INPUT_TOO_LARGE: "LLM request exceeds the allowed input size",
    WireReason.LLM_MODEL_NOT_ALLOWED: "the host-configured LLM model is not allowed for this agent",
    WireReason.LLM_TOOL_NOT_ALLOWED: "the request offers the model a tool that is not among this run's tool "
    "definitions (ListTools: the tools of its allowlist)",
    WireReason.LLM_CALL_LIMIT: "LLM call limit reached for this run",
    WireReason.LLM_OUTPUT_TOO_LARGE: "LLM response exceeds the allowed output size",
    WireReason.LLM_RATE_LIMITED: "the LLM provider is rate-limiting the host; try again later",
    WireReason.LLM_TIMEOUT: "the LLM provider did not answer in time",
    WireReason.LLM_UNAVAILABLE: "the host's LLM provider is unavailable",
    WireReason.LLM_TOKEN_BUDGET: "the run's LLM token budget is used up (max_total_tokens)",
    WireReason.LLM_COST_BUDGET: "the run's LLM cost budget is used up (max_cost_usd)",
}


class LlmRefusal(CallRefusal):
    """A refused or failed LLM call; `message` is a fixed generic text per reason, so nothing leaks (a
    budget refusal's own fixed text names its cap)."""

    def __init__(self, reason: WireReason, message: str | None = None) -> None:
        super().__init__(reason, _REFUSAL_MESSAGES[reason] if message is None else message)


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


@dataclass(frozen=True)
class _Binding:
    """The provider the host resolved; the key is kept out of repr so it cannot reach a log by accident."""

    provider: str
    model: str
    base_url: str
    api_key: str = field(repr=False)


class _Adapter(Protocol):
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

    def reason_for(self, exc: Exception) -> WireReason:
        if isinstance(exc, self._timeouts):
            return WireReason.LLM_TIMEOUT
        if isinstance(exc, self._rate_limited):
            return WireReason.LLM_RATE_LIMITED
        return WireReason.LLM_UNAVAILABLE


def _openai_call(request: Prepared, call: Any, taken: set[str]) -> ModelToolCall:
    """A function call (a `custom` tool call names nothing the request defined: refused); `taken`: the ids
    of the completion's calls so far."""
    function = getattr(call, "function", None) if getattr(call, "type", None) == "function" else None
    if function is None:
        custom = getattr(call, "custom", None)
        return model_call(request, getattr(call, "id", None), getattr(custom, "name", ""), None, taken)
    return model_call(request, call.id, function.name, function.arguments, taken)


class _AnthropicAdapter:
    """Anthropic through the anthropic SDK's messages API; system messages go to `system=`, tool calls are
    tool_use blocks, a JSON response format is a forced response tool (host/llm/toolcalls.py)."""

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

    def reason_for(self, exc: Exception) -> WireReason:
        if isinstance(exc, self._timeouts):
            return WireReason.LLM_TIMEOUT
        if isinstance(exc, self._rate_limited):
            return WireReason.LLM_RATE_LIMITED
        return WireReason.LLM_UNAVAILABLE


# --- .env: parsed, never executed --------------------------------------------------------------------

_ENV_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=[ \t]*(.*)")
_LINE_BREAK = re.compile(r"\r\n|\n|\r")
_DOUBLE_QUOTED_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_TRAILER = re.compile(r"\s*(?:#.*)?")  # what may follow a closing quote


def _quoted(raw: str) -> tuple[str, str] | None:
    """A quoted value and what follows its closing quote, or None when the quote is never closed.

    Single quotes are literal; double quotes understand \\n \\t \\r \\" and \\\\ (other escapes are kept
    as written). A value never spans lines.
    """
    if raw[0] == "'":
        end = raw.find("'", 1)
        return None if end < 0 else (raw[1:end], raw[end + 1 :])
    out: list[str] = []
    i = 1
    while i < len(raw):
        char = raw[i]
        if char == "\\" and i + 1 < len(raw):
            out.append(_DOUBLE_QUOTED_ESCAPES.get(raw[i + 1], raw[i : i + 2]))
            i += 2
        elif char == '"':
            return "".join(out), raw[i + 1 :]
        else:
            out.append(char)
            i += 1
    return None


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """`KEY=VALUE` lines as a dict (a later line wins), the way operators write `.env` for python-dotenv.

    Accepted: blank lines and `#` comments; an optional `export `; whitespace around `=`; a value in single
    quotes (literal), double quotes (see `_quoted`) or none, where ` #` starts a comment and the value is
    stripped. Nothing is expanded (`$VAR` stays as written) and nothing is executed. Any other line (no
    `=`, a bad name, an unclosed quote, text after a closing quote) is ignored with a warning that names
    `source` and the line numbers only: a line may hold a key.
    """
    values: dict[str, str] = {}
    malformed: list[int] = []
    for number, line in enumerate(_LINE_BREAK.split(text), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ENV_LINE.fullmatch(line)
        if match is None:
            malformed.append(number)
            continue
        name, raw = match.group(1), match.group(2)
        if raw[:1] in ("'", '"'):
            quoted = _quoted(raw)
            if quoted is None or not _TRAILER.fullmatch(quoted[1]):
                malformed.append(number)
                continue
            value = quoted[0]
        else:
            value = re.split(r"\s#", raw, maxsplit=1)[0].strip()
        values[name] = value
    if malformed:
        shown = ", ".join(str(n) for n in malformed[:10]) + (", ..." if len(malformed) > 10 else "")
        logger.warning(
            "%s: ignored %d line(s) that are not KEY=VALUE (line %s)", source, len(malformed), shown
        )
    return values


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of the operator's `.env`, or {} when there is none; never touches `os.environ`.

    Refused with a ConfigError (naming the file, never its content) when it is not a regular file, larger
    than MAX_ENV_FILE_BYTES, unreadable or not UTF-8. A file other users may read or write is used, with a
    warning: they could read the keys, or point a base URL elsewhere and collect them.
    """
    hint = f"keep {path} a small KEY=VALUE text file readable only by you (chmod 600 {path})"
    try:
        # O_NONBLOCK: a FIFO planted at the path cannot hang the host; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open the .env file ({type(exc).__name__})", hint=hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: the .env file is not a regular file", hint=hint)
        if info.st_mode & 0o077:
            logger.warning(
                "%s is readable or writable by group or others (mode %o): run chmod 600 %s",
                path, stat.S_IMODE(info.st_mode), path,
            )  # fmt: skip
        data = b""
        try:
            while len(data) <= MAX_ENV_FILE_BYTES:  # one byte past the bound tells "too large"
                chunk = os.read(fd, MAX_ENV_FILE_BYTES + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            reason = type(exc).__name__
            raise ConfigError(f"{path}: cannot read the .env file ({reason})", hint=hint) from None
    finally:
        os.close(fd)
    if len(data) > MAX_ENV_FILE_BYTES:
        raise ConfigError(f"{path}: the .env file is larger than {MAX_ENV_FILE_BYTES} bytes", hint=hint)
    text: str | None = None
    with contextlib.suppress(UnicodeDecodeError):  # its message would quote bytes of the file
        text = data.decode("utf-8-sig")
    if text is None:
        raise ConfigError(f"{path}: the .env file is not UTF-8 text", hint=hint)
    return parse_env_text(text, str(path))


class _Credentials:
    """The variables the broker may use, each from the process environment or else the `.env` file.

    Only the names it was asked for are kept, with where each came from; an empty value counts as unset.
    Its repr holds names only.
    """

    ENV = "env"
    FILE = ".env"

    def __init__(self, env: Mapping[str, str], file_env: Mapping[str, str], names: set[str]) -> None:
        self._values: dict[str, tuple[str, str]] = {}
        for name in names:
            if env.get(name):
                self._values[name] = (env[name], self.ENV)
            elif file_env.get(name):
                self._values[name] = (file_env[name], self.FILE)

    def get(self, name: str) -> tuple[str, str] | None:
        """(value, "env" or ".env"), or None when neither has it."""
        return self._values.get(name)

    def __repr__(self) -> str:
        return f"_Credentials({sorted(self._values)})"


# --- provider resolution ---------------------------------------------------------------------------

SOURCE_HOST = "host config"
SOURCE_AGENT = "agent-config"
SOURCE_AUTO = "auto-detect"


@dataclass(frozen=True)
class _Resolution:
    """What serves one agent's calls and how it was chosen; `unavailable` says why nothing does.

    None of it is secret: provider, model, variable names, sources and file paths, never a key or URL.
    """

    binding: _Binding | None
    provider: str | None
    model: str | None
    provider_source: str | None
    key_variable: str | None = None
    key_source: str | None = None
    unavailable: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "configured": self.binding is not None,
            "provider_source": self.provider_source,
            "key_variable": self.key_variable,
            "key_source": self.key_source,
            "unavailable": self.unavailable or None,
        }


def _resolve(
    host: LlmHostConfig, creds: _Credentials, agent: AgentLlmConfig | None, slug: str | None
) -> _Resolution:
    """Provider, model, key and URL for one agent; the host config has the last word.

    provider: agent_sandbox.llm.provider, else agents.<slug>.llm.provider, else auto-detection (the first
    of OPENAI_API_KEY, ANTHROPIC_API_KEY that is set). The agent's model and api_key_env count only when its
    provider is the one in use. model: agent_sandbox.llm.model, else the agent's, else the provider default.
    key: the agent's api_key_env, else the provider's variable. base URL: agent_sandbox.llm.base_url, else
    the provider's URL variable, else its default. Variables: the process environment, else `.env`.
    """
    where = f"agents.{slug}.llm in {host.agent_config_file}"
    env_file = host.env_file or ".env"
    if host.provider is not None:
        provider, source = host.provider, SOURCE_HOST
        if agent is not None and agent.provider != provider:
            agent = None  # chosen for another provider: neither its model nor its key variable fits
    elif agent is not None:
        provider, source = agent.provider, SOURCE_AGENT
    else:
        detected = next((p for p in _AUTO_DETECT if creds.get(_PROVIDERS[p][0])), None)
        if detected is None:
            return _Resolution(
                None, None, host.model, None, unavailable="no LLM provider: set OPENAI_API_KEY or "
                f"ANTHROPIC_API_KEY (environment or {env_file}) or agent_sandbox.llm.provider",
            )  # fmt: skip
        provider, source = detected, SOURCE_AUTO
    agent_model = agent.model if agent is not None else None
    if provider not in _PROVIDERS:
        return _Resolution(
            None, provider, host.model or agent_model, source,
            unavailable=f"provider {provider} ({where}) is not supported by the broker (no {provider} SDK): "
            "choose openai, anthropic or openrouter there, or pin agent_sandbox.llm.provider",
        )  # fmt: skip
    key_var, url_var, default_url, default_model = _PROVIDERS[provider]
    if agent is not None and agent.api_key_env:
        key_var = agent.api_key_env
    model = host.model or agent_model or default_model
    found = creds.get(key_var)
    url_found = creds.get(url_var)
    url = host.base_url or (url_found[0] if url_found else default_url)
    key_source = found[1] if found else None
    if found:
        key = found[0]
    elif provider == "openai_compatible":
        key = _KEYLESS
    else:
        return _Resolution(
            None, provider, model, source, key_var, None,
            f"no API key for {provider}: {key_var} is set neither in the environment nor in {env_file}",
        )  # fmt: skip
    if not url:
        return _Resolution(
            None, provider, model, source, key_var, key_source,
            f"no base URL for {provider}: set agent_sandbox.llm.base_url or {url_var}",
        )  # fmt: skip
    sdk = "anthropic" if provider == "anthropic" else "openai"  # openrouter and compatible servers: openai's
    if importlib.util.find_spec(sdk) is None:
        return _Resolution(
            None, provider, model, source, key_var, key_source,
            f"the {sdk} SDK is not installed in the host's environment: "
            f"pip install 'agentnode-sandbox[{sdk}]'",
        )  # fmt: skip
    binding = _Binding(provider=provider, model=model, base_url=url, api_key=key)
    return _Resolution(binding, provider, model, source, key_var, key_source)


class LlmBroker:
    """One per host process: reads `.env` once, resolves each agent's provider, and builds each SDK client
    once, on first use.

    `env` is the process environment (os.environ when None); `.env` (host.env_file) only fills what it
    lacks, and neither is ever copied into os.environ or into any child's environment.
    """

    def __init__(
        self, host: LlmHostConfig, env: Mapping[str, str] | None = None, *, retry: RetryPolicy | None = None
    ) -> None:
        self._host = host
        self._retry = RetryPolicy() if retry is None else retry
        file_env = read_env_file(host.env_file) if host.env_file is not None else {}
        names = {var for spec in _PROVIDERS.values() for var in spec[:2]}
        names |= {a.api_key_env for a in host.agents.values() if a.api_key_env}
        self._creds = _Credentials(os.environ if env is None else env, file_env, names)
        self._default = _resolve(host, self._creds, None, None)
        self._adapters: dict[_Binding, _Adapter] = {}
        self._lock = threading.Lock()

    def _resolution(self, slug: str | None) -> _Resolution:
        agent = self._host.agents.get(slug) if slug else None
        return self._default if agent is None else _resolve(self._host, self._creds, agent, slug)

    def describe(self, slug: str | None = None) -> dict[str, Any]:
        """What would serve `slug`'s calls, for doctor and policy explain: provider, model, whether calls
        can be made, how they were chosen and why not; never the key or URL."""
        return self._resolution(slug).describe()

    def session(
        self, policy: LlmPolicy, slug: str | None = None, *, deadline: float | None = None
    ) -> LlmSession:
        """A fresh budget for one run of agent `slug` (its agent-config.json entry picks the provider);
        `deadline` (time.monotonic) bounds its provider retries."""
        return LlmSession(self, policy, self._resolution(slug), deadline=deadline)

    def _client(self, binding: _Binding) -> _Adapter:
        """The provider adapter for `binding`, built once; raises when the SDK cannot load."""
        with self._lock:
            adapter = self._adapters.get(binding)
            if adapter is None:
                build = _AnthropicAdapter if binding.provider == "anthropic" else _OpenAiAdapter
                adapter = self._adapters[binding] = build(binding, self._host.timeout_seconds)
            return adapter


class LlmSession:
    """One run's LLM budget; thread-safe. Checks run before any spend, and a call slot is reserved before
    the provider is called, so concurrent calls can never exceed `max_calls`.

    Order: granted → message count → tools on the run's catalog → well-formed → input size → provider
    configured → model allowed → token/cost budget (host/llm/budget.py: reserved, settled after the call) →
    call slot. Only the last two consume anything: a request refused earlier cost nothing and is not
    charged. A transient provider failure (429, 5xx, a reset connection) is retried within the call's one
    slot, with bounded backoff, never past the run's deadline nor after the run ended; the retry keeps the
    reservation unless the failed attempt may have been billed (see `_retrying`). The RPC layer runs
    `screen` first, on a request it has not even decoded yet.
    """

    def __init__(
        self,
        broker: LlmBroker,
        policy: LlmPolicy,
        resolution: _Resolution | None = None,
        *,
        deadline: float | None = None,
    ) -> None:
        self._broker = broker
        self._policy = policy
        self._resolution = broker._default if resolution is None else resolution
        self._lock = threading.Lock()
        # Token and cost budgets and provider retries (host/llm/budget.py): reserved in _admit, settled in
        # _settled; counts only, for the audit (budget_usage).
        self._budget = LlmBudget.for_policy(policy, broker._host.prices)
        self._retries = RetryCounts()
        self._deadline = deadline
        self._closed = threading.Event()  # the run ended: a provider retry waiting to start gives up
        self.trace = CallTrace()  # each admitted or refused call's timing, for the run's trace
        self._tools: Callable[[], ToolCatalog] | None = None
        self._catalog: ToolCatalog | None = None
        self._catalog_lock = threading.Lock()
        self._catalog_failed = False
        self._usage: dict[str, Any] = {
            "requests": 0,
            "calls": 0,
            "ok": 0,
            "refused_disabled": 0,
            "refused_limit": 0,
            "refused_input": 0,
            "refused_output": 0,
            "refused_model": 0,
            "refused_tool": 0,
            "provider_errors": 0,
            "tool_calls": 0,
            "tool_calls_refused": 0,
            "model": None,
        }

    def close(self) -> None:
        """The run ended: a call waiting to retry its provider gives up at once with its last failure."""
        self._closed.set()

    def use_tools(self, catalog: Callable[[], ToolCatalog]) -> None:
        """Where the run's tool catalog comes from (host/runtime/wiring.py); built on first use, once per run.
        Without it the run has no tools to offer a model."""
        self._tools = catalog

    def tool_catalog(self) -> ToolCatalog:
        """The tools this run may hand to a model (ListTools), built once; needs no LLM grant. A build that
        failed (the lockfile unreadable) fails every later ask the same way without building again."""
        with self._catalog_lock:
            if self._catalog_failed:
                raise LlmRefusal(WireReason.LLM_UNAVAILABLE, _CATALOG_FAILED)  # fresh: no frames kept
            if self._catalog is None:
                try:
                    self._catalog = self._tools() if self._tools is not None else EMPTY_CATALOG
                except Exception as exc:  # noqa: BLE001  logged by type; the agent gets a fixed refusal
                    self._catalog_failed = True
                    logger.warning("the run's tool definitions could not be built: %s", type(exc).__name__)
                    raise LlmRefusal(WireReason.LLM_UNAVAILABLE, _CATALOG_FAILED) from None
                if self._catalog.dropped:
                    logger.warning(
                        "%d declared tool(s) left out of this run's tool definitions (too many, too large, "
                        "or not an object schema)", self._catalog.dropped,
                    )  # fmt: skip
            return self._catalog

    @property
    def max_request_bytes(self) -> int:
        """The most bytes an admissible input can take encoded: the input size counts every text a request
        carries at least as its UTF-8 bytes (what protobuf carries), and each of at most MAX_MESSAGES
        messages, MAX_TOOLS tool definitions and MAX_TOOL_CALLS tool calls adds at most
        FRAMING_BYTES_PER_MESSAGE of framing."""
        if not self._policy.enabled:
            return 0
        framed = MAX_MESSAGES + MAX_TOOLS + MAX_TOOL_CALLS
        return self._policy.max_input_chars + FRAMING_BYTES_PER_MESSAGE * framed + 256

    def screen(
        self,
        *,
        request_bytes: int | None = None,
        message_count: int | None = None,
        tool_count: int | None = None,
    ) -> None:
        """The checks that need no message at all, so a request that cannot pass costs nothing to refuse.

        Granted, a call left, a token and cost budget not used up, an encoded size that could fit the input
        cap (`max_request_bytes`), at most MAX_MESSAGES messages and MAX_TOOLS tools. A refusal counts
        exactly as it would in `call`; passing counts nothing.
        """
        if not self._policy.enabled:
            self._refuse_request(WireReason.LLM_NOT_GRANTED, "refused_disabled")
        if self.calls_remaining == 0:
            self._refuse_request(WireReason.LLM_CALL_LIMIT, "refused_limit")
        try:
            self._budget.screen()
        except BudgetRefusal as refusal:
            self._count("requests")
            raise LlmRefusal(refusal.reason, refusal.message) from None
        too_many_bytes = request_bytes is not None and request_bytes > self.max_request_bytes
        if too_many_bytes or (message_count is not None and message_count > MAX_MESSAGES):
            self._refuse_request(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
        if tool_count is not None and tool_count > MAX_TOOLS:
            self._refuse_request(WireReason.LLM_TOOL_NOT_ALLOWED, "refused_tool")

    def call(
        self, request: LlmCall | Sequence[Mapping[str, Any]], *, on_admit: Callable[[], None] | None = None
    ) -> Completion:
        """One completion; raises LlmRefusal. `request` is an LlmCall or just its messages. `on_admit` runs
        once every check passed and a call was reserved, before the provider is called (the RPC layer counts
        the run as active from there)."""
        start = time.monotonic()
        try:
            completion = self._call(request, on_admit)
        except LlmRefusal as refusal:
            self._traced(start, str(refusal.reason), None, streamed=False)
            raise
        self._traced(start, "ok", completion, streamed=False)
        return completion

    def _traced(self, start: float, outcome: str, completion: Completion | None, *, streamed: bool) -> None:
        """Record one call's timing for the run's trace: its outcome and counts, never its text."""
        attributes: dict[str, str | int | bool] = {
            "agentnode.outcome": outcome,
            "agentnode.llm.streamed": streamed,
        }
        if completion is not None:
            attributes["agentnode.llm.input_tokens"] = max(0, completion.input_tokens)
            attributes["agentnode.llm.output_tokens"] = max(0, completion.output_tokens)
            attributes["agentnode.llm.tool_calls"] = len(completion.tool_calls)
        self.trace.add("agentnode.llm_call", start, attributes)

    def _call(
        self, request: LlmCall | Sequence[Mapping[str, Any]], on_admit: Callable[[], None] | None
    ) -> Completion:
        admitted = self._admit(_as_call(request), on_admit)
        reason = WireReason.LLM_OUTPUT_TOO_LARGE

        def complete() -> Completion:
            return admitted.adapter.complete(admitted.request, admitted.reservation.max_tokens)

        try:
            completion = self._retrying(complete, admitted)
        except BudgetRefusal as refusal:  # a retry the budget no longer covers (its attempt was charged)
            self._provider_failed(WireReason.LLM_UNAVAILABLE, refusal.__context__ or refusal)
            raise LlmRefusal(refusal.reason, refusal.message) from None
        except TooManyToolCalls:
            self._settled(admitted, None, generated=True)
            self._count("refused_output")
        except Exception as exc:  # noqa: BLE001  any provider failure becomes a generic refusal
            kind = admitted.adapter.reason_for(exc)
            # A call that timed out, or lost its connection once the request was sent, may have been
            # generating (and billed) all along: charge its whole reservation.
            self._settled(admitted, None, generated=_maybe_billed(kind, exc))
            reason = self._provider_failed(kind, exc)
        else:
            self._settled(admitted, completion)
            if completion.output_chars > self._policy.max_output_chars:
                self._refuse(WireReason.LLM_OUTPUT_TOO_LARGE, "refused_output")
            self._delivered(completion)
            return completion
        raise LlmRefusal(reason)  # outside the handler: the provider exception is not chained

    def stream(
        self, request: LlmCall | Sequence[Mapping[str, Any]], *, on_admit: Callable[[], None] | None = None
    ) -> Iterator[StreamItem]:
        """Text chunks and tool-call pieces (CallDelta) as they arrive, then one Completion with content ""
        (the text was already sent) and the completed tool calls.

        The output cap counts text and tool-call argument pieces together: at the cap it yields up to exactly
        `max_output_chars`, closes the provider stream and raises LlmRefusal(LLM_OUTPUT_TOO_LARGE). Closing
        this generator closes the provider stream. As a generator, it checks and sends nothing until the
        first `next()`; `on_admit` is as for `call`.
        """
        start = time.monotonic()
        outcome, final = "closed", None  # closed: the consumer stopped reading before the end
        try:
            with contextlib.closing(self._stream(request, on_admit)) as items:  # closing this closes it
                for item in items:
                    if isinstance(item, Completion):
                        outcome, final = "ok", item
                    yield item
        except LlmRefusal as refusal:
            outcome = str(refusal.reason)
            raise
        finally:
            self._traced(start, outcome, final, streamed=True)

    def _stream(
        self, request: LlmCall | Sequence[Mapping[str, Any]], on_admit: Callable[[], None] | None
    ) -> Generator[StreamItem, None, None]:
        admitted = self._admit(_as_call(request), on_admit)
        sent = 0
        final: Completion | None = None
        failed = started = False
        try:
            with contextlib.closing(self._retrying_stream(admitted)) as chunks:
                while True:
                    try:
                        item = next(chunks)
                    except BudgetRefusal as refusal:  # a retry the budget no longer covers
                        self._provider_failed(WireReason.LLM_UNAVAILABLE, refusal.__context__ or refusal)
                        raise LlmRefusal(refusal.reason, refusal.message) from None
                    except TooManyToolCalls:
                        reason = WireReason.LLM_OUTPUT_TOO_LARGE
                        self._count("refused_output")
                        break
                    except Exception as exc:  # noqa: BLE001  any provider failure becomes a generic refusal
                        kind = admitted.adapter.reason_for(exc)
                        failed = not started and not _maybe_billed(kind, exc)  # else it may have generated
                        reason = self._provider_failed(kind, exc)
                        break
                    started = True
                    if isinstance(item, Completion):
                        final = item
                        self._settled(admitted, final)
                        if final.output_chars > self._policy.max_output_chars:
                            # the final chunk re-sends the calls' canonical arguments: the cap holds there too
                            self._refuse(WireReason.LLM_OUTPUT_TOO_LARGE, "refused_output")
                        self._delivered(final)
                        yield final
                        return
                    size = len(item) if isinstance(item, str) else len(item.arguments)
                    room = self._policy.max_output_chars - sent
                    if size > room:
                        chunks.close()  # stop the spend now, even if the consumer never asks for more
                        self._count("refused_output")
                        if isinstance(item, str) and room:
                            yield item[:room]
                        elif isinstance(item, CallDelta) and (room or item.name):
                            yield dataclasses.replace(item, arguments=item.arguments[:room])
                        raise LlmRefusal(WireReason.LLM_OUTPUT_TOO_LARGE)
                    sent += size
                    yield item
        finally:
            if final is None:  # failed, cut at the cap, or closed by the consumer: usage never came
                self._settled(admitted, None, generated=not failed)
        raise LlmRefusal(reason)

    def usage(self) -> dict[str, Any]:
        """Counters and the host-side model name, for the audit record only (never sent to the sandbox)."""
        with self._lock:
            return dict(self._usage)

    def budget_usage(self) -> dict[str, Any]:
        """Token, cost and retry counts (host/llm/budget.py), for the audit record only."""
        return {**self._budget.totals(), **self._retries.totals()}

    def _retrying(self, attempt: Callable[[], _T], admitted: _Admitted) -> _T:
        """`attempt()`, retried on transient provider failures (429, 5xx, a reset connection) with bounded
        backoff inside the run's deadline and never after the run ended; the call keeps its one call slot.
        It keeps its budget reservation too, unless the failed attempt may have reached the provider (a
        connection lost after it was made): that attempt is charged in full and the retry reserves anew, or
        raises BudgetRefusal when the budget no longer covers it."""
        retry, counts = self._broker._retry, self._retries
        # A retry starts only if a whole attempt (up to the provider timeout) fits before the run's deadline.
        span = self._broker._host.timeout_seconds
        deadline = None if self._deadline is None else self._deadline - span

        def before_retry(kind: Transient, exc: BaseException) -> None:
            if kind is Transient.CONNECTION and may_have_reached_provider(exc):
                admitted.reservation = self._budget.renew(admitted.reservation)

        return call_with_retries(
            attempt,
            policy=retry,
            counts=counts,
            deadline=deadline,
            sleep=self._closed.wait,
            before_retry=before_retry,
        )

    def _retrying_stream(self, admitted: _Admitted) -> Generator[StreamItem, None, None]:
        """The adapter's stream, its opening (up to the first item) retried like a call; later failures are
        not (the agent may already have text)."""
        opened: list[Generator[StreamItem, None, None]] = []

        def first() -> StreamItem:
            if opened:
                opened.pop().close()
            opened.append(admitted.adapter.stream(admitted.request, admitted.reservation.max_tokens))
            return next(opened[0])

        try:
            item = self._retrying(first, admitted)
            yield item
            yield from opened[0]
        finally:
            for chunks in opened:
                chunks.close()

    @property
    def tokens_remaining(self) -> int | None:
        """The run's max_total_tokens left (settled and reserved tokens taken off); None without the cap."""
        return self._budget.tokens_left

    @property
    def calls_remaining(self) -> int:
        """Provider calls this run may still make."""
        if not self._policy.enabled:
            return 0
        with self._lock:
            return max(0, self._policy.max_calls - int(self._usage["calls"]))

    def _admit(self, call: LlmCall, on_admit: Callable[[], None] | None) -> _Admitted:
        """Run every check, reserve a call slot and return what the provider call needs."""
        self._count("requests")
        if not self._policy.enabled:
            self._refuse(WireReason.LLM_NOT_GRANTED, "refused_disabled")
        if isinstance(call.messages, Sequence) and len(call.messages) > MAX_MESSAGES:
            # before looking at a single message
            self._refuse(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
        try:
            tools = check_tools(call.tools, self.tool_catalog()) if call.tools else ()
        except Rejected as rejected:
            if rejected.reason == WireReason.LLM_TOOL_NOT_ALLOWED:
                self._refuse(rejected.reason, "refused_tool")
            raise LlmRefusal(rejected.reason) from None
        try:
            request = prepare(call, tools)
        except Rejected as rejected:
            raise LlmRefusal(rejected.reason) from None
        if request.chars > self._policy.max_input_chars:
            self._refuse(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
        binding = self._resolution.binding
        if binding is None:
            # Provider, variable names and file paths only: never a key, URL or model.
            logger.warning("LLM call refused: %s", self._resolution.unavailable)
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
        max_tokens = max(1, math.ceil(self._policy.max_output_chars / _CHARS_PER_TOKEN))
        max_tokens = min(_MAX_TOKENS_CEILING, max_tokens)
        # Budgets (host/llm/budget.py): reserved after every free check and before the call slot, in one step
        # under the budget's lock; max_tokens becomes what is left. A refusal names its cap (nothing spent).
        try:
            reservation = self._budget.reserve(_estimate(request), binding.model, output_limit=max_tokens)
        except BudgetRefusal as refusal:
            if refusal.unpriced:
                logger.warning("LLM call refused: max_cost_usd is set and %s", UNPRICED_HINT)
            raise LlmRefusal(refusal.reason, refusal.message) from None
        with self._lock:
            if self._usage["calls"] >= self._policy.max_calls:
                self._usage["refused_limit"] += 1
                self._budget.cancel(reservation)
                raise LlmRefusal(WireReason.LLM_CALL_LIMIT)
            self._usage["calls"] += 1
        if on_admit is not None:
            on_admit()
        return _Admitted(adapter, request, reservation)

    def _settled(
        self, admitted: _Admitted, completion: Completion | None, *, generated: bool = False
    ) -> None:
        """The provider call of `admitted` is over: `completion` carries the provider's own usage, None when
        it failed, was cut at the output cap or was closed early, before usage was known. Only the first
        call per admitted call counts (the budget ignores the rest).

        Settled from the provider's counts; without them a failed call is charged its input estimate and no
        output, one that `generated` output (cut at a cap, closed early) its whole reservation.
        """
        if completion is not None:
            self._budget.settle(admitted.reservation, completion.input_tokens, completion.output_tokens)
        elif generated:
            self._budget.settle(admitted.reservation, None, None)
        else:
            self._budget.release(admitted.reservation)

    def _delivered(self, completion: Completion) -> None:
        """A completion goes to the agent: count it and the model's tool calls (refused ones apart)."""
        refused = sum(1 for c in completion.tool_calls if c.refused)
        with self._lock:
            self._usage["ok"] += 1
            self._usage["tool_calls"] += len(completion.tool_calls)
            self._usage["tool_calls_refused"] += refused

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

    def _provider_failed(self, reason: WireReason, exc: BaseException) -> WireReason:
        """Count and log a provider failure by exception type only: its text may hold the key or prompt."""
        self._count("provider_errors")
        logger.warning("LLM provider call failed (%s): %s", reason, type(exc).__name__)
        return reason


@dataclass
class _Admitted:
    """A call that passed every check and holds a call slot: what its provider call needs. `reservation`
    changes when a retry reserves anew (LlmSession._retrying); its max_tokens is what each attempt asks."""

    adapter: _Adapter
    request: Prepared
    reservation: Reservation


def _estimate(request: Prepared) -> int:
    """The request's input-token bound (host/llm/budget): every text it sends, roles, names and ids, and the
    providers' hidden tool prompt when it defines tools or asks for JSON."""
    # Catalog names and the provider-safe names actually sent, both: whichever is longer is covered.
    names: list[str] = [x for t in request.tools for x in (t.name, request.names.get(t.name, ""))]
    calls = 0
    for m in request.messages:
        names += [m.role, m.tool_call_id]
        names += [x for c in m.tool_calls for x in (c.id, c.name, request.provider_name(c))]
        calls += len(m.tool_calls)
    return estimate_tokens(
        [*request.texts(), *names],
        messages=len(request.messages),
        tools=bool(request.tools) or request.json_mode,
        definitions=len(request.tools) + (1 if request.json_mode else 0),  # JSON mode: a response tool
        calls=calls,
    )


def _maybe_billed(kind: WireReason, exc: BaseException) -> bool:
    """The failed provider call may have generated (and been billed) up to its whole reservation: it timed
    out, or its connection was lost after the request may have reached the provider."""
    lost = transient_kind(exc) is Transient.CONNECTION and may_have_reached_provider(exc)
    return kind is WireReason.LLM_TIMEOUT or lost


def _as_call(request: LlmCall | Sequence[Mapping[str, Any]]) -> LlmCall:
    return request if isinstance(request, LlmCall) else LlmCall(messages=request)


def input_chars(messages: Sequence[Mapping[str, str]]) -> int:
    """The input size of plain {role, content} messages, as a call is capped on (`max_input_chars`): every
    role and every content as the bytes it takes in the request body (`json_string_bytes`: JSON-escaped,
    UTF-8), plus MESSAGE_OVERHEAD_CHARS per message. For plain ASCII text without quotes, backslashes or
    control characters that is one per character; text that escaping or UTF-8 makes longer on the wire
    counts what it sends, so no content shape can make a request several times the cap.

    It bounds what either adapter sends of roles and contents: OpenAI gets each as counted; Anthropic gets
    the non-system messages as counted plus the non-empty system contents joined by "\\n\\n" (4 bytes
    escaped), which is less than their roles, contents and overheads together. The rest of the body is
    JSON structure: at most a fixed ~25 bytes a message besides what is counted, and a few fields.

    A request with tools, tool calls, tool results or a response format counts those too
    (host/llm/toolcalls.prepare): tool definitions as the host sends them, call ids, names and arguments,
    result ids, the response schema, each the larger of what the agent sent and what the provider is sent.
    """
    return sum(
        json_string_bytes(m["role"]) + json_string_bytes(m["content"]) + MESSAGE_OVERHEAD_CHARS
        for m in messages
    )


__all__ = [
    "FRAMING_BYTES_PER_MESSAGE",
    "MAX_ENV_FILE_BYTES",
    "MAX_MESSAGES",
    "MESSAGE_OVERHEAD_CHARS",
    "Completion",
    "LlmBroker",
    "LlmCall",
    "LlmRefusal",
    "LlmSession",
    "StreamItem",
    "input_chars",
    "json_string_bytes",
    "parse_env_text",
    "read_env_file",
]
