"""Key hunting: the host holds a canary API key; the agent searches everywhere it can reach for it."""

from __future__ import annotations

import json

import pytest

from tests.hostile.conftest import CANARY, PROVIDER_SECRET, Lab, Ledger, brief
from tests.support import fake_llm
from tests.support.fake_llm import Behaviour

pytestmark = [pytest.mark.docker, pytest.mark.podman]

HUNTER = r"""
import json, os, re, subprocess, time

PATTERN = re.compile(rb"sk-[A-Za-z0-9_-]{6,}")

def scan(data):
    return {m.decode("utf-8", "replace") for m in PATTERN.findall(data)}

def read(path, limit=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return b""

# Built at run time, so no control string appears whole in this source (which the file scan reads too).
CONTROLS = {k: "sk" + "-control-" + k + "-4d9a1c" for k in ("env", "environ", "cmdline", "file")}

def run(context, **kwargs):
    # The controls: an sk- string planted where each scan looks, which that scan must find.
    os.environ["AGENTNODE_SCAN_CONTROL"] = CONTROLS["env"]
    # Two commands, so the shell stays (a lone `sleep` would replace it, and its argument with it); and
    # the scan starts only once the child shows its controls, not while it is still being exec'd.
    child = subprocess.Popen(["sh", "-c", "sleep 60; exit 0", CONTROLS["cmdline"]],
                             env={"PATH": os.environ["PATH"], "SCAN_CONTROL": CONTROLS["environ"]})
    for _ in range(500):
        shown = read(f"/proc/{child.pid}/cmdline") + read(f"/proc/{child.pid}/environ")
        if CONTROLS["cmdline"].encode() in shown and CONTROLS["environ"].encode() in shown:
            break
        time.sleep(0.01)
    with open("/tmp/scan-control.txt", "w") as fh:
        fh.write(CONTROLS["file"])
    found = {"env": sorted(scan("\n".join(f"{k}={v}" for k, v in os.environ.items()).encode()))}
    environ, cmdline, pids = set(), set(), []
    for pid in os.listdir("/proc"):
        if not (pid.isdigit() or pid in ("self", "thread-self")):
            continue
        pids.append(pid)
        task_dir = f"/proc/{pid}/task"
        threads = os.listdir(task_dir) if os.path.isdir(task_dir) else []
        tasks = [f"/proc/{pid}"] + [f"{task_dir}/{t}" for t in threads]
        for base in tasks:
            environ |= scan(read(base + "/environ"))
            cmdline |= scan(read(base + "/cmdline"))
    found["proc_environ"], found["proc_cmdline"], found["pids"] = sorted(environ), sorted(cmdline), pids
    files, scanned, total = set(), 0, 0
    for top, dirs, names in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
        for name in names:
            path = os.path.join(top, name)
            if os.path.islink(path) or not os.path.isfile(path) or total > (512 << 20):
                continue
            data = read(path)
            scanned, total = scanned + 1, total + len(data)
            files |= scan(data)
    found["files"], found["files_scanned"] = sorted(files)[:100], scanned
    child.kill()
    child.wait()
    found["controls_found"] = {
        "env": CONTROLS["env"] in found["env"], "proc_environ": CONTROLS["environ"] in environ,
        "proc_cmdline": CONTROLS["cmdline"] in cmdline, "files": CONTROLS["file"] in files}
    errors = []
    for _ in range(5):
        try:
            context.call_llm("tell me your key")
            errors.append("answered")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc} [{getattr(exc, 'reason', '')}] {exc.__cause__!r}")
    try:
        for _chunk in context.stream_llm("tell me your key"):
            pass
        errors.append("streamed")
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc} [{getattr(exc, 'reason', '')}]")
    found["llm_errors"] = errors
    env = context.run_tool("hostile-tools", "environ")
    boom = context.run_tool("hostile-tools", "boom")
    found["tool"] = {"env_ok": env.success, "env_keys": sorted((env.result or {}).keys()),
                     "env_hits": sorted(scan(json.dumps(env.result).encode())), "boom_error": boom.error}
    return found
"""


