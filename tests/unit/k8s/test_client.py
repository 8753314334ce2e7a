"""`run --backend kubernetes` against the Kubernetes API stand-in (no cluster, no Docker).

A thread plays the controller and node agent by writing the AgentRun's status (Scheduled, Running, then a
terminal one); the client (`submit_and_wait`, or the CLI in this process or as the installed command) must
print exactly what `result_json` makes of that status, whatever happens to its watch in between.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host.cli.main import main
from host.k8s.api import KubeApi, KubeError, Ref, WatchExpired
from host.k8s.client import (
    DEFAULT_WAIT_SECONDS,
    InvalidAgentRun,
    RunCancelled,
    agentrun_body,
    agentrun_name,
    submit_and_wait,
)
from host.k8s.objects.agentrun import (
    MAX_AGENTRUN_NAME_CHARS,
    MAX_GOAL_CHARS,
    MAX_KWARGS_JSON_CHARS,
    RunRequest,
    agentrun,
)
from host.k8s.run import result_json, run_result
from host.policy.caller import CallerInfo
from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.k8s import eventually as poll
from tests.support.kubeapi import KubeAPI, kube_api
from tests.support.schema import check_schema

__all__ = ["kube_api"]  # the fixture, from tests.support.kubeapi

NAMESPACE = "team-a"
DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
RUN_ID = "0123456789abcdef0123456789abcdef"
ECHO = RunRequest(slug="echo")
SUCCEEDED = {
    "phase": "Succeeded", "runId": RUN_ID, "success": True, "resultJson": '{"answer":42,"text":"h\\u00e9"}',
    "errorCode": None, "error": None, "hint": None, "timedOut": False, "durationMs": 1234,
    "modeUsed": "agent_sandbox", "auditDigest": "a" * 64,
}  # fmt: skip
FAILED = {
    "phase": "Failed", "runId": RUN_ID, "success": False, "errorCode": "agent_error",
    "error": "the agent raised ValueError", "hint": "see the agent's code", "timedOut": False,
    "durationMs": 77, "modeUsed": "agent_sandbox",
}  # fmt: skip


# -- helpers -------------------------------------------------------------------------------------------------


def write_kubeconfig(path: Path, server: str, namespace: str = NAMESPACE) -> Path:
    """A kubeconfig for `server` whose current context names `namespace` (JSON is YAML)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
        "contexts": [
            {"name": "stand-in", "context": {"cluster": "stand-in", "user": "u", "namespace": namespace}},
            {"name": "other", "context": {"cluster": "stand-in", "user": "u", "namespace": "team-b"}},
        ],
    }))  # fmt: skip
    return path


