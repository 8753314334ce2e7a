"""The admin service's error model without Docker: a malformed SubmitRun or StreamRun request is refused
with INVALID_ARGUMENT / INVALID_REQUEST (errors.proto's model) before any run starts or any event is sent."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from host._proto.agentnode.sandbox.v1 import runner_pb2, runner_pb2_grpc
from host.api.client import RunnerClient
from host.api.server import build_admin_server
from host.files.run import FilesRequest
from host.policy.caller import CallerInfo, RunOverrides
from host.runtime.runner import RunResult


class FakeHost:
    """What RunnerServicer needs of a SandboxHost; records every run it was asked for."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.runs: list[dict[str, Any]] = []
        self.cancelled = threading.Event()
        self.returned: list[float] = []
        self.followed: list[float] = []
        """When each run returned its result, and when the follow-up it deferred ran."""
        self.env = env or {}
        self.config = SimpleNamespace(paths=SimpleNamespace(dir=Path(tempfile.gettempdir())))

    def run(self, slug: str, **kwargs: Any) -> RunResult:
        self.runs.append({"slug": slug, **kwargs})
        if slug == "late":  # a cold start: the run has no id for a while
            time.sleep(1.0)
        if slug == "early" and kwargs.get("on_log") is not None:
            kwargs["on_log"]("written before the id was announced")  # a warm member's first line
        kwargs["on_start"]("run-1")
        if kwargs.get("on_log") is not None:
            for line in ("first line", "\x1b[31mred\x1b[0m"):
                kwargs["on_log"](line)
        if slug == "slow":  # until the caller goes away
            self.cancelled.wait(30)
            return self._result(kwargs, RunResult(success=False, error="cancelled", error_code="cancelled",
                                                  run_id="run-1"))
        return self._result(kwargs, RunResult(success=True, result={"ok": True}, run_id="run-1"))

    def _result(self, kwargs: dict[str, Any], result: RunResult) -> RunResult:
        """As SandboxHost.run ends: the follow-up handed to `defer`, then the result returned."""
        kwargs["defer"](lambda: self.followed.append(time.monotonic()))
        self.returned.append(time.monotonic())
        return result

    def cancel(self, run_id: str) -> bool:
        self.cancelled.set()
        return False


@pytest.fixture
def admin() -> Iterator[tuple[FakeHost, Any]]:
    host = FakeHost()
    root = Path(tempfile.mkdtemp(prefix="an-admin-"))  # short: Unix socket paths are capped near 108 bytes
    server = build_admin_server(host, root / "s" / "admin.sock")  # type: ignore[arg-type]
    server.start()
    channel = grpc.insecure_channel(f"unix:{root / 's' / 'admin.sock'}")
    try:
        yield host, runner_pb2_grpc.RunnerServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=None).wait(5)
        shutil.rmtree(root, ignore_errors=True)


BAD_REQUESTS = {
    "runtime": ({"runtime": "kata"}, "runtime must be runc or runsc"),
    "kwargs_not_json": ({"kwargs_json": "{"}, "kwargs_json must be a strict JSON object"),
    "kwargs_not_object": ({"kwargs_json": "[1]"}, "kwargs_json must be a strict JSON object"),
    "kwargs_not_finite": ({"kwargs_json": '{"x": NaN}'}, "kwargs_json must be a strict JSON object"),
    "tenant": ({"caller": runner_pb2.CallerMetadata(tenant="a b")}, "caller: tenant must be"),
    "request_id": ({"caller": runner_pb2.CallerMetadata(request_id="x" * 129)}, "caller: request_id must"),
    "label_name": ({"caller": runner_pb2.CallerMetadata(labels={"Bad": "v"})}, "caller: a label name"),
    "label_value": ({"caller": runner_pb2.CallerMetadata(labels={"k": "\x1b]0;x"})}, "caller: label k:"),
    "labels": ({"caller": runner_pb2.CallerMetadata(labels={f"k{i}": "" for i in range(17)})},
               "caller: at most 16 labels"),
    "limit_runtime": ({"limits": runner_pb2.RunLimitOverrides(max_runtime_seconds=0)},
                      "limits: max_runtime_seconds must be"),
    "limit_cost": ({"limits": runner_pb2.RunLimitOverrides(max_cost_usd=float("nan"))},
                   "limits: max_cost_usd must be"),
    "files_apply_alone": ({"files": runner_pb2.RunFiles(apply=True)}, "files: --apply and --export-* need"),
    "files_input_name": ({"files": runner_pb2.RunFiles(inputs=[runner_pb2.RunInput(name="../x", data=b"")])},
                         "files: an input name is refused (name_dot)"),
    "files_input_twice": (
        {"files": runner_pb2.RunFiles(inputs=[runner_pb2.RunInput(name="a", data=b"")] * 2)},
        "files: two inputs have the same name"),
}


