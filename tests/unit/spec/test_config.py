"""Config paths, validation with key paths, the feature flag and the atomic image pin."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import AuditReason, ConfigError
from host.spec.config import (
    AgentLlmConfig,
    AgentSandboxConfig,
    KubernetesConfig,
    LimitsCeiling,
    LlmHostConfig,
    ModelPrice,
    agent_llm_configs,
    config_paths,
    load_config,
    sandbox_enabled,
    set_image_pin,
)


def _write(tmp_path: Path, data: Any) -> dict[str, str]:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return {"AGENTNODE_CONFIG": str(path)}


def _defaults_in(directory: Path, **llm: Any) -> AgentSandboxConfig:
    """The default sandbox config as load_config fills it in for a config in `directory`."""
    files = {"env_file": directory / ".env", "agent_config_file": directory / "agent-config.json"}
    return AgentSandboxConfig(llm=LlmHostConfig(**(files | llm)))


def test_default_paths_live_under_home(tmp_path: Path) -> None:
    paths = config_paths({"HOME": str(tmp_path)})
    base = tmp_path / ".agentnode"
    assert paths.config_file == base / "config.json"
    assert paths.dir == base
    assert paths.audit_file == base / "audit.jsonl"
    assert paths.lockfile == base / "agentnode.lock"
    assert paths.packs_dir == base / "packs"
    assert paths.env_file == base / ".env"
    assert paths.agent_config_file == base / "agent-config.json"


def test_agentnode_config_json_suffix_is_the_file(tmp_path: Path) -> None:
    paths = config_paths({"AGENTNODE_CONFIG": str(tmp_path / "host.json")})
    assert paths.config_file == tmp_path / "host.json"
    assert paths.dir == tmp_path
    assert paths.audit_file == tmp_path / "audit.jsonl"
    assert paths.env_file == tmp_path / ".env"
    assert paths.agent_config_file == tmp_path / "agent-config.json"


def test_agentnode_config_other_value_is_the_directory(tmp_path: Path) -> None:
    paths = config_paths({"AGENTNODE_CONFIG": str(tmp_path / "state")})
    assert paths.config_file == tmp_path / "state" / "config.json"
    assert paths.packs_dir == tmp_path / "state" / "packs"


def test_lockfile_override(tmp_path: Path) -> None:
    paths = config_paths({"AGENTNODE_CONFIG": str(tmp_path), "AGENTNODE_LOCKFILE": str(tmp_path / "x.lock")})
    assert paths.lockfile == tmp_path / "x.lock"
    assert paths.config_file == tmp_path / "config.json"


def test_audit_file_override(tmp_path: Path) -> None:
    """A node agent reads its config from a read-only ConfigMap and audits to the node's disk."""
    env = {"AGENTNODE_CONFIG": str(tmp_path / "ro"), "AGENTNODE_AUDIT_FILE": str(tmp_path / "rw" / "a.jsonl")}
    paths = config_paths(env)
    assert paths.audit_file == tmp_path / "rw" / "a.jsonl"
    assert paths.config_file == tmp_path / "ro" / "config.json"
    assert config_paths({"AGENTNODE_CONFIG": str(tmp_path)}).audit_file == tmp_path / "audit.jsonl"


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    cfg = load_config({"AGENTNODE_CONFIG": str(tmp_path / "nowhere")})
    assert cfg.agent_sandbox == _defaults_in(tmp_path / "nowhere")
    assert cfg.raw == {}
    assert cfg.agent_sandbox.runtime == "runc"
    assert cfg.agent_sandbox.idle_timeout_seconds == 60
    assert cfg.agent_sandbox.llm.timeout_seconds == 60.0


