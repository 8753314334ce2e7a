"""The installed `agentnode-sandbox` command without an engine: every command, exit code and --json schema.

Each test runs the console script from .venv as a subprocess with its own state directory and
DOCKER_HOST pointing at nothing, so no test here can touch a real engine. The --json outputs are checked
against the schema tables of docs/cli.md (parsed by `check_schema`, also used by the integration tests).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from host.audit.log import AuditLog
from host.audit.records import run_record
from host.cli.doctor import LEFTOVER_FIX, capability_checks, image_checks, leftover_check
from host.core.errors import EngineError
from host.core.owner import owner_token
from host.engine.errors import classify_engine_exception
from host.engine.facts import EngineFacts, require_capable
from host.engine.image import BUILD_HINT
from host.engine.labels import LABEL_OWNER, LABEL_RUN
from host.packs.install import Lockfile
from host.spec.config import load_config
from host.spec.manifest.load import load_manifest
from host.spec.manifest.model import AgentManifest, ToolpackManifest
from host.tools.gate import InstalledToolpack, ToolRunner, resolve_tool
from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.packs import write_agent as write_pack
from tests.support.paths import REPO
from tests.support.schema import check_schema, documented_schema, schema_names

NO_ENGINE = "unix:///nonexistent/docker.sock"
CANARY = "sk-canary-cli-8d7e6f5a4b"

# -- the documented schemas (checked by tests/support/schema.py) ----------------------------------------


def test_every_documented_schema_parses() -> None:
    names = schema_names()
    assert sorted(names) == sorted(
        ["run", "error", "install", "uninstall", "list", "image-build", "image-pull", "image-status",
         "doctor", "policy-explain", "audit", "audit-verify"]
    )  # fmt: skip
    for name in names:
        documented_schema(name)


def test_the_schema_check_catches_missing_extra_and_mistyped_keys() -> None:
    good = {"success": False, "error": "x", "error_code": "not_installed", "hint": None}
    check_schema("error", good)
    for bad in ({**good, "extra": 1}, {k: v for k, v in good.items() if k != "hint"}, {**good, "error": 3}):
        with pytest.raises(AssertionError):
            check_schema("error", bad)
    with pytest.raises(AssertionError):
        check_schema("list", [{"slug": "a"}])


# -- running the command ------------------------------------------------------------------------------


def cli_env(root: Path, **extra: str) -> dict[str, str]:
    """A private environment: its own config dir and home, and no engine."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "LANG": "C.UTF-8",
        "AGENTNODE_CONFIG": str(root / "state"),
        "DOCKER_HOST": NO_ENGINE,
    }
    env.update(extra)
    return env


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path)


def write_agent(root: Path, slug: str, extra: str = "", source: str | None = None) -> Path:
    """An agent pack under `root` (by default it returns its goal); `extra` goes under `agent:`."""
    source = source or "def run(context, **kwargs):\n    return {'goal': context.goal}\n"
    return write_pack(root, slug, source, agent=extra)


def set_trust(env: dict[str, str], slug: str, trust: str) -> None:
    """Turn an installed entry into one with another trust level (community installs need an engine)."""
    lockfile = Lockfile(load_config(env).paths.lockfile)
    entry = lockfile.get(slug)
    assert entry is not None
    lockfile.put(dataclasses.replace(entry, trust_level=trust))


def doctor_rows(proc: Any) -> dict[str, dict[str, Any]]:
    report = json_out(proc)
    check_schema("doctor", report)
    return {row["check"]: row for row in report["checks"]}


# -- usage errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("frobnicate",),
        ("run",),
        ("run", "x", "--bogus"),
        ("run", "x", "--arg", "novalue"),
        ("run", "x", "--arg", "n=not-json"),
        ("install", "/nonexistent/pack"),
        ("install", ".", "--trust", "root"),
        ("audit", "--last", "0"),
        ("audit", "--last", "many"),
        ("init", "Bad_Name"),
        ("init", "-"),
        ("init", "a" * 65),
        ("init", "ok", "--type", "plugin"),
        ("image",),
        ("image", "pull"),
        ("policy", "explain"),
        ("run", "x", "--backend", "cloud"),
        ("run", "x", "--namespace", "team-a"),
        ("run", "x", "--kubeconfig", "/dev/null"),
        ("run", "x", "--context", "prod"),
        ("run", "x", "--wait-seconds", "10"),
        ("run", "x", "--backend", "kubernetes", "--via", "/tmp/admin.sock"),
        ("run", "x", "--backend", "kubernetes", "--follow"),
        ("run", "x", "--backend", "kubernetes", "--max-tool-calls", "0"),
        ("run", "x", "--backend", "kubernetes", "--max-cost-usd", "1"),
        ("run", "x", "--backend", "kubernetes", "--runtime", "crun"),
        ("run", "x", "--backend", "kubernetes", "--wait-seconds", "0"),
        ("run", "x", "--backend", "kubernetes", "--wait-seconds", "nan"),
        ("run", "x", "--backend", "kubernetes", "--namespace", "Team_A"),
        ("run", "Not_A_Slug", "--backend", "kubernetes"),
        ("run", "x", "--backend", "kubernetes", "--goal", "g" * 20_000),
        ("serve", "--node"),  # with --json: the node agent prints no ready line
        ("serve", "--node", "--socket", "/tmp/admin.sock"),
        ("serve", "--node", "--warm", "x"),
        ("serve", "--node", "--drain-seconds", "0"),
        ("serve", "--node", "--metrics", ":9100"),
        ("k8s-controller", "--namespace", "a", "--all-namespaces"),
        ("k8s-controller", "--namespace", "Not_A_Namespace"),
        ("k8s-controller",),  # with --json: the controller prints no JSON
    ],
)
def test_usage_errors_exit_2_with_error_and_hint_and_no_stdout(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    takes_json = bool(args) and args[0] not in ("init", "image", "policy")
    proc = cli(env, *args, "--json") if takes_json else cli(env, *args)
    assert_error_lines(proc, 2)
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("run", "x", "--namespace", "a"), "--namespace needs --backend kubernetes"),
        (("run", "x", "--backend", "kubernetes", "--follow"), "--follow cannot be used with --backend"),
        (("run", "x", "--backend", "kubernetes", "--max-runtime-seconds", "5"), "--max-runtime-seconds"),
        (("run", "x", "--backend", "kubernetes", "--via", "s"), "--via cannot be used with --backend"),
        (("run", "x", "--backend", "kubernetes", "--runtime", "crun"), "--runtime crun cannot be used"),
        (("serve", "--node", "--socket", "s"), "--socket cannot be used with --node"),
        (("serve", "--node", "--warm", "x"), "--warm cannot be used with --node"),
        (("k8s-controller", "--namespace", "a", "--all-namespaces"), "--namespace and --all-namespaces"),
    ],
)
def test_kubernetes_refusals_name_the_flag(env: dict[str, str], args: tuple[str, ...], flag: str) -> None:
    proc = cli(env, *args)
    assert_error_lines(proc, 2)
    assert proc.stderr.startswith(f"error: {flag}"), proc.stderr