def _submit(stub: Any, fields: dict[str, Any]) -> Any:
    return stub.SubmitRun(runner_pb2.SubmitRunRequest(slug="agent", **fields), timeout=10)


def _stream(stub: Any, fields: dict[str, Any]) -> Any:
    return list(stub.StreamRun(runner_pb2.StreamRunRequest(slug="agent", **fields), timeout=10))


@pytest.mark.parametrize("call", [_submit, _stream], ids=["SubmitRun", "StreamRun"])
@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_malformed_request_is_refused_before_any_run(
    admin: tuple[FakeHost, Any], call: Callable[[Any, dict[str, Any]], Any], case: str
) -> None:
    host, stub = admin
    fields, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as info:
        call(stub, fields)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"INVALID_REQUEST: {message}")
    assert dict(err.trailing_metadata() or ()) == {"agentnode-reason": "INVALID_REQUEST"}
    assert host.runs == []


def test_a_valid_request_runs_and_streams_started_then_the_report(admin: tuple[FakeHost, Any]) -> None:
    host, stub = admin
    caller = runner_pb2.CallerMetadata(tenant="acme", request_id="req-1", labels={"team": "search"})
    events = _stream(stub, {"runtime": "runsc", "kwargs_json": '{"n": 1}', "caller": caller})
    assert [e.WhichOneof("event") for e in events] == ["started_run_id", "log", "log", "report"]
    assert [(e.log.run_id, e.log.text) for e in events[1:3]] == [
        ("run-1", "first line"), ("run-1", "\x1b[31mred\x1b[0m"),  # the agent's text, as written
    ]  # fmt: skip
    assert events[-1].report.success and events[-1].report.result_json == '{"ok": true}'
    assert _submit(stub, {}).report.run_id == "run-1"
    assert [(r["runtime"], r["kwargs"]) for r in host.runs] == [("runsc", {"n": 1}), (None, {})]
    assert host.runs[0]["caller"] == CallerInfo("acme", "req-1", {"team": "search"})
    assert host.runs[1]["caller"].empty and host.runs[1]["on_log"] is None  # SubmitRun streams nothing
    assert host.runs[1]["limits"] is None
    limits = runner_pb2.RunLimitOverrides(max_tool_calls=0, max_cost_usd=0.5)
    _submit(stub, {"limits": limits})
    assert host.runs[2]["limits"] == RunOverrides(max_tool_calls=0, max_cost_usd=0.5)
    assert host.runs[2]["files"] is None
    files = runner_pb2.RunFiles(workspace="/srv/project", apply=True, output_dir="/srv/out", inputs=[
        runner_pb2.RunInput(name="data.csv", path="/srv/data.csv"),
        runner_pb2.RunInput(name="raw", data=b"\0")])  # fmt: skip
    _stream(stub, {"files": files})
    assert host.runs[3]["files"] == FilesRequest(
        workspace=Path("/srv/project"), apply=True, output_dir=Path("/srv/out"),
        inputs=(("data.csv", Path("/srv/data.csv")), ("raw", b"\0")))  # fmt: skip


