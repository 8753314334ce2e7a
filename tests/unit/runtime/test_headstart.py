"""The head start without a real engine: which commands it takes, when a record holds, that a replay is the
very request recorded (with this run's id, owner and directory), and that it never trusts what it finds."""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.core.owner import owner_token
from host.engine.contract import SOCKET_NAME, ContainerLimits
from host.engine.launch import container_name
from host.engine.spec import container_spec, create_body
from host.runtime import headstart as _headstart
from host.runtime.headstart import Headstart, begin, forget, load_record, plan, record_path, remember
from host.runtime.rundir import made_for, run_dir_of
from tests.support.fake_engine import FakeEngine

SLUG = "hs-agent"


@pytest.mark.parametrize(
    ("argv", "planned"),
    [
        (["run", SLUG], (SLUG, "")),
        (["run", SLUG, "--json", "--runtime", "runsc"], (SLUG, "runsc")),
        (["run", "--json", SLUG, "--runtime=runc", "--follow"], (SLUG, "runc")),
        (["run", SLUG, "--goal", "g", "--arg", "a=1", "--tenant", "t", "--label", "k=v", "--no-serve"],
         (SLUG, "")),
        (["run", SLUG, "--max-runtime-seconds", "5", "--request-id=r"], (SLUG, "")),
        # anything it does not know, or that goes elsewhere, gets no head start
        (["run", SLUG, "--via", "/tmp/s"], None),
        (["run", SLUG, "--backend", "kubernetes"], None),
        (["run", SLUG, "--runt", "runc"], None),  # an abbreviation argparse would accept
        (["run", SLUG, "extra"], None),
        (["run", SLUG, "--goal"], None),
        (["run", SLUG, "--goal", "--json"], None),
        (["--debug", "run", SLUG], None),
        (["list"], None),
        (["run"], None),
        ([], None),
    ],
)
def test_only_a_local_run_it_fully_understands_is_planned(
    argv: list[str], planned: tuple[str, str] | None
) -> None:
    assert plan(argv) == planned


@pytest.fixture
def place() -> Iterator[dict[str, Any]]:
    """A config directory with a config file and a lockfile, a run root, and an engine stand-in."""
    root = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))
    (root / "cfg").mkdir(mode=0o700)
    (root / "cfg" / "config.json").write_text("{}")
    (root / "cfg" / "agentnode.lock").write_text("{}")
    env = {"AGENTNODE_CONFIG": str(root / "cfg"), "AGENTNODE_RUN_DIR": str(root / "r"), "HOME": str(root)}
    with FakeEngine() as engine:
        engine.volumes.add("agentnode-pack-x")
        env["DOCKER_HOST"] = engine.docker_host
        try:
            yield {"root": root, "env": env, "engine": engine}
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _request(env: dict[str, str], run_id: str, owner: str) -> dict[str, Any]:
    """What the host would send for run `run_id`: remember's arguments."""
    rundir = run_dir_of(run_id, env)
    name = container_name(run_id)
    keywords = container_spec(
        image="sha256:" + "b" * 64, run_id=run_id, name=name, owner=owner, slug=SLUG, runtime="runc",
        pack_volume="agentnode-pack-x", import_root="/pack", socket_dir=str(rundir.path),
        limits=ContainerLimits(), socket_wait=60.0,
    )  # fmt: skip
    _, body = create_body(keywords)
    cfg = Path(env["AGENTNODE_CONFIG"])
    socket_path = env["DOCKER_HOST"].removeprefix("unix://")
    return {
        "files": [str(cfg / "config.json"), str(cfg / "agentnode.lock")], "engine_socket": socket_path,
        "volume_target": "/v1.45/volumes/agentnode-pack-x",
        "create_target": f"/v1.45/containers/create?name={name}",
        "start_target": f"/v1.45/containers/{name}/start",
        "body": body, "run_id": run_id, "name": name, "owner": owner, "rundir": str(rundir.path),
        "owner_file": str(rundir.owner_file),
    }  # fmt: skip


