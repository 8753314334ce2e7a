"""Python requirements of packs without an engine or an index: validation, pip commands as data, pip's
failures named, wheels unpacked and archived, the lockfile record, and an offline install end to end
(a handmade wheel in a --find-links directory, a trusted toolpack's own environment, its tool run)."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from host.core.errors import PackError
from host.engine.volumes import verify_volume, volume_name
from host.packs import declared as dq
from host.packs import requirements as rq
from host.packs import site as st
from host.packs.declared import Declared, read_requirements, validate_requirement
from host.packs.install import install_pack, uninstall_pack
from host.packs.requirements import (
    Finished,
    Resolved,
    Source,
    Target,
    Wheel,
    identity,
    image_target,
    recorded_wheels,
)
from host.packs.site import SITE_DIR
from host.runtime.wiring import lookup_toolpack
from host.spec.config import ConfigPaths, config_paths
from host.spec.lockfile import LockEntry, Lockfile
from host.spec.wheels import VENV_DIR
from host.tools.calls import ResolvedTool
from host.tools.workers import ToolRunner
from sandbox_wrapper import _runner
from tests.support.tars import assert_ends_at_marker

ESC = "\x1b]0;pwned\x07\x1b[2K"


def pyproject(dependencies: str, extra: str = "") -> bytes:
    return f'[project]\nname = "p"\nversion = "1"\ndependencies = {dependencies}\n{extra}'.encode()


# --- what a pack may declare -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("six", "six"),
        ("six>=1.16,<2", "six<2,>=1.16"),
        (" Requests[socks] >= 2.31 ; python_version >= '3.8'", 'Requests[socks]>=2.31; python_version >= "3.8"'),  # noqa: E501
        ("zope.interface==6.*", "zope.interface==6.*"),
    ],
)
def test_plain_pep508_requirements_pass_in_normalized_form(text: str, normalized: str) -> None:
    assert str(validate_requirement(text, 0)) == normalized


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("six @ https://example.invalid/six.whl", "direct URL reference"),
        ("six @ file:///etc/passwd", "direct URL reference"),
        ("-e .", "looks like a pip option"),
        ("--index-url https://evil.invalid/simple", "looks like a pip option"),
        (" -r other.txt", "looks like a pip option"),
        ("--extra-index-url=https://evil.invalid", "looks like a pip option"),
        ("six --hash=sha256:00", "is not a PEP 508 requirement"),
        ("six; --trusted-host x", "is not a PEP 508 requirement"),
        ("./local/dir", "is not a PEP 508 requirement"),
        ("", "is not a PEP 508 requirement"),
        ("s\u00efx", "printable ASCII"),
        ("six" + ESC, "printable ASCII"),
        ("six\n--index-url x", "printable ASCII"),
        ("a" * 201, "longer than 200 characters"),
        ("hx-sdist.tar.gz", "names an archive file"),
        ("evil.whl", "names an archive file"),
        ("pkg.ZIP>=1", "names an archive file"),
        (3, "is not a string"),
        (["six"], "is not a string"),
    ],
)
def test_anything_but_a_plain_requirement_is_refused_naming_it(text: object, problem: str) -> None:
    with pytest.raises(PackError, match=problem) as info:
        validate_requirement(text, 4)
    message = info.value.message
    assert message.startswith("pyproject.toml: [project].dependencies[4] ")
    assert "\x1b" not in message and "\n" not in message and len(message) < 400
    assert info.value.hint


def test_read_requirements_takes_project_dependencies_only() -> None:
    assert read_requirements(None) == Declared()
    assert read_requirements(b"[tool.poetry]\nname = 'x'\n") == Declared()
    assert read_requirements(b'[project]\nname = "p"\n') == Declared()
    extras = '[project.optional-dependencies]\nlocal = ["torch"]\n'
    listed = '["six==1.16.0", "agentnode-sdk>=0.4", "AgentNode_SDK", "idna"]'
    declared = read_requirements(pyproject(listed, extras))
    assert declared.requirements == ("six==1.16.0", "idna")  # extras never, the SDK is the host's
    assert declared.names == {"six", "idna"}
    assert len(declared.warnings) == 2 and all("agentnode runtime" in w for w in declared.warnings)
    dynamic = read_requirements(b'[project]\nname = "p"\ndynamic = ["dependencies"]\n')
    assert dynamic.requirements == () and "dynamic" in dynamic.warnings[0]


def test_a_requirement_naming_an_agentnode_pack_is_a_pack_reference_not_a_pip_install() -> None:
    # Real packs list the packs they call as pip requirements; they are no PyPI projects (format §2.1).
    listed = '["Web_Search-Pack>=0.2", "six", "summarizer"]'
    declared = read_requirements(pyproject(listed), pack_refs=("web-search-pack", "summarizer"))
    assert declared.requirements == ("six",)
    assert len(declared.warnings) == 2 and all("names an agentnode pack" in w for w in declared.warnings)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (pyproject('"six"'), r"\[project\].dependencies is not a list"),
        (pyproject(str([f"p{i}" for i in range(65)]).replace("'", '"')), "lists 65 requirements, more than"),
        (pyproject('["six", 3]'), r"\[project\].dependencies\[1\] is not a string"),
        (b"[project]\ndependencies = [\n", "is not valid TOML"),
        (b"a = " + b"[" * 200_000, "is not valid TOML"),  # nesting, not a crash
        (b'[project]\nname = "\xff"\n', "is not UTF-8"),
        (b"project = 3\n", r"\[project\] is not a table"),
        (b"# " + b"x" * (256 * 1024), "larger than 256 KiB"),
    ],
)
def test_a_malformed_pyproject_is_refused(data: bytes, problem: str) -> None:
    with pytest.raises(PackError, match=problem):
        read_requirements(data)


def test_reserved_names_are_found_at_the_root_and_under_src() -> None:
    assert dq.reserved_name(["agentnode.yaml", "mod.py", "lib/.agentnode-site/x.py"]) is None
    assert dq.reserved_name(["mod.py", ".agentnode-site/evil.py"]) == ".agentnode-site/evil.py"
    assert dq.reserved_name(["src/.agentnode-venv"]) == "src/.agentnode-venv"


# --- commands, as data -------------------------------------------------------------------------------


def test_the_download_command_for_the_image_is_binary_only_and_pack_text_comes_last(tmp_path: Path) -> None:
    links = tmp_path / "wheels"
    source = Source(True, (links,))
    cmd = rq.download_command(("six==1.16.0", "idna"), image_target("x86_64"), source, tmp_path)
    assert cmd[:5] == [sys.executable, "-I", "-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd and "--no-input" in cmd
    assert cmd[cmd.index("--dest") + 1] == str(tmp_path)
    assert "--no-index" in cmd and cmd[cmd.index("--find-links") + 1] == str(links.resolve())
    assert cmd[-3:] == ["--", "six==1.16.0", "idna"]  # after `--`: never read as an option
    platforms = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--platform"]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_37_x86_64" not in platforms
    legacy = {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"}
    assert legacy <= set(platforms)
    for flag, value in (("--python-version", "3.11"), ("--implementation", "cp"), ("--abi", "cp311")):
        assert cmd[cmd.index(flag) + 1] == value
    host = rq.download_command(("six",), rq.host_target(), Source(), tmp_path)
    assert "--platform" not in host and "--no-index" not in host and "--find-links" not in host


def test_image_targets_follow_the_engine_architecture() -> None:
    arm = image_target("aarch64")
    assert arm.name == "cp311-manylinux_2_36_aarch64" and "manylinux2014_aarch64" in (arm.platforms or ())
    assert not any("manylinux1" in p or "manylinux2010" in p for p in arm.platforms or ())
    assert image_target("x86_64").label == "CPython 3.11 manylinux x86_64 (the sandbox image)"


def test_venv_and_compile_commands(tmp_path: Path) -> None:
    env = tmp_path / VENV_DIR
    assert rq.venv_command(env) == [sys.executable, "-I", "-m", "venv", "--without-pip", str(env)]
    install = rq.venv_install_command(env, [tmp_path / "six-1.16.0-py2.py3-none-any.whl"])
    assert install[:6] == [sys.executable, "-I", "-m", "pip", "--python", str(env / "bin" / "python")]
    assert install[6:8] == ["--isolated", "install"]
    assert {"--no-index", "--no-deps", "--only-binary=:all:"} <= set(install)
    assert install[-2:] == ["--", str(tmp_path / "six-1.16.0-py2.py3-none-any.whl")]
    compiled = rq.compile_command(tmp_path, "/pack/.agentnode-site")
    assert compiled[-3:] == ["-d", "/pack/.agentnode-site", str(tmp_path)]
    assert "unchecked-hash" in compiled


def test_pip_sees_its_configuration_but_no_keys() -> None:
    host_env = {
        "PATH": "/usr/bin", "HOME": "/h", "PIP_INDEX_URL": "https://mirror", "HTTPS_PROXY": "http://p",
        "OPENAI_API_KEY": "sk-canary", "PYTHONPATH": "/evil", "AGENTNODE_CONFIG": "/c",
    }  # fmt: skip
    env = rq.pip_env(host_env)
    assert env == {
        "PATH": "/usr/bin", "HOME": "/h", "PIP_INDEX_URL": "https://mirror", "HTTPS_PROXY": "http://p",
        "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }  # fmt: skip


# --- pip's failures, named and escaped ---------------------------------------------------------------

TARGET = image_target("x86_64")
DECLARED = Declared(("six==1.16.0", "fancy>=1"))


def failure(output: str, code: int | None = 1, source: Source | None = None) -> PackError:
    return rq._resolve_failed(Finished(code, output), DECLARED, TARGET, source or Source())


def test_a_missing_wheel_names_the_requirement_and_what_to_do() -> None:
    pip_says = (
        "ERROR: Could not find a version that satisfies the requirement fancy>=1 (from versions: none)\n"
        "ERROR: No matching distribution found for fancy>=1\n"
    )
    err = failure(pip_says)
    assert err.message == "no wheel of fancy for CPython 3.11 manylinux x86_64 (the sandbox image)"
    assert "ask the pack's publisher" in err.hint and "--offline --find-links DIR" in err.hint
    dep = failure("ERROR: No matching distribution found for tinydep==0.1\n")
    assert "no wheel of tinydep (needed by one of the pack's requirements)" in dep.message
    offline = failure(pip_says, source=Source(offline=True))
    assert offline.message.endswith("in the --find-links directories")
    assert offline.hint.startswith("put a wheel of fancy for CPython 3.11")


def test_other_pip_failures_are_short_escaped_summaries() -> None:
    assert "did not finish within" in failure("", code=None).message
    assert "conflict" in failure("ERROR: ResolutionImpossible: ...\n").message
    assert "cannot reach the package index" in failure("WARNING: Retrying (NewConnectionError ...)\n").message
    hostile = failure(f"Collecting x\nERROR: No matching distribution found for {ESC}evil\n" + "x" * 5000)
    assert "\x1b" not in hostile.message and "\x07" not in hostile.message
    assert len(hostile.message) < 400 and "pip exit code 1" in hostile.message
    assert rq.summary("a\nERROR: first\nb\nERROR: " + ESC + "last\nc") == "\\x1b]0;pwned\\x07\\x1b[2Klast"
    assert rq.summary("") == "no output"


def test_a_tool_that_hangs_is_killed_with_its_children(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    done = rq.run_step(
        ["/bin/sh", "-c", f"echo visible-only-to-us; sleep 60 & echo $! > {pidfile}; wait"],
        timeout=1.0,
        cwd=tmp_path,
    )
    assert done.code is None and time.monotonic() - started < 10
    assert "visible-only-to-us" in done.output
    assert "visible-only-to-us" not in capfd.readouterr().out  # captured, never echoed
    child = int(pidfile.read_text())
    for _ in range(50):
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the tool's child survived the timeout")
    assert rq.run_step(["/bin/sh", "-c", "exit 3"], timeout=10, cwd=tmp_path).code == 3


# --- wheels: unpacked, archived, recorded -----------------------------------------------------------


def make_wheel(
    directory: Path, name: str, version: str, files: dict[str, str], *, raw: dict[str, bytes] | None = None
) -> Path:
    """A minimal valid pure-Python wheel (what pip installs), written by hand."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    records: list[str] = []
    with zipfile.ZipFile(path, "w") as zf:

        def add(arcname: str, data: bytes) -> None:
            zf.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{arcname},sha256={digest},{len(data)}")

        for arcname, text in files.items():
            add(arcname, textwrap.dedent(text).encode())
        for arcname, data in (raw or {}).items():
            zf.writestr(arcname, data)
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        add(f"{dist}.dist-info/METADATA", metadata.encode())
        wheel_info = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        add(f"{dist}.dist-info/WHEEL", wheel_info)
        zf.writestr(f"{dist}.dist-info/RECORD", "\n".join([*records, f"{dist}.dist-info/RECORD,,"]) + "\n")
    return path