def test_help_exits_0_and_names_every_command(env: dict[str, str]) -> None:
    proc = cli(env, "--help")
    assert proc.returncode == 0
    for command in ("run", "install", "uninstall", "list", "init", "image", "doctor", "policy", "audit"):
        assert command in proc.stdout


# -- list, install, uninstall, policy explain, run on the host path ----------------------------------


def test_install_reports_manifest_warnings_on_stderr_and_in_json(env: dict[str, str], tmp_path: Path) -> None:
    """Unknown keys install (as the publisher tolerates them) but are reported; pack text stays escaped."""
    extra = '  limtis: {max_tool_calls: 3}\n  "x\\e[2K\\u202e\\a": 1\n'
    pack = write_agent(tmp_path / "src", "warned", extra)
    proc = cli(env, "install", pack, "--trust", "trusted", "--json")
    assert proc.returncode == 0, proc.stderr
    installed = json_out(proc)
    check_schema("install", installed)
    assert installed["warnings"] == [
        "agent.limtis: unknown key, ignored (did you mean limits?)",
        "agent.x\\x1b[2K\\u202e\\x07: unknown key, ignored",
    ]
    human = cli(env, "install", pack, "--trust", "trusted")
    assert human.returncode == 0, human.stderr
    assert human.stderr.splitlines() == [f"warning: {w}" for w in installed["warnings"]]
    assert not any(c in human.stderr for c in ("\x1b", "\u202e", "\x07"))
    assert human.stdout.startswith("installed warned 1.0.0")
    clean = cli(env, "install", write_agent(tmp_path / "src", "clean"), "--trust", "trusted", "--json")
    assert json_out(clean)["warnings"] == []


def test_list_on_empty_state(env: dict[str, str]) -> None:
    proc = cli(env, "list", "--json")
    assert proc.returncode == 0 and json_out(proc) == []
    human = cli(env, "list")
    assert human.returncode == 0 and "no packs installed" in human.stdout


def test_install_list_explain_uninstall_a_trusted_agent_without_an_engine(
    env: dict[str, str], tmp_path: Path
) -> None:
    pack = write_agent(tmp_path / "src", "helper", "  tool_access:\n    allowed_packages: [word-tools]\n")
    proc = cli(env, "install", pack, "--trust", "TRUSTED", "--json")
    assert proc.returncode == 0, proc.stderr
    installed = json_out(proc)
    check_schema("install", installed)
    assert installed["slug"] == "helper" and installed["trust_level"] == "trusted"
    assert installed["sandbox_volume"] is None and Path(installed["host_path"]).is_dir()

    listed = json_out(cli(env, "list", "--json"))
    check_schema("list", listed)
    assert [(r["slug"], r["package_type"], r["trust_level"]) for r in listed] == [
        ("helper", "agent", "trusted")
    ]

    explained = cli(env, "policy", "explain", "helper", "--json")
    assert explained.returncode == 0, explained.stderr
    p = json_out(explained)
    check_schema("policy-explain", p)
    assert p["route"] == "host" and p["runtime"] is None and p["image"] is None
    assert p["allowed_packages"] == ["word-tools"] and p["max_tool_calls"] == 40 and p["clamped"] == []

    proc = cli(env, "uninstall", "helper", "--json")
    assert proc.returncode == 0, proc.stderr
    removed = json_out(proc)
    check_schema("uninstall", removed)
    assert removed["volume_left_behind"] is None and not Path(installed["host_path"]).exists()
    assert json_out(cli(env, "list", "--json")) == []
    assert_error_lines(cli(env, "uninstall", "helper"), 1)


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


def test_a_community_agent_cannot_be_installed_without_an_engine(env: dict[str, str], tmp_path: Path) -> None:
    pack = write_agent(tmp_path / "src", "stranger")
    proc = cli(env, "install", pack, "--json")
    assert_error_lines(proc, 1)
    out = json_out(proc)
    check_schema("error", out)
    expected = _engine_error()
    assert out["error_code"] == expected.reason.value == "engine_unavailable"
    assert out["hint"] == expected.hint
    assert json_out(cli(env, "list", "--json")) == []