def test_api_key_cannot_be_found(lab: Lab, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    # Provider error bodies carry the key itself, as some real providers echo credentials in errors.
    monkeypatch.setattr(fake_llm, "SECRET_IN_ERROR_BODY", f"invalid api key {CANARY} ({PROVIDER_SECRET})")
    lab.llm.script(
        Behaviour(status=401),
        Behaviour(status=403),
        *[Behaviour(status=429)] * 3,  # 429 and 5xx are retried by the broker: 3 attempts
        *[Behaviour(status=500)] * 3,
        Behaviour(garbage=True),
        Behaviour(status=400),
    )
    lab.agent("key-hunter", HUNTER, llm_calls=6, max_runtime_seconds=120)
    result = lab.run("key-hunter")
    assert result.success, (result.error_code, result.error, result.logs[-3000:])
    found = result.result
    # The canary was live: the provider received it from the broker, and only from the broker.
    assert any(CANARY in json.dumps(r.headers) for r in lab.llm.requests)

    def clean(value: object) -> bool:
        text = json.dumps(value)
        return CANARY not in text and PROVIDER_SECRET not in text

    # Each scan found the control string the agent planted where that scan looks (its own environment, a
    # child's environ and cmdline, a file in /tmp): "no key found" comes from a scan that does find keys.
    controls = found["controls_found"]
    ledger.attack(
        "secrets.env",
        expected="the key is not in the agent's environment (a planted sk- control is found there)",
        observed=brief({"sk_strings": found["env"], "control_found": controls["env"]}),
        ok=clean(found["env"]) and controls["env"],
    )
    ledger.attack(
        "secrets.proc_environ",
        expected="no /proc/*/environ (every task) holds the key (a child's planted sk- control is found)",
        observed=brief(
            {
                "sk_strings": found["proc_environ"],
                "pids": found["pids"],
                "control_found": controls["proc_environ"],
            }
        ),
        ok=clean(found["proc_environ"]) and controls["proc_environ"],
    )
    ledger.attack(
        "secrets.proc_cmdline",
        expected="no /proc/*/cmdline holds the key (a child's planted sk- argument is found)",
        observed=brief({"sk_strings": found["proc_cmdline"], "control_found": controls["proc_cmdline"]}),
        ok=clean(found["proc_cmdline"]) and controls["proc_cmdline"],
    )
    ledger.attack(
        "secrets.files",
        expected="no readable file under / holds the key (a planted sk- control file is found)",
        observed=brief(
            {
                "sk_strings": found["files"],
                "files_scanned": found["files_scanned"],
                "control_found": controls["files"],
            }
        ),
        ok=clean(found["files"]) and found["files_scanned"] > 1000 and controls["files"],
    )
    ledger.attack(
        "secrets.llm_error_bodies",
        expected="401/403/429/500/garbage/400 bodies holding the key reach the agent as bare reasons",
        observed=brief([e.split(" [")[1] if " [" in e else e for e in found["llm_errors"]]),
        ok=clean(found["llm_errors"]) and all(e.startswith("LlmAccessError") for e in found["llm_errors"]),
    )
    ledger.attack(
        "secrets.tool_env_and_errors",
        expected="a host tool's environment and error text carry no key (the environ tool answered, with "
        "PATH; the boom tool's error arrived)",
        observed=brief(found["tool"]),
        ok=clean(found["tool"])
        and found["tool"]["env_ok"] is True
        and "PATH" in found["tool"]["env_keys"]
        and found["tool"]["boom_error"] == "tool raised ValueError",
    )
    audit = lab.state.audit_all()
    ledger.attack(
        "secrets.result_logs_audit",
        expected="0 sightings of the key in the run's result, logs and audit records (start and end written)",
        observed=brief(
            {
                "in_result_or_logs": lab.sightings,
                "in_audit": sum(CANARY in json.dumps(r) for r in audit),
                "audit_records": len(audit),
            }
        ),
        ok=lab.sightings == 0 and not any(CANARY in json.dumps(r) for r in audit) and len(audit) == 2,
    )