def test_wheels_unpack_into_an_import_root_and_archive_under_a_prefix(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "w", "demo", "1.0",
        {"demo/__init__.py": "X = 1\n", "demo.data/purelib/extra_mod.py": "Y = 2\n",
         "demo.data/scripts/demo-cli": "#!/bin/sh\n", "demo.data/data/share/x": "data\n"},
    )  # fmt: skip
    site = tmp_path / "site"
    st.unpack_site([wheel], site)
    assert (site / "demo" / "__init__.py").read_text() == "X = 1\n"
    assert (site / "extra_mod.py").exists() and (site / "demo-1.0.dist-info" / "METADATA").exists()
    assert not (site / "demo-cli").exists() and not (site / "share").exists()  # nothing runs scripts
    with st.site_archive(site, "src/.agentnode-site") as archive:
        assert_ends_at_marker(archive)
        with tarfile.open(fileobj=archive) as tar:
            members = {m.name: m for m in tar.getmembers()}
    assert members["src/.agentnode-site"].isdir() and members["src/.agentnode-site/demo"].isdir()
    assert members["src/.agentnode-site/demo/__init__.py"].mode == 0o644
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members.values())
    assert all(m.name.startswith("src/.agentnode-site") for m in members.values())


@pytest.mark.parametrize("bad", ["../escape.py", "/abs.py", "a\\b.py", "demo/../../x.py", "x/\x1b.py"])
def test_a_wheel_with_an_unsafe_path_is_refused(tmp_path: Path, bad: str) -> None:
    wheel = make_wheel(tmp_path / "w", "demo", "1.0", {}, raw={bad: b"x"})
    with pytest.raises(PackError, match="unsafe path"):
        st.unpack_site([wheel], tmp_path / "site")
    assert not (tmp_path / "escape.py").exists()


