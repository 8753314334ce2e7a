"""Trust routing table, llm_access resolution and run-policy clamping: the host ceiling always wins."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import AuditReason, ConfigError, ManifestError
from host.core.vocab import Route
from host.policy.rules import (
    GRANT_DECLARED,
    GRANT_HOST_PATH,
    GRANT_LLM_ACCESS,
    HOST_PATH_LLM,
    LlmPolicy,
    declares_llm,
    resolve_llm_policy,
    resolve_run_policy,
    route_run,
)
from host.spec.config import AgentSandboxConfig, LimitsCeiling, LlmHostConfig
from host.spec.manifest.model import AgentManifest
from tests.support.cli import cli, json_out
from tests.support.packs import write_agent
from tests.support.schema import check_schema

SANDBOX, HOST, REFUSED = Route.SANDBOX, Route.HOST, Route.REFUSED

# (host_trust_policy, trust) -> (route with flag off, route with flag on)
TABLE: dict[str, dict[str, tuple[Route, Route]]] = {
    "default": {
        "verified": (REFUSED, SANDBOX),
        "unverified": (REFUSED, SANDBOX),
        "trusted": (HOST, HOST),
        "curated": (HOST, HOST),
    },
    "curated_only": {
        "verified": (REFUSED, SANDBOX),
        "unverified": (REFUSED, SANDBOX),
        "trusted": (REFUSED, SANDBOX),
        "curated": (HOST, HOST),
    },
    "none": {
        "verified": (REFUSED, SANDBOX),
        "unverified": (REFUSED, SANDBOX),
        "trusted": (REFUSED, SANDBOX),
        "curated": (REFUSED, SANDBOX),
    },
}
SPELLINGS: dict[str, Callable[[str], str]] = {
    "plain": str,
    "padded": lambda s: f" {s}\t\n",
    "upper": str.upper,
    "title": str.title,
}


@pytest.mark.parametrize("policy", list(TABLE))
@pytest.mark.parametrize("level", ["verified", "unverified", "trusted", "curated"])
@pytest.mark.parametrize("spelling", list(SPELLINGS))
@pytest.mark.parametrize("flag", [False, True])
def test_known_trust_levels(policy: str, level: str, spelling: str, flag: bool) -> None:
    decision = route_run(SPELLINGS[spelling](level), sandbox_enabled=flag, host_trust_policy=policy)
    expected = TABLE[policy][level][flag]
    assert decision.route is expected
    if expected is REFUSED:
        assert decision.reason == AuditReason.REFUSED_FLAG_OFF
        assert "AGENTNODE_AGENT_SANDBOX" in decision.message
        assert "agent_sandbox.enabled" in decision.message
    else:
        assert decision.reason == ""


@pytest.mark.parametrize("policy", list(TABLE))
@pytest.mark.parametrize("trust", [None, "", "   ", "bogus", "trusted-ish", "verified unverified", "root"])
@pytest.mark.parametrize("flag", [False, True])
def test_unknown_trust_is_always_refused(policy: str, trust: str | None, flag: bool) -> None:
    decision = route_run(trust, sandbox_enabled=flag, host_trust_policy=policy)
    assert decision.route is REFUSED
    assert decision.reason == AuditReason.REFUSED_TRUST
    assert decision.message


def test_refused_trust_message_does_not_echo_the_value() -> None:
    assert "\x1b" not in route_run("\x1b[2Jpwn", sandbox_enabled=True, host_trust_policy="default").message


def test_unknown_host_trust_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^agent_sandbox\.host_trust_policy: "):
        route_run("trusted", sandbox_enabled=True, host_trust_policy="lenient")


# --- llm_access -------------------------------------------------------------------------------------------

ON: dict[str, Any] = {"enabled": True}


@pytest.mark.parametrize(
    "block",
    [{}, {"enabled": False}, {"enabled": "true"}, {"enabled": 1}, {"enabled": "yes"}, {"enabled": None},
     {"max_calls": 5}],
)
def test_default_deny_only_literal_true_enables(block: dict[str, Any]) -> None:
    assert resolve_llm_policy(block, LlmHostConfig()) == LlmPolicy()


def test_literal_true_enables_with_builtin_ceilings() -> None:
    assert resolve_llm_policy(ON, LlmHostConfig()) == LlmPolicy(
        enabled=True, max_calls=20, max_input_chars=24_000, max_output_chars=24_000, allowed_models=None,
        granted_by=GRANT_LLM_ACCESS,
    )


def test_host_force_disable() -> None:
    assert resolve_llm_policy(ON, LlmHostConfig(enabled=False)) == LlmPolicy()


def test_host_enabled_true_does_not_override_manifest_deny() -> None:
    assert resolve_llm_policy({}, LlmHostConfig(enabled=True)).enabled is False


def test_manifest_request_below_ceiling_is_kept() -> None:
    policy = resolve_llm_policy({**ON, "max_calls": 3, "max_input_chars": 100, "max_output_chars": 50},
                                LlmHostConfig())
    assert (policy.max_calls, policy.max_input_chars, policy.max_output_chars) == (3, 100, 50)
    assert policy.clamped == ()


def test_manifest_request_above_builtin_is_clamped() -> None:
    policy = resolve_llm_policy({**ON, "max_calls": 100, "max_input_chars": 10}, LlmHostConfig())
    assert (policy.max_calls, policy.max_input_chars, policy.max_output_chars) == (20, 10, 24_000)
    assert policy.clamped == ("max_calls",)


def test_host_ceiling_lowers_manifest() -> None:
    host = LlmHostConfig(max_calls=2, max_input_chars=500, max_output_chars=600)
    block = {**ON, "max_calls": 5, "max_input_chars": 400, "max_output_chars": 9000}
    policy = resolve_llm_policy(block, host)
    assert (policy.max_calls, policy.max_input_chars, policy.max_output_chars) == (2, 400, 600)
    assert policy.clamped == ("max_calls", "max_output_chars")


def test_host_ceiling_may_exceed_builtins() -> None:
    host = LlmHostConfig(max_calls=500, max_input_chars=1_000_000, max_output_chars=100_000)
    assert resolve_llm_policy({**ON, "max_calls": 300}, host) == LlmPolicy(
        enabled=True, max_calls=300, max_input_chars=1_000_000, max_output_chars=100_000,
        granted_by=GRANT_LLM_ACCESS,
    )


@pytest.mark.parametrize(
    ("manifest_models", "host_models", "expected", "clamped"),
    [
        (None, None, None, ()),
        ([], None, frozenset(), ()),
        (None, (), frozenset(), ()),
        (["a", " b "], None, frozenset({"a", "b"}), ()),
        (None, ("a", "b"), frozenset({"a", "b"}), ()),
        (["a", "b"], ("b", "c"), frozenset({"b"}), ("allowed_models",)),
        (["a"], ("a", "b"), frozenset({"a"}), ()),
        (["a"], ("b",), frozenset(), ("allowed_models",)),
    ],
)
def test_allowed_models(
    manifest_models: list[str] | None,
    host_models: tuple[str, ...] | None,
    expected: frozenset[str] | None,
    clamped: tuple[str, ...],
) -> None:
    block = dict(ON) if manifest_models is None else {**ON, "allowed_models": manifest_models}
    policy = resolve_llm_policy(block, LlmHostConfig(allowed_models=host_models))
    assert policy.allowed_models == expected
    assert policy.clamped == clamped


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({**ON, "allowed_models": "gpt-4o"}, "allowed_models"),
        ({**ON, "allowed_models": [1, 2]}, "allowed_models"),
        ({**ON, "allowed_models": {"a": 1}}, "allowed_models"),
        ({**ON, "max_calls": 0}, "max_calls"),
        ({**ON, "max_calls": "10"}, "max_calls"),
        ({**ON, "max_input_chars": -5}, "max_input_chars"),
        ({**ON, "max_output_chars": 1.5}, "max_output_chars"),
        ({**ON, "max_output_chars": True}, "max_output_chars"),
        ({"enabled": False, "max_calls": "lots"}, "max_calls"),
    ],
)
def test_malformed_llm_access_is_a_manifest_error(block: dict[str, Any], key: str) -> None:
    with pytest.raises(ManifestError, match=rf"^agent\.llm_access\.{key}: "):
        resolve_llm_policy(block, LlmHostConfig())


# --- token and cost budgets ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "ceiling", "expected", "clamped"),
    [
        (None, None, None, False),
        (500, None, 500, False),
        (None, 800, 800, False),
        (500, 800, 500, False),
        (900, 800, 800, True),
        (800, 800, 800, False),
    ],
)
@pytest.mark.parametrize("key", ["max_input_tokens", "max_output_tokens", "max_total_tokens"])
def test_token_budgets_take_the_lower_of_request_and_ceiling(
    key: str, requested: int | None, ceiling: int | None, expected: int | None, clamped: bool
) -> None:
    block = {**ON} if requested is None else {**ON, key: requested}
    ceilings: dict[str, Any] = {key: ceiling}
    policy = resolve_llm_policy(block, LlmHostConfig(**ceilings))
    assert getattr(policy, key) == expected
    assert policy.clamped == ((key,) if clamped else ())


def test_cost_budget_takes_the_lower_and_names_a_lowered_request() -> None:
    host = LlmHostConfig(max_cost_usd=0.5, max_total_tokens=10_000)
    policy = resolve_llm_policy({**ON, "max_cost_usd": 2, "max_total_tokens": 20_000, "max_calls": 50}, host)
    assert (policy.max_cost_usd, policy.max_total_tokens) == (0.5, 10_000)
    assert policy.clamped == ("max_calls", "max_total_tokens", "max_cost_usd")
    assert resolve_llm_policy({**ON, "max_cost_usd": 0.25}, host).max_cost_usd == 0.25
    assert resolve_llm_policy(ON, LlmHostConfig()).max_cost_usd is None
    # Budgets in a block that is not granted grant nothing.
    assert resolve_llm_policy({"max_total_tokens": 5}, LlmHostConfig(max_total_tokens=9)) == LlmPolicy()


def test_run_policy_names_lowered_budgets_and_the_host_path_has_none() -> None:
    cfg = AgentSandboxConfig(llm=LlmHostConfig(max_output_tokens=100, max_cost_usd=1.0))
    manifest = _manifest(llm_access={"enabled": True, "max_output_tokens": 4000, "max_cost_usd": 0.5})
    policy = resolve_run_policy(manifest, cfg, sandboxed=True)
    assert (policy.llm.max_output_tokens, policy.llm.max_cost_usd) == (100, 0.5)
    assert policy.clamped == ("llm.max_output_tokens",)
    host = resolve_run_policy(manifest, cfg, sandboxed=False).llm
    assert (host.max_input_tokens, host.max_output_tokens, host.max_total_tokens, host.max_cost_usd) == (
        None, None, None, None
    )


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({**ON, "max_total_tokens": 0}, "max_total_tokens"),
        ({**ON, "max_input_tokens": "many"}, "max_input_tokens"),
        ({**ON, "max_output_tokens": 2**32}, "max_output_tokens"),
        ({**ON, "max_cost_usd": 0}, "max_cost_usd"),
        ({**ON, "max_cost_usd": -1.5}, "max_cost_usd"),
        ({**ON, "max_cost_usd": "1"}, "max_cost_usd"),
        ({**ON, "max_cost_usd": True}, "max_cost_usd"),
        ({**ON, "max_cost_usd": float("nan")}, "max_cost_usd"),
        ({**ON, "max_cost_usd": 2e6}, "max_cost_usd"),
    ],
)
def test_malformed_budgets_are_manifest_errors(block: dict[str, Any], key: str) -> None:
    with pytest.raises(ManifestError, match=rf"^agent\.llm_access\.{key}: "):
        resolve_llm_policy(block, LlmHostConfig())


# --- run policy -------------------------------------------------------------------------------------------


def _manifest(**overrides: Any) -> AgentManifest:
    fields: dict[str, Any] = {
        "slug": "a", "version": "1", "name": "a", "entrypoint": "a:run", "goal": "", "system_prompt": "",
        "allowed_packages": ("web", "calc", "web"), "max_tool_calls": 40, "max_runtime_seconds": 180,
        "max_iterations": 10, "llm_access": {}, "dependencies": (), "llm_required": False, "tier": "",
    }
    return AgentManifest(**{**fields, **overrides})


def test_sandboxed_without_ceilings_takes_the_manifest() -> None:
    policy = resolve_run_policy(_manifest(), AgentSandboxConfig(), sandboxed=True)
    assert policy.allowed_packages == ("web", "calc")
    assert (policy.max_tool_calls, policy.max_runtime_seconds, policy.max_iterations) == (40, 180, 10)
    assert policy.llm == LlmPolicy()
    assert policy.clamped == ()


def test_sandboxed_host_ceilings_win() -> None:
    cfg = AgentSandboxConfig(
        tools_allowed_packages=("calc", "other"),
        limits=LimitsCeiling(max_tool_calls=5, max_runtime_seconds=60, max_iterations=3),
        llm=LlmHostConfig(max_calls=4),
    )
    manifest = _manifest(llm_access={"enabled": True, "max_calls": 10})
    policy = resolve_run_policy(manifest, cfg, sandboxed=True)
    assert policy.allowed_packages == ("calc",)
    assert (policy.max_tool_calls, policy.max_runtime_seconds, policy.max_iterations) == (5, 60, 3)
    assert policy.llm.max_calls == 4
    assert policy.clamped == (
        "max_tool_calls", "max_runtime_seconds", "max_iterations", "tools.allowed_packages", "llm.max_calls"
    )


def test_sandboxed_ceilings_above_manifest_do_not_raise_limits() -> None:
    cfg = AgentSandboxConfig(
        tools_allowed_packages=("web", "calc", "extra"),
        limits=LimitsCeiling(max_tool_calls=400, max_runtime_seconds=900, max_iterations=99),
    )
    policy = resolve_run_policy(_manifest(), cfg, sandboxed=True)
    assert policy.allowed_packages == ("web", "calc")
    assert (policy.max_tool_calls, policy.max_runtime_seconds, policy.max_iterations) == (40, 180, 10)
    assert policy.clamped == ()


def test_an_absent_allowlist_means_any_installed_pack_under_the_host_ceiling() -> None:
    # The format (§1.8): an absent tool_access.allowed_packages is unrestricted; [] is no tools.
    unrestricted = _manifest(allowed_packages=None)
    for sandboxed in (True, False):
        policy = resolve_run_policy(unrestricted, AgentSandboxConfig(), sandboxed=sandboxed)
        assert policy.allowed_packages is None
    ceiling = AgentSandboxConfig(tools_allowed_packages=("web",))
    capped = resolve_run_policy(unrestricted, ceiling, sandboxed=True)
    assert (capped.allowed_packages, capped.clamped) == (("web",), ("tools.allowed_packages",))
    none = resolve_run_policy(_manifest(allowed_packages=[]), AgentSandboxConfig(), sandboxed=True)
    assert none.allowed_packages == ()


def test_sandboxed_host_empty_allowlist_refuses_all_tools() -> None:
    cfg = AgentSandboxConfig(tools_allowed_packages=())
    policy = resolve_run_policy(_manifest(), cfg, sandboxed=True)
    assert policy.allowed_packages == ()
    assert policy.clamped == ("tools.allowed_packages",)


def test_sandboxed_llm_is_resolved_from_manifest() -> None:
    manifest = _manifest(llm_access={"enabled": True, "allowed_models": ["m"]})
    policy = resolve_run_policy(manifest, AgentSandboxConfig(), sandboxed=True)
    assert policy.llm == LlmPolicy(True, 20, 24_000, 24_000, frozenset({"m"}), granted_by=GRANT_LLM_ACCESS)


def test_sandboxed_malformed_llm_access_raises() -> None:
    with pytest.raises(ManifestError):
        resolve_run_policy(_manifest(llm_access={"max_calls": 0}), AgentSandboxConfig(), sandboxed=True)


def test_host_path_has_no_llm_caps_and_ignores_tool_ceilings() -> None:
    cfg = AgentSandboxConfig(
        tools_allowed_packages=(),
        limits=LimitsCeiling(max_tool_calls=1, max_iterations=1),
        llm=LlmHostConfig(enabled=False, max_calls=1),
    )
    policy = resolve_run_policy(_manifest(llm_access={"enabled": False}), cfg, sandboxed=False)
    assert policy.allowed_packages == ("web", "calc")
    assert (policy.max_tool_calls, policy.max_runtime_seconds, policy.max_iterations) == (40, 180, 10)
    assert policy.llm == HOST_PATH_LLM
    assert policy.llm == LlmPolicy(True, 10_000, 10_000_000, 10_000_000, None, granted_by=GRANT_HOST_PATH)
    assert policy.clamped == ()


def test_host_path_runtime_ceiling_applies() -> None:
    cfg = AgentSandboxConfig(limits=LimitsCeiling(max_runtime_seconds=30))
    policy = resolve_run_policy(_manifest(allowed_packages=None), cfg, sandboxed=False)
    assert policy.max_runtime_seconds == 30
    assert policy.allowed_packages is None
    assert policy.clamped == ("max_runtime_seconds",)


# --- grant_declared -----------------------------------------------------------------------------------

GRANTING = LlmHostConfig(grant_declared=True)


@pytest.mark.parametrize(
    ("required", "tier", "declared"),
    [
        (False, "", False),
        (True, "", True),
        (False, "llm_only", True),
        (True, "llm_only", True),
        # Only llm_only declares LLM use, as in the agentnode SDK (format §1.8, §4.5).
        (False, "llm_plus_tools", False),
        (False, "llm_plus_credentials", False),
        (True, "llm_plus_tools", True),
    ],
)
def test_what_declares_llm_use(required: bool, tier: str, declared: bool) -> None:
    assert declares_llm(_manifest(llm_required=required, tier=tier)) is declared


def test_grant_declared_grants_a_declaring_pack_the_host_ceilings() -> None:
    assert resolve_llm_policy({}, GRANTING, declared=True) == LlmPolicy(
        enabled=True, max_calls=20, max_input_chars=24_000, max_output_chars=24_000, allowed_models=None,
        granted_by=GRANT_DECLARED,
    )
    host = LlmHostConfig(grant_declared=True, max_calls=3, max_input_chars=50, max_output_chars=60,
                         allowed_models=("m",))  # fmt: skip
    assert resolve_llm_policy({}, host, declared=True) == LlmPolicy(
        True, 3, 50, 60, frozenset({"m"}), granted_by=GRANT_DECLARED
    )


def test_grant_declared_off_keeps_default_deny() -> None:
    assert resolve_llm_policy({}, LlmHostConfig(), declared=True) == LlmPolicy()
    assert resolve_llm_policy({}, LlmHostConfig(enabled=True), declared=True) == LlmPolicy()


def test_grant_declared_does_not_grant_an_undeclaring_pack() -> None:
    assert resolve_llm_policy({}, GRANTING, declared=False) == LlmPolicy()


@pytest.mark.parametrize("declared", [False, True])
def test_an_explicit_enabled_decides_over_grant_declared(declared: bool) -> None:
    assert resolve_llm_policy({"enabled": False}, GRANTING, declared=declared) == LlmPolicy()
    granted = resolve_llm_policy({**ON, "max_calls": 2}, GRANTING, declared=declared)
    assert (granted.enabled, granted.max_calls, granted.granted_by) == (True, 2, GRANT_LLM_ACCESS)


def test_grant_declared_keeps_the_blocks_caps_and_models() -> None:
    block = {"max_calls": 100, "max_input_chars": 10, "allowed_models": ["a", "b"]}
    host = LlmHostConfig(grant_declared=True, allowed_models=("b",))
    policy = resolve_llm_policy(block, host, declared=True)
    assert (policy.enabled, policy.granted_by) == (True, GRANT_DECLARED)
    assert (policy.max_calls, policy.max_input_chars, policy.max_output_chars) == (20, 10, 24_000)
    assert policy.allowed_models == frozenset({"b"})
    assert policy.clamped == ("max_calls", "allowed_models")


def test_host_disable_wins_over_grant_declared() -> None:
    host = LlmHostConfig(enabled=False, grant_declared=True)
    assert resolve_llm_policy({}, host, declared=True) == LlmPolicy()


def test_grant_declared_still_validates_the_block() -> None:
    with pytest.raises(ManifestError, match=r"^agent\.llm_access\.max_calls: "):
        resolve_llm_policy({"max_calls": 0}, GRANTING, declared=True)


@pytest.mark.parametrize(
    ("overrides", "granted_by"),
    [
        ({"llm_required": True}, GRANT_DECLARED),
        ({"tier": "llm_only"}, GRANT_DECLARED),
        ({"tier": "llm_plus_tools"}, ""),
        ({}, ""),
        ({"llm_required": True, "llm_access": {"enabled": False}}, ""),
        ({"llm_required": True, "llm_access": {"enabled": True}}, GRANT_LLM_ACCESS),
    ],
)
def test_run_policy_grants_declaring_packs_when_the_host_says_so(
    overrides: dict[str, Any], granted_by: str
) -> None:
    cfg = AgentSandboxConfig(llm=LlmHostConfig(grant_declared=True, max_calls=7))
    llm = resolve_run_policy(_manifest(**overrides), cfg, sandboxed=True).llm
    assert (llm.enabled, llm.granted_by) == (bool(granted_by), granted_by)
    assert llm.max_calls == (7 if granted_by else 0)
    off = resolve_run_policy(_manifest(**overrides), AgentSandboxConfig(), sandboxed=True).llm
    assert off.granted_by == ("" if granted_by == GRANT_DECLARED else granted_by)


# --- policy explain: the grant and the provider binding, end to end ----------------------------------

EXPLAIN_KEY = "sk-explain-DOTENV-93"


def _explain_env(root: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root / "home"), "LANG": "C.UTF-8",
        "AGENTNODE_CONFIG": str(root / "state"), "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        "AGENTNODE_AGENT_SANDBOX": "1", **extra,
    }  # fmt: skip


def test_policy_explain_shows_the_grant_the_binding_and_no_key(tmp_path: Path) -> None:
    env = _explain_env(tmp_path)
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    # host_trust_policy none: trusted packs (installed without an engine) still get the sandbox policy.
    sandbox = {"host_trust_policy": "none", "llm": {"grant_declared": True}}
    (state / "config.json").write_text(json.dumps({"agent_sandbox": sandbox}))
    (state / "agent-config.json").write_text(json.dumps({"agents": {
        "declarer": {"llm": {"provider": "anthropic", "model": "claude-declared", "api_key_env": "DECL_KEY"}},
        "tiered": {"llm": {"provider": "gemini"}},
    }}))  # fmt: skip
    (state / ".env").write_text(f"export DECL_KEY='{EXPLAIN_KEY}'\nOPENAI_API_KEY={EXPLAIN_KEY}\n")
    (state / ".env").chmod(0o600)
    packs = {
        "declarer": "  llm:\n    required: true\n",
        "tiered": "  tier: llm_only\n",
        "optout": "  llm:\n    required: true\n  llm_access:\n    enabled: false\n",
        "silent": "  tier: llm_plus_tools\n",
    }
    explained = {}
    for slug, agent in packs.items():
        pack = write_agent(tmp_path / "src", slug, "def run(ctx):\n    return {}\n", agent=agent)
        proc = cli(env, "install", pack, "--trust", "trusted")
        assert proc.returncode == 0, proc.stderr
        proc = cli(env, "policy", "explain", slug, "--json")
        assert proc.returncode == 0, proc.stderr
        assert EXPLAIN_KEY not in proc.stdout + proc.stderr
        explained[slug] = p = json_out(proc)
        check_schema("policy-explain", p)
        assert p["route"] == "sandbox"
    llm = explained["declarer"]["llm"]
    assert (llm["enabled"], llm["granted_by"], llm["max_calls"]) == (True, "grant_declared", 20)
    assert explained["declarer"]["requested"]["llm"]["declared"] is True
    assert (llm["provider"], llm["model"], llm["configured"], llm["provider_source"]) == (
        "anthropic", "claude-declared", True, "agent-config"
    )
    assert (llm["key_variable"], llm["key_source"], llm["unavailable"]) == ("DECL_KEY", ".env", None)
    llm = explained["tiered"]["llm"]
    assert (llm["enabled"], llm["granted_by"], llm["provider"], llm["configured"]) == (
        True, "grant_declared", "gemini", False
    )
    assert "not supported" in llm["unavailable"]
    for slug in ("optout", "silent"):
        llm = explained[slug]["llm"]
        assert (llm["enabled"], llm["granted_by"], llm["max_calls"]) == (False, None, 0)
        binding = (llm["provider"], llm["provider_source"], llm["key_source"])
        assert binding == ("openai", "auto-detect", ".env")
    assert explained["optout"]["requested"]["llm"]["declared"] is True
    assert explained["silent"]["requested"]["llm"]["declared"] is False


def test_policy_explain_shows_budgets_prices_and_what_the_host_lowered(tmp_path: Path) -> None:
    env = _explain_env(tmp_path, OPENAI_API_KEY=EXPLAIN_KEY)
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    llm = {
        "max_total_tokens": 5000, "max_cost_usd": 0.5, "model": "gpt-priced",
        "prices": {"gpt-priced": {"input_per_million": 0.15, "output_per_million": 0.6}},
    }  # fmt: skip
    config = {"agent_sandbox": {"host_trust_policy": "none", "llm": llm}}
    (state / "config.json").write_text(json.dumps(config))
    agent = ("  llm_access:\n    enabled: true\n    max_input_tokens: 300\n    max_total_tokens: 9000\n"
             "    max_cost_usd: 0.25\n")  # fmt: skip
    pack = write_agent(tmp_path / "src", "budgeted", "def run(ctx):\n    return {}\n", agent=agent)
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    proc = cli(env, "policy", "explain", "budgeted", "--json")
    assert proc.returncode == 0, proc.stderr
    p = json_out(proc)
    check_schema("policy-explain", p)
    keys = ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd")
    got = {k: p["llm"][k] for k in keys}
    assert got == {"max_input_tokens": 300, "max_output_tokens": None, "max_total_tokens": 5000,
                   "max_cost_usd": 0.25}  # fmt: skip
    assert p["llm"]["price"] == {"input_per_million": 0.15, "output_per_million": 0.6}
    assert p["llm"]["clamped"] == ["max_total_tokens"] and "llm.max_total_tokens" in p["clamped"]
    requested = p["requested"]["llm"]
    assert (requested["max_total_tokens"], requested["max_cost_usd"], requested["max_output_tokens"]) == (
        9000, 0.25, None
    )
    human = cli(env, "policy", "explain", "budgeted").stdout
    assert "llm max_total_tokens:" in human and "5000 (lowered from 9000)" in human
    assert "0.15 / 0.6 USD per million" in human and "llm max_output_tokens" not in human

    # The model the host would call has no price: the cost cap refuses every call, and explain says so.
    llm["model"] = "gpt-unpriced"
    config = {"agent_sandbox": {"host_trust_policy": "none", "llm": llm}}
    (state / "config.json").write_text(json.dumps(config))
    p = json_out(cli(env, "policy", "explain", "budgeted", "--json"))
    check_schema("policy-explain", p)
    assert p["llm"]["price"] is None and p["llm"]["max_cost_usd"] == 0.25
    human = cli(env, "policy", "explain", "budgeted").stdout
    assert "max_cost_usd refuses every call" in human and "agent_sandbox.llm.prices" in human
    assert EXPLAIN_KEY not in human
