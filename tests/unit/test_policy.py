"""Trust routing table, llm_access resolution and run-policy clamping: the host ceiling always wins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from host._config import AgentSandboxConfig, LimitsCeiling, LlmHostConfig
from host._errors import AuditReason, ConfigError, ManifestError
from host._manifest import AgentManifest
from host._policy import (
    HOST_PATH_LLM,
    LlmPolicy,
    resolve_llm_policy,
    resolve_run_policy,
    route_run,
)
from host._vocab import Route

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
        enabled=True, max_calls=20, max_input_chars=24_000, max_output_chars=24_000, allowed_models=None
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
        enabled=True, max_calls=300, max_input_chars=1_000_000, max_output_chars=100_000
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


# --- run policy -------------------------------------------------------------------------------------------


def _manifest(**overrides: Any) -> AgentManifest:
    fields: dict[str, Any] = {
        "slug": "a", "version": "1", "name": "a", "entrypoint": "a:run", "goal": "", "system_prompt": "",
        "allowed_packages": ("web", "calc", "web"), "max_tool_calls": 40, "max_runtime_seconds": 180,
        "max_iterations": 10, "llm_access": {}, "dependencies": (),
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


def test_sandboxed_absent_allowlist_means_no_tools() -> None:
    cfg = AgentSandboxConfig(tools_allowed_packages=("web",))
    assert resolve_run_policy(_manifest(allowed_packages=None), cfg, sandboxed=True).allowed_packages == ()


def test_sandboxed_host_empty_allowlist_refuses_all_tools() -> None:
    cfg = AgentSandboxConfig(tools_allowed_packages=())
    policy = resolve_run_policy(_manifest(), cfg, sandboxed=True)
    assert policy.allowed_packages == ()
    assert policy.clamped == ("tools.allowed_packages",)


def test_sandboxed_llm_is_resolved_from_manifest() -> None:
    manifest = _manifest(llm_access={"enabled": True, "allowed_models": ["m"]})
    policy = resolve_run_policy(manifest, AgentSandboxConfig(), sandboxed=True)
    assert policy.llm == LlmPolicy(True, 20, 24_000, 24_000, frozenset({"m"}))


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
    assert policy.llm == LlmPolicy(True, 10_000, 10_000_000, 10_000_000, None)
    assert policy.clamped == ()


def test_host_path_runtime_ceiling_applies() -> None:
    cfg = AgentSandboxConfig(limits=LimitsCeiling(max_runtime_seconds=30))
    policy = resolve_run_policy(_manifest(allowed_packages=None), cfg, sandboxed=False)
    assert policy.max_runtime_seconds == 30
    assert policy.allowed_packages == ()
    assert policy.clamped == ("max_runtime_seconds",)