def test_unpacked_sizes_are_bounded_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(st, "MAX_SITE_BYTES", 1000)
    wheel = make_wheel(tmp_path / "w", "demo", "1.0", {"demo/big.py": "#" * 2000})
    with pytest.raises(PackError, match="unpack to more than"):
        st.unpack_site([wheel], tmp_path / "site")
    assert not (tmp_path / "site" / "demo").exists()


def test_a_tool_environment_gets_the_same_archive_bounds_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(st, "MAX_SITE_BYTES", 1000)
    wheel = make_wheel(tmp_path / "w", "demo", "1.0", {"demo/big.py": "#" * 2000})
    resolved = Resolved(image_target("x86_64"), (Wheel(wheel.name, "0" * 64),), wheel.parent)
    env = tmp_path / "env"
    with pytest.raises(PackError, match="unpack to more than"):
        st.build_venv(env, resolved)
    assert not env.exists()  # refused before the venv was even created


def test_a_download_is_stopped_as_soon_as_it_crosses_the_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rq, "MAX_WHEELS", 3)
    monkeypatch.setattr(rq, "STOP_POLL_SECONDS", 0.05)
    d = tmp_path / "d"
    d.mkdir()
    # A "pip" that keeps downloading: a file every 10 ms, for a minute.
    writer = (
        "import time, pathlib\nfor i in range(6000):\n    pathlib.Path(f'w{i}.whl').touch(); time.sleep(.01)"
    )
    started = time.monotonic()
    over = lambda: rq._over_download_bounds(d)  # noqa: E731
    done = rq.run_step([sys.executable, "-c", writer], timeout=60, cwd=d, stop=over)
    assert done.stopped and done.code is None and time.monotonic() - started < 10
    assert len(list(d.iterdir())) < 100  # killed early, not at the end


