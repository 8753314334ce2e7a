"""Files across the boundary on the real engine (issue 38): the starter packs' shapes (a workspace_read agent
reading a project, a workspace_write agent editing it, a toolpack that declares a workspace level working on
the agent's files), apply, conflict and export, inputs and artifacts, through the library and the CLI.

What the process inside sees is what is checked: the snapshot at /workspace (never the caller's directory),
read-only unless the pack writes its own copy; nothing of the caller's changes unless the caller asked.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host.files.run import FilesRequest
from host.runtime.rundir import run_root
from tests.support.cli import cli, json_out
from tests.support.host_state import HostState

pytestmark = [pytest.mark.docker, pytest.mark.podman]

READER = """
import os

def run(context, **kwargs):
    root = context.workspace
    seen = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    try:
        open(os.path.join(root, "planted"), "w").write("x")
        wrote = True
    except OSError as exc:
        wrote = exc.errno
    return {"workspace": root, "seen": seen, "main": open(os.path.join(root, "src/main.py")).read(),
            "wrote": wrote, "mounts": mounts()}


def mounts():
    found = {}
    for line in open("/proc/self/mountinfo"):
        point, options = line.split()[4:6]
        if point in ("/workspace", "/inputs", "/outputs"):
            found[point] = options.split(",")[0]
    return found
"""

EDITOR = """
import os

def run(context, **kwargs):
    root = context.workspace
    with open(os.path.join(root, "src/main.py"), "a") as f:
        f.write("print('edited')\\n")
    os.unlink(os.path.join(root, "notes.txt"))
    os.makedirs(os.path.join(root, "docs"), exist_ok=True)
    open(os.path.join(root, "docs/new.md"), "w").write("# new\\n")
    if kwargs.get("tool"):
        r = context.run_tool("ws-format", "shout", path="src/main.py")
        return {"tool": r.success, "error": r.error, "result": r.result}
    return {"ok": True}
"""

ARTIFACTS = """
import os

def run(context, **kwargs):
    data = open(os.path.join(context.inputs_dir, "data.csv")).read()
    context.write_artifact("report.md", "rows: %d\\n" % (len(data.splitlines()) - 1))
    os.makedirs(os.path.join(context.outputs_dir, "plots"))
    open(os.path.join(context.outputs_dir, "plots", "a.svg"), "wb").write(b"<svg/>" * 1000)
    return {"inputs": sorted(os.listdir(context.inputs_dir)), "workspace": context.workspace}
"""

FORMATTER = """
import os

def shout(path):
    full = os.path.join("/workspace", path)
    text = open(full).read()
    open(full, "w").write(text.upper())
    return {"chars": len(text)}