def _engine_error() -> EngineError:
    """What connecting to NO_ENGINE raises: the socket file does not exist."""
    return classify_engine_exception(FileNotFoundError(2, "No such file or directory"))


def test_run_on_the_host_path_prints_one_documented_json_object(env: dict[str, str], tmp_path: Path) -> None:
    pack = write_agent(
        tmp_path / "src", "echoer",
        source="import sys\ndef run(context, n=0, **kwargs):\n    print('to the log')\n"
               "    return {'goal': context.goal, 'n': n}\n",
    )  # fmt: skip
    assert cli(env, "install", pack, "--trust", "curated").returncode == 0
    proc = cli(env, "run", "echoer", "--goal", "hi there", "--arg", "n=3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json_out(proc)
    check_schema("run", out)
    assert out["success"] is True and out["result"] == {"goal": "hi there", "n": 3}
    assert out["mode_used"] == "agent_host" and "to the log" in out["logs"] and out["error_code"] is None
    human = cli(env, "run", "echoer")
    assert human.returncode == 0 and json.loads(human.stdout) == {"goal": "probe", "n": 0}
    assert human.stderr.startswith("ok: echoer")

    records = json_out(cli(env, "audit", "--json", "--slug", "echoer"))
    check_schema("audit", records)
    assert len(records) == 2 and records[0]["run_id"] == out["run_id"]


def test_a_failed_run_exits_1_with_the_full_run_object(env: dict[str, str], tmp_path: Path) -> None:
    source = "def run(context, **kwargs):\n    raise ValueError('no')\n"
    pack = write_agent(tmp_path / "src", "broken", source=source)
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    proc = cli(env, "run", "broken", "--json")
    assert proc.returncode == 1
    out = json_out(proc)
    check_schema("run", out)
    assert out["success"] is False and out["error_code"] and out["result"] is None
    assert_error_lines(cli(env, "run", "missing"), 1)


def test_a_config_error_before_the_run_still_prints_the_run_object(env: dict[str, str]) -> None:
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "config.json").write_text('{"agent_sandbox": {"limits": {"max_tool_calls": "x"}}}')
    proc = cli(env, "run", "anything", "--json")
    assert_error_lines(proc, 1)
    out = json_out(proc)
    check_schema("run", out)
    assert out["error_code"] == "config_invalid" and "agent_sandbox.limits.max_tool_calls" in out["error"]


# -- refusals: run, doctor and policy explain give the same fix ----------------------------------------


@pytest.mark.parametrize(
    ("trust", "code", "rows"),
    [
        ("unverified", "refused_flag_off", {"feature_flag", "route"}),
        ("mystery", "refused_trust", {"route"}),
    ],
)
def test_refused_runs_and_doctor_name_the_same_fix(
    env: dict[str, str], tmp_path: Path, trust: str, code: str, rows: set[str]
) -> None:
    pack = write_agent(tmp_path / "src", "community")
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    set_trust(env, "community", trust)

    run = json_out(cli(env, "run", "community", "--json"))
    assert run["error_code"] == code and run["hint"]
    proc = cli(env, "doctor", "community", "--json")
    assert proc.returncode == 1
    found = doctor_rows(proc)
    for name in rows:
        assert found[name]["ok"] is False and found[name]["fix"] == run["hint"]
    assert found["installed"]["ok"] and found["agent"]["ok"] and found["manifest"]["ok"]
    explained = json_out(cli(env, "policy", "explain", "community", "--json"))
    assert explained["route"] == "refused" and explained["route_reason"] == code
    assert explained["hint"] == run["hint"]


def test_not_installed_and_not_an_agent_share_the_runs_fix(env: dict[str, str]) -> None:
    assert cli(env, "install", REPO / "examples" / "word-tools", "--trust", "trusted").returncode == 0
    for slug, row, code in (("ghost", "installed", "not_installed"), ("word-tools", "agent", "not_an_agent")):
        run = json_out(cli(env, "run", slug, "--json"))
        assert run["error_code"] == code
        found = doctor_rows(cli(env, "doctor", slug, "--json"))
        assert found[row] == {"check": row, "ok": False, "detail": run["error"], "fix": run["hint"]}
        explained = cli(env, "policy", "explain", slug, "--json")
        assert explained.returncode == 1 and json_out(explained)["hint"] == run["hint"]


def test_a_host_routed_agent_without_its_host_copy(env: dict[str, str], tmp_path: Path) -> None:
    assert cli(env, "install", write_agent(tmp_path / "src", "helper"), "--trust", "trusted").returncode == 0
    lockfile = Lockfile(load_config(env).paths.lockfile)
    entry = lockfile.get("helper")
    assert entry is not None
    lockfile.put(dataclasses.replace(entry, host_path=None))
    run = json_out(cli(env, "run", "helper", "--json"))
    assert run["error_code"] == "not_installed" and "--trust trusted" in run["hint"]
    proc = cli(env, "doctor", "helper", "--json")
    found = doctor_rows(proc)
    assert proc.returncode == 1 and failed_rows(found) == ["host_copy"]
    assert found["host_copy"]["fix"] == run["hint"] and found["host_copy"]["detail"] == run["error"]


def failed_rows(rows: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name, row in rows.items() if not row["ok"]]


# -- doctor -------------------------------------------------------------------------------------------