def test_downloaded_files_are_checked_and_hashed(tmp_path: Path) -> None:
    d = tmp_path / "d"
    wheel = make_wheel(d, "demo", "1.0", {"demo.py": ""})
    (wheels,) = [rq._downloaded(d, TARGET)]
    assert wheels == (Wheel(wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()),)
    (d / "demo-1.0-cp311-cp311-win_amd64.whl").write_bytes(b"")
    with pytest.raises(PackError, match=r"does not run on CPython 3\.11 manylinux"):
        rq._downloaded(d, TARGET)
    (d / "demo-1.0-cp311-cp311-win_amd64.whl").unlink()
    (d / "demo-1.0.tar.gz").write_bytes(b"")
    with pytest.raises(PackError, match="something other than a wheel"):
        rq._downloaded(d, TARGET)


def test_identity_is_the_artifact_hash_plus_the_wheels() -> None:
    a, b = Wheel("a-1-py3-none-any.whl", "1" * 64), Wheel("b-1-py3-none-any.whl", "2" * 64)
    assert identity("f" * 64, ()) == "f" * 64  # a pack without requirements keeps its volume name
    assert identity("f" * 64, (a, b)) == identity("f" * 64, (b, a)) != identity("f" * 64, (a,))
    assert identity("f" * 64, (a,)) != identity("f" * 64, (Wheel(a.filename, "3" * 64),))