@pytest.fixture
def kubeconfig(kube_api: KubeAPI, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", kube_api.url)


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main() in this process with private state, no engine, and no cluster but the one a test names."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENTNODE_CONFIG", str(tmp_path / "state"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)


wait_for = functools.partial(poll, timeout=10.0)


def the_agentrun(kube_api: KubeAPI, namespace: str = NAMESPACE) -> dict[str, Any]:
    runs: list[dict[str, Any]] = wait_for(lambda: kube_api.objects("agentruns", namespace))
    assert len(runs) == 1, runs
    return runs[0]


class NodeAgent(threading.Thread):
    """Plays the controller and node agent: once the AgentRun exists and is watched, writes each status in
    turn (waiting for the client to watch again before each); `between` runs before each write."""

    def __init__(self, kube_api: KubeAPI, statuses: list[dict[str, Any]], *, namespace: str = NAMESPACE,
                 between: Callable[[int], None] | None = None) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.kube_api, self.statuses, self.namespace, self.between = kube_api, statuses, namespace, between
        self.final: dict[str, Any] | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            name = the_agentrun(self.kube_api, self.namespace)["metadata"]["name"]
            for i, status in enumerate(self.statuses):
                self.kube_api.wait_for_watches(1)
                if self.between is not None:
                    self.between(i)
                    self.kube_api.wait_for_watches(1)
                self.final = self.kube_api.set_status("agentruns", self.namespace, name, status)
        except BaseException as exc:  # reported by the test through `failure`
            self.failure = exc

    def result(self) -> dict[str, Any]:
        self.join(30)
        assert self.failure is None, self.failure
        assert self.final is not None
        return self.final


@pytest.fixture
def kube(kube_api: KubeAPI) -> Iterator[KubeApi]:
    api = KubeApi.connect(host=kube_api.url)
    yield api
    api.close()


def stdout_json(capsys: pytest.CaptureFixture[str]) -> tuple[Any, str]:
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, (out, err)
    return json.loads(lines[0]), err


# -- names and bodies ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("slug", ["echo", "a.b_c", "x" * 64, "9-lives", "a..--__b", "_", "-x-"])
def test_agentrun_names_are_dns_labels_with_a_random_suffix(slug: str) -> None:
    names = {agentrun_name(slug) for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert DNS_LABEL.fullmatch(name) and len(name) <= MAX_AGENTRUN_NAME_CHARS, name
        assert re.fullmatch(r".+-[0-9a-f]{8}", name)
    assert agentrun_name("echo").startswith("echo-") and agentrun_name("a.b_c").startswith("a-b-c-")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"namespace": "Team_A"}, "namespace must be a DNS label"),
        ({"name": "x" * 64}, "AgentRun name must be a DNS label"),
        ({"slug": "Not A Slug"}, "SLUG must be a pack slug"),
        ({"runtime": "crun"}, "runsc or runc"),
        ({"goal": "g" * (MAX_GOAL_CHARS + 1)}, f"{MAX_GOAL_CHARS} characters"),
        ({"kwargs": {"k": "v" * MAX_KWARGS_JSON_CHARS}}, f"{MAX_KWARGS_JSON_CHARS} characters of JSON"),
        ({"kwargs": {"n": float("nan")}}, "finite numbers only"),
    ],
)
def test_what_the_crd_would_refuse_is_refused_before_anything_is_sent(
    kube_api: KubeAPI, kube: KubeApi, change: dict[str, Any], words: str
) -> None:
    request: dict[str, Any] = {"namespace": NAMESPACE, "name": "r-1", "slug": "echo", **change}
    where = {key: request.pop(key) for key in ("namespace", "name")}
    with pytest.raises(InvalidAgentRun, match=re.escape(words)) as refused:
        submit_and_wait(kube, RunRequest(**request), timeout=5, **where)
    assert "vvvv" not in str(refused.value) and "Not A Slug" not in str(refused.value)  # never the value
    assert kube_api.objects("agentruns") == [] and kube_api.requests == []
    with pytest.raises(InvalidAgentRun):
        submit_and_wait(kube, ECHO, namespace=NAMESPACE, timeout=0)


def test_the_body_is_what_agentrun_builds() -> None:
    caller = CallerInfo.parse("acme", "req-1", {"team": "blue"})
    request = RunRequest(slug="echo", goal="hi", kwargs={"n": 3, "s": "é"}, runtime="runsc", caller=caller)
    assert agentrun_body("r-1", NAMESPACE, request) == agentrun("r-1", NAMESPACE, request)


# -- the CLI: submit, follow, print the run object -----------------------------------------------------------