def test_full_config_is_converted(tmp_path: Path) -> None:
    env = _write(tmp_path, {
        "api_key_owner": {"kept": True},
        "agent_sandbox": {
            "enabled": True,
            "host_trust_policy": "curated_only",
            "image": "repo@sha256:abc",
            "runtime": "runsc",
            "tools": {"allowed_packages": ["web-search", "calc"]},
            "limits": {"max_tool_calls": 5, "max_runtime_seconds": 30, "max_iterations": 3},
            "llm": {
                "enabled": False, "max_calls": 50, "max_input_chars": 100, "max_output_chars": 200,
                "allowed_models": [], "provider": "openai_compatible", "model": "m",
                "base_url": "http://127.0.0.1:9", "timeout_seconds": 2.5,
            },
            "idle_timeout_seconds": 7,
        },
    })
    cfg = load_config(env)
    assert cfg.agent_sandbox == AgentSandboxConfig(
        enabled=True,
        host_trust_policy="curated_only",
        image="repo@sha256:abc",
        runtime="runsc",
        tools_allowed_packages=("web-search", "calc"),
        limits=LimitsCeiling(max_tool_calls=5, max_runtime_seconds=30, max_iterations=3),
        llm=LlmHostConfig(
            enabled=False, max_calls=50, max_input_chars=100, max_output_chars=200, allowed_models=(),
            provider="openai_compatible", model="m", base_url="http://127.0.0.1:9", timeout_seconds=2.5,
            env_file=tmp_path / ".env", agent_config_file=tmp_path / "agent-config.json",
        ),
        idle_timeout_seconds=7,
    )
    assert cfg.raw["api_key_owner"] == {"kept": True}


def test_null_means_unset_for_optional_keys(tmp_path: Path) -> None:
    env = _write(tmp_path, {"agent_sandbox": {"image": None, "llm": {"max_calls": None}, "limits": None}})
    sandbox = load_config(env).agent_sandbox
    assert sandbox.image is None
    assert sandbox.llm.max_calls is None
    assert sandbox.limits == LimitsCeiling()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"llm": {"max_calls": "x"}}, 'agent_sandbox.llm.max_calls: expected a positive integer, got "x"'),
        ({"llm": {"max_calls": 0}}, "agent_sandbox.llm.max_calls: expected a positive integer, got 0"),
        ({"llm": {"max_calls": True}}, "agent_sandbox.llm.max_calls: expected a positive integer, got true"),
        ({"llm": {"max_calls": 2.0}}, "agent_sandbox.llm.max_calls: expected a positive integer, got 2.0"),
        ({"enabled": "true"}, 'agent_sandbox.enabled: expected true or false, got "true"'),
        ({"llm": {"enabled": 1}}, "agent_sandbox.llm.enabled: expected true or false, got 1"),
        ({"runtime": "kata"}, 'agent_sandbox.runtime: expected one of runc, runsc, crun, got "kata"'),
        ({"host_trust_policy": "strict"}, "agent_sandbox.host_trust_policy: expected one of default,"),
        ({"llm": {"provider": "gemini"}}, "agent_sandbox.llm.provider: expected one of openai, anthropic,"),
        ({"image": ""}, 'agent_sandbox.image: expected a non-empty string, got ""'),
        ({"image": 5}, "agent_sandbox.image: expected a non-empty string, got 5"),
        ({"llm": {"timeout_seconds": -1}}, "agent_sandbox.llm.timeout_seconds: expected a positive number"),
        ({"llm": {"timeout_seconds": "5"}}, "agent_sandbox.llm.timeout_seconds: expected a positive number"),
        ({"llm": {"timeout_seconds": float("nan")}},
         "agent_sandbox.llm.timeout_seconds: expected a positive"),
        ({"llm": {"timeout_seconds": float("inf")}},
         "agent_sandbox.llm.timeout_seconds: expected a positive"),
        ({"idle_timeout_seconds": 1.5}, "agent_sandbox.idle_timeout_seconds: expected a positive integer"),
        ({"limits": {"max_iterations": -3}},
         "agent_sandbox.limits.max_iterations: expected a positive integer"),
        ({"llm": {"allowed_models": "gpt"}},
         "agent_sandbox.llm.allowed_models: expected a list of non-empty"),
        ({"llm": {"allowed_models": ["a", ""]}}, "agent_sandbox.llm.allowed_models: expected a list of non-"),
        ({"tools": {"allowed_packages": [1]}},
         "agent_sandbox.tools.allowed_packages: expected a list of non-"),
        ({"tools": []}, "agent_sandbox.tools: expected an object, got []"),
        ({"llm": "on"}, 'agent_sandbox.llm: expected an object, got "on"'),
        ({"limit": {}}, "agent_sandbox.limit: unknown key"),
        ({"llm": {"api_key": "sk-secret"}}, "agent_sandbox.llm.api_key: unknown key"),
        ({"limits": {"max_tool_call": 3}}, "agent_sandbox.limits.max_tool_call: unknown key"),
        ({"tools": {"allowed": []}}, "agent_sandbox.tools.allowed: unknown key"),
        ({"kubernetes": {"runtime_class": "gVisor!"}},
         'agent_sandbox.kubernetes.runtime_class: expected a DNS label (a RuntimeClass name), got "gVisor!"'),
        ({"kubernetes": {"socket_wait_seconds": 0}},
         "agent_sandbox.kubernetes.socket_wait_seconds: expected a positive integer"),
        ({"kubernetes": {"socket_wait_seconds": 601}},
         "agent_sandbox.kubernetes.socket_wait_seconds: expected at most"),
        ({"kubernetes": {"namespace": "x"}}, "agent_sandbox.kubernetes.namespace: unknown key"),
    ],
)
def test_invalid_values_name_the_key_path(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    env = _write(tmp_path, {"agent_sandbox": section})
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert str(info.value).startswith(message)
    assert info.value.reason == AuditReason.CONFIG_INVALID
    assert str(tmp_path / "config.json") in info.value.hint


def test_kubernetes_placement_defaults_and_overrides(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, {"agent_sandbox": {}})).agent_sandbox.kubernetes == KubernetesConfig()
    section = {"kubernetes": {"runtime_class": "gvisor-fast", "socket_wait_seconds": 30}}
    got = load_config(_write(tmp_path, {"agent_sandbox": section})).agent_sandbox.kubernetes
    assert got == KubernetesConfig(runtime_class="gvisor-fast", socket_wait_seconds=30)


