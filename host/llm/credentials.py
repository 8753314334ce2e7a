"""Provider API keys and which provider serves a run: the llm package is the only code that reads the keys,
and this module the only one of it that looks them up, so they never leave the host.

Keys come from the process environment or, where it has none, from the `.env` beside the host config
(read here and nowhere else: parsed, never executed, never put into `os.environ` or a child's environment).
Which provider and model serve a run: the host config's `agent_sandbox.llm` pins win, then the agent's
entry in `agent-config.json`, then auto-detection (OPENAI_API_KEY, then ANTHROPIC_API_KEY).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host.core.errors import ConfigError
from host.spec.config import AgentLlmConfig, LlmHostConfig

logger = logging.getLogger("agentnode.sandbox.broker")


# provider -> (API key variable, base URL variable, default base URL, default model). An
# openai_compatible server (Ollama, vLLM) has no default URL and may need no key.
PROVIDERS: dict[str, tuple[str, str, str | None, str]] = {
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


@dataclass(frozen=True)
class Binding:
    """The provider the host resolved; the key is kept out of repr so it cannot reach a log by accident."""

    provider: str
    model: str
    base_url: str
    api_key: str = field(repr=False)


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


class Credentials:
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
        return f"Credentials({sorted(self._values)})"


# --- provider resolution ---------------------------------------------------------------------------

SOURCE_HOST = "host config"
SOURCE_AGENT = "agent-config"
SOURCE_AUTO = "auto-detect"


@dataclass(frozen=True)
class Resolution:
    """What serves one agent's calls and how it was chosen; `unavailable` says why nothing does.

    None of it is secret: provider, model, variable names, sources and file paths, never a key or URL.
    """

    binding: Binding | None
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


def resolve(
    host: LlmHostConfig, creds: Credentials, agent: AgentLlmConfig | None, slug: str | None
) -> Resolution:
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
        detected = next((p for p in _AUTO_DETECT if creds.get(PROVIDERS[p][0])), None)
        if detected is None:
            return Resolution(
                None, None, host.model, None, unavailable="no LLM provider: set OPENAI_API_KEY or "
                f"ANTHROPIC_API_KEY (environment or {env_file}) or agent_sandbox.llm.provider",
            )  # fmt: skip
        provider, source = detected, SOURCE_AUTO
    agent_model = agent.model if agent is not None else None
    if provider not in PROVIDERS:
        return Resolution(
            None, provider, host.model or agent_model, source,
            unavailable=f"provider {provider} ({where}) is not supported by the broker (no {provider} SDK): "
            "choose openai, anthropic or openrouter there, or pin agent_sandbox.llm.provider",
        )  # fmt: skip
    key_var, url_var, default_url, default_model = PROVIDERS[provider]
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
        return Resolution(
            None, provider, model, source, key_var, None,
            f"no API key for {provider}: {key_var} is set neither in the environment nor in {env_file}",
        )  # fmt: skip
    if not url:
        return Resolution(
            None, provider, model, source, key_var, key_source,
            f"no base URL for {provider}: set agent_sandbox.llm.base_url or {url_var}",
        )  # fmt: skip
    sdk = "anthropic" if provider == "anthropic" else "openai"  # openrouter and compatible servers: openai's
    if importlib.util.find_spec(sdk) is None:
        return Resolution(
            None, provider, model, source, key_var, key_source,
            f"the {sdk} SDK is not installed in the host's environment: "
            f"pip install 'agentnode-sandbox[{sdk}]'",
        )  # fmt: skip
    binding = Binding(provider=provider, model=model, base_url=url, api_key=key)
    return Resolution(binding, provider, model, source, key_var, key_source)


__all__ = [
    "MAX_ENV_FILE_BYTES",
    "PROVIDERS",
    "SOURCE_AGENT",
    "SOURCE_AUTO",
    "SOURCE_HOST",
    "Binding",
    "Credentials",
    "Resolution",
    "parse_env_text",
    "read_env_file",
    "resolve",
]
