"""`run` (host/cli/run.py): its one --json object, failures and their escaped text, strict JSON in and out,
and the `serve` host's socket it hands a run to."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.schema import check_schema
from tests.unit.cli._support import HOSTILE, assert_terminal_safe, strict_json, write_agent


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


def run_result(**fields: Any) -> Any:
    from host.runtime.runner import RunResult

    base: dict[str, Any] = {"mode_used": "agent_sandbox", "run_id": "a" * 32, "duration_ms": 5}
    base["logs"] = HOSTILE
    return RunResult(**{**base, **fields})


def test_a_failed_runs_error_and_hint_reach_the_terminal_escaped_on_two_lines(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, run_result(success=False, error=HOSTILE, error_code="agent_exception",
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

    fake_run(monkeypatch, run_result(success=False, error=HOSTILE, error_code="agent_exception"))
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
    fake_run(monkeypatch, run_result(success=True, result=result, mode_used="agent\x1b[8m"))
    assert main(["run", "probe"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == result and out.isascii() and "\x1b" not in out
    assert err.startswith("ok: probe (") and '"agent\\x1b[8m"' in err and "\x1b" not in err


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_result_is_a_failed_run_never_invalid_json(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: float
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, run_result(success=True, result={"n": [1, value]}, logs=""))
    assert main(["run", "probe", "--json"]) == 1
    out, _ = capsys.readouterr()
    payload = strict_json(out)
    check_schema("run", payload)
    assert payload["success"] is False and payload["result"] is None
    assert payload["error_code"] == "result_not_serializable" and payload["run_id"] == "a" * 32
    assert main(["run", "probe"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: the agent's result cannot be shown as JSON")


@pytest.mark.parametrize("raw", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "[1, 1e400]"])
def test_arg_values_must_be_strict_json(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raw: str
) -> None:
    from host.cli.main import main

    fake_run(monkeypatch, run_result(success=True, result=None))  # never reached
    assert main(["run", "probe", "--arg", f"n={raw}", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --arg n: the value is not strict JSON")


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