def record() -> dict[str, object]:
    sandbox = Resolved(TARGET, (Wheel("six-1.16.0-py2.py3-none-any.whl", "ab" * 32),), Path("/tmp"))
    host = Resolved(rq.host_target(), (Wheel("six-1.16.0-py2.py3-none-any.whl", "ab" * 32),), Path("/tmp"))
    out = rq.lock_record(Declared(("six==1.16.0",)), sandbox, host)
    assert out is not None
    return out


def test_the_lockfile_record_round_trips_and_names_the_volume(tmp_path: Path) -> None:
    assert rq.lock_record(Declared(), None, None) is None
    req = record()
    wheel = {"filename": "six-1.16.0-py2.py3-none-any.whl", "sha256": "ab" * 32}
    assert req["sandbox"] == {"target": "cp311-manylinux_2_36_x86_64", "wheels": [wheel]}
    digest = identity("a" * 64, recorded_wheels(req, "sandbox"))
    entry = LockEntry(
        slug="alpha", version="1.0.0", package_type="agent", trust_level="unverified", artifact_hash="a" * 64,
        import_subdir="", sandbox_volume=volume_name("alpha", "1.0.0", digest), host_path=None,
        manifest={}, installed_at="2024-01-01T00:00:00Z", requirements=req,
    )  # fmt: skip
    lock = Lockfile(tmp_path / "agentnode.lock")
    lock.put(entry)
    assert lock.get("alpha") == entry and entry.volume_digest == digest != entry.artifact_hash
    assert entry.host_interpreter() is None  # an agent has no environment of its own
    tools = LockEntry(**{**entry.to_json(), "package_type": "toolpack", "host_path": "/p/t/1.0.0-x"})
    assert tools.host_interpreter() == Path("/p/t/1.0.0-x") / VENV_DIR / "bin" / "python"
    # An entry an older host wrote has no record: its volume is named by the artifact hash, as before.
    old = LockEntry.from_json({k: v for k, v in entry.to_json().items() if k != "requirements"})
    assert old.requirements is None and old.volume_digest == "a" * 64 and old.host_interpreter() is None


@pytest.mark.parametrize(
    "broken",
    [
        "not an object",
        {"sandbox": {"wheels": "six.whl"}},
        {"sandbox": {"wheels": [{"filename": "../x.whl", "sha256": "ab" * 32}]}},
        {"sandbox": {"wheels": [{"filename": "six-1-py3-none-any.whl", "sha256": "nothex"}]}},
        {"sandbox": {"wheels": ["six-1-py3-none-any.whl"]}},
    ],
)
def test_an_edited_record_fails_closed(broken: object) -> None:
    with pytest.raises(ValueError, match="requirements"):
        recorded_wheels(broken, "sandbox")
    entry = LockEntry(
        slug="alpha", version="1.0.0", package_type="toolpack", trust_level="trusted", artifact_hash="a" * 64,
        import_subdir="", sandbox_volume=volume_name("alpha", "1.0.0", "a" * 64), host_path="/p",
        manifest={}, installed_at="2024-01-01T00:00:00Z", requirements=broken,  # type: ignore[arg-type]
    )  # fmt: skip
    assert entry.volume_digest == ""
    with pytest.raises(PackError, match="missing or stale") as info:
        verify_volume(None, entry)  # type: ignore[arg-type]  # refused before the engine is asked
    assert info.value.reason == "volume_stale"
    host_side = broken if not isinstance(broken, dict) else {"host": broken["sandbox"]}
    tools = LockEntry(**{**entry.to_json(), "requirements": host_side})
    interpreter = tools.host_interpreter()  # a path that does not exist: the worker cannot start
    assert interpreter is not None and not interpreter.exists()