def _followed(host: FakeHost, n: int) -> list[float]:
    deadline = time.monotonic() + 10
    while len(host.followed) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return host.followed


def test_a_runs_follow_up_waits_until_its_answer_has_left(admin: tuple[FakeHost, Any]) -> None:
    """The engine-heavy work after a result (a pool refill, a teardown) is deferred to the call's end, so
    it never competes with the answer on its way; it runs for unary and streamed calls alike."""
    host, stub = admin
    _submit(stub, {})
    _stream(stub, {})
    followed = _followed(host, 2)
    assert len(followed) == 2
    assert all(after >= returned for after, returned in zip(followed, host.returned, strict=True))


def test_a_runs_follow_up_runs_when_its_caller_left(admin: tuple[FakeHost, Any]) -> None:
    host, stub = admin
    call = stub.SubmitRun.future(runner_pb2.SubmitRunRequest(slug="slow"), timeout=10)
    deadline = time.monotonic() + 10
    while not host.runs and time.monotonic() < deadline:
        time.sleep(0.01)
    call.cancel()  # the run ends on the cancel (FakeHost.cancel), after its call is over
    assert len(_followed(host, 1)) == 1  # nothing to wait for: it ran as the run ended, not never


def test_cancel_of_an_unknown_run_is_an_answer_not_an_error(admin: tuple[FakeHost, Any]) -> None:
    _, stub = admin
    assert stub.CancelRun(runner_pb2.CancelRunRequest(run_id="nope"), timeout=10).cancelled is False