def test_a_cluster_run_prints_exactly_the_local_json_contract(
    kube_api: KubeAPI, kubeconfig: Path, isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = NodeAgent(kube_api, [{"phase": "Scheduled"}, {"phase": "Running", "runId": RUN_ID}, SUCCEEDED])
    agent.start()
    code = main([
        "run", "echo", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--json",
        "--goal", "say hi", "--arg", "n=3", "--arg", 'who="Ada"', "--runtime", "runsc",
        "--tenant", "acme", "--request-id", "req-1", "--label", "team=blue",
    ])  # fmt: skip
    final = agent.result()
    payload, err = stdout_json(capsys)
    assert code == 0, err
    assert payload == result_json(final) == run_result(final)
    check_schema("run", payload)
    assert payload["success"] is True and payload["result"] == {"answer": 42, "text": "hé"}
    assert payload["run_id"] == RUN_ID and payload["duration_ms"] == 1234
    assert "say hi" not in err and "Ada" not in err and "42" not in err  # no request or result text there
    # The AgentRun is what agentrun(...) builds, in the kubeconfig context's namespace, and it stays.
    created = the_agentrun(kube_api)
    name = created["metadata"]["name"]
    assert DNS_LABEL.fullmatch(name) and name.startswith("echo-")
    caller = CallerInfo.parse("acme", "req-1", {"team": "blue"})
    request = RunRequest(slug="echo", goal="say hi", kwargs={"n": 3, "who": "Ada"}, runtime="runsc",
                         caller=caller)  # fmt: skip
    expected = agentrun(name, NAMESPACE, request)
    assert created["spec"] == expected["spec"]
    assert created["spec"]["kwargsJson"] == '{"n":3,"who":"Ada"}'
    assert created["spec"]["caller"] == {"tenant": "acme", "requestId": "req-1", "labels": {"team": "blue"}}
    assert (created["apiVersion"], created["kind"]) == (expected["apiVersion"], expected["kind"])


def test_human_output_shows_each_phase_and_the_result(
    kube_api: KubeAPI, kubeconfig: Path, isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = NodeAgent(kube_api, [{"phase": "Scheduled"}, {"phase": "Running"}, SUCCEEDED], namespace="ns-x")
    agent.start()
    args = ["run", "echo", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", "ns-x"]
    assert main(args) == 0
    agent.result()
    out, err = capsys.readouterr()
    assert json.loads(out) == {"answer": 42, "text": "hé"}
    name = the_agentrun(kube_api, "ns-x")["metadata"]["name"]
    phases = [line for line in err.splitlines() if line.startswith("  AgentRun ")]
    expected = ("Pending", "Scheduled", "Running", "Succeeded")
    assert phases == [f"  AgentRun ns-x/{name}: {phase}" for phase in expected]
    assert f"ok: echo (agent_sandbox, run {RUN_ID[:12]}, 1234 ms)" in err


def test_a_failed_run_prints_the_failure_object_and_exits_1(
    kube_api: KubeAPI, kubeconfig: Path, isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = NodeAgent(kube_api, [{"phase": "Running"}, FAILED])
    agent.start()
    code = main(["run", "echo", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--json"])
    final = agent.result()
    payload, _ = stdout_json(capsys)
    assert code == 1
    assert payload == result_json(final)
    check_schema("run", payload)
    assert payload["error_code"] == "agent_error" and payload["result"] is None
    # without --json: the error and hint lines, exit 1
    kube_api.delete("agentruns", NAMESPACE, final["metadata"]["name"])
    agent = NodeAgent(kube_api, [FAILED])
    agent.start()
    assert main(["run", "echo", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig)]) == 1
    agent.result()
    err = capsys.readouterr().err.splitlines()
    assert "error: the agent raised ValueError [agent_error]" in err and "hint: see the agent's code" in err


def test_the_installed_command_prints_the_contract(
    kube_api: KubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    agent = NodeAgent(kube_api, [{"phase": "Running"}, SUCCEEDED], namespace="team-b")
    agent.start()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "AGENTNODE_CONFIG": str(tmp_path / "s")}
    args = ("run", "echo", "--backend", "kubernetes", "--kubeconfig", kubeconfig, "--context", "other")
    proc = cli(env, *args, "--json", timeout=60)
    final = agent.result()
    assert proc.returncode == 0, proc.stderr
    assert json_out(proc) == result_json(final)
    assert proc.stderr == ""  # progress is off with --json off a TTY


# -- the watch: dropped, expired, never a busy loop ----------------------------------------------------------


def test_dropped_watches_and_a_compacted_history_still_end_with_the_result(
    kube_api: KubeAPI, kube: KubeApi
) -> None:
    def disrupt(step: int) -> None:
        if step == 1:
            kube_api.drop_watches()  # an API server restart
        if step == 2:
            kube_api.compact()  # etcd compaction: old resourceVersions answer 410 now
            kube_api.drop_watches()

    agent = NodeAgent(kube_api, [{"phase": "Scheduled"}, {"phase": "Running"}, SUCCEEDED], between=disrupt)
    agent.start()
    phases: list[str] = []
    payload = submit_and_wait(kube, ECHO, namespace=NAMESPACE, timeout=30, on_phase=phases.append)
    assert payload == result_json(agent.result())
    assert phases == ["Pending", "Scheduled", "Running", "Succeeded"]
    watches = [r for r in kube_api.requests if r.query.get("watch") == "true"]
    assert len(watches) >= 3  # watched anew after each drop
    assert any(r.method == "GET" and r.path.endswith("/agentruns/" + agent.final["metadata"]["name"])  # type: ignore[index]
               for r in kube_api.requests)  # fmt: skip


class Flaky:
    """A KubeApi whose watches misbehave as `watch` says; everything else is the real client's."""

    def __init__(self, api: KubeApi, watch: Callable[[KubeApi, Ref, int, int], Iterator[Any]]) -> None:
        self.api, self.watch, self.watch_calls, self.get_calls = api, watch, 0, 0

    def watch_agentrun(self, ref: Ref, *, timeout_seconds: int = 300) -> Iterator[Any]:
        self.watch_calls += 1
        return self.watch(self.api, ref, timeout_seconds, self.watch_calls)

    def get_agentrun(self, ref: Ref) -> Any:
        self.get_calls += 1
        return self.api.get_agentrun(ref)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def test_an_expired_watch_is_read_again_and_watched_anew(kube_api: KubeAPI, kube: KubeApi) -> None:
    def watch(api: KubeApi, ref: Ref, timeout: int, call: int) -> Iterator[Any]:
        events = api.watch_agentrun(ref, timeout_seconds=timeout)
        if call == 1:
            yield next(events)  # the current state, then 410 Gone mid-stream
            raise WatchExpired("the watch expired", status=410)
        yield from events

    flaky = Flaky(kube, watch)
    agent = NodeAgent(kube_api, [{"phase": "Running"}, FAILED],
                      between=lambda step: wait_for(lambda: flaky.watch_calls >= 2))  # fmt: skip
    agent.start()
    payload = submit_and_wait(flaky, ECHO, namespace=NAMESPACE, timeout=30)  # type: ignore[arg-type]
    assert payload == result_json(agent.result())
    assert flaky.watch_calls >= 2 and flaky.get_calls >= 1


def test_watches_that_end_at_once_back_off_instead_of_spinning(kube_api: KubeAPI, kube: KubeApi) -> None:
    def watch(api: KubeApi, ref: Ref, timeout: int, call: int) -> Iterator[Any]:
        return iter(())  # the stream ends at once, every time

    flaky = Flaky(kube, watch)
    started = time.monotonic()
    payload = submit_and_wait(flaky, ECHO, namespace=NAMESPACE, timeout=1.5)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert payload["error_code"] == "timeout"
    assert flaky.watch_calls <= 6, flaky.watch_calls  # 0.2 + 0.4 + 0.8 s of backoff fill 1.5 s
    assert kube_api.objects("agentruns") == []


def test_an_api_that_keeps_failing_mid_wait_deletes_the_run_and_says_so(
    kube_api: KubeAPI, kube: KubeApi
) -> None:
    def forbidden(api: KubeApi, ref: Ref, timeout: int, call: int) -> Iterator[Any]:
        raise KubeError("the API server refused the watch (403)", status=403)
        yield  # a generator

    with pytest.raises(KubeError, match=r"\(403\); the AgentRun was deleted"):
        submit_and_wait(Flaky(kube, forbidden), ECHO, namespace=NAMESPACE, timeout=30)  # type: ignore[arg-type]
    assert kube_api.objects("agentruns") == []

    class Unreachable(Flaky):
        def get_agentrun(self, ref: Ref) -> Any:
            raise KubeError("the API server did not answer GET (MaxRetryError)", status=0)

    naps: list[float] = []
    with pytest.raises(KubeError, match="did not answer GET"):
        submit_and_wait(Unreachable(kube, broken), ECHO, namespace=NAMESPACE, timeout=30,  # type: ignore[arg-type]
                        sleep=naps.append)  # fmt: skip
    assert naps == [0.2, 0.4]  # transient: retried with backoff (watch and read fail: 2 each), then given up
    assert kube_api.objects("agentruns") == []


def broken(api: KubeApi, ref: Ref, timeout: int, call: int) -> Iterator[Any]:
    raise KubeError("the watch broke (ProtocolError)", status=0)
    yield  # a generator


def test_watches_that_keep_breaking_become_backed_off_polling(kube_api: KubeAPI, kube: KubeApi) -> None:
    flaky = Flaky(kube, broken)

    def finish() -> None:
        name = the_agentrun(kube_api)["metadata"]["name"]
        wait_for(lambda: flaky.watch_calls >= 8)  # more broken watches in a row than failures allowed
        kube_api.set_status("agentruns", NAMESPACE, name, SUCCEEDED)

    finisher = threading.Thread(target=finish, daemon=True)
    finisher.start()
    naps: list[float] = []  # the pauses it asks for (not slept here)
    payload = submit_and_wait(flaky, ECHO, namespace=NAMESPACE, timeout=30,  # type: ignore[arg-type]
                              sleep=naps.append)  # fmt: skip
    finisher.join(10)
    assert payload == result_json({"status": SUCCEEDED})
    assert naps[:7] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0] and flaky.get_calls == len(naps) + 1


# -- timeout, Ctrl-C, deletion -------------------------------------------------------------------------------


def test_a_run_that_outlives_its_wait_is_deleted_with_a_clear_error(
    kube_api: KubeAPI, kubeconfig: Path, isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", "echo", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--wait-seconds", "1"]
    assert main([*args, "--json"]) == 1
    payload, _ = stdout_json(capsys)
    check_schema("run", payload)
    assert payload["error_code"] == "timeout" and payload["timed_out"] is True and payload["success"] is False
    assert "did not finish within 1 s" in payload["error"] and "--wait-seconds" in payload["hint"]
    assert kube_api.objects("agentruns") == []  # nothing left behind
    assert any(r.method == "DELETE" for r in kube_api.requests)
    assert main(args) == 1
    assert_lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("error: the run did not finish") and line.endswith("[timeout]")
               for line in assert_lines)  # fmt: skip
    assert any(line.startswith("hint: wait longer") for line in assert_lines)


def test_ctrl_c_deletes_the_agentrun_and_reports_a_cancelled_run(kube_api: KubeAPI, kube: KubeApi) -> None:
    def interrupt(phase: str) -> None:
        if phase == "Running":
            raise KeyboardInterrupt

    agent = NodeAgent(kube_api, [{"phase": "Running", "runId": RUN_ID}])
    agent.start()
    with pytest.raises(RunCancelled) as cancelled:
        submit_and_wait(kube, ECHO, namespace=NAMESPACE, timeout=30, on_phase=interrupt)
    agent.result()
    assert isinstance(cancelled.value, KeyboardInterrupt)
    result = cancelled.value.result
    check_schema("run", result)
    assert result["error_code"] == "cancelled" and result["run_id"] == RUN_ID and result["hint"]
    assert kube_api.objects("agentruns") == []


def test_ctrl_c_in_the_cli_prints_the_cancelled_run_and_exits_130(
    kube_api: KubeAPI, kubeconfig: Path, isolated: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    def progress(_args: Any) -> Callable[[str], None]:
        def show(line: str) -> None:
            if line.endswith(": Running"):
                raise KeyboardInterrupt

        return show

    monkeypatch.setattr("host.cli.run.progress", progress)
    agent = NodeAgent(kube_api, [{"phase": "Running"}])
    agent.start()
    code = main(["run", "echo", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--json"])
    agent.result()
    payload, err = stdout_json(capsys)
    assert code == 130
    check_schema("run", payload)
    assert payload["error_code"] == "cancelled" and "its AgentRun was deleted" in payload["error"]
    assert err == ""  # as a local run's --json: the object says it all
    assert kube_api.objects("agentruns") == []


@pytest.mark.parametrize("given_name", [None, "mine-1"])
def test_ctrl_c_during_the_create_deletes_only_a_name_made_here(
    kube_api: KubeAPI, kube: KubeApi, given_name: str | None
) -> None:
    class InterruptedCreate(Flaky):
        def create_agentrun(self, body: Any) -> Any:
            self.api.create_agentrun(body)  # it reached the server; the answer never came back
            raise KeyboardInterrupt

    flaky = InterruptedCreate(kube, lambda *_: iter(()))
    with pytest.raises(RunCancelled) as cancelled:
        submit_and_wait(flaky, ECHO, namespace=NAMESPACE, name=given_name, timeout=30)  # type: ignore[arg-type]
    result = cancelled.value.result
    check_schema("run", result)
    assert result["error_code"] == "cancelled"
    if given_name is None:
        assert kube_api.objects("agentruns") == [] and "nothing is left" in result["hint"]
    else:  # a given name may hold someone else's AgentRun: never deleted blindly
        assert [r["metadata"]["name"] for r in kube_api.objects("agentruns")] == [given_name]
        assert f"kubectl -n {NAMESPACE} get agentrun {given_name}" in result["hint"]


def test_an_agentrun_deleted_on_the_cluster_ends_the_wait(kube_api: KubeAPI, kube: KubeApi) -> None:
    def delete() -> None:
        name = the_agentrun(kube_api)["metadata"]["name"]
        kube_api.wait_for_watches(1)
        kube_api.delete("agentruns", NAMESPACE, name)

    deleter = threading.Thread(target=delete, daemon=True)
    deleter.start()
    payload = submit_and_wait(kube, ECHO, namespace=NAMESPACE, timeout=30)
    deleter.join(10)
    check_schema("run", payload)
    assert payload["error_code"] == "cancelled" and "deleted on the cluster" in payload["error"]


# -- what the cluster sends is bounded -----------------------------------------------------------------------


def test_a_hostile_status_is_held_to_the_schema() -> None:
    hostile = {"status": {
        "phase": "Succeeded", "success": "yes", "durationMs": float("inf"), "timedOut": 1,
        "error": "e\x1b[2J" * 10_000, "hint": ["not", "text"], "errorCode": "Not A Code\x1b",
        "runId": "../../etc", "modeUsed": {"x": 1}, "resultJson": "[" * 100_000,
    }}  # fmt: skip
    payload = run_result(hostile)
    check_schema("run", payload)
    assert payload["success"] is False and payload["result"] is None and payload["duration_ms"] == 0
    assert payload["error_code"] is None and payload["run_id"] == "" and payload["hint"] is None
    assert len(payload["error"]) == 1024 and payload["timed_out"] is False
    odd: list[Any] = [None, "Succeeded", [], {"durationMs": "12"}, {"success": True, "resultJson": 5}]
    for status in odd:
        check_schema("run", run_result({"status": status}))
    assert run_result({"status": SUCCEEDED}) == result_json({"status": SUCCEEDED})
    assert run_result({"status": FAILED}) == result_json({"status": FAILED})


def test_phases_outside_the_contract_are_never_reported(kube_api: KubeAPI, kube: KubeApi) -> None:
    agent = NodeAgent(kube_api, [{"phase": "Evil\x1b[2J"}, {"phase": "Running"}, SUCCEEDED])
    agent.start()
    phases: list[str] = []
    submit_and_wait(kube, ECHO, namespace=NAMESPACE, timeout=30, on_phase=phases.append)
    agent.result()
    assert phases == ["Pending", "Running", "Succeeded"]


# -- no cluster ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_api_is_one_error_line_and_the_engine_unavailable_exit(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "AGENTNODE_CONFIG": str(tmp_path / "s")}
    base = ("run", "echo", "--backend", "kubernetes", "--kubeconfig", config)
    human = cli(env, *base, timeout=60)
    assert_error_lines(human, 1)
    assert human.stdout == "" and len(human.stderr.splitlines()) == 2
    assert human.stderr.startswith("error: the API server did not answer POST")
    proc = cli(env, *base, "--json", timeout=60)
    assert_error_lines(proc, 1)
    payload = json_out(proc)
    check_schema("run", payload)
    assert payload["error_code"] == "engine_unavailable" and payload["hint"]


@pytest.mark.parametrize("extra", [("--kubeconfig", "/nonexistent/kubeconfig"), ("--context", "nope")])
def test_no_usable_cluster_configuration_is_one_error_line(
    tmp_path: Path, kubeconfig: Path, extra: tuple[str, ...]
) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "AGENTNODE_CONFIG": str(tmp_path / "s"),
           "KUBECONFIG": str(kubeconfig)}  # fmt: skip
    proc = cli(env, "run", "echo", "--backend", "kubernetes", *extra, timeout=60)
    assert_error_lines(proc, 1)
    assert proc.stderr.startswith("error: no usable Kubernetes cluster configuration")
    assert "--kubeconfig" in proc.stderr.splitlines()[1]


def test_the_default_wait_is_what_the_help_says() -> None:
    import contextlib
    import io

    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        main(["run", "--help"])
    assert f"default {int(DEFAULT_WAIT_SECONDS)}" in " ".join(help_text.getvalue().split())


# -- serve --node and k8s-controller -------------------------------------------------------------------------


def test_serve_node_runs_the_node_agent_with_the_environment(
    isolated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    calls: list[Any] = []

    def serve_node(env: Any, *, stop: threading.Event | None = None) -> int:
        calls.append(env)
        return 3

    monkeypatch.setattr("host.k8s.node.serve_node", serve_node)
    assert main(["serve", "--node"]) == 3
    assert calls == [os.environ]


@pytest.mark.parametrize(
    ("args", "namespaces", "clusterwide"),
    [
        ([], (), True),
        (["--all-namespaces"], (), True),
        (["--namespace", "a", "--namespace", "b", "--namespace", "a"], ("a", "b"), False),
    ],
)
def test_k8s_controller_runs_the_controller(
    isolated: None, monkeypatch: pytest.MonkeyPatch, args: list[str], namespaces: tuple[str, ...],
    clusterwide: bool,
) -> None:  # fmt: skip
    import os

    calls: list[Any] = []

    def run_controller(env: Any, *, namespaces: Any, clusterwide: bool) -> int:
        calls.append((env, namespaces, clusterwide))
        return 0

    monkeypatch.setattr("host.k8s.controller.run_controller", run_controller)
    assert main(["k8s-controller", *args]) == 0
    assert calls == [(os.environ, namespaces, clusterwide)]
