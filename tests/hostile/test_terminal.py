"""Terminal injection through the real CLI: agent failure text and pack manifests never drive the terminal.

Issue 12, findings 7 and 8: an agent's failure text (an exception's message, or a raw ReportResult failure
sent on its own channel) and a pack's manifest fields reach the operator's terminal through the CLI's human
output. Each test runs the installed command as a subprocess against a real sandboxed agent and checks that
its stdout and stderr carry no raw ESC, C1 or bidi character while the escaped forms stay visible; and that
`run --json` stays strict JSON (no NaN/Infinity) whatever the agent reports.

Every terminal row has a positive control: the escaped form of the hostile text must be in the output, so
a command that never printed the text (or crashed before it could) fails the row instead of passing it.
Which pack-authored text a human-mode command prints (host/cli/*.py): `policy explain` the tool packages
and the LLM model allowlist; `install` its warnings (unknown manifest key names) and its errors (the
offending file name). A pack's name, goal and system prompt reach only the agent (no command prints them),
and slug and version are validated to plain tokens at install, so no row claims to test those on the
terminal.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host.spec.lockfile import Lockfile
from tests.hostile.conftest import STUBS, Lab, Ledger, brief
from tests.support.cli import cli

pytestmark = pytest.mark.docker

HOSTILE = "\x1b[2K\x1b[1A\x1b]0;pwned\x07\rok: fake (agent_sandbox)\x9b31m\u202etxt.exe\u2066\x1b[8mhidden"
"""Erase the line, cursor up, retitle the window, overwrite with a fake ok: line, 8-bit CSI, bidi, conceal."""
RAW = {"\x1b": "ESC", "\x07": "BEL", "\r": "CR", "\x9b": "8-bit CSI", "\u202e": "RLO", "\u2066": "LRI"}
ESCAPED = ("\\x1b]0;pwned\\x07", "\\x9b31m", "\\u202etxt.exe", "\\u2066", "\\x1b[8mhidden")
"""What the operator must see; the wrapper's one-line summary of an exception already turns CR into a space,
so `\\r` itself is checked only for the raw ReportResult failure."""
HOSTILE_SHOWN = (
    "\\x1b[2K\\x1b[1A\\x1b]0;pwned\\x07\\rok: fake (agent_sandbox)\\x9b31m\\u202etxt.exe\\u2066\\x1b[8mhidden"
)
"""HOSTILE exactly as the operator must see it (written out by hand, not computed by host/core/terminal)."""

AGENT = STUBS + textwrap.dedent(
    """
    import time

    TEXT = __TEXT__

    def report(request):
        session = session_pb2_grpc.SessionServiceStub(channel())
        seen = status(lambda: session.ReportResult(request, timeout=30))
        time.sleep(60)  # the host ends the run on the first report; it never returns here
        return seen

    def run(context, mode, **kwargs):
        print("log line " + TEXT, flush=True)
        if mode == "raise":
            raise ValueError(TEXT)
        if mode == "raw_failure":
            code = session_pb2.AGENT_ERROR_CODE_AGENT_EXCEPTION
            failure = session_pb2.AgentFailure(code=code, message=TEXT)
            return report(session_pb2.ReportResultRequest(failure=failure))
        if mode == "echo":
            return {"text": TEXT}
        if mode == "inf":
            return {"n": float("inf")}
        if mode.startswith("raw_value:"):
            return report(session_pb2.ReportResultRequest(value_json=mode.removeprefix("raw_value:")))
        raise ValueError(mode)
    """
).replace("__TEXT__", repr(HOSTILE))


def raw_found(text: str) -> list[str]:
    """The raw terminal-driving characters in `text`, by name."""
    return [name for ch, name in RAW.items() if ch in text]


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, as any strict JSON reader does."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def record_terminal(
    ledger: Ledger, id: str, proc: Any, *, expected: str, escaped: tuple[str, ...], code: int | None = None
) -> bool:
    """One attack: raw characters absent from stdout+stderr, the escaped forms present (and exit `code`).

    `escaped` is the positive control proving the hostile text reached the terminal; without it the row
    could not fail, so it may not be empty.
    """
    assert escaped, f"{id}: a terminal row needs the escaped form it must see (else it cannot fail)"
    seen = proc.stdout + proc.stderr
    raw = raw_found(seen)
    missing = [brief(e, 40) for e in escaped if e not in seen]
    return ledger.attack(
        id,
        expected=expected,
        observed=f"exit {proc.returncode}; raw: {raw or 'none'}; escapes missing: {missing or 'none'}; "
        f"stdout {brief(ascii(proc.stdout), 120)}; stderr {brief(ascii(proc.stderr), 160)}",
        ok=not raw and not missing and (code is None or proc.returncode == code),
    )


def record_refusal(
    ledger: Ledger, id: str, proc: Any, *, expected: str, wording: str, escaped: tuple[str, ...]
) -> bool:
    """One refused command: exit 1 (the contract's failure code), nothing on stdout, exactly the `error:`
    and `hint:` lines on stderr, the error naming the documented refusal (`wording`, so a crash's generic
    `unexpected …` line does not pass) and quoting the hostile text in its escaped form, nothing raw."""
    assert escaped, f"{id}: a refusal row needs the escaped form it must see (else it cannot fail)"
    lines = proc.stderr.splitlines()
    shaped = (
        len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")
        and "Traceback" not in proc.stderr
    )  # fmt: skip
    worded = bool(lines) and wording in lines[0]
    raw = raw_found(proc.stdout + proc.stderr)
    missing = [brief(e, 40) for e in escaped if not (lines and e in lines[0])]
    return ledger.attack(
        id,
        expected=expected,
        observed=f"exit {proc.returncode}; stdout {len(proc.stdout)} chars; error+hint lines: {shaped}; "
        f"documented wording: {worded}; raw: {raw or 'none'}; escapes missing from the error: "
        f"{missing or 'none'}; stderr {brief(ascii(proc.stderr), 200)}",
        ok=proc.returncode == 1 and proc.stdout == "" and shaped and worded and not raw and not missing,
    )


@pytest.fixture
def run_cli(lab: Lab) -> Callable[..., Any]:
    env = {**lab.state.env, "LANG": "C.UTF-8"}
    for key in ("DOCKER_HOST", "DOCKER_CONFIG"):
        if key in os.environ:
            env[key] = os.environ[key]

    def run(*args: str) -> Any:
        return cli(env, *args, timeout=300)

    return run


def test_agent_failure_text_is_escaped_in_human_output(
    lab: Lab, ledger: Ledger, run_cli: Callable[..., Any]
) -> None:
    slug = lab.agent("term-agent", AGENT)
    for mode, id, escaped in (
        ("raise", "terminal.exception_message", ESCAPED),
        ("raw_failure", "terminal.raw_failure_report", (*ESCAPED, "\\rok: fake")),
    ):
        human = run_cli("run", slug, "--runtime", lab.runtime, "--arg", f'mode="{mode}"')
        lines = [line for line in human.stderr.splitlines() if not line.startswith("WARNING ")]
        ok = record_terminal(
            ledger, f"{id}.human", human, escaped=escaped,
            expected="exit 1; one `error:` line, ESC/C1/bidi shown escaped (\\x1b, \\u202e)",
        )  # fmt: skip
        # The agent's last output lines come first, each one line behind `| `, then the one `error:` line.
        errors = [line for line in lines if line.startswith("error: ")]
        shown_lines = [line for line in lines if line.startswith("| ")]
        header = [line for line in lines if line.startswith("the agent's last ")]
        ledger.attack(
            f"{id}.one_error_line",
            expected="the agent's text stays inside the one `error:` line and its own `| ` output lines "
            "(no fake `ok:` line of its own)",
            observed=f"exit {human.returncode}; stdout {len(human.stdout)} chars; stderr lines "
            f"{[brief(ascii(line), 40) for line in lines]}",
            ok=ok and human.returncode == 1 and human.stdout == "" and len(errors) == 1 and len(header) <= 1
            and all(line.startswith(("error: ", "hint: ", "| ", "the agent's last ")) for line in lines)
            and len(shown_lines) <= 10 and not any(line.startswith("ok:") for line in lines),
        )  # fmt: skip
        as_json = run_cli("run", slug, "--runtime", lab.runtime, "--arg", f'mode="{mode}"', "--json")
        try:
            out = strict_json(as_json.stdout)
            verdict = out["success"] is False and "pwned" in out["error"]
            shown = f"error_code {out['error_code']}; text exact in error: {HOSTILE in out['error']}"
        except ValueError as exc:
            verdict, shown = False, f"not JSON: {exc}"
        ledger.attack(
            f"{id}.json",
            expected="--json: valid JSON with the text inside (JSON escapes ESC as \\u001b), no raw ESC",
            observed=f"exit {as_json.returncode}; {shown}; stderr raw: {raw_found(as_json.stderr) or 'none'}",
            ok=verdict and not raw_found(as_json.stdout + as_json.stderr),
        )


def test_agent_result_and_non_finite_numbers_in_run_output(
    lab: Lab, ledger: Ledger, run_cli: Callable[..., Any]
) -> None:
    slug = lab.agent("term-result", AGENT)
    human = run_cli("run", slug, "--runtime", lab.runtime, "--arg", 'mode="echo"')
    try:
        shown_ok = json.loads(human.stdout) == {"text": HOSTILE} and human.stdout.isascii()
    except ValueError:
        shown_ok = False
    ledger.attack(
        "terminal.result_text.human",
        expected="the result is printed as ASCII JSON (every control a \\u escape), exit 0",
        observed=f"exit {human.returncode}; parses back exactly: {shown_ok}; raw: "
        f"{raw_found(human.stdout + human.stderr) or 'none'}",
        ok=human.returncode == 0 and shown_ok and not raw_found(human.stdout + human.stderr),
    )
    for mode, id in (
        ("inf", "terminal.non_finite.returned"),
        ("raw_value:1e999", "terminal.non_finite.raw_1e999"),
        ("raw_value:[Infinity]", "terminal.non_finite.raw_infinity"),
        ("raw_value:NaN", "terminal.non_finite.raw_nan"),
    ):
        proc = run_cli("run", slug, "--runtime", lab.runtime, "--arg", "mode=" + json.dumps(mode), "--json")
        try:
            out = strict_json(proc.stdout)
            verdict = out["success"] is False and out["result"] is None and len(proc.stdout.splitlines()) == 1
            shown = f"success {out['success']}, error_code {out['error_code']}"
        except ValueError as exc:
            verdict, shown = False, f"invalid JSON on stdout ({exc}): {brief(proc.stdout, 80)}"
        ledger.attack(
            id,
            expected="run --json prints one strict JSON object (no NaN/Infinity): a failed run, exit 1",
            observed=f"exit {proc.returncode}; {shown}",
            ok=verdict and proc.returncode == 1,
        )
    refused = run_cli("run", slug, "--runtime", lab.runtime, "--arg", "mode=1e999", "--json")
    ledger.attack(
        "terminal.non_finite.arg",
        expected="--arg KEY=1e999 is a usage error (exit 2), nothing on stdout, no run",
        observed=f"exit {refused.returncode}; stdout {brief(refused.stdout, 60)!r}; "
        f"stderr {brief(refused.stderr, 100)}",
        ok=refused.returncode == 2 and refused.stdout == "" and "not strict JSON" in refused.stderr,
    )


def _write_pack(root: Path, slug: str, manifest: str, files: dict[str, str] | None = None) -> Path:
    pack = root / slug
    pack.mkdir(parents=True)
    (pack / "agentnode.yaml").write_text(manifest)
    for name, text in (files or {"agent.py": "def run(context, **kwargs):\n    return {}\n"}).items():
        (pack / name).write_text(text)
    return pack


def _yaml(text: str) -> str:
    """A YAML double-quoted scalar carrying `text` exactly (JSON strings are YAML)."""
    return json.dumps(text)


def _agent_manifest(slug: str, *, version: str = '"1.0.0"', name: str = "", extra: str = "") -> str:
    return (
        f"package_id: {slug}\nversion: {version}\npackage_type: agent\n"
        + (f"name: {name}\n" if name else "")
        + f"agent:\n  entrypoint: agent:run\n  goal: {_yaml(HOSTILE)}\n  system_prompt: {_yaml(HOSTILE)}\n"
        + extra
    )


UNKNOWN_KEYS = (
    "\x1b[2K\x1b[1A\x1b]0;pwned\x07\rok:",
    "fake (agent_sandbox)\x9b31m",
    "\u202etxt.exe\u2066\x1b[8mhidden",
)
"""HOSTILE in three unknown top-level manifest keys (install warns about each, the key cut to 64 escaped
characters; these fit whole)."""
UNKNOWN_KEYS_SHOWN = (
    "warning: \\x1b[2K\\x1b[1A\\x1b]0;pwned\\x07\\rok:: unknown key, ignored\n",
    "warning: fake (agent_sandbox)\\x9b31m: unknown key, ignored\n",
    "warning: \\u202etxt.exe\\u2066\\x1b[8mhidden: unknown key, ignored\n",
)
"""How install's warnings show them: one stderr line each, escaped."""


def test_pack_manifest_text_is_escaped_or_refused(
    make_lab: Callable[[str], Lab], ledger: Ledger, tmp_path: Path
) -> None:
    lab = make_lab("runc")
    env = {**lab.state.env, "LANG": "C.UTF-8"}
    packs = tmp_path / "term-packs"
    # Every text field hostile; of these, `policy explain` prints the tool packages and the model allowlist
    # (each quoted by safe_token). Name, goal and system prompt are printed by no command (module docstring).
    extra = (
        f"  tool_access: {{allowed_packages: [{_yaml('tools' + HOSTILE)}]}}\n"
        f"  llm_access: {{enabled: true, allowed_models: [{_yaml('model' + HOSTILE)}]}}\n"
    )
    named = _write_pack(packs, "term-named", _agent_manifest("term-named", name=_yaml(HOSTILE), extra=extra))
    installed = cli(env, "install", named)
    explained = cli(env, "policy", "explain", "term-named")
    # The "tools"/"model" prefixes tell the two fields apart: each escaped form can come only from its field.
    for field, shown in (("tools", f'"tools{HOSTILE_SHOWN}"'), ("llm_models", f'"model{HOSTILE_SHOWN}"')):
        record_terminal(
            ledger, f"terminal.manifest_{field}.policy_explain", explained, code=0, escaped=(shown,),
            expected=f"`policy explain` exits 0 and shows the manifest's hostile {field} entry quoted and "
            f"escaped (\\x1b, \\x9b, \\u202e), nothing raw (install exit {installed.returncode})",
        )  # fmt: skip

    # version: a spoofed "trust curated" with CR and CSI; refused at install (semver) or shown escaped
    spoof = "1.0.0 (agent, trust curated)\r\x1b[2K"
    versioned = _write_pack(packs, "term-version", _agent_manifest("term-version", version=_yaml(spoof)))
    proc = cli(env, "install", versioned)
    seen = proc.stdout + proc.stderr
    refused = (
        proc.returncode == 1 and seen.startswith("error: ") and "version: expected a semantic version" in seen
    )
    quoted = proc.returncode == 0 and '"1.0.0 (agent, trust curated)\\r\\x1b[2K"' in proc.stdout
    if proc.returncode == 0:
        listed = cli(env, "list")
        seen += listed.stdout + listed.stderr
        quoted = quoted and '"1.0.0 (agent, trust curated)\\r\\x1b[2K"' in listed.stdout
    ledger.attack(
        "terminal.manifest_version",
        expected="a version with CR/CSI faking `trust curated` is refused at install (the semver error), or "
        "shown quoted and escaped (never as bare text next to the real trust level)",
        observed=f"install exit {proc.returncode} ({'refused' if refused else 'installed'}); raw: "
        f"{raw_found(seen) or 'none'}; {brief(ascii(seen), 160)}",
        ok=not raw_found(seen) and (refused or quoted),
    )

    # pack-derived text in install output: unknown manifest keys (warnings) and file names (an error)
    keys = "".join(f"{_yaml(k)}: 1\n" for k in UNKNOWN_KEYS)
    keyed = _write_pack(packs, "term-keys", _agent_manifest("term-keys", extra=keys))
    record_terminal(
        ledger, "terminal.install_warning.unknown_keys", cli(env, "install", keyed), code=0,
        escaped=UNKNOWN_KEYS_SHOWN,
        expected="install succeeds (exit 0) and warns about each unknown manifest key on its own stderr "
        "line, the key escaped (\\x1b, \\x9b, \\u202e), no raw control characters",
    )  # fmt: skip
    named_file = _write_pack(
        packs, "term-file", _agent_manifest("term-file"),
        {"agent.py": "def run(context, **kwargs):\n    return {}\n", f"x{HOSTILE}.py": "X = 1\n"},
    )  # fmt: skip
    record_refusal(
        ledger, "terminal.install_error.file_name", cli(env, "install", named_file),
        wording=": file names with control characters or undecodable bytes are not allowed",
        escaped=(f"error: x{HOSTILE_SHOWN}.py: ",),
        expected="install refused (exit 1, one error and one hint line, no traceback): the error names the "
        "file whose name has ESC/OSC/C1/bidi, escaped, no raw control characters",
    )  # fmt: skip
    installed_entries = Lockfile(lab.state.dir / "agentnode.lock").entries().values()
    lab.volumes.update(e.sandbox_volume for e in installed_entries if e.sandbox_volume)  # removed at teardown