def test_a_metrics_address_is_host_and_port() -> None:
    from host.api.server import parse_address

    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address(":9464") == ("127.0.0.1", 9464)  # opt-in, and local unless told otherwise
    assert parse_address("[::1]:9464") == ("::1", 9464)
    for bad in ("9464", "host:", "host:0", "host:70000", "host:x"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the admin socket runs only"),
        (["run", "agent"], "the admin socket runs only"),
        (["serve"], "the admin socket runs only"),
        (["image", "build"], "the admin socket runs only"),
        (["policy"], "policy needs one of: explain"),
        (["list", "x" * 70000], "at most 64 arguments"),
        (["list", *(["--json"] * 64)], "at most 64 arguments"),
        (["list", "a\0b"], "no NUL"),
        (["list", "--via=/elsewhere"], "--via names the host"),
    ],
)
def test_admin_commands_are_an_allowlist_checked_before_anything_runs(
    admin: tuple[FakeHost, Any], args: list[str], message: str
) -> None:
    _, stub = admin
    with pytest.raises(grpc.RpcError) as info:
        stub.RunAdminCommand(runner_pb2.RunAdminCommandRequest(args=args), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in info.value.details()


def test_an_admin_command_runs_as_the_host_with_the_hosts_config(tmp_path: Path) -> None:
    import os

    host = FakeHost(env={"PATH": os.environ.get("PATH", ""), "AGENTNODE_CONFIG": str(tmp_path / "cfg")})
    root = Path(tempfile.mkdtemp(prefix="an-admin-"))
    server = build_admin_server(host, root / "s" / "admin.sock")  # type: ignore[arg-type]
    server.start()
    try:
        with RunnerClient(root / "s" / "admin.sock") as client:
            code, out, err = client.admin(["list", "--json"])
            assert (code, json.loads(out)) == (0, [])  # the host's (empty) lockfile, not this process's
            code, out, err = client.admin(["uninstall", "nothing-here"])
            assert code == 1 and out == "" and err.startswith("error: ")
            code, _, err = client.admin(["list", "--no-such-option"])
            assert code == 2 and "unrecognized arguments" in err
            # An abbreviation of --via is no --via, and the host's child never forwards anyway.
            code, _, err = client.admin(["list", "--vi", str(root / "s" / "admin.sock")])
            assert code == 2 and "unrecognized arguments: --vi" in err
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(root, ignore_errors=True)


def test_lines_written_before_the_run_id_come_right_after_it(admin: tuple[FakeHost, Any]) -> None:
    _, stub = admin
    events = list(stub.StreamRun(runner_pb2.StreamRunRequest(slug="early"), timeout=10))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["started_run_id", "log", "log", "log", "report"]
    assert [e.log.run_id for e in events[1:4]] == ["run-1"] * 3
    assert events[1].log.text == "written before the id was announced"


def test_the_host_child_never_forwards() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "AGENTNODE_ADMIN_CHILD": "1"}
    proc = subprocess.run([sys.executable, "-m", "host", "list", "--via", "/nowhere.sock"], env=env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "--via cannot be used" in proc.stderr


def test_global_options_stay_with_the_caller_and_the_command_goes_to_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from host.cli.main import main

    host = FakeHost(env={"PATH": os.environ.get("PATH", ""), "AGENTNODE_CONFIG": str(tmp_path / "cfg")})
    root = Path(tempfile.mkdtemp(prefix="an-admin-"))
    server = build_admin_server(host, root / "s" / "admin.sock")  # type: ignore[arg-type]
    server.start()
    try:
        code = main(["--log-format", "json", "list", "--json", "--via", str(root / "s" / "admin.sock")])
        out = capsys.readouterr().out
        assert code == 0 and json.loads(out) == []
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(root, ignore_errors=True)


# -- the client's readiness check ---------------------------------------------------------------------------


@pytest.mark.parametrize("health", [None, "SERVING", "NOT_SERVING"])
def test_the_client_knows_a_host_from_a_draining_one(health: str | None) -> None:
    """Any answer is a host (an admin server without the health service says UNIMPLEMENTED); one whose
    health says NOT_SERVING (serve's drain) is refused before anything is submitted."""
    from grpc_health.v1 import health as grpc_health
    from grpc_health.v1 import health_pb2

    from host.core.errors import EngineError

    checks = None
    if health is not None:
        checks = grpc_health.HealthServicer()
        checks.set("", getattr(health_pb2.HealthCheckResponse, health))
    host = FakeHost()
    root = Path(tempfile.mkdtemp(prefix="an-admin-"))
    server = build_admin_server(host, root / "s" / "admin.sock", health=checks)  # type: ignore[arg-type]
    server.start()
    try:
        with RunnerClient(root / "s" / "admin.sock", connect_timeout=5) as client:
            if health == "NOT_SERVING":
                with pytest.raises(EngineError, match="shutting down") as info:
                    client.submit("agent")
                assert "--no-serve" in (info.value.hint or "") and host.runs == []
            else:
                assert client.submit("agent").success and len(host.runs) == 1
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(root, ignore_errors=True)


def test_the_client_says_nothing_answers_on_a_dead_socket(tmp_path: Path) -> None:
    from host.core.errors import EngineError

    with RunnerClient(tmp_path / "gone.sock", connect_timeout=0.5) as client:
        with pytest.raises(EngineError, match="nothing answers"):
            client.submit("agent")


def test_run_passes_over_a_draining_serve_host_and_runs_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host found on the config's socket that is draining gets no run: `run` runs it in this process
    (here: no engine, so the local run's own refusal, with path local)."""
    from grpc_health.v1 import health as grpc_health
    from grpc_health.v1 import health_pb2

    from host.cli.main import main

    config = Path(tempfile.mkdtemp(prefix="an-cfg-"))  # short: the socket path must fit
    monkeypatch.setenv("AGENTNODE_CONFIG", str(config))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    checks = grpc_health.HealthServicer()
    checks.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    host = FakeHost()
    server = build_admin_server(host, config / "agentnode-admin.sock", health=checks)  # type: ignore[arg-type]
    server.start()
    try:
        code = main(["run", "agent", "--json"])
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(config, ignore_errors=True)
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["path"] == "local" and host.runs == []