# --- install, without an engine or an index ---------------------------------------------------------


@pytest.fixture
def paths(tmp_path: Path) -> ConfigPaths:
    return config_paths({"AGENTNODE_CONFIG": str(tmp_path / "config")})


def write_pack(
    base: Path, slug: str, *, kind: str, source: str, dependencies: str, module: str = "mod"
) -> Path:
    pack = base / slug
    (pack / "src").mkdir(parents=True)
    (pack / "src" / f"{module}.py").write_text(textwrap.dedent(source))
    (pack / "pyproject.toml").write_bytes(pyproject(dependencies))
    body = f'agent:\n  entrypoint: "{module}:run"\n' if kind == "agent" else f"entrypoint: {module}\n"
    head = f'package_id: {slug}\nversion: "1.0.0"\npackage_type: {kind}\n'
    (pack / "agentnode.yaml").write_text(head + body)
    return pack


def test_refusals_come_before_pip_or_any_copy(
    tmp_path: Path, paths: ConfigPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rq, "run_step", lambda *a, **k: pytest.fail("pip ran"))
    monkeypatch.setattr(st, "run_step", lambda *a, **k: pytest.fail("pip ran"))
    pack = write_pack(tmp_path, "url-tools", kind="toolpack", source="", dependencies='["six @ https://x/six.whl"]')
    with pytest.raises(PackError, match="direct URL reference"):
        install_pack(pack, trust="trusted", paths=paths, client=None, image=None)
    squatter = write_pack(tmp_path, "squat", kind="toolpack", source="", dependencies="[]")
    (squatter / ".agentnode-venv" / "bin").mkdir(parents=True)
    (squatter / ".agentnode-venv" / "bin" / "python").write_text("#!/bin/sh\n")
    with pytest.raises(PackError, match="reserved for the host"):
        install_pack(squatter, trust="trusted", paths=paths, client=None, image=None)
    assert Lockfile(paths.lockfile).entries() == {} and not paths.packs_dir.exists()


def test_an_offline_install_gives_a_trusted_toolpack_its_own_environment(
    tmp_path: Path, paths: ConfigPaths
) -> None:
    links = tmp_path / "wheels"
    make_wheel(links, "agentnode_demo_dep", "2.5", {"agentnode_demo_dep.py": "VERSION = '2.5'\n"})
    source = Source(offline=True, find_links=(links,))
    tool = """
        import sys
        import agentnode_demo_dep

        def run(**kwargs):
            return {"dep": agentnode_demo_dep.VERSION, "prefix": sys.prefix}
    """
    pack = write_pack(
        tmp_path, "demo-tools", kind="toolpack", source=tool, dependencies='["agentnode-demo-dep==2.5"]'
    )
    lines: list[str] = []
    entry = install_pack(
        pack, trust="trusted", paths=paths, client=None, image=None, source=source, progress=lines.append
    )
    assert entry.requirements is not None and "sandbox" not in entry.requirements
    assert [w["filename"] for w in entry.requirements["host"]["wheels"]] == [
        "agentnode_demo_dep-2.5-py3-none-any.whl"
    ]
    assert any(line.startswith("requirements: resolving 1 requirement(s)") for line in lines)
    assert any("creating the tool environment" in line for line in lines)
    assert entry.host_path is not None
    copy = Path(entry.host_path)
    holds = identity(entry.artifact_hash, recorded_wheels(entry.requirements, "host"))
    assert copy.name == f"1.0.0-{holds[:16]}"  # named by what it holds: the pack and its wheels

    installed = lookup_toolpack(Lockfile(paths.lockfile), "demo-tools")
    assert installed is not None and installed.interpreter == copy / VENV_DIR / "bin" / "python"
    runner = ToolRunner()
    try:
        outcome = runner.run(installed, ResolvedTool("mod:run"), {}, timeout=30)
    finally:
        runner.close()
    assert outcome.success, outcome.error
    assert outcome.result == {"dep": "2.5", "prefix": str(copy / VENV_DIR)}

    # A pack that needs what the directory lacks is refused, naming it; nothing is recorded or copied.
    needs = '["agentnode-absent-dep"]'
    other = write_pack(tmp_path, "needy-tools", kind="toolpack", source="", dependencies=needs)
    with pytest.raises(PackError, match="no wheel of agentnode-absent-dep for this host's Python") as info:
        install_pack(other, trust="trusted", paths=paths, client=None, image=None, source=source)
    assert "in the --find-links directories" in info.value.message
    assert Lockfile(paths.lockfile).get("needy-tools") is None
    assert not (paths.packs_dir / "needy-tools").exists()

    uninstall_pack("demo-tools", paths=paths, client=None)
    assert not copy.exists()