def test_doctor_without_an_engine_names_the_engine_fix(env: dict[str, str]) -> None:
    proc = cli(env, "doctor", "--json")
    assert proc.returncode == 1
    report = json_out(proc)
    check_schema("doctor", report)
    assert report["ready"] is False and report["slug"] is None
    assert [r["check"] for r in report["checks"]] == ["config", "feature_flag", "engine"]
    engine = report["checks"][2]
    expected = _engine_error()
    assert engine["ok"] is False and engine["fix"] == expected.hint and engine["detail"] == expected.message
    human = cli(env, "doctor")
    assert human.returncode == 1 and "FAIL  engine" in human.stdout and "not ready" in human.stdout


def test_doctor_with_the_flag_on_fails_only_on_the_engine(tmp_path: Path) -> None:
    env = cli_env(tmp_path, AGENTNODE_AGENT_SANDBOX="true")
    found = doctor_rows(cli(env, "doctor", "--json"))
    assert found["feature_flag"]["ok"] is True and found["engine"]["ok"] is False


def test_doctor_is_ready_for_a_trusted_agent_without_an_engine(env: dict[str, str], tmp_path: Path) -> None:
    assert cli(env, "install", write_agent(tmp_path / "src", "helper"), "--trust", "trusted").returncode == 0
    proc = cli(env, "doctor", "helper", "--json")
    assert proc.returncode == 0, proc.stdout
    found = doctor_rows(proc)
    assert list(found) == ["config", "feature_flag", "installed", "agent", "route", "manifest", "host_copy"]
    assert all(row["ok"] for row in found.values())
    assert cli(env, "doctor", "helper").stdout.rstrip().endswith("ready")


def test_doctor_reports_a_bad_config_and_a_bad_flag(env: dict[str, str]) -> None:
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "config.json").write_text('{"agent_sandbox": {"runtime": "kata"}}')
    report = json_out(cli(env, "doctor", "--json"))
    assert [r["check"] for r in report["checks"]] == ["config"]
    assert "agent_sandbox.runtime" in report["checks"][0]["detail"] and report["checks"][0]["fix"]
    (state / "config.json").write_text("{}")
    found = doctor_rows(cli({**env, "AGENTNODE_AGENT_SANDBOX": "maybe"}, "doctor", "--json"))
    flag = found["feature_flag"]
    assert flag["ok"] is False and "AGENTNODE_AGENT_SANDBOX" in flag["detail"] and flag["fix"]


def test_doctor_changes_nothing(env: dict[str, str], tmp_path: Path) -> None:
    state = Path(env["AGENTNODE_CONFIG"])
    assert cli(env, "doctor", "--json").returncode == 1
    assert not state.exists()  # not even the state directory
    assert cli(env, "install", write_agent(tmp_path / "src", "helper"), "--trust", "trusted").returncode == 0

    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(state.rglob("*"))}

    before = snapshot()
    for args in (("doctor", "--json"), ("doctor", "helper"), ("policy", "explain", "helper")):
        cli(env, *args)
    assert snapshot() == before


class InfoOnly:
    """An engine client stand-in that answers `info()` and a dockerd `/_ping` (the client is injected by
    design)."""

    def __init__(self, **info: Any) -> None:
        self._info = {"ServerVersion": "27.0", "Runtimes": {"runc": {}, "runsc": {}},
                      "MemoryLimit": True, "SwapLimit": True, **info}  # fmt: skip

    def info(self) -> dict[str, Any]:
        return self._info

    def ping(self) -> dict[str, str]:
        return {"Api-Version": "1.41", "Server": "Docker/27.0 (linux)"}  # as dockerd answers: no libpod


def _capability_error(runtime: str, **facts: Any) -> EngineError:
    base = {"server_version": "27.0", "runtimes": frozenset({"runc", "runsc"}), "memory_limit": True,
            "swap_limit": True}  # fmt: skip
    with pytest.raises(EngineError) as info:
        require_capable(EngineFacts(**{**base, **facts}), runtime)
    return info.value


def test_capability_checks_name_the_runtime_registration_fix() -> None:
    rows = {c.check: c for c in capability_checks(InfoOnly(Runtimes={"runc": {}}), "runsc")}  # type: ignore[arg-type]
    assert rows["memory_limit"].ok and not rows["runtime"].ok
    assert rows["runtime"].fix == _capability_error("runsc", runtimes=frozenset({"runc"})).hint
    assert "runsc" in rows["runtime"].fix and "daemon.json" in rows["runtime"].fix
    ok = capability_checks(InfoOnly(Runtimes={"runc": {}}), "runc")  # type: ignore[arg-type]
    assert all(c.ok for c in ok)


@pytest.mark.parametrize("missing", ["MemoryLimit", "SwapLimit"])
def test_capability_checks_name_the_memory_fix_not_the_image(missing: str) -> None:
    rows = {c.check: c for c in capability_checks(InfoOnly(**{missing: False}), "runc")}  # type: ignore[arg-type]
    assert rows["runtime"].ok and not rows["memory_limit"].ok
    assert rows["memory_limit"].fix == _capability_error("runc", memory_limit=False).hint
    assert "swap" in rows["memory_limit"].fix and "image" not in rows["memory_limit"].fix


def test_capability_checks_show_both_problems_at_once() -> None:
    client = InfoOnly(Runtimes={"runc": {}}, MemoryLimit=False)
    rows = capability_checks(client, "runsc")  # type: ignore[arg-type]
    assert [(c.check, c.ok) for c in rows] == [("memory_limit", False), ("runtime", False)]


def test_capability_checks_classify_an_engine_that_stops_answering() -> None:
    class Gone:
        """Every request meets a closed socket: the ping as much as /info."""

        def ping(self) -> dict[str, str]:
            raise ConnectionRefusedError("gone")

        def info(self) -> dict[str, Any]:
            raise ConnectionRefusedError("gone")

    rows = capability_checks(Gone(), "runc")  # type: ignore[arg-type]
    assert [(c.check, c.ok) for c in rows] == [("engine", False)] and rows[0].fix == _engine_error().hint


