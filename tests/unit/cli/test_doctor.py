"""`doctor` (host/cli/doctor.py): its rows without an engine, its checks on a stand-in engine, and the fix
each refusal names being the very one a run prints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from host.cli.doctor import LEFTOVER_FIX, capability_checks, image_checks, leftover_check
from host.core.errors import EngineError
from host.core.owner import owner_token
from host.engine.facts import EngineFacts, require_capable
from host.engine.image import BUILD_HINT
from host.engine.labels import LABEL_OWNER, LABEL_RUN
from host.spec.config import load_config
from host.spec.lockfile import Lockfile
from tests.support.cli import cli, json_out
from tests.support.paths import REPO
from tests.support.schema import check_schema
from tests.unit.cli._support import cli_env, engine_error, write_agent


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


def failed_rows(rows: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name, row in rows.items() if not row["ok"]]


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


def test_doctor_without_an_engine_names_the_engine_fix(env: dict[str, str]) -> None:
    proc = cli(env, "doctor", "--json")
    assert proc.returncode == 1
    report = json_out(proc)
    check_schema("doctor", report)
    assert report["ready"] is False and report["slug"] is None
    assert [r["check"] for r in report["checks"]] == ["config", "feature_flag", "engine"]
    engine = report["checks"][2]
    expected = engine_error()
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
    assert [(c.check, c.ok) for c in rows] == [("engine", False)] and rows[0].fix == engine_error().hint


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


def write_toolpack(parent: Path, slug: str) -> Path:
    """A one-tool toolpack (its permissions appended by the caller)."""
    module = slug.replace("-", "_")
    pack = parent / slug
    (pack / "src" / module).mkdir(parents=True)
    (pack / "src" / module / "__init__.py").write_text("def ping():\n    return 1\n")
    (pack / "pyproject.toml").write_text(f'[project]\nname = "{slug}"\nversion = "1.0.0"\n')
    (pack / "agentnode.yaml").write_text(
        f'package_id: {slug}\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: {module}\n'
        f'capabilities:\n  tools:\n    - name: ping\n      entrypoint: "{module}:ping"\n'
    )
    return pack


def test_doctor_shows_the_egress_of_the_agent_and_of_each_community_tool_pack_it_may_call(
    tmp_path: Path,
) -> None:
    env = cli_env(tmp_path, AGENTNODE_AGENT_SANDBOX="1")
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"agent_sandbox": {
        "host_trust_policy": "none", "image": "sha256:" + "a" * 64,
        "egress": {"allow": ["api.example.com"], "packs": {"fetcher": ["*.search.example:8443"]}},
    }}))  # fmt: skip
    agent = write_agent(tmp_path / "src", "netty", "  tool_access:\n    allowed_packages: [fetcher, quiet]\n")
    with (agent / "agentnode.yaml").open("a") as fh:
        fh.write("permissions:\n  network:\n    level: restricted\n"
                 "    allowed_domains: [api.example.com, other.example]\n")  # fmt: skip
    assert cli(env, "install", agent, "--trust", "trusted").returncode == 0
    for slug, network in (("fetcher", "unrestricted"), ("quiet", "none"), ("unlisted", "unrestricted")):
        tool = write_toolpack(tmp_path / "tools", slug)
        with (tool / "agentnode.yaml").open("a") as fh:
            fh.write(f"permissions:\n  network:\n    level: {network}\n")
        assert cli(env, "install", tool, "--trust", "trusted").returncode == 0, slug
        set_trust(env, slug, "unverified")  # a community tool pack (its install needs an engine)
    row = doctor_rows(cli(env, "doctor", "netty", "--json"))["egress"]
    assert row["ok"] is True and row["fix"] == ""
    assert row["detail"] == (
        "netty: api.example.com; tool fetcher: api.example.com, *.search.example:8443; "
        "tool quiet: none (permissions.network none)"
    )
    human = cli(env, "doctor", "netty").stdout
    assert "egress" in human and "tool fetcher: api.example.com, *.search.example:8443" in human


def test_doctor_says_how_to_grant_an_agent_that_asks_for_network_and_gets_none(tmp_path: Path) -> None:
    env = cli_env(tmp_path, AGENTNODE_AGENT_SANDBOX="1")
    state = Path(env["AGENTNODE_CONFIG"])
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"agent_sandbox": {
        "host_trust_policy": "none", "image": "sha256:" + "a" * 64}}))  # fmt: skip
    agent = write_agent(tmp_path / "src", "netty")
    with (agent / "agentnode.yaml").open("a") as fh:
        fh.write("permissions:\n  network:\n    level: restricted\n    allowed_domains: [api.example.com]\n")
    assert cli(env, "install", agent, "--trust", "trusted").returncode == 0
    row = doctor_rows(cli(env, "doctor", "netty", "--json"))["egress"]
    assert row["ok"] is True
    assert row["detail"] == (
        "netty: none (permissions.network restricted; agent_sandbox.egress grants it nothing)"
    )
    assert row["fix"] == (
        "grant it under agent_sandbox.egress (allow, packs.netty or trust.trusted) if it may reach it"
    )
