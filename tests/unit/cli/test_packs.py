"""`install`, `uninstall`, `list` and `init` (host/cli/packs.py), through the installed command or main()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from host.spec.config import load_config
from host.spec.lockfile import Lockfile
from host.spec.manifest.load import load_manifest
from host.spec.manifest.model import AgentManifest, ToolpackManifest
from host.tools.calls import InstalledToolpack, resolve_tool
from host.tools.workers import ToolRunner
from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.schema import check_schema
from tests.unit.cli._support import HOSTILE, SPOOF_VERSION, assert_terminal_safe, engine_error, write_agent


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


def test_a_community_agent_cannot_be_installed_without_an_engine(env: dict[str, str], tmp_path: Path) -> None:
    pack = write_agent(tmp_path / "src", "stranger")
    proc = cli(env, "install", pack, "--json")
    assert_error_lines(proc, 1)
    out = json_out(proc)
    check_schema("error", out)
    expected = engine_error()
    assert out["error_code"] == expected.reason.value == "engine_unavailable"
    assert out["hint"] == expected.hint
    assert json_out(cli(env, "list", "--json")) == []


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


def _entry(**fields: Any) -> Any:
    from host.spec.lockfile import LockEntry

    base: dict[str, Any] = {
        "slug": "spoof", "version": "1.0.0", "package_type": "agent", "trust_level": "unverified",
        "artifact_hash": "f" * 64, "import_subdir": "", "sandbox_volume": None, "host_path": None,
        "manifest": {}, "installed_at": "2025-01-01T00:00:00Z",
    }  # fmt: skip
    return LockEntry(**{**base, **fields})


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