@pytest.mark.parametrize("pin", [None, "agentnode-sandbox:latest"])
def test_image_checks_refuse_a_missing_or_unusable_pin_before_asking_the_engine(pin: str | None) -> None:
    rows = image_checks(object(), pin)  # type: ignore[arg-type]  # never touched: the pin is refused first
    assert [(c.check, c.ok) for c in rows] == [("image_pinned", False)] and rows[0].fix == BUILD_HINT


def test_leftover_check_counts_only_containers_of_dead_hosts() -> None:
    class Client:
        def containers(self, **kwargs: Any) -> list[dict[str, Any]]:
            assert kwargs == {"labels": [LABEL_RUN, LABEL_OWNER]}
            return [{"Labels": {LABEL_OWNER: owner_token()}}, {"Labels": {LABEL_OWNER: "999999999:1"}}]

    row = leftover_check(Client())  # type: ignore[arg-type]
    assert row.ok and row.detail.startswith("1 ") and row.fix == LEFTOVER_FIX


# -- image commands without an engine -----------------------------------------------------------------


@pytest.mark.parametrize("args", [("build",), ("status",), ("pull", "registry.example/agentnode-sandbox:1")])
def test_image_commands_without_an_engine_fail_with_the_engine_fix(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    proc = cli(env, "image", *args, "--json")
    assert_error_lines(proc, 1)
    out = json_out(proc)
    check_schema("error", out)
    assert out["error_code"] == "engine_unavailable" and out["hint"] == _engine_error().hint


# -- init ---------------------------------------------------------------------------------------------


def test_init_agent_scaffolds_a_valid_pack_with_the_llm_access_block(
    env: dict[str, str], tmp_path: Path
) -> None:
    proc = cli(env, "init", "my-agent", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pack = tmp_path / "my-agent"
    assert sorted(p.name for p in pack.iterdir()) == ["agentnode.yaml", "my_agent.py"]
    assert "agentnode-sandbox install" in proc.stdout and "agentnode-sandbox run my-agent" in proc.stdout
    manifest = load_manifest(pack)
    assert isinstance(manifest, AgentManifest) and manifest.entrypoint == "my_agent:run"
    assert dict(manifest.llm_access) == {
        "enabled": False, "max_calls": 20, "max_input_chars": 24000, "max_output_chars": 24000,
    }  # fmt: skip
    text = (pack / "agentnode.yaml").read_text()
    block = text[text.index("  llm_access:") :]
    assert "# allowed_models:" in block and "opt-in" in block
    assert "never picks the model" in block and "ALWAYS wins" in block
    source = (pack / "my_agent.py").read_text()
    assert "def run(context" in source and "async" not in source
    assert "LlmAccessError" in source and "PermissionError" in source


def test_init_toolpack_uses_the_src_layout_and_its_tool_runs(env: dict[str, str], tmp_path: Path) -> None:
    proc = cli(env, "init", "my-tools", "--type", "toolpack", "--dir", tmp_path / "packs")
    assert proc.returncode == 0, proc.stderr
    pack = tmp_path / "packs" / "my-tools"
    assert (pack / "src" / "my_tools.py").is_file() and "--trust trusted" in proc.stdout
    manifest = load_manifest(pack)
    assert isinstance(manifest, ToolpackManifest)
    (tool,) = manifest.tools
    assert tool.name == "echo" and tool.input_schema is not None and tool.input_schema["required"] == ["text"]
    runner = ToolRunner()
    try:
        out = runner.run(
            InstalledToolpack(slug="my-tools", version="0.1.0", trust="trusted", root=pack / "src",
                              manifest=manifest),
            resolve_tool("my-tools", manifest, tool.name), {"text": "hello"}, timeout=30,
        )  # fmt: skip
    finally:
        runner.close()
    assert out.success and out.result == {"text": "hello", "length": 5}


def test_init_refuses_a_non_empty_directory_and_fills_an_empty_one(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    proc = cli(env, "init", "taken", cwd=tmp_path)
    assert_error_lines(proc, 1)
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert cli(env, "init", "empty", cwd=tmp_path).returncode == 0
    assert (tmp_path / "empty" / "agentnode.yaml").is_file()


@pytest.mark.parametrize("slug", ["123", "yes", "json", "a.b-c"])
def test_init_names_that_are_awkward_in_yaml_or_python_still_make_valid_packs(
    env: dict[str, str], tmp_path: Path, slug: str
) -> None:
    assert cli(env, "init", slug, cwd=tmp_path).returncode == 0
    manifest = load_manifest(tmp_path / slug)
    assert manifest.slug == slug
    module = manifest.entrypoint.split(":")[0]
    assert module.isidentifier() and module != "json" and (tmp_path / slug / f"{module}.py").is_file()


def test_init_agent_and_toolpack_run_together_on_the_host_path(env: dict[str, str], tmp_path: Path) -> None:
    assert cli(env, "init", "my-tools", "--type", "toolpack", cwd=tmp_path).returncode == 0
    assert cli(env, "init", "helper", cwd=tmp_path).returncode == 0
    manifest = tmp_path / "helper" / "agentnode.yaml"
    manifest.write_text(manifest.read_text().replace("allowed_packages: []", "allowed_packages: [my-tools]"))
    assert yaml.safe_load(manifest.read_text())["agent"]["tool_access"]["allowed_packages"] == ["my-tools"]
    for name in ("my-tools", "helper"):
        assert cli(env, "install", tmp_path / name, "--trust", "trusted").returncode == 0
    out = json_out(cli(env, "run", "helper", "--goal", "four words goal here", "--json"))
    assert out["success"] is True, out
    assert out["result"]["tool"] == {"text": "four words goal here", "length": 20}
    assert [r["step"] for r in out["result"]["refusals"]] == ["llm"]


# -- audit --------------------------------------------------------------------------------------------


def _record(slug: str, run_id: str) -> dict[str, Any]:
    return run_record(
        slug=slug, trust="unverified", run_id=run_id, action="allow", source="agent_sandbox",
        reason="agent_completed", sandbox=True, runtime="runc", image="sha256:" + "b" * 64, duration_ms=12,
        timed_out=False, llm={"enabled": True, "max_calls": 2, "calls": 1, "ok": 1, "model": "m"},
        tool_calls=1, tool_refusals=0,
    )  # fmt: skip


def test_audit_show_and_verify_on_a_handmade_log(env: dict[str, str]) -> None:
    path = load_config(env).paths.audit_file
    log = AuditLog(path)
    for slug, run_id in (("a", "r1"), ("b", "r2"), ("a", "r3")):
        assert log.append(_record(slug, run_id))

    last = json_out(cli(env, "audit", "--json", "--last", "1"))
    check_schema("audit", last)
    assert [r["run_id"] for r in last] == ["r3"]
    only_a = json_out(cli(env, "audit", "show", "--json", "--slug", "a"))
    assert [r["run_id"] for r in only_a] == ["r1", "r3"]
    assert "r2" in cli(env, "audit").stdout

    proc = cli(env, "audit", "verify", "--json")
    assert proc.returncode == 0
    report = json_out(proc)
    check_schema("audit-verify", report)
    assert report["ok"] is True and report["records"] == 3 and report["problems"] == []

    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"duration_ms":12', '"duration_ms":13')
    path.write_text("\n".join(lines) + "\n")
    proc = cli(env, "audit", "verify", "--json")
    assert proc.returncode == 1
    report = json_out(proc)
    check_schema("audit-verify", report)
    assert report["ok"] is False and any("audit.jsonl:3" in p for p in report["problems"])
    human = cli(env, "audit", "verify")
    assert human.returncode == 1 and human.stdout.startswith("FAILED")


def test_audit_shows_the_run_id_of_records_written_before_the_rename(env: dict[str, str]) -> None:
    log = AuditLog(load_config(env).paths.audit_file)
    old = {("request_id" if k == "run_id" else k): v for k, v in _record("a", "old-run").items()}
    assert log.append(old) and log.append(_record("a", "new-run"))
    proc = cli(env, "audit")
    assert proc.returncode == 0, proc.stderr
    assert [line.split(" run=")[1].split()[0] for line in proc.stdout.splitlines()] == ["old-run", "new-run"]


def test_audit_on_empty_state(env: dict[str, str]) -> None:
    assert json_out(cli(env, "audit", "--json")) == []
    proc = cli(env, "audit", "verify", "--json")
    assert proc.returncode == 0 and json_out(proc)["records"] == 0


# -- errors and --debug -------------------------------------------------------------------------------


def test_tracebacks_only_with_debug(env: dict[str, str]) -> None:
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "agentnode.lock").write_text("{not json")
    proc = cli(env, "list")
    assert_error_lines(proc, 1)
    assert "agentnode.lock" in proc.stderr
    for args in (("--debug", "list"), ("list", "--debug")):
        debug = cli(env, *args)
        assert debug.returncode == 1 and "Traceback" in debug.stderr and "error: " in debug.stderr
    out = json_out(cli(env, "list", "--json"))
    check_schema("error", out)
    assert out["success"] is False and out["hint"]


# -- terminal injection (issue 12, finding 7) and strict JSON out (finding 8) --------------------------

HOSTILE = "\x1b[2K\x1b[1A\x1b]0;pwned\x07\rok: fake (agent_sandbox)\x9b31m\u202etxt.exe\u2066\n\x00"
"""Erase the line, cursor up, retitle the window, overwrite with a fake ok:, 8-bit CSI, bidi, a newline."""
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e", "\u2066", "\x00")


def assert_terminal_safe(text: str, *, cr: bool = True) -> None:
    """No raw control, C1 or bidi character, and the hostile text is visible as escapes.

    `cr=False`: the text went through the wrapper's one-line summary of an exception, which already turned
    the CR (whitespace) into a space.
    """
    for ch in RAW:
        assert ch not in text, (ch, text)
    assert "\\x1b]0;pwned\\x07" in text and "\\u202e" in text and "\\x9b" in text
    assert ("\\rok: fake" if cr else "ok: fake") in text


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """main() in this process, with a private state directory and no engine; returns the state dir."""
    for key, value in cli_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    return Path(cli_env(tmp_path)["AGENTNODE_CONFIG"])


def fake_run(monkeypatch: pytest.MonkeyPatch, result: Any) -> None:
    """Every SandboxHost the CLI creates returns `result` (a RunResult) from run()."""

    class FakeHost:
        audit_failures = 0

        def __init__(self, **kwargs: Any) -> None:
            pass

        def startup_sweep(self) -> None:
            pass

        def run(self, slug: str, **kwargs: Any) -> Any:
            return result

        def close(self) -> None:
            pass

    monkeypatch.setattr("host.runtime.runner.SandboxHost", FakeHost)


def _run_result(**fields: Any) -> Any:
    from host.runtime.runner import RunResult

    base: dict[str, Any] = {"mode_used": "agent_sandbox", "run_id": "a" * 32, "duration_ms": 5}
    base["logs"] = HOSTILE
    return RunResult(**{**base, **fields})


def strict_json(text: str) -> Any:
    """Parse JSON as a strict reader would: NaN, Infinity and -Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_failed_runs_error_and_hint_reach_the_terminal_escaped_on_two_lines(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, _run_result(success=False, error=HOSTILE, error_code="agent_exception",
                                      hint="try " + HOSTILE))  # fmt: skip
    assert main(["run", "probe"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert_terminal_safe(err)
    lines = err.splitlines()
    assert lines[-2].startswith("error: \\x1b[2K") and lines[-1].startswith("hint: try ")
    # Before them, the agent's last output lines, escaped like everything else (one terminal line each).
    logged = HOSTILE.splitlines()[-10:]
    assert lines[0] == f"the agent's last {len(logged)} output line(s):" and len(lines) == len(logged) + 3
    assert all(line.startswith("| ") for line in lines[1:-2])
    assert lines[-2].endswith("\\n\\x00 [agent_exception]")


def test_a_failed_runs_json_keeps_the_text_exact_and_escaped_by_json(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, _run_result(success=False, error=HOSTILE, error_code="agent_exception"))
    assert main(["run", "probe", "--json"]) == 1
    out, err = capsys.readouterr()
    assert "\x1b" not in out and "\\u001b" in out  # JSON's own escaping
    payload = strict_json(out)
    check_schema("run", payload)
    assert payload["error"] == HOSTILE and payload["logs"] == HOSTILE
    assert err == ""  # with --json, the run object is the whole report


def test_a_successful_run_prints_its_result_as_ascii_json(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    result = {"text": HOSTILE, "name": "日本 é"}
    fake_run(monkeypatch, _run_result(success=True, result=result, mode_used="agent\x1b[8m"))
    assert main(["run", "probe"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == result and out.isascii() and "\x1b" not in out
    assert err.startswith("ok: probe (") and '"agent\\x1b[8m"' in err and "\x1b" not in err


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_result_is_a_failed_run_never_invalid_json(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: float
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, _run_result(success=True, result={"n": [1, value]}, logs=""))
    assert main(["run", "probe", "--json"]) == 1
    out, _ = capsys.readouterr()
    payload = strict_json(out)
    check_schema("run", payload)
    assert payload["success"] is False and payload["result"] is None
    assert payload["error_code"] == "result_not_serializable" and payload["run_id"] == "a" * 32
    assert main(["run", "probe"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: the agent's result cannot be shown as JSON")


def test_any_other_value_json_cannot_carry_is_a_clean_error_object(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    class Explained:
        def to_json(self) -> dict[str, Any]:
            return {"slug": "x", "max_tool_calls": float("nan")}

    monkeypatch.setattr("host.cli.explain.explain_policy", lambda slug: Explained())
    assert main(["policy", "explain", "x", "--json"]) == 1
    out, err = capsys.readouterr()
    payload = strict_json(out)
    check_schema("error", payload)
    assert payload["error_code"] == "host_loop_error" and "cannot be printed as JSON" in payload["error"]
    assert err.startswith("error: the output cannot be printed as JSON")


@pytest.mark.parametrize("raw", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "[1, 1e400]"])
def test_arg_values_must_be_strict_json(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raw: str
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, _run_result(success=True, result=None))  # never reached
    assert main(["run", "probe", "--arg", f"n={raw}", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --arg n: the value is not strict JSON")


def _entry(**fields: Any) -> Any:
    from host.packs.install import LockEntry

    base: dict[str, Any] = {
        "slug": "spoof", "version": "1.0.0", "package_type": "agent", "trust_level": "unverified",
        "artifact_hash": "f" * 64, "import_subdir": "", "sandbox_volume": None, "host_path": None,
        "manifest": {}, "installed_at": "2025-01-01T00:00:00Z",
    }  # fmt: skip
    return LockEntry(**{**base, **fields})


SPOOF_VERSION = "1.0.0 (agent, trust curated)\r\x1b[2K"
"""A version that, printed raw, makes an unverified pack read as curated."""


def test_install_shows_a_hostile_version_quoted_and_escaped(
    in_process: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    monkeypatch.setattr("host.packs.install.install_pack", lambda *a, **k: _entry(version=SPOOF_VERSION))
    assert main(["install", str(tmp_path)]) == 0
    out, _ = capsys.readouterr()
    assert out == 'installed spoof "1.0.0 (agent, trust curated)\\r\\x1b[2K" (agent, trust unverified)\n'


def test_list_uninstall_and_audit_show_lockfile_and_audit_text_escaped(
    in_process: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    lockfile = Lockfile(load_config().paths.lockfile)
    lockfile.put(_entry(version=SPOOF_VERSION, trust_level="unverified\x1b[8m"))
    assert main(["list"]) == 0
    out, _ = capsys.readouterr()
    assert "\x1b" not in out and "\r" not in out and len(out.splitlines()) == 1
    assert '"1.0.0 (agent, trust curated)\\r\\x1b[2K"' in out and '"unverified\\x1b[8m"' in out

    audit = load_config().paths.audit_file
    audit.parent.mkdir(parents=True, exist_ok=True)
    record = {"event": "agent_run", "ts": "t", "slug": HOSTILE, "action": "deny", "reason": "x\u202e",
              "run_id": "\x9b" * 20, "duration_ms": 1}  # fmt: skip
    audit.write_text(json.dumps(record) + "\n")
    assert main(["audit"]) == 0
    out, _ = capsys.readouterr()
    assert len(out.splitlines()) == 1
    assert_terminal_safe(out)

    assert main(["uninstall", "spoof"]) == 0
    out, err = capsys.readouterr()
    assert out == 'uninstalled spoof "1.0.0 (agent, trust curated)\\r\\x1b[2K"\n' and "\x1b" not in err


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


def test_errors_that_quote_pack_text_stay_on_their_two_lines(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main
    from host.core.errors import PackError

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PackError(f"{HOSTILE}: symlinks are not allowed in a pack", hint=HOSTILE)

    monkeypatch.setattr("host.packs.install.install_pack", refuse)
    assert main(["install", str(in_process.parent)]) == 1
    _, err = capsys.readouterr()
    assert len(err.splitlines()) == 2
    assert_terminal_safe(err)

    def crash(slug: str) -> Any:
        raise RuntimeError(HOSTILE)

    monkeypatch.setattr("host.cli.doctor.run_doctor", crash)
    assert main(["doctor", "--debug"]) == 1
    _, err = capsys.readouterr()
    assert "Traceback" in err and "RuntimeError: \\x1b[2K" in err
    assert_terminal_safe(err)


def test_log_lines_are_escaped_too() -> None:
    import logging

    from host.cli.output import SafeFormatter

    record = logging.LogRecord("host.x", logging.WARNING, __file__, 1, "seen: %s", (HOSTILE,), None)
    line = SafeFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line.startswith("WARNING host.x: seen: ")
    assert_terminal_safe(line)


def test_a_host_path_agents_exception_text_is_escaped(env: dict[str, str], tmp_path: Path) -> None:
    source = (
        "def run(context, mode='raise', **kwargs):\n"
        f"    if mode == 'inf':\n        return {{'n': float('inf')}}\n"
        f"    raise ValueError({HOSTILE!r})\n"
    )
    pack = write_agent(tmp_path / "src", "painter", source=source)
    assert cli(env, "install", pack, "--trust", "trusted").returncode == 0
    human = cli(env, "run", "painter")
    assert human.returncode == 1 and human.stdout == ""
    assert_terminal_safe(human.stderr, cr=False)
    lines = human.stderr.splitlines()  # the agent's last output lines (its traceback), then the error
    assert lines[-1].startswith("error: ") and all(line.startswith("| ") for line in lines[1:-1])
    proc = cli(env, "run", "painter", "--arg", 'mode="inf"', "--json")
    assert proc.returncode == 1
    out = strict_json(proc.stdout)
    check_schema("run", out)
    assert out["success"] is False and out["error_code"] == "result_not_serializable"


def _complete(script: str, words: list[str], env: dict[str, str] | None = None) -> list[str]:
    """What bash completes for `words` (the last one being typed) with the generated script."""
    import shlex
    import subprocess

    line = " ".join(shlex.quote(w) for w in words)
    program = f"""{script}
COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}
_agentnode_sandbox
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, env=env)
    return sorted(w for w in out.stdout.split("\n") if w)


