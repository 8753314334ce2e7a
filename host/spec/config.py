"""Host configuration: where state lives and the operator's ceilings, validated with key paths."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from host.core.errors import ConfigError
from host.core.paths import ADMIN_SOCKET_NAME, config_file_location
from host.core.vocab import Runtime
from host.spec.egress import EgressConfig, egress_config
from host.spec.files import FilesConfig, files_config

_T = TypeVar("_T")

FLAG_ENV = "AGENTNODE_AGENT_SANDBOX"
HOST_TRUST_POLICIES = ("default", "curated_only", "none")
PROVIDERS = ("openai", "anthropic", "openai_compatible", "openrouter")
AGENT_CONFIG_PROVIDERS = ("openai", "anthropic", "openrouter", "gemini")
"""What agent-config.json may name (the agentnode SDK's set); gemini is accepted but unavailable (no SDK)."""
ENV_FILE_NAME = ".env"
AGENT_CONFIG_NAME = "agent-config.json"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SLUG_SHOWN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_ECHO_MAX = 24
"""agent-config.json values longer than this are never echoed in an error: a misplaced API key must not be."""
WIRE_UINT32_MAX = 2**32 - 1
"""Limits cross to the sandbox as uint32 (session.proto): a larger number would not survive the wire."""
DEFAULT_MAX_RUNTIME_SECONDS = 3600
"""The runtime ceiling when the operator sets none (the pack format's own maximum): no run is unbounded."""
MAX_PRICED_MODELS = 256
"""Entries `agent_sandbox.llm.prices` may hold."""
MAX_MODEL_NAME_CHARS = 200
MAX_PRICE_PER_MILLION = 1_000_000.0
"""A price above this (USD per million tokens) is a typo, not a model."""


@dataclass(frozen=True)
class ConfigPaths:
    """Files the host owns, all beside the config file."""

    config_file: Path
    dir: Path
    audit_file: Path
    lockfile: Path
    packs_dir: Path
    env_file: Path
    """`.env`: API keys (and base URLs) the LLM broker, and only it, reads; the process environment wins."""
    agent_config_file: Path
    """`agent-config.json`: the agentnode SDK's per-agent LLM choice (`agents.<slug>.llm`)."""
    admin_socket: Path
    """`serve`'s default admin socket; `run` looks for a host listening on it (docs/cli.md)."""


@dataclass(frozen=True)
class AgentLlmConfig:
    """`agents.<slug>.llm` of agent-config.json: the provider, model and key variable chosen for one agent."""

    provider: str
    model: str | None = None
    api_key_env: str | None = None


@dataclass(frozen=True)
class ModelPrice:
    """One entry of `agent_sandbox.llm.prices`: USD per million input and output tokens (finite, >= 0)."""

    input_per_million: float
    output_per_million: float


@dataclass(frozen=True)
class LlmHostConfig:
    """`agent_sandbox.llm`: the host ceiling for brokered LLM access and the provider binding."""

    enabled: bool | None = None
    max_calls: int | None = None
    max_input_chars: int | None = None
    max_output_chars: int | None = None
    allowed_models: tuple[str, ...] | None = None
    max_input_tokens: int | None = None
    """Token ceilings (host/llm/budget): per call for input and output, per run in all; None: no ceiling."""
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    """Ceiling on a run's provider cost, priced from `prices`; a model without a price is refused under it."""
    prices: Mapping[str, ModelPrice] = field(default_factory=dict)
    """USD per million tokens by host-side model name (the model the provider is called with)."""
    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    timeout_seconds: float = 60.0
    grant_declared: bool = False
    """Grant LLM access, under the host ceilings, to packs that declare they need it (agent.llm.required or
    tier llm_only) but carry no `llm_access.enabled`."""
    # Not keys of `agent_sandbox.llm`: the operator's LLM files beside the config, filled in by load_config.
    env_file: Path | None = None
    """The `.env` the broker reads keys from (None: none); read by the broker only, never by this module."""
    agent_config_file: Path | None = None
    agents: Mapping[str, AgentLlmConfig] = field(default_factory=dict)
    """Validated `agents.<slug>.llm` entries of agent_config_file, by slug."""


@dataclass(frozen=True)
class LimitsCeiling:
    """`agent_sandbox.limits`: host ceilings on the manifest's limits."""

    max_tool_calls: int | None = None
    max_runtime_seconds: int = DEFAULT_MAX_RUNTIME_SECONDS
    max_iterations: int | None = None


@dataclass(frozen=True)
class PoolConfig:
    """`agent_sandbox.pool`: warm pools of a long-running host (`serve`); single-use members."""

    size: int = 2
    idle_ttl_seconds: int = 300
    memory_budget_mb: int = 4096


@dataclass(frozen=True)
class KubernetesConfig:
    """`agent_sandbox.kubernetes`: how runs are placed on a cluster (docs/kubernetes.md); the image is
    `agent_sandbox.image`, which there must be a registry reference pinned by digest."""

    runtime_class: str = "gvisor"
    """The RuntimeClass a runsc run's pod names (its handler is runsc); a runc run names none."""
    socket_wait_seconds: int = 120
    """How long a run pod's wrapper waits for the node agent to make its socket."""


@dataclass(frozen=True)
class AgentSandboxConfig:
    """`agent_sandbox`: everything the operator decides about sandboxed runs."""

    enabled: bool = False
    host_trust_policy: str = "default"
    image: str | None = None
    runtime: str = Runtime.RUNC.value
    tools_allowed_packages: tuple[str, ...] | None = None
    limits: LimitsCeiling = field(default_factory=LimitsCeiling)
    llm: LlmHostConfig = field(default_factory=LlmHostConfig)
    idle_timeout_seconds: int = 60
    pool: PoolConfig = field(default_factory=PoolConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    egress: EgressConfig = field(default_factory=EgressConfig)
    """What packs may reach through the host's egress path (host/spec/egress.py); default: nothing."""
    filesystem: FilesConfig = field(default_factory=FilesConfig)
    """The filesystem levels granted and the bounds of files in and out (host/spec/files.py)."""


@dataclass(frozen=True)
class HostConfig:
    """The loaded host configuration."""

    paths: ConfigPaths
    agent_sandbox: AgentSandboxConfig
    raw: Mapping[str, Any]


def config_paths(env: Mapping[str, str] | None = None) -> ConfigPaths:
    """Resolve every host-owned path so all modules agree on where state lives."""
    env = os.environ if env is None else env
    config_file = Path(config_file_location(env))
    directory = config_file.parent
    lock_override = env.get("AGENTNODE_LOCKFILE", "").strip()
    # a node agent's config is a read-only ConfigMap; its audit log lives on the node (docs/kubernetes.md)
    audit_override = env.get("AGENTNODE_AUDIT_FILE", "").strip()
    return ConfigPaths(
        config_file=config_file,
        dir=directory,
        audit_file=Path(audit_override).expanduser() if audit_override else directory / "audit.jsonl",
        lockfile=Path(lock_override).expanduser() if lock_override else directory / "agentnode.lock",
        packs_dir=directory / "packs",
        env_file=directory / ENV_FILE_NAME,
        agent_config_file=directory / AGENT_CONFIG_NAME,
        admin_socket=directory / ADMIN_SOCKET_NAME,
    )


def load_config(env: Mapping[str, str] | None = None) -> HostConfig:
    """Load and validate the config so a typo fails loudly instead of silently loosening a ceiling."""
    paths = config_paths(env)
    raw = _read_json(paths.config_file)
    section = raw.get("agent_sandbox")
    sandbox = AgentSandboxConfig() if section is None else _Validator(paths.config_file).sandbox(section)
    llm = replace(
        sandbox.llm,
        env_file=paths.env_file,
        agent_config_file=paths.agent_config_file,
        agents=agent_llm_configs(paths.agent_config_file),
    )
    return HostConfig(paths=paths, agent_sandbox=replace(sandbox, llm=llm), raw=raw)


def agent_llm_configs(path: Path) -> dict[str, AgentLlmConfig]:
    """The `agents.<slug>.llm` entries of agent-config.json, validated; a missing file has none.

    Only `agents`, each agent's object and its `llm` are checked: other keys belong to the agentnode SDK and
    are left alone. Inside `llm` only provider (required), model and api_key_env are allowed.
    """
    raw = _read_json(path)
    agents = raw.get("agents")
    if agents is None:
        return {}
    if not isinstance(agents, dict):
        raise _agent_error(path, "agents", "expected an object", agents)
    out: dict[str, AgentLlmConfig] = {}
    for slug, entry in agents.items():
        key = f"agents.{slug if _SLUG_SHOWN.fullmatch(slug) else _render(slug)}"
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise _agent_error(path, key, "expected an object", entry)
        llm = entry.get("llm")
        if llm is None:
            continue
        key += ".llm"
        if not isinstance(llm, dict):
            raise _agent_error(path, key, "expected an object", llm)
        for name in llm:
            if name not in ("provider", "model", "api_key_env"):
                shown = name if len(name) <= _ECHO_MAX else "(name not shown)"
                allowed = "unknown key (allowed: provider, model, api_key_env)"
                raise _agent_error(path, f"{key}.{shown}", allowed)
        provider = llm.get("provider")
        if provider not in AGENT_CONFIG_PROVIDERS:
            raise _agent_error(
                path, f"{key}.provider", f"expected one of {', '.join(AGENT_CONFIG_PROVIDERS)}", provider
            )
        model = llm.get("model")
        if model is not None and (not isinstance(model, str) or not model):
            raise _agent_error(path, f"{key}.model", "expected a non-empty string", model)
        key_env = llm.get("api_key_env")
        if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env)):
            # Never echoed: a key pasted where its variable's name belongs is the likely mistake.
            raise _agent_error(
                path, f"{key}.api_key_env", "expected the name of an environment variable, such as "
                "OPENAI_API_KEY (the value is not shown: it may be a key)"
            )
        out[slug] = AgentLlmConfig(provider=str(provider), model=model, api_key_env=key_env)
    return out


