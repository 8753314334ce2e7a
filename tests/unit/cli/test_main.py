"""The command's contract as a whole (docs/cli.md): its documented --json schemas, usage errors (exit 2),
the error lines of a failed command and its traceback only with --debug, and the lazy dispatch table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.schema import check_schema, documented_schema, schema_names
from tests.unit.cli._support import HOSTILE, assert_terminal_safe


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
        ("run", "x", "--backend", "kubernetes", "--allow-egress", "api.example.com"),
        ("run", "x", "--backend", "kubernetes", "--no-egress"),
        ("run", "x", "--allow-egress", "a.example.com", "--no-egress"),
        ("run", "x", "--allow-egress", "http://a.example.com/"),
        ("run", "x", "--allow-egress", "127.1"),
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


def test_every_command_dispatches_to_its_module_imported_only_then() -> None:
    """The dispatch table names each command of the parser, and each names a function that exists."""
    import argparse

    from host.cli.main import COMMANDS, command
    from host.cli.parser import build_parser

    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(COMMANDS) == sorted(sub.choices)
    for name in COMMANDS:
        assert callable(command(name)), name
