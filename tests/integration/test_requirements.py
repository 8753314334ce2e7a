"""Python requirements of packs against the real engine and the real package index: a trusted toolpack's
own environment, an agent's binary wheel inside the network-less sandbox, refusals, and offline installs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from host.core.errors import PackError
from host.packs.requirements import Source
from host.packs.site import SITE_DIR
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.wheels import VENV_DIR
from tests.support.cli import cli, json_out
from tests.support.host_state import HostState

pytestmark = pytest.mark.docker

SIX_TOOL = """
import sys

import six


def version():
    return {"six": six.__version__, "file": six.__file__, "prefix": sys.prefix}
"""

TOOL_CALLER = """
def run(context, **kwargs):
    out = {}
    for slug in ("six-old", "six-new"):
        r = context.run_tool(slug, "version")
        out[slug] = r.result if r.success else {"error": r.error}
    return out
"""

MARKUPSAFE_AGENT = """
import socket

import markupsafe
from markupsafe import _speedups


def run(context, **kwargs):
    try:
        socket.create_connection(("151.101.0.223", 443), timeout=3).close()  # pypi.org
        reached = True
    except OSError:
        reached = False
    with open("/proc/net/dev") as fh:
        interfaces = [line.split(":")[0].strip() for line in fh.read().splitlines()[2:]]
    return {
        "escaped": str(markupsafe.escape("<b>")),
        "impl": markupsafe._escape_inner.__module__,
        "speedups": _speedups.__file__,
        "markupsafe": markupsafe.__file__,
        "interfaces": interfaces,
        "reached_the_internet": reached,
    }