def test_unknown_key_error_never_echoes_its_value(tmp_path: Path) -> None:
    env = _write(tmp_path, {"agent_sandbox": {"llm": {"api_key": "sk-secret"}}})
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert "sk-secret" not in str(info.value) + info.value.hint


def test_non_object_agent_sandbox_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^agent_sandbox: expected an object, got true"):
        load_config(_write(tmp_path, {"agent_sandbox": True}))


def test_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    env = _write(tmp_path, '{\n  "agent_sandbox": {\n    "enabled": tru\n  }\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert str(info.value).startswith(f"{tmp_path / 'config.json'}:3: invalid JSON")


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_config(_write(tmp_path, "[1, 2]"))


def test_other_top_level_keys_are_kept_and_ignored(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, {"registry": {"anything": [1, "x"]}, "telemetry": "whatever"}))
    assert cfg.agent_sandbox == _defaults_in(tmp_path)
    assert cfg.raw == {"registry": {"anything": [1, "x"]}, "telemetry": "whatever"}


def _cfg(tmp_path: Path, enabled: bool) -> Any:
    return load_config(_write(tmp_path, {"agent_sandbox": {"enabled": enabled}}))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), (" TRUE ", True), ("True\n", True), ("0", False), ("false", False),
     (" False", False)],
)
@pytest.mark.parametrize("config_enabled", [True, False])
def test_env_flag_wins(tmp_path: Path, value: str, expected: bool, config_enabled: bool) -> None:
    cfg = _cfg(tmp_path, config_enabled)
    assert sandbox_enabled(cfg, {"AGENTNODE_AGENT_SANDBOX": value}) is expected


@pytest.mark.parametrize("env", [{}, {"AGENTNODE_AGENT_SANDBOX": ""}, {"AGENTNODE_AGENT_SANDBOX": "  "}])
@pytest.mark.parametrize("config_enabled", [True, False])
def test_unset_env_defers_to_config(tmp_path: Path, env: dict[str, str], config_enabled: bool) -> None:
    assert sandbox_enabled(_cfg(tmp_path, config_enabled), env) is config_enabled


def test_flag_defaults_off(tmp_path: Path) -> None:
    assert sandbox_enabled(load_config({"AGENTNODE_CONFIG": str(tmp_path)}), {}) is False


@pytest.mark.parametrize("value", ["yes", "on", "2", "enabled"])
def test_unrecognised_flag_value_is_an_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        sandbox_enabled(_cfg(tmp_path, True), {"AGENTNODE_AGENT_SANDBOX": value})
    assert str(info.value).startswith("AGENTNODE_AGENT_SANDBOX: ")
    assert value in str(info.value)
    assert "agent_sandbox.enabled" in info.value.hint


def test_set_image_pin_creates_dir_and_file(tmp_path: Path) -> None:
    paths = config_paths({"AGENTNODE_CONFIG": str(tmp_path / "new" / "state")})
    set_image_pin(paths, "sha256:0123")
    assert stat.S_IMODE(paths.dir.stat().st_mode) == 0o700
    assert json.loads(paths.config_file.read_text()) == {"agent_sandbox": {"image": "sha256:0123"}}
    assert load_config({"AGENTNODE_CONFIG": str(paths.config_file)}).agent_sandbox.image == "sha256:0123"