"""


@pytest.fixture
def state(host_state: HostState, runtime: str) -> HostState:
    host_state.write_config({"runtime": runtime})
    return host_state


def _agent(make_agent: Callable[..., Path], slug: str, source: str, level: str, extra: str = "") -> Path:
    pack = make_agent(slug, source, extra=extra)
    with (pack / "agentnode.yaml").open("a") as manifest:
        manifest.write(f"permissions:\n  filesystem:\n    level: {level}\n")
    return pack


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('hi')\n")
    (project / "notes.txt").write_text("notes\n")
    secret = tmp_path / "host-secret"
    secret.write_text("root's only")
    (project / "link-out").symlink_to(secret)  # leads out of DIR: never carried in
    os.mkfifo(project / "pipe")
    return project


def _run(state: HostState, slug: str, files: FilesRequest, **kwargs: Any) -> Any:
    host = state.host()
    try:
        return host.run(slug, files=files, **kwargs)
    finally:
        host.close()


def _no_areas(state: HostState) -> None:
    assert not list(run_root(state.env).glob("run-*.files")), "a run's files area was left behind"


def test_a_workspace_read_agent_reads_a_snapshot_it_cannot_change(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    project = _project(tmp_path)
    state.install(_agent(make_agent, "ws-reader", READER, "workspace_read"))
    result = _run(state, "ws-reader", FilesRequest(workspace=project))
    assert result.success, (result.error_code, result.error, result.logs)
    got = result.result
    assert got["workspace"] == "/workspace" and got["seen"] == ["notes.txt", "src/main.py"]
    assert got["main"] == "print('hi')\n" and got["wrote"] in (13, 30)  # EACCES (runsc) or EROFS (runc)
    assert got["mounts"] == {"/workspace": "ro", "/inputs": "ro", "/outputs": "rw"}  # as seen from inside
    assert not (project / "planted").exists()
    ws = result.files["workspace"]
    assert ws["files"] == 2 and ws["skipped"] == {"fifo": 1, "symlink_outside": 1}
    (record,) = state.audit()
    assert record["files"]["workspace"]["digest"] == ws["digest"] and "main.py" not in json.dumps(record)
    _no_areas(state)


def test_a_workspace_write_agent_edits_its_copy_and_the_change_set_is_applied_only_when_asked(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    project = _project(tmp_path)
    state.install(_agent(make_agent, "ws-editor", EDITOR, "workspace_write"))
    result = _run(state, "ws-editor", FilesRequest(workspace=project))
    assert result.success, (result.error_code, result.error, result.logs)
    changes = {c["path"]: c["change"] for c in result.files["changes"]["paths"]}
    assert changes == {"src/main.py": "modified", "notes.txt": "deleted", "docs": "added",
                       "docs/new.md": "added"}  # fmt: skip
    assert (project / "notes.txt").exists() and (project / "src/main.py").read_text() == "print('hi')\n"

    patch = tmp_path / "changes.patch"
    exported = _run(state, "ws-editor", FilesRequest(workspace=project, export_patch=patch))
    assert exported.success and exported.files["exported"] == "patch"
    assert "+print('edited')" in patch.read_text()
    assert (project / "src/main.py").read_text() == "print('hi')\n"

    def meanwhile(_run_id: str) -> None:  # after the snapshot, before the change set is applied
        (project / "notes.txt").write_text("changed on the host meanwhile\n")

    applied = _run(state, "ws-editor", FilesRequest(workspace=project, apply=True), on_start=meanwhile)
    assert applied.success, (applied.error_code, applied.error, applied.logs)
    assert (project / "src/main.py").read_text() == "print('hi')\nprint('edited')\n"
    assert (project / "docs/new.md").read_text() == "# new\n"
    assert (project / "notes.txt").read_text() == "changed on the host meanwhile\n"  # never overwritten
    assert applied.files["applied"]["conflicts_paths"] == ["notes.txt"]
    assert [r["files"]["applied"]["applied"] for r in state.audit() if r["files"].get("applied")] == [3]
    _no_areas(state)


def test_a_toolpack_declaring_workspace_write_works_on_the_agents_files(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    project = _project(tmp_path)
    tool = tmp_path / "toolpacks" / "ws-format"
    (tool / "src" / "ws_format").mkdir(parents=True)
    (tool / "src" / "ws_format" / "__init__.py").write_text(FORMATTER)
    (tool / "pyproject.toml").write_text('[project]\nname = "ws-format"\nversion = "1.0.0"\n')
    (tool / "agentnode.yaml").write_text(
        'package_id: ws-format\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: ws_format\n'
        "permissions:\n  filesystem:\n    level: workspace_write\n"
        'capabilities:\n  tools:\n    - name: shout\n      entrypoint: "ws_format:shout"\n'
    )
    state.install(tool, trust="unverified")
    state.install(_agent(make_agent, "ws-tooled", EDITOR, "workspace_write",
                         extra="tool_access:\n  allowed_packages: [ws-format]\n"))  # fmt: skip
    result = _run(state, "ws-tooled", FilesRequest(workspace=project, apply=True), kwargs={"tool": True})
    assert result.success and result.result["tool"], (result.result, result.error, result.logs)
    assert (project / "src/main.py").read_text() == "PRINT('HI')\nPRINT('EDITED')\n"  # the tool's edit too
    _no_areas(state)


def test_inputs_and_artifacts_through_the_cli(state: HostState, make_agent: Callable[..., Path],
                                              tmp_path: Path) -> None:  # fmt: skip
    state.install(_agent(make_agent, "ws-artifacts", ARTIFACTS, "none"))
    data, out = tmp_path / "data.csv", tmp_path / "out"
    data.write_text("x,y\n1,2\n3,4\n")
    proc = cli(state.env, "run", "ws-artifacts", "--input", f"data.csv={data}", "--output-dir", out, "--json")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    got = json_out(proc)
    assert got["result"] == {"inputs": ["data.csv"], "workspace": None}
    assert (out / "report.md").read_text() == "rows: 2\n"
    assert (out / "plots" / "a.svg").read_bytes() == b"<svg/>" * 1000
    paths = {p["path"]: p for p in got["files"]["artifacts"]["paths"]}
    assert set(paths) == {"report.md", "plots", "plots/a.svg"} and paths["plots/a.svg"]["size"] == 6000
    assert got["files"]["inputs"]["files"] == 1

    refused = cli(state.env, "run", "ws-artifacts", "--workspace", tmp_path, "--json")  # it declares none
    assert refused.returncode == 1 and json_out(refused)["error_code"] == "filesystem_refused"
    human = cli(state.env, "run", "ws-artifacts", "--input", f"data.csv={data}",
                "--output-dir", tmp_path / "o2")
    assert human.returncode == 0 and "files: 1 input(s); 3 artifact(s) in" in human.stderr, human.stderr
    _no_areas(state)


def test_a_level_the_config_does_not_grant_refuses_the_run_naming_the_key(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    runtime = json.loads((state.dir / "config.json").read_text())["agent_sandbox"]["runtime"]
    state.write_config({"runtime": runtime, "filesystem": {"allow": ["workspace_read"]}})
    state.install(_agent(make_agent, "ws-editor", EDITOR, "workspace_write"))
    result = _run(state, "ws-editor", FilesRequest(workspace=_project(tmp_path)))
    assert not result.success and result.error_code == "filesystem_refused"
    assert "agent_sandbox.filesystem.allow" in result.error + result.hint
    (record,) = state.audit()
    assert record["reason"] == "filesystem_refused"


def test_files_through_runner_client_and_host_aio_on_a_serve_host(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    import asyncio

    from host.aio import AsyncRunnerClient
    from tests.integration.test_serve import Served

    project = _project(tmp_path)
    host_state.install(_agent(make_agent, "ws-editor", EDITOR, "workspace_write"))
    host_state.install(_agent(make_agent, "ws-artifacts", ARTIFACTS, "none"))
    served = Served(host_state, warm=[])
    try:
        result = served.client.submit("ws-editor", files=FilesRequest(workspace=project, apply=True))
        assert result.success, (result.error_code, result.error, result.logs)
        assert (project / "docs/new.md").read_text() == "# new\n" and not (project / "notes.txt").exists()
        assert {c["path"] for c in result.files["changes"]["paths"]} >= {"src/main.py", "docs/new.md"}

        out = tmp_path / "out"

        async def artifacts() -> Any:
            async with AsyncRunnerClient(served.socket) as client:
                return await client.submit("ws-artifacts", files=FilesRequest(
                    inputs=(("data.csv", b"x\n1\n2\n3\n"),), output_dir=out))  # fmt: skip

        got = asyncio.run(artifacts())
        assert got.success, (got.error_code, got.error, got.logs)
        assert (out / "report.md").read_text() == "rows: 3\n" and got.files["inputs"]["bytes"] == 8
    finally:
        served.close()
    _no_areas(host_state)


def test_a_warm_member_gets_its_files_at_claim_time(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path
) -> None:
    from tests.integration.test_serve import Served

    host_state.install(_agent(make_agent, "ws-editor", EDITOR, "workspace_write"))
    host_state.write_config({"pool": {"size": 1, "idle_ttl_seconds": 120}})
    served = Served(host_state, warm=["ws-editor"])
    try:
        for attempt in range(5):  # until a member is up and waiting for its task (each run uses one)
            time.sleep(2)
            project = _project(tmp_path / f"try{attempt}")
            result = served.client.submit("ws-editor", files=FilesRequest(workspace=project, apply=True))
            assert result.success, (result.error_code, result.error, result.logs)
            assert (project / "docs/new.md").read_text() == "# new\n"
            assert result.files["workspace"]["files"] == 2
            if result.warm:
                break
        assert result.warm, "no run was served by a warm member"
        plain = served.client.submit("ws-editor", goal="no files")  # a member with an area, handed none
        assert not plain.success and plain.error_code == "agent_exception"  # no workspace: EDITOR fails
    finally:
        served.close()
    _no_areas(host_state)