"""


def pip_freeze() -> str:
    """The host venv's installed distributions: installs must never change them."""
    cmd = [sys.executable, "-m", "pip", "freeze", "--all"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout


def write_pack(
    parent: Path, slug: str, *, kind: str, module: str, source: str, requirements: list[str], extra: str = ""
) -> Path:
    """A pack with a src/ layout and a pyproject.toml listing `requirements`."""
    pack = parent / slug
    (pack / "src").mkdir(parents=True)
    (pack / "src" / f"{module}.py").write_text(textwrap.dedent(source))
    deps = ", ".join(f'"{r}"' for r in requirements)
    (pack / "pyproject.toml").write_text(
        f'[project]\nname = "{slug}"\nversion = "1.0.0"\ndependencies = [{deps}]\n'
        '[project.optional-dependencies]\nheavy = ["torch"]\n'  # never installed
    )
    if kind == "toolpack":
        tool = f"    - name: version\n      entrypoint: {module}:version\n"
        body = f"entrypoint: {module}\ncapabilities:\n  tools:\n{tool}"
    else:
        body = f'agent:\n  entrypoint: "{module}:run"\n  goal: probe\n{textwrap.indent(extra, "  ")}'
    head = f'package_id: {slug}\nversion: "1.0.0"\npackage_type: {kind}\n'
    (pack / "agentnode.yaml").write_text(head + body)
    return pack


@pytest.fixture
def packs(tmp_path: Path) -> Path:
    return tmp_path / "packs"


def test_trusted_toolpacks_with_conflicting_pins_each_get_their_own_environment(
    host_state: HostState, packs: Path
) -> None:
    before = pip_freeze()
    old = host_state.install(
        write_pack(packs, "six-old", kind="toolpack", module="six_old", source=SIX_TOOL,
                   requirements=["six==1.16.0"]),
        trust="trusted",
    )  # fmt: skip
    new = host_state.install(
        write_pack(packs, "six-new", kind="toolpack", module="six_new", source=SIX_TOOL,
                   requirements=["six==1.17.0", "agentnode-sdk>=0.4"]),
        trust="curated",
    )  # fmt: skip
    caller = write_pack(
        packs, "six-caller", kind="agent", module="caller", source=TOOL_CALLER, requirements=[],
        extra="tool_access:\n  allowed_packages: [six-old, six-new]\n",
    )  # fmt: skip
    host_state.install(caller)
    assert pip_freeze() == before  # nothing went into the host's own environment

    for entry, version in ((old, "1.16.0"), (new, "1.17.0")):
        assert entry.requirements is not None
        assert entry.requirements["declared"] == [f"six=={version}"]  # agentnode-sdk is the host's
        wheels = entry.requirements["host"]["wheels"]
        assert [w["filename"] for w in wheels] == [f"six-{version}-py2.py3-none-any.whl"]
        assert len(wheels[0]["sha256"]) == 64
        assert "sandbox" not in entry.requirements  # a toolpack runs on the host
        assert entry.host_path and (Path(entry.host_path) / VENV_DIR / "bin" / "python").exists()

    host = host_state.host()
    try:
        result = host.run("six-caller")
    finally:
        host.close()
    assert result.success, (result.error_code, result.error, result.logs)
    out = result.result
    assert out["six-old"]["six"] == "1.16.0" and out["six-new"]["six"] == "1.17.0"
    assert out["six-old"]["prefix"] == str(Path(old.host_path or "") / VENV_DIR)
    assert out["six-new"]["file"].startswith(str(Path(new.host_path or "") / VENV_DIR))

    # Uninstalling removes the pack's environment with its host copy.
    cli(host_state.env, "uninstall", "six-old")
    assert not Path(old.host_path or "").exists()


def test_an_agent_imports_its_binary_wheel_inside_the_network_less_sandbox(
    host_state: HostState, packs: Path, runtime: str
) -> None:
    before = pip_freeze()
    agent = write_pack(
        packs, "markup-agent", kind="agent", module="markup_agent", source=MARKUPSAFE_AGENT,
        requirements=["markupsafe>=2.1"],
    )  # fmt: skip
    proc = cli(host_state.env, "install", agent, "--json")
    assert proc.returncode == 0, proc.stderr
    entry = json_out(proc)  # pip's output never reaches stdout
    assert pip_freeze() == before
    wheels = entry["requirements"]["sandbox"]["wheels"]
    assert len(wheels) == 1 and wheels[0]["filename"].startswith("markupsafe-")
    assert "cp311-cp311-manylinux" in wheels[0]["filename"]
    assert entry["requirements"]["sandbox"]["target"].startswith("cp311-manylinux_2_36_")
    assert entry["sandbox_volume"] and entry["artifact_hash"][:16] not in entry["sandbox_volume"]

    host = host_state.host()
    try:
        result = host.run("markup-agent", runtime=runtime)
    finally:
        host.close()
    assert result.success, (result.error_code, result.error, result.logs)
    out = result.result
    assert out["escaped"] == "&lt;b&gt;"
    assert out["impl"] == "markupsafe._speedups"  # the compiled extension, not the pure-Python fallback
    assert out["speedups"].startswith(f"/pack/src/{SITE_DIR}/markupsafe/") and out["speedups"].endswith(".so")
    assert out["interfaces"] == ["lo"] and out["reached_the_internet"] is False


def test_a_volume_whose_wheels_differ_from_the_lockfile_fails_closed(
    host_state: HostState, packs: Path
) -> None:
    agent = write_pack(
        packs, "six-agent", kind="agent", module="six_agent",
        source="import six\ndef run(context, **kw):\n    return six.__version__\n",
        requirements=["six==1.16.0"],
    )  # fmt: skip
    entry = host_state.install(agent)
    host = host_state.host()
    try:
        assert host.run("six-agent").result == "1.16.0"
        lockfile = Lockfile(host_state.dir / "agentnode.lock")
        record = dict(entry.requirements or {})
        wheel = {**record["sandbox"]["wheels"][0], "sha256": "0" * 64}  # not what the volume holds
        record["sandbox"] = {**record["sandbox"], "wheels": [wheel]}
        lockfile.put(LockEntry(**{**entry.to_json(), "requirements": record}))
        stale = host.run("six-agent")
    finally:
        host.close()
    assert not stale.success and stale.error_code == "volume_stale"


def test_requirements_without_a_wheel_are_refused_naming_them(host_state: HostState, packs: Path) -> None:
    invented = "agentnode-sandbox-no-such-package-4f2a9c"
    for slug, requirement, name in (
        ("no-such", f"{invented}>=1", invented),
        ("sdist-only", "docopt==0.6.2", "docopt"),  # only ever published as an sdist: never built here
    ):
        agent = write_pack(packs, slug, kind="agent", module="a", source="def run(c):\n    return 1\n",
                           requirements=[requirement])  # fmt: skip
        proc = cli(host_state.env, "install", agent)
        assert proc.returncode == 1, proc.stderr
        error = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
        assert f"no wheel of {name} for CPython 3.11 manylinux" in error, proc.stderr
        assert "--offline --find-links DIR" in proc.stderr
        assert "Traceback" not in proc.stderr and "Could not find a version" not in proc.stderr
        tools = write_pack(packs, f"{slug}-tools", kind="toolpack", module="t", source=SIX_TOOL,
                           requirements=[requirement])  # fmt: skip
        with pytest.raises(PackError, match=f"no wheel of {name} for this host's Python"):
            host_state.install(tools, trust="trusted")  # a trusted toolpack's environment: the same refusal
    assert Lockfile(host_state.dir / "agentnode.lock").entries() == {}


@pytest.mark.parametrize(
    ("requirement", "problem"),
    [
        ("six @ https://example.invalid/six-1.16.0-py2.py3-none-any.whl", "direct URL reference"),
        ("--index-url=https://example.invalid/simple", "looks like a pip option"),
        ("-e .", "looks like a pip option"),
        ("six --hash=sha256:00", "is not a PEP 508 requirement"),
    ],
)
def test_url_and_option_requirements_are_refused(
    host_state: HostState, packs: Path, requirement: str, problem: str
) -> None:
    agent = write_pack(packs, "bad-req", kind="agent", module="a", source="def run(c):\n    return 1\n",
                       requirements=[requirement.replace('"', '\\"')])  # fmt: skip
    proc = cli(host_state.env, "install", agent, "--trust", "trusted")
    assert proc.returncode == 1
    assert problem in proc.stderr and "[project].dependencies[0]" in proc.stderr


def download(requirement: str, dest: Path, *, platform: bool) -> None:
    """Fill a --find-links directory the way an operator would."""
    args = ["--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest),
         *(args if platform else []), requirement],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip


def test_offline_installs_use_only_the_find_links_directory(
    host_state: HostState, packs: Path, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    download("six==1.16.0", wheels, platform=False)
    make: Callable[[str, str, list[str]], Path] = lambda slug, kind, reqs: write_pack(  # noqa: E731
        packs, slug, kind=kind, module=slug.replace("-", "_"),
        source=SIX_TOOL if kind == "toolpack" else "import six\ndef run(c):\n    return six.__version__\n",
        requirements=reqs,
    )  # fmt: skip

    # The venv path (a trusted toolpack) and the wheel path (an agent's volume), from the directory alone.
    for slug, kind, trust in (
        ("offline-tools", "toolpack", "trusted"),
        ("offline-agent", "agent", "verified"),
    ):
        proc = cli(host_state.env, "install", make(slug, kind, ["six==1.16.0"]), "--trust", trust,
                   "--offline", "--find-links", wheels, "--json")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        entry = json_out(proc)
        side = "host" if kind == "toolpack" else "sandbox"
        filenames = [w["filename"] for w in entry["requirements"][side]["wheels"]]
        assert filenames == ["six-1.16.0-py2.py3-none-any.whl"]
    host = host_state.host()
    try:
        assert host.run("offline-agent").result == "1.16.0"
    finally:
        host.close()

    # A requirement the directory has no wheel for is refused, naming it and where to put one.
    proc = cli(host_state.env, "install", make("offline-missing", "agent", ["idna==3.6"]),
               "--offline", "--find-links", wheels)  # fmt: skip
    assert proc.returncode == 1
    assert "no wheel of idna for CPython 3.11 manylinux" in proc.stderr
    assert "in the --find-links directories" in proc.stderr and "put a wheel of idna" in proc.stderr

    nodir = make("offline-nodir", "agent", [])
    proc = cli(host_state.env, "install", nodir, "--find-links", tmp_path / "nope")
    assert proc.returncode == 2 and "not a directory" in proc.stderr


def test_a_pack_without_requirements_creates_no_environment(host_state: HostState, packs: Path) -> None:
    tools = write_pack(packs, "plain-tools", kind="toolpack", module="plain_tools",
                       source="def version():\n    return 1\n", requirements=[])  # fmt: skip
    entry = host_state.install(tools, trust="trusted")
    assert entry.requirements is None and entry.host_path
    assert not (Path(entry.host_path) / VENV_DIR).exists()
    assert Source().pip_args() == []


def test_a_trusted_agent_on_the_host_path_imports_its_requirements(
    host_state: HostState, packs: Path
) -> None:
    agent = write_pack(
        packs, "host-six", kind="agent", module="host_six",
        source="import six\ndef run(context, **kw):\n    return [six.__version__, six.__file__]\n",
        requirements=["six==1.16.0"],
    )  # fmt: skip
    before = pip_freeze()
    entry = host_state.install(agent, trust="trusted")
    assert pip_freeze() == before
    assert entry.requirements is not None and {"sandbox", "host"} <= set(entry.requirements)
    host = host_state.host()
    try:
        result = host.run("host-six")
    finally:
        host.close()
    assert result.success and result.mode_used != "agent_sandbox", (result.error_code, result.error)
    version, where = result.result
    assert version == "1.16.0" and where.startswith(str(Path(entry.host_path or "") / "src" / SITE_DIR))
