"""`policy explain` (host/cli/explain.py): the clamped policy, the provider without its key, escaped rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import cli, json_out
from tests.support.schema import check_schema
from tests.unit.cli._support import HOSTILE, SPOOF_VERSION, assert_terminal_safe, cli_env, write_agent

CANARY = "sk-canary-cli-8d7e6f5a4b"


def test_policy_explain_shows_the_host_ceiling_clamping_the_manifest(tmp_path: Path) -> None:
    env = cli_env(tmp_path, AGENTNODE_AGENT_SANDBOX="1")
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"agent_sandbox": {
        "host_trust_policy": "none", "runtime": "runsc", "image": "sha256:" + "a" * 64,
        "limits": {"max_tool_calls": 3, "max_runtime_seconds": 30},
        "tools": {"allowed_packages": ["word-tools"]},
        "llm": {"max_calls": 2, "allowed_models": ["m1"]},
    }}))  # fmt: skip
    pack = write_agent(tmp_path / "src", "greedy", (
        "  tool_access:\n    allowed_packages: [word-tools, other-tools]\n"
        "  limits:\n    max_tool_calls: 40\n    max_runtime_seconds: 20\n"
        "  llm_access:\n    enabled: true\n    max_calls: 20\n    max_input_chars: 1000\n"
        "    allowed_models: [m1, m2]\n"
    ))  # fmt: skip
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    p = json_out(cli(env, "policy", "explain", "greedy", "--json"))
    check_schema("policy-explain", p)
    assert p["route"] == "sandbox" and p["runtime"] == "runsc" and p["image"] == "sha256:" + "a" * 64
    assert p["max_tool_calls"] == 3 and p["max_runtime_seconds"] == 20
    assert p["allowed_packages"] == ["word-tools"]
    assert p["llm"]["enabled"] is True and p["llm"]["max_calls"] == 2 and p["llm"]["max_input_chars"] == 1000
    assert p["llm"]["allowed_models"] == ["m1"]
    assert p["llm"]["clamped"] == ["max_calls", "allowed_models"]
    assert p["clamped"] == ["max_tool_calls", "tools.allowed_packages", "llm.max_calls", "llm.allowed_models"]
    assert p["requested"]["max_tool_calls"] == 40 and p["requested"]["llm"]["max_calls"] == 20
    assert p["requested"]["llm"]["max_output_chars"] is None
    human = cli(env, "policy", "explain", "greedy")
    assert human.returncode == 0 and "lowered it from 40" in human.stdout
    assert "granted by the manifest's llm_access" in human.stdout


def test_policy_explain_names_the_provider_but_never_the_key(env: dict[str, str], tmp_path: Path) -> None:
    env.update(OPENAI_API_KEY=CANARY)
    pack = write_agent(tmp_path / "src", "helper")
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    for args in (("--json",), ()):
        proc = cli(env, "policy", "explain", "helper", *args)
        assert proc.returncode == 0 and CANARY not in proc.stdout + proc.stderr
    llm = json_out(cli(env, "policy", "explain", "helper", "--json"))["llm"]
    assert llm["provider"] == "openai" and llm["configured"] is True


def test_doctor_and_policy_explain_rows_are_escaped(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.doctor import Check, DoctorReport
    from host.cli.main import main

    report = DoctorReport("x", (Check("installed", False, "x " + HOSTILE, "fix: " + HOSTILE),))
    monkeypatch.setattr("host.cli.doctor.run_doctor", lambda slug: report)
    assert main(["doctor", "x"]) == 1
    out, _ = capsys.readouterr()
    assert len(out.splitlines()) == 3  # the row, its fix, the verdict
    assert_terminal_safe(out)

    requested_llm = {"enabled": True, "max_calls": 9, "max_input_chars": None, "max_output_chars": None,
                     "allowed_models": ["m" + HOSTILE]}  # fmt: skip
    explained = {
        "slug": "x", "version": SPOOF_VERSION, "trust": "unverified", "route": "sandbox",
        "route_reason": None, "route_message": HOSTILE, "hint": HOSTILE, "runtime": "runc",
        "image": "sha256:" + "a" * 64,
        "allowed_packages": ["tools" + HOSTILE], "max_tool_calls": 3, "max_runtime_seconds": 20,
        "max_iterations": 10, "idle_timeout_seconds": 30, "clamped": ["max_tool_calls", "llm.max_calls"],
        "llm": {"enabled": True, "granted_by": "llm_access", "max_calls": 2, "max_input_chars": 10,
                "max_output_chars": 10,
                "allowed_models": ["m" + HOSTILE], "clamped": ["max_calls"], "provider": "openai",
                "model": "gpt" + HOSTILE, "configured": True},
        "egress": {"network": "restricted" + HOSTILE, "declared": ["d" + HOSTILE],
                   "granted": ["g" + HOSTILE]},
        "filesystem": {"level": "any" + HOSTILE, "workspace": "write", "refused": None, "limits": {}},
        "requested": {"allowed_packages": ["tools" + HOSTILE], "max_tool_calls": 40,
                      "max_runtime_seconds": 20, "max_iterations": 10, "llm": requested_llm},
    }  # fmt: skip

    class Explained:
        def to_json(self) -> dict[str, Any]:
            return explained

    monkeypatch.setattr("host.cli.explain.explain_policy", lambda slug: Explained())
    assert main(["policy", "explain", "x"]) == 0
    out, _ = capsys.readouterr()
    assert_terminal_safe(out)
    assert out.splitlines()[0] == 'x "1.0.0 (agent, trust curated)\\r\\x1b[2K" (trust unverified)'
    assert all(line.startswith("  ") for line in out.splitlines()[1:])  # no line of the agent's own


def test_policy_explain_shows_the_agents_egress_grant(tmp_path: Path) -> None:
    env = cli_env(tmp_path, AGENTNODE_AGENT_SANDBOX="1")
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"agent_sandbox": {
        "host_trust_policy": "none", "image": "sha256:" + "a" * 64,
        "egress": {"allow": ["api.example.com"], "trust": {"trusted": ["*.docs.example"]}},
    }}))  # fmt: skip
    pack = write_agent(tmp_path / "src", "netty", "")
    with (pack / "agentnode.yaml").open("a") as fh:
        fh.write("permissions:\n  network:\n    level: restricted\n"
                 "    allowed_domains: [API.example.com, other.example, '*.docs.example']\n")  # fmt: skip
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    p = json_out(cli(env, "policy", "explain", "netty", "--json"))
    check_schema("policy-explain", p)
    assert p["egress"] == {"network": "restricted",
                           "declared": ["api.example.com", "other.example", "*.docs.example"],
                           "granted": ["api.example.com", "*.docs.example"]}  # fmt: skip
    human = cli(env, "policy", "explain", "netty").stdout
    assert "egress:" in human and "api.example.com, *.docs.example" in human


@pytest.mark.parametrize(("level", "allow", "workspace", "words"), [
    ("workspace_read", None, "read", "the caller's snapshot, read-only at /workspace"),
    ("any", None, "write", "its own copy at /workspace"),
    ("none", None, "none", "no workspace"),
    ("workspace_write", ["workspace_read"], None, "refused: the pack declares permissions.filesystem"),
])  # fmt: skip
def test_policy_explain_shows_the_agents_filesystem_grant(
    tmp_path: Path, level: str, allow: list[str] | None, workspace: str | None, words: str
) -> None:
    env = cli_env(tmp_path, AGENTNODE_AGENT_SANDBOX="1")
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    section: dict[str, Any] = {"host_trust_policy": "none", "image": "sha256:" + "a" * 64}  # no engine needed
    if allow is not None:
        section["filesystem"] = {"allow": allow}
    (state / "config.json").write_text(json.dumps({"agent_sandbox": section}))
    pack = write_agent(tmp_path / "src", "filer", "")
    with (pack / "agentnode.yaml").open("a") as fh:
        fh.write(f"permissions:\n  filesystem:\n    level: {level}\n")
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    p = json_out(cli(env, "policy", "explain", "filer", "--json"))
    check_schema("policy-explain", p)
    fs = p["filesystem"]
    assert (fs["level"], fs["workspace"]) == (level, workspace)
    assert (fs["refused"] is not None) == (workspace is None) and fs["limits"]["max_files_in"] == 20_000
    assert words in cli(env, "policy", "explain", "filer").stdout