def test_the_completion_script_completes_commands_options_and_installed_slugs(
    in_process: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "run" in _complete(script, ["agentnode-sandbox", "r"])
    assert _complete(script, ["agentnode-sandbox", "image", "b"]) == ["build"]
    assert "--max-tool-calls" in _complete(script, ["agentnode-sandbox", "run", "--max-t"])
    assert _complete(script, ["agentnode-sandbox", "policy", "e"]) == ["explain"]
    # Slugs come from `list --json`, asked when completing: a fake command on PATH stands in for it.
    fake = tmp_path / "bin"
    fake.mkdir()
    listing = '[{"slug": "hello-agent"}, {"slug": "word-tools"}]'
    (fake / "agentnode-sandbox").write_text(f"#!/bin/sh\necho '{listing}'\n")
    (fake / "agentnode-sandbox").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    assert _complete(script, ["agentnode-sandbox", "run", "hel"], env) == ["hello-agent"]
    assert _complete(script, ["agentnode-sandbox", "serve", "hel"], env) == []  # serve takes no slug
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out.startswith("autoload -U +X bashcompinit && bashcompinit\n")


# -- run finds a serve host running for its config ----------------------------------------------------------


@pytest.mark.parametrize(
    "spoil", ["none", "missing", "not listening", "regular file", "symlink", "dir writable by others",
              "socket not ours", "dir not ours"],
)  # fmt: skip
def test_run_takes_only_an_owner_only_listening_admin_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: str
) -> None:
    """`run` hands a goal to a `serve` host only through a socket that is this user's, in a directory no one
    else may write to, and that accepts a connection now; anything else is passed over (run here)."""
    import socket

    from host.cli.run import _serve_socket

    config = tmp_path / "cfg"
    config.mkdir(mode=0o755)
    monkeypatch.setenv("AGENTNODE_CONFIG", str(config))
    path = config / "agentnode-admin.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    target = tmp_path / "elsewhere.sock" if spoil == "symlink" else path
    if spoil not in ("missing", "regular file"):
        listener.bind(str(target))
        if spoil != "not listening":
            listener.listen(1)
    try:
        if spoil == "regular file":
            path.write_text("")
        elif spoil == "symlink":
            path.symlink_to(target)
        elif spoil == "dir writable by others":
            config.chmod(0o777)
        elif spoil in ("socket not ours", "dir not ours"):
            if os.geteuid() != 0:
                pytest.skip("changing an owner needs root")
            os.chown(path if spoil == "socket not ours" else config, 4321, 4321)
        assert _serve_socket() == (path if spoil == "none" else None)
    finally:
        listener.close()