def test_set_image_pin_keeps_other_keys(tmp_path: Path) -> None:
    original: dict[str, Any] = {
        "registry": {"url": "https://example.invalid", "n": [1, 2]},
        "agent_sandbox": {"enabled": True, "image": "old@sha256:aa", "llm": {"max_calls": 3}},
        "zeta": None,
    }
    env = _write(tmp_path, original)
    path = tmp_path / "config.json"
    os.chmod(path, 0o640)
    set_image_pin(config_paths(env), "repo@sha256:bb")
    written = json.loads(path.read_text())
    assert written == {**original, "agent_sandbox": {**original["agent_sandbox"], "image": "repo@sha256:bb"}}
    assert list(written) == ["registry", "agent_sandbox", "zeta"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_set_image_pin_refuses_to_clobber_a_broken_file(tmp_path: Path) -> None:
    env = _write(tmp_path, "{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        set_image_pin(config_paths(env), "sha256:1")
    assert (tmp_path / "config.json").read_text() == "{not json"


def test_set_image_pin_rejects_non_object_section(tmp_path: Path) -> None:
    env = _write(tmp_path, {"agent_sandbox": ["x"]})
    with pytest.raises(ConfigError, match=r"^agent_sandbox: expected an object"):
        set_image_pin(config_paths(env), "sha256:1")


def test_set_image_pin_that_cannot_be_written_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    paths = config_paths({"AGENTNODE_CONFIG": str(tmp_path)})
    monkeypatch.setattr("host.spec.config.os.fsync", disk_full)
    with pytest.raises(ConfigError) as info:
        set_image_pin(paths, "sha256:1")
    assert info.value.message == f"{paths.config_file}: cannot write the config (OSError)"
    assert str(tmp_path) in info.value.hint and list(tmp_path.iterdir()) == []  # no temporary file left


def test_set_image_pin_rejects_empty_ref(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        set_image_pin(config_paths({"AGENTNODE_CONFIG": str(tmp_path)}), "")
    assert not (tmp_path / "config.json").exists()


def test_runtime_has_a_default_host_ceiling(tmp_path: Path) -> None:
    """No run is unbounded: without a configured ceiling the pack format's own maximum applies."""
    assert load_config(_write(tmp_path, {})).agent_sandbox.limits.max_runtime_seconds == 3600
    raised = _write(tmp_path, {"agent_sandbox": {"limits": {"max_runtime_seconds": 7200}}})
    assert load_config(raised).agent_sandbox.limits.max_runtime_seconds == 7200


@pytest.mark.parametrize(
    "key",
    ["limits.max_runtime_seconds", "limits.max_tool_calls", "llm.max_calls", "llm.max_input_chars",
     "idle_timeout_seconds"],
)  # fmt: skip
def test_integers_that_cross_the_wire_must_fit_uint32(tmp_path: Path, key: str) -> None:
    section, _, name = key.rpartition(".")
    value: dict[str, Any] = {name: 2**32}
    data = {"agent_sandbox": {section: value} if section else value}
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, data))
    assert f"agent_sandbox.{key}: expected a positive integer up to 4294967295" in err.value.message
    value[name] = 2**32 - 1
    load_config(_write(tmp_path, data))


# --- agent_sandbox.llm.grant_declared and agent-config.json ------------------------------------------


def test_grant_declared_is_a_boolean_defaulting_to_false(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, {})).agent_sandbox.llm.grant_declared is False
    cfg = load_config(_write(tmp_path, {"agent_sandbox": {"llm": {"grant_declared": True}}}))
    assert cfg.agent_sandbox.llm.grant_declared is True
    with pytest.raises(ConfigError, match=r"^agent_sandbox\.llm\.grant_declared: expected true or false"):
        load_config(_write(tmp_path, {"agent_sandbox": {"llm": {"grant_declared": "yes"}}}))


def test_openrouter_can_be_pinned_on_the_host(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, {"agent_sandbox": {"llm": {"provider": "openrouter"}}}))
    assert cfg.agent_sandbox.llm.provider == "openrouter"


def _agent_config(tmp_path: Path, data: Any) -> dict[str, str]:
    env = _write(tmp_path, {})
    text = data if isinstance(data, str) else json.dumps(data)
    (tmp_path / "agent-config.json").write_text(text, encoding="utf-8")
    return env


