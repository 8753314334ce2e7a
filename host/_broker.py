"""The LLM credential broker: the only module that reads provider API keys, so they never leave the host.

Keys come from the process environment or, where it has none, from the `.env` beside the host config
(read here and nowhere else: parsed, never executed, never put into `os.environ` or a child's environment).
Which provider and model serve a run: the host config's `agent_sandbox.llm` pins win, then the agent's
entry in `agent-config.json`, then auto-detection (OPENAI_API_KEY, then ANTHROPIC_API_KEY).

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
import re
import stat
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from host._config import AgentLlmConfig, LlmHostConfig
from host._errors import CallRefusal, ConfigError
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
    binding = _Binding(provider=provider, model=model, base_url=url, api_key=key)
    return _Resolution(binding, provider, model, source, key_var, key_source)


class LlmBroker:
    """One per host process: reads `.env` once, resolves each agent's provider, and builds each SDK client
    once, on first use.

    `env` is the process environment (os.environ when None); `.env` (host.env_file) only fills what it
    lacks, and neither is ever copied into os.environ or into any child's environment.
    """

    def __init__(self, host: LlmHostConfig, env: Mapping[str, str] | None = None) -> None:
        self._host = host
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

    def session(self, policy: LlmPolicy, slug: str | None = None) -> LlmSession:
        """A fresh budget for one run of agent `slug` (its agent-config.json entry picks the provider)."""
        return LlmSession(self, policy, self._resolution(slug))

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

    Order: granted → message count → well-formed → input size → provider configured → model allowed →
    call slot. Only the last consumes a call: a request refused earlier cost nothing and is not charged.
    The RPC layer runs `screen` first, on a request it has not even decoded yet.
    """

    def __init__(self, broker: LlmBroker, policy: LlmPolicy, resolution: _Resolution | None = None) -> None:
        self._broker = broker
        self._policy = policy
        self._resolution = broker._default if resolution is None else resolution
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
    "MAX_ENV_FILE_BYTES",
    "MAX_MESSAGES",
    "MESSAGE_OVERHEAD_CHARS",
    "Completion",
    "LlmBroker",
    "LlmRefusal",
    "LlmSession",
    "input_chars",
    "json_string_bytes",
    "parse_env_text",
    "read_env_file",
]