def test_requirements_whose_markers_exclude_this_python_install_nothing(
    tmp_path: Path, paths: ConfigPaths
) -> None:
    links = tmp_path / "wheels"
    links.mkdir()
    pack = write_pack(tmp_path, "py2-tools", kind="toolpack", source="def run():\n    return 1\n",
                      dependencies="[\"futures; python_version < '3'\"]")  # fmt: skip
    source = Source(True, (links,))
    entry = install_pack(pack, trust="trusted", paths=paths, client=None, image=None, source=source)
    assert entry.requirements is not None and entry.requirements["host"]["wheels"] == []
    assert entry.host_interpreter() is None and entry.host_path is not None
    assert not (Path(entry.host_path) / VENV_DIR).exists()


def test_a_trusted_agent_on_the_host_path_gets_its_requirements_beside_its_code(
    tmp_path: Path, paths: ConfigPaths
) -> None:
    links = tmp_path / "wheels"
    make_wheel(links, "agentnode_demo_dep", "2.5", {"agentnode_demo_dep.py": "VERSION = '2.5'\n"})
    pack = write_pack(tmp_path, "host-agent", kind="agent", source="def run(context):\n    return 1\n",
                      dependencies='["agentnode-demo-dep"]')  # fmt: skip
    entry = install_pack(
        pack, trust="curated", paths=paths, client=None, image=None, source=Source(True, (links,))
    )
    assert entry.sandbox_volume is None and entry.host_path is not None
    site = Path(entry.host_path) / "src" / SITE_DIR
    assert (site / "agentnode_demo_dep.py").exists() and not (Path(entry.host_path) / VENV_DIR).exists()
    assert entry.host_interpreter() is None  # the wrapper runs under the host's own interpreter
    pycache = site / "__pycache__"
    assert pycache.is_dir() and any(p.name.startswith("agentnode_demo_dep.") for p in pycache.iterdir())


# --- the wrapper's side --------------------------------------------------------------------------------


def test_the_wrapper_puts_the_requirements_right_after_the_import_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _runner.REQUIREMENTS_DIR == SITE_DIR
    root = tmp_path / "pack"
    site = root / SITE_DIR
    (site / "legacy").mkdir(parents=True)
    (site / "legacy-nspkg.pth").write_text("legacy\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    _runner.add_import_root(str(root))
    assert sys.path[:2] == [str(root), str(site)]
    assert sys.path.index(str(site / "legacy")) > 1 and sys.path.count(str(site)) == 1
    bare = tmp_path / "bare"
    bare.mkdir()
    before = len(sys.path)
    _runner.add_import_root(str(bare))
    assert sys.path[0] == str(bare) and len(sys.path) == before + 1


def test_a_target_without_platforms_is_the_running_interpreter() -> None:
    host = rq.host_target()
    assert isinstance(host, Target) and host.platforms is None and host.pip_args == ()
    assert host.name.startswith(sys.implementation.cache_tag)
    assert os.sep not in host.name