_NOT_SHOWN = object()


def _echo(value: Any) -> str:
    """An agent-config.json value for an error message; a long string is not shown (it may be a key)."""
    if isinstance(value, str) and len(value) > _ECHO_MAX:
        return "(a string, not shown)"
    return _render(value)


def _agent_error(path: Path, key: str, expected: str, value: Any = _NOT_SHOWN) -> ConfigError:
    got = "" if value is _NOT_SHOWN else f", got {_echo(value)}"
    return ConfigError(f"{path}: {key}: {expected}{got}", hint=f"Edit {key} in {path}.")


def sandbox_enabled(cfg: HostConfig, env: Mapping[str, str] | None = None) -> bool:
    """The feature flag: the environment wins over the config; an unrecognised value is an error, not off."""
    env = os.environ if env is None else env
    value = env.get(FLAG_ENV, "").strip().lower()
    if not value:
        return cfg.agent_sandbox.enabled
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise ConfigError(
        f"{FLAG_ENV}: expected one of 1, true, 0, false, got {_render(env[FLAG_ENV])}",
        hint=f"Set {FLAG_ENV} to 1 or 0, or unset it to use agent_sandbox.enabled in "
        f"{cfg.paths.config_file}.",
    )


def set_image_pin(paths: ConfigPaths, image_ref: str) -> None:
    """Record the pinned image atomically, keeping every other key other tools own."""
    if not isinstance(image_ref, str) or not image_ref:
        raise ValueError("image_ref must be a non-empty string")
    raw = dict(_read_json(paths.config_file))
    section = raw.get("agent_sandbox", {})
    if not isinstance(section, dict):
        raise _error(paths.config_file, "agent_sandbox", "expected an object", section)
    raw["agent_sandbox"] = {**section, "image": image_ref}
    try:
        paths.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".config.", suffix=".tmp", dir=paths.dir)
    except OSError as exc:
        raise _unwritable(paths.config_file, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(raw, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if paths.config_file.exists():
            os.chmod(tmp, paths.config_file.stat().st_mode & 0o777)
        os.replace(tmp, paths.config_file)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _unwritable(paths.config_file, exc) from None
        raise


def _unwritable(path: Path, exc: OSError) -> ConfigError:
    return ConfigError(
        f"{path}: cannot write the config ({type(exc).__name__})",
        hint=f"check free space and the permissions of {path.parent}, then try again",
    )


def _read_json(path: Path) -> dict[str, Any]:
    """The config file's top-level object; a missing file is an empty config."""
    hint = f"Fix the JSON in {path}."
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({type(exc).__name__})", hint=hint) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}", hint=hint) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level", hint=hint)
    return data


def _render(value: Any) -> str:
    """A short JSON rendering of an offending value for an error message."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _error(config_file: Path, key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(
        f"{key}: {expected}, got {_render(value)}",
        hint=f"Edit {key} in {config_file}.",
    )


def _unset_is_empty(value: Any) -> Any:
    """An absent or `null` sub-section means "no settings", not a type error."""
    return {} if value is None else value


class _Validator:
    """Walks `agent_sandbox`, converting each key and naming its full path on failure."""

    def __init__(self, config_file: Path) -> None:
        self.config_file = config_file

    def fail(self, key: str, expected: str, value: Any) -> ConfigError:
        return _error(self.config_file, key, expected, value)

    def section(self, value: Any, key: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, "expected an object", value)
        for name in value:
            if name not in allowed:
                raise ConfigError(
                    f"{key}.{name}: unknown key (allowed: {', '.join(allowed)})",
                    hint=f"Remove or correct {key}.{name} in {self.config_file}.",
                )
        return value

    def optional(self, data: Mapping[str, Any], key: str, check: Callable[[Any, str], _T]) -> _T | None:
        """`null` or absence means "not set" for keys whose default is unset."""
        value = data.get(key.rsplit(".", 1)[-1])
        return None if value is None else check(value, key)

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, "expected true or false", value)
        return value

    def positive_int(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, "expected a positive integer", value)
        if value > WIRE_UINT32_MAX:
            raise self.fail(key, f"expected a positive integer up to {WIRE_UINT32_MAX}", value)
        return value

    def non_negative_int(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(key, "expected a non-negative integer", value)
        return value

    def positive_number(self, value: Any, key: str) -> float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise self.fail(key, "expected a positive number", value)
        return float(value)

    def price(self, value: Any, key: str) -> float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not 0 <= value <= MAX_PRICE_PER_MILLION:
            raise self.fail(
                key, f"expected a finite non-negative number (USD per million tokens) up to "
                f"{MAX_PRICE_PER_MILLION:.0f}", value,
            )  # fmt: skip
        return float(value)

    def prices(self, value: Any, key: str) -> dict[str, ModelPrice]:
        """`{"<model>": {"input_per_million": x, "output_per_million": y}}`, both numbers required."""
        if not isinstance(value, dict):
            raise self.fail(key, "expected an object mapping model names to prices", value)
        if len(value) > MAX_PRICED_MODELS:
            raise self.fail(key, f"expected at most {MAX_PRICED_MODELS} models", f"{len(value)} models")
        out: dict[str, ModelPrice] = {}
        for model, entry in value.items():
            if not model or len(model) > MAX_MODEL_NAME_CHARS or not model.isprintable():
                raise self.fail(
                    key, f"expected model names of 1 to {MAX_MODEL_NAME_CHARS} printable characters", model
                )
            where = f"{key}.{model}"
            data = self.section(entry, where, ("input_per_million", "output_per_million"))
            for name in ("input_per_million", "output_per_million"):
                if name not in data:
                    raise ConfigError(
                        f"{where}.{name}: required (USD per million tokens)",
                        hint=f"Add {where}.{name} in {self.config_file}.",
                    )
            out[model] = ModelPrice(
                input_per_million=self.price(data["input_per_million"], f"{where}.input_per_million"),
                output_per_million=self.price(data["output_per_million"], f"{where}.output_per_million"),
            )
        return out

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, "expected a non-empty string", value)
        return value

    def choice(self, choices: tuple[str, ...]) -> Callable[[Any, str], str]:
        def check(value: Any, key: str) -> str:
            if value not in choices:
                raise self.fail(key, f"expected one of {', '.join(choices)}", value)
            return str(value)

        return check

    def names(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, "expected a list of non-empty strings", value)
        return tuple(value)

    def sandbox(self, value: Any) -> AgentSandboxConfig:
        key = "agent_sandbox"
        allowed = ("enabled", "host_trust_policy", "image", "runtime", "tools", "limits", "llm",
                   "idle_timeout_seconds", "pool", "kubernetes", "egress", "filesystem")
        data = self.section(value, key, allowed)
        d = AgentSandboxConfig()
        enabled = self.optional(data, f"{key}.enabled", self.boolean)
        policy = self.optional(data, f"{key}.host_trust_policy", self.choice(HOST_TRUST_POLICIES))
        runtime = self.optional(data, f"{key}.runtime", self.choice(tuple(r.value for r in Runtime)))
        idle = self.optional(data, f"{key}.idle_timeout_seconds", self.positive_int)
        tools = self.section(_unset_is_empty(data.get("tools")), f"{key}.tools", ("allowed_packages",))
        return AgentSandboxConfig(
            enabled=d.enabled if enabled is None else enabled,
            host_trust_policy=policy or d.host_trust_policy,
            image=self.optional(data, f"{key}.image", self.text),
            runtime=runtime or d.runtime,
            tools_allowed_packages=self.optional(tools, f"{key}.tools.allowed_packages", self.names),
            limits=self.limits(_unset_is_empty(data.get("limits")), f"{key}.limits"),
            llm=self.llm(_unset_is_empty(data.get("llm")), f"{key}.llm"),
            idle_timeout_seconds=idle or d.idle_timeout_seconds,
            pool=self.pool(_unset_is_empty(data.get("pool")), f"{key}.pool"),
            kubernetes=self.kubernetes(_unset_is_empty(data.get("kubernetes")), f"{key}.kubernetes"),
            egress=egress_config(_unset_is_empty(data.get("egress")), f"{key}.egress", self.fail),
            filesystem=files_config(data.get("filesystem"), f"{key}.filesystem", self.fail),
        )

    def kubernetes(self, value: Any, key: str) -> KubernetesConfig:
        data = self.section(value, key, ("runtime_class", "socket_wait_seconds"))
        d = KubernetesConfig()
        runtime_class = self.optional(data, f"{key}.runtime_class", self.text)
        if runtime_class is not None and not _DNS_LABEL.fullmatch(runtime_class):
            expected = "expected a DNS label (a RuntimeClass name)"
            raise self.fail(f"{key}.runtime_class", expected, runtime_class)
        wait = self.optional(data, f"{key}.socket_wait_seconds", self.positive_int)
        if wait is not None and wait > 600:
            raise self.fail(f"{key}.socket_wait_seconds", "expected at most 600", wait)
        return KubernetesConfig(
            runtime_class=runtime_class or d.runtime_class, socket_wait_seconds=wait or d.socket_wait_seconds
        )

    def pool(self, value: Any, key: str) -> PoolConfig:
        data = self.section(value, key, ("size", "idle_ttl_seconds", "memory_budget_mb"))
        d = PoolConfig()
        size = self.optional(data, f"{key}.size", self.non_negative_int)
        ttl = self.optional(data, f"{key}.idle_ttl_seconds", self.positive_int)
        budget = self.optional(data, f"{key}.memory_budget_mb", self.positive_int)
        return PoolConfig(
            size=d.size if size is None else size,
            idle_ttl_seconds=ttl or d.idle_ttl_seconds,
            memory_budget_mb=budget or d.memory_budget_mb,
        )

    def limits(self, value: Any, key: str) -> LimitsCeiling:
        data = self.section(value, key, ("max_tool_calls", "max_runtime_seconds", "max_iterations"))
        return LimitsCeiling(
            max_tool_calls=self.optional(data, f"{key}.max_tool_calls", self.positive_int),
            max_runtime_seconds=self.optional(data, f"{key}.max_runtime_seconds", self.positive_int)
            or DEFAULT_MAX_RUNTIME_SECONDS,
            max_iterations=self.optional(data, f"{key}.max_iterations", self.positive_int),
        )

    def llm(self, value: Any, key: str) -> LlmHostConfig:
        allowed = ("enabled", "max_calls", "max_input_chars", "max_output_chars", "allowed_models",
                   "max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd", "prices",
                   "provider", "model", "base_url", "timeout_seconds", "grant_declared")
        data = self.section(value, key, allowed)
        timeout = self.optional(data, f"{key}.timeout_seconds", self.positive_number)
        grant_declared = self.optional(data, f"{key}.grant_declared", self.boolean)
        prices = self.optional(data, f"{key}.prices", self.prices)
        return LlmHostConfig(
            enabled=self.optional(data, f"{key}.enabled", self.boolean),
            max_calls=self.optional(data, f"{key}.max_calls", self.positive_int),
            max_input_chars=self.optional(data, f"{key}.max_input_chars", self.positive_int),
            max_output_chars=self.optional(data, f"{key}.max_output_chars", self.positive_int),
            allowed_models=self.optional(data, f"{key}.allowed_models", self.names),
            max_input_tokens=self.optional(data, f"{key}.max_input_tokens", self.positive_int),
            max_output_tokens=self.optional(data, f"{key}.max_output_tokens", self.positive_int),
            max_total_tokens=self.optional(data, f"{key}.max_total_tokens", self.positive_int),
            max_cost_usd=self.optional(data, f"{key}.max_cost_usd", self.positive_number),
            prices={} if prices is None else prices,
            provider=self.optional(data, f"{key}.provider", self.choice(PROVIDERS)),
            model=self.optional(data, f"{key}.model", self.text),
            base_url=self.optional(data, f"{key}.base_url", self.text),
            timeout_seconds=LlmHostConfig.timeout_seconds if timeout is None else timeout,
            grant_declared=bool(grant_declared),
        )