def test_agent_config_entries_are_loaded_by_slug(tmp_path: Path) -> None:
    env = _agent_config(tmp_path, {
        "version": 1, "defaults": {"anything": True},  # the SDK's other keys are left alone
        "agents": {
            "writer": {"llm": {"provider": "anthropic", "model": "claude-x", "api_key_env": "MY_KEY"},
                       "notes": "kept"},
            "coder": {"llm": {"provider": "openrouter"}},
            "plain": {"other": 1},
            "nulled": None,
            "null-llm": {"llm": None},
        },
    })  # fmt: skip
    llm = load_config(env).agent_sandbox.llm
    assert llm.agent_config_file == tmp_path / "agent-config.json"
    assert llm.agents == {
        "writer": AgentLlmConfig("anthropic", "claude-x", "MY_KEY"),
        "coder": AgentLlmConfig("openrouter"),
    }


def test_missing_agent_config_or_agents_means_none(tmp_path: Path) -> None:
    assert agent_llm_configs(tmp_path / "absent.json") == {}
    assert load_config(_agent_config(tmp_path, {"other": 1})).agent_sandbox.llm.agents == {}


def test_gemini_is_accepted_by_the_validator(tmp_path: Path) -> None:
    env = _agent_config(tmp_path, {"agents": {"g": {"llm": {"provider": "gemini", "model": "gemini-pro"}}}})
    assert load_config(env).agent_sandbox.llm.agents == {"g": AgentLlmConfig("gemini", "gemini-pro")}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"agents": []}, "agents: expected an object, got []"),
        ({"agents": {"a": "openai"}}, 'agents.a: expected an object, got "openai"'),
        ({"agents": {"a": {"llm": "openai"}}}, 'agents.a.llm: expected an object, got "openai"'),
        ({"agents": {"a": {"llm": {}}}},
         "agents.a.llm.provider: expected one of openai, anthropic, openrouter, gemini, got null"),
        ({"agents": {"a": {"llm": {"provider": "azure"}}}},
         'agents.a.llm.provider: expected one of openai, anthropic, openrouter, gemini, got "azure"'),
        ({"agents": {"a": {"llm": {"provider": "openai_compatible"}}}},
         "agents.a.llm.provider: expected one of"),
        ({"agents": {"a": {"llm": {"provider": "openai", "model": ""}}}},
         'agents.a.llm.model: expected a non-empty string, got ""'),
        ({"agents": {"a": {"llm": {"provider": "openai", "model": 4}}}},
         "agents.a.llm.model: expected a non-empty string, got 4"),
        ({"agents": {"a": {"llm": {"provider": "openai", "base_url": "http://x"}}}},
         "agents.a.llm.base_url: unknown key (allowed: provider, model, api_key_env)"),
        ({"agents": {"a": {"llm": {"provider": "openai", "api_key_env": "1BAD"}}}},
         "agents.a.llm.api_key_env: expected the name of an environment variable"),
        ({"agents": {"a": {"llm": {"provider": "openai", "api_key_env": 5}}}},
         "agents.a.llm.api_key_env: expected the name of an environment variable"),
    ],
)  # fmt: skip
def test_agent_config_errors_name_the_file_and_key_path(tmp_path: Path, data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_agent_config(tmp_path, data))
    path = tmp_path / "agent-config.json"
    assert str(info.value).startswith(f"{path}: {message}")
    assert info.value.reason == AuditReason.CONFIG_INVALID
    assert str(path) in info.value.hint


def test_agent_config_invalid_json_names_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent-config\.json:2: invalid JSON"):
        load_config(_agent_config(tmp_path, '{"agents":\n {,}}'))


def test_agent_config_errors_never_echo_a_misplaced_key(tmp_path: Path) -> None:
    secret = "sk-proj-" + "A" * 40
    for llm in (
        {"provider": "openai", "api_key_env": secret},
        {"provider": secret},
        {"provider": "openai", "model": 7, secret: 1},
    ):
        with pytest.raises(ConfigError) as info:
            load_config(_agent_config(tmp_path, {"agents": {"a": {"llm": llm}}}))
        assert secret not in str(info.value) + info.value.hint
        assert "agents.a.llm." in str(info.value)


# --- token and cost ceilings, the price table ---------------------------------------------------------