def test_a_record_replays_exactly_the_request_it_was_made_from(place: dict[str, Any]) -> None:
    env = place["env"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    record = load_record(env, SLUG, "")
    assert record is not None
    early = Headstart(SLUG, "", record)
    want = _request(env, early.run_id, owner_token())
    assert early.owner == owner_token() and early.run_id != "1" * 32
    assert early.body() == want["body"]
    assert (early.name, early.rundir, early.owner_file) == (want["name"], want["rundir"], want["owner_file"])
    assert (early.create_target, early.start_target) == (want["create_target"], want["start_target"])
    assert early.volume_target == want["volume_target"]
    assert "1" * 12 not in early.body_text and "111:222" not in early.body_text


def test_the_record_is_private_and_names_no_value_of_the_environment(place: dict[str, Any]) -> None:
    env = {**place["env"], "AGENTNODE_SOMETHING": "s3cr3t-value"}
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    path = Path(record_path(env, SLUG, ""))
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert "s3cr3t-value" not in path.read_text()


@pytest.mark.parametrize("change", ["env", "docker_host", "config", "lockfile", "runtime", "slug",
                                    "version"])  # fmt: skip
def test_a_record_no_longer_holds_once_anything_it_stood_on_changed(
    place: dict[str, Any], change: str
) -> None:
    env = place["env"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    slug, runtime = SLUG, ""
    cfg = Path(env["AGENTNODE_CONFIG"])
    if change == "env":
        env = {**env, "AGENTNODE_AGENT_SANDBOX": "0"}
    elif change == "docker_host":
        env = {**env, "DOCKER_HOST": "unix:///var/run/other.sock"}
    elif change == "config":
        (cfg / "config.json").write_text('{"agent_sandbox": {}}')
    elif change == "lockfile":
        (cfg / "agentnode.lock").unlink()
        (cfg / "agentnode.lock").write_text("{}")  # same content, another file
    elif change == "runtime":
        runtime = "runsc"
    elif change == "slug":
        slug = "other"
    elif change == "version":
        path = Path(record_path(env, slug, runtime))
        path.write_text(path.read_text().replace("agentnode-headstart 1", "agentnode-headstart 0", 1))
    assert load_record(env, slug, runtime) is None


@pytest.mark.parametrize("tamper", ["group-writable", "open-directory", "symlink", "oversize", "garbage",
                                    "short", "request-line"])  # fmt: skip
def test_a_record_anyone_else_could_have_written_or_that_is_not_one_is_ignored(
    place: dict[str, Any], tamper: str
) -> None:
    env = place["env"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    path = Path(record_path(env, SLUG, ""))
    if tamper == "group-writable":
        path.chmod(0o620)
    elif tamper == "open-directory":
        path.parent.chmod(0o777)
    elif tamper == "symlink":
        real = path.with_name("real")
        path.rename(real)
        path.symlink_to(real)
    elif tamper == "oversize":
        with path.open("a") as fh:
            fh.write("x" * (_headstart.MAX_RECORD_BYTES + 1))
    elif tamper == "garbage":
        path.write_bytes(b"\xff\xfe" + os.urandom(64))
    elif tamper == "short":
        path.write_text("agentnode-headstart 1\nkey x\n")
    elif tamper == "request-line":  # a target that would end the request line and add a header
        text = path.read_text()
        path.write_text(text.replace("/start\n", "/start HTTP/1.1\rX-Injected: 1\n", 1))
    assert load_record(env, SLUG, "") is None
    assert begin(["run", SLUG], env) is None


def test_nothing_per_run_or_unreplayable_is_recorded(place: dict[str, Any]) -> None:
    env = place["env"]
    request = _request(env, "1" * 32, "111:222")
    missing = {**request, "files": [*request["files"], str(place["root"] / "absent.json")]}
    assert not remember(env, SLUG, "", **missing)
    assert not remember(env, SLUG, "", **{**request, "rundir": "/run/a\nb"})
    # the run id left somewhere a placeholder does not cover (a path that is not the run directory's)
    leaky = {**request, "body": {**request["body"], "Hostname": "1" * 32 + "-x"}}
    assert remember(env, SLUG, "", **leaky)  # the run id is a placeholder wherever it occurs: still exact
    assert not Path(record_path(env, SLUG, "")).read_text().count("1" * 12)
    forget(env, SLUG, "")
    assert load_record(env, SLUG, "") is None


def test_a_head_start_creates_and_starts_its_container_and_is_removed_unless_adopted(
    place: dict[str, Any],
) -> None:
    env, engine = place["env"], place["engine"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    early = begin(["run", SLUG, "--json"], env)
    assert early is not None
    assert early.started(10) and early.created() == f"{1:064x}"
    target, body = engine.created[0]
    assert body == early.body() and target == early.create_target
    assert engine.started == [early.name]
    # its directory is a run directory for this process (private, owner recorded), with no socket yet
    rundir = run_dir_of(early.run_id, env)
    assert str(rundir.path) == early.rundir and made_for(rundir, owner_token())
    assert not (rundir.path / SOCKET_NAME).exists()
    early.discard()
    assert engine.removed == [f"{1:064x}"]
    assert not rundir.path.exists() and not rundir.owner_file.exists()
    early.discard()  # once
    assert engine.removed == [f"{1:064x}"]


def test_an_adopted_head_start_is_not_removed(place: dict[str, Any]) -> None:
    env, engine = place["env"], place["engine"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    early = begin(["run", SLUG], env)
    assert early is not None and early.started(10)
    early.adopted = True
    early.discard()
    assert engine.removed == [] and Path(early.rundir).is_dir()
    shutil.rmtree(early.rundir)


def test_no_container_is_created_without_its_pack_volume(place: dict[str, Any]) -> None:
    """An engine would create the missing volume, empty, on create: the head start asks first."""
    env, engine = place["env"], place["engine"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    engine.volumes.clear()
    early = begin(["run", SLUG], env)
    assert early is not None and not early.started(10) and not early.created()
    assert engine.created == [] and "/volumes/agentnode-pack-x" in engine.paths
    early.discard()
    assert not Path(early.rundir).exists()


@pytest.mark.parametrize("failure", ["create", "start", "chunked"])
def test_an_engine_refusal_is_recorded_not_raised(place: dict[str, Any], failure: str) -> None:
    env, engine = place["env"], place["engine"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    if failure == "create":
        engine.create_status = 409
    elif failure == "start":
        engine.start_status = 500
    else:
        engine.chunked_create = True  # not a failure: a chunked answer is read as well
    early = begin(["run", SLUG], env)
    assert early is not None
    assert early.started(10) is (failure == "chunked")
    assert bool(early.created()) is (failure != "create")
    early.discard()
    assert not Path(early.rundir).exists()


def test_a_serve_host_for_the_config_takes_the_run_instead(place: dict[str, Any]) -> None:
    env, engine = place["env"], place["engine"]
    assert remember(env, SLUG, "", **_request(env, "1" * 32, "111:222"))
    (Path(env["AGENTNODE_CONFIG"]) / "agentnode-admin.sock").write_text("")
    assert begin(["run", SLUG], env) is None
    assert engine.created == []


def test_begin_never_raises(place: dict[str, Any]) -> None:
    assert begin(["run", SLUG], {"AGENTNODE_CONFIG": "\x00bad"}) is None
    assert begin(["run", SLUG], place["env"]) is None  # no record yet


class _Raw(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}", (201, b"{}")),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
         (200, b"abcde")),
        (b"HTTP/1.1 204 No Content\r\n\r\n", (204, b"")),
        (b"SSH-2.0-nope\r\n", OSError),
        (b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (_headstart.MAX_ANSWER_BYTES + 1), OSError),
    ],
)
def test_the_raw_engine_call_reads_an_answer_within_its_bounds(answer: bytes, expected: Any) -> None:
    directory = tempfile.mkdtemp(prefix="hsr-", dir="/tmp")
    path = f"{directory}/s.sock"

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(answer)

    server = _Raw(path, Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        if isinstance(expected, tuple):
            assert _headstart._call(path, "POST", "/x", b"{}") == expected
        else:
            with pytest.raises(expected):
                _headstart._call(path, "POST", "/x", b"{}")
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        (json.dumps({"Id": "a" * 64, "Warnings": []}).encode(), True),
        (b'{"Id":"' + b"a" * 64 + b'","Warnings":[]}', True),
        (b'{"Id":"' + b"A" * 64 + b'"}', False),
        (b'{"Id":"abc"}', False),
        (b'{"message":"conflict"}', False),
    ],
)
def test_a_create_answer_yields_a_container_id_or_nothing(answer: bytes, ok: bool) -> None:
    if ok:
        assert _headstart._container_id(answer) == "a" * 64
    else:
        with pytest.raises(OSError):
            _headstart._container_id(answer)