def test_token_and_cost_ceilings_and_prices_are_converted(tmp_path: Path) -> None:
    llm = {
        "max_input_tokens": 4000, "max_output_tokens": 1000, "max_total_tokens": 50_000,
        "max_cost_usd": 0.25,
        "prices": {"gpt-4o-mini": {"input_per_million": 0.15, "output_per_million": 0.6},
                   "local/llama 3": {"input_per_million": 0, "output_per_million": 0}},
    }  # fmt: skip
    got = load_config(_write(tmp_path, {"agent_sandbox": {"llm": llm}})).agent_sandbox
    assert got == _defaults_in(
        tmp_path, max_input_tokens=4000, max_output_tokens=1000, max_total_tokens=50_000, max_cost_usd=0.25,
        prices={"gpt-4o-mini": ModelPrice(0.15, 0.6), "local/llama 3": ModelPrice(0.0, 0.0)},
    )  # fmt: skip
    assert isinstance(got.llm.prices["local/llama 3"].input_per_million, float)
    unset = load_config(_write(tmp_path, {"agent_sandbox": {"llm": {"prices": None, "max_cost_usd": None}}}))
    assert unset.agent_sandbox == _defaults_in(tmp_path)


def _price(input_price: Any = 1.0, output_price: Any = 2.0) -> dict[str, Any]:
    return {"input_per_million": input_price, "output_per_million": output_price}


@pytest.mark.parametrize(
    ("llm", "message"),
    [
        ({"max_total_tokens": 0}, "agent_sandbox.llm.max_total_tokens: expected a positive integer, got 0"),
        ({"max_input_tokens": 1.5}, "agent_sandbox.llm.max_input_tokens: expected a positive integer"),
        ({"max_output_tokens": 2**32},
         "agent_sandbox.llm.max_output_tokens: expected a positive integer up to"),
        ({"max_cost_usd": 0}, "agent_sandbox.llm.max_cost_usd: expected a positive number, got 0"),
        ({"max_cost_usd": -1}, "agent_sandbox.llm.max_cost_usd: expected a positive number"),
        ({"max_cost_usd": float("nan")}, "agent_sandbox.llm.max_cost_usd: expected a positive number"),
        ({"max_cost_usd": "1"}, "agent_sandbox.llm.max_cost_usd: expected a positive number"),
        ({"prices": []}, "agent_sandbox.llm.prices: expected an object mapping model names to prices"),
        ({"prices": {"m": 1.0}}, "agent_sandbox.llm.prices.m: expected an object, got 1.0"),
        ({"prices": {"m": {"input_per_million": 1}}},
         "agent_sandbox.llm.prices.m.output_per_million: required"),
        ({"prices": {"m": {**_price(), "currency": "EUR"}}},
         "agent_sandbox.llm.prices.m.currency: unknown key"),
        ({"prices": {"m": _price(-0.1)}},
         "agent_sandbox.llm.prices.m.input_per_million: expected a finite non-negative number"),
        ({"prices": {"m": _price(output_price=float("inf"))}},
         "agent_sandbox.llm.prices.m.output_per_million: expected a finite non-negative number"),
        ({"prices": {"m": _price(output_price=True)}},
         "agent_sandbox.llm.prices.m.output_per_million: expected a finite non-negative number"),
        ({"prices": {"m": _price("0.1")}},
         "agent_sandbox.llm.prices.m.input_per_million: expected a finite non-negative number"),
        ({"prices": {"m": _price(2e6)}},
         "agent_sandbox.llm.prices.m.input_per_million: expected a finite non-negative number (USD per "
         "million tokens) up to 1000000"),
        ({"prices": {"": _price()}}, "agent_sandbox.llm.prices: expected model names of 1 to 200 printable"),
        ({"prices": {"m\x1b[2J": _price()}}, "agent_sandbox.llm.prices: expected model names of 1 to 200"),
        ({"prices": {"m" * 201: _price()}}, "agent_sandbox.llm.prices: expected model names of 1 to 200"),
        ({"prices": {f"m{i}": _price() for i in range(257)}},
         'agent_sandbox.llm.prices: expected at most 256 models, got "257 models"'),
    ],
)  # fmt: skip
def test_budget_ceilings_and_prices_are_validated_naming_the_key(
    tmp_path: Path, llm: dict[str, Any], message: str
) -> None:
    env = _write(tmp_path, {"agent_sandbox": {"llm": llm}})
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert str(info.value).startswith(message)
    assert "\x1b" not in str(info.value)
    assert str(tmp_path / "config.json") in info.value.hint
