"""Community tool packs run in tool sandboxes: one per pack per run, started on first use, gone with the run.

Against the real engine and image, under runc and runsc: the acceptance (20 calls, one sandbox, none after
the run), results equal to the host worker's, isolation proven from inside the tool sandbox, a hanging and
a crashing tool, and teardown on every ending (cancel, agent crash, deadline).
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import docker
import pytest

import host.runtime.wiring
from host.audit.verify import verify_audit
from host.engine.facts import EngineKind
from host.engine.labels import LABEL_RUN, LABEL_SLUG, LABEL_TOOL_FOR
from host.engine.wrapper_env import wrapper_env
from host.runtime.runner import RunResult
from host.tools.gate import ToolGate
from tests.support.engine import ENGINE_ENV
from tests.support.host_state import HostState
from tests.support.paths import REPO

pytestmark = [pytest.mark.docker, pytest.mark.podman]

CANARY = "sk-canary-tool-sandbox-4f3e2d"

TOOLS = """
import json, os, re, socket, sys, time

N = 0


def tick(**kwargs):
    global N
    N += 1
    return {"host": socket.gethostname(), "pid": os.getpid(), "n": N}


def echo(**kwargs):
    return kwargs


def nested(**kwargs):
    return {"int": 2**60, "float": 0.1, "text": "h\\u00e9llo \\u2713", "list": [1, None, True], "kw": kwargs}


def boom(**kwargs):
    raise ValueError("this text never leaves the tool")


def unserializable(**kwargs):
    return {1, 2}


def big(**kwargs):
    return "x" * (2 * 1024 * 1024)


def prints(**kwargs):
    print("noise on stdout")
    print("noise on stderr", file=sys.stderr)
    return "quiet"


def crash(**kwargs):
    os._exit(7)


def hang(**kwargs):
    while True:
        time.sleep(1)


def run(**kwargs):
    return {"default": True, "kw": kwargs}


def _attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return type(exc).__name__


def _write(path):
    with open(path, "w") as fh:
        fh.write("x")


def _status(status, key):
    found = re.search(key + r":\\s*(\\w+)", status)
    return found.group(1) if found else None


def probe(agent_run_id="", host_paths=(), **kwargs):
    status = open("/proc/self/status").read()
    mounts = open("/proc/self/mounts").read()
    second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "cap_eff": _status(status, "CapEff"),
        "no_new_privs": _status(status, "NoNewPrivs"),
        "interfaces": sorted(os.listdir("/sys/class/net")),
        "connect_out": _attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2).close()),
        "write_pack": _attempt(lambda: _write("/pack/x")),
        "write_root": _attempt(lambda: _write("/x")),
        "write_socket_dir": _attempt(lambda: _write("/run/agentnode/x")),
        "socket_dir": sorted(os.listdir("/run/agentnode")),
        "second_connection": _attempt(lambda: second.connect("/run/agentnode/sandbox.sock")),
        "pack_mount": [m.split()[3].split(",")[0] for m in mounts.splitlines() if m.split()[1] == "/pack"],
        "agent_run_id_seen": bool(agent_run_id)
        and (agent_run_id in mounts or agent_run_id in json.dumps(dict(os.environ))),
        "host_paths_seen": [p for p in host_paths if os.path.exists(p)],
        "env": dict(os.environ),
    }
"""

TOOL_NAMES = ("tick", "echo", "nested", "boom", "unserializable", "big", "prints", "crash", "hang", "probe")

CALLER = """
import os, time


def run(context, calls=(), then="", **kwargs):
    out = []
    for slug, tool_name, arguments in calls:
        try:
            r = context.run_tool(slug, tool_name, **arguments)
        except Exception as exc:
            out.append({"raised": type(exc).__name__, "error": str(exc)})
            continue
        out.append({"success": r.success, "result": r.result, "error": r.error, "mode_used": r.mode_used})
    if then == "crash":
        os._exit(3)
    if then == "sleep":
        time.sleep(120)
    return out
"""


def _toolpack(parent: Path, slug: str) -> Path:
    pack = parent / slug
    pack.mkdir(parents=True)
    (pack / "probe_tools.py").write_text(textwrap.dedent(TOOLS))
    tools = "".join(f'    - name: {name}\n      entrypoint: "probe_tools:{name}"\n' for name in TOOL_NAMES)
    (pack / "agentnode.yaml").write_text(
        f'package_id: {slug}\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: probe_tools\n'
        f"capabilities:\n  tools:\n{tools}"
    )
    return pack


@pytest.fixture
def setup(
    host_state: HostState, make_agent: Callable[..., Path], tmp_path: Path, runtime: str
) -> HostState:
    """A host on `runtime` with the probe pack installed as community (`ctools`) and as trusted (`ttools`),
    and an agent allowed both."""
    host_state.write_config({"runtime": runtime})
    host_state.env["OPENAI_API_KEY"] = CANARY
    host_state.install(_toolpack(tmp_path / "toolpacks", "ctools"), trust="unverified")
    host_state.install(_toolpack(tmp_path / "toolpacks", "ttools"), trust="trusted")
    host_state.install(
        make_agent("caller", CALLER, extra="tool_access:\n  allowed_packages: [ctools, ttools]\n")
    )
    return host_state


def _tool_boxes(client: docker.DockerClient, run_id: str) -> list[str]:
    """Ids of the containers serving `run_id`'s tool calls (running or not)."""
    return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"{LABEL_TOOL_FOR}={run_id}"})]


class _Watch:
    """Records every tool sandbox container of the run while it lasts (the engine's view, not ours)."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.run_id = ""
        self.seen: set[str] = set()
        self.most_at_once = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self, run_id: str) -> None:
        self.run_id = run_id
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            boxes = _tool_boxes(self.client, self.run_id)
            self.seen.update(boxes)
            self.most_at_once = max(self.most_at_once, len(boxes))
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _run(state: HostState, calls: list[Any], *, then: str = "", watch: _Watch | None = None,
         **run_kwargs: Any) -> RunResult:
    host = state.host()
    try:
        return host.run("caller", kwargs={"calls": calls, "then": then},
                        on_start=watch.start if watch else None, **run_kwargs)
    finally:
        host.close()
        if watch is not None:
            watch.stop()


@pytest.fixture
def short_tool_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    """Runs' gates give each tool call 3 s instead of 60."""
    monkeypatch.setattr(host.runtime.wiring, "ToolGate", partial(ToolGate, tool_timeout=3.0))
    return 3.0


def test_twenty_calls_start_one_tool_sandbox_that_is_gone_after_the_run(
    setup: HostState, docker_client: docker.DockerClient
) -> None:
    watch = _Watch(docker_client)
    calls = [["ctools", "tick", {}]] * 20 + [["ctools", "echo", {"wait": 0}]]
    result = _run(setup, calls, watch=watch)
    assert result.success, (result.error_code, result.error, result.logs)
    ticks = result.result[:20]
    assert all(t["success"] and t["mode_used"] == "tool_sandbox" for t in ticks), ticks
    # From inside: one container (its hostname), one process, its state carried across all 20 calls.
    assert {(t["result"]["host"], t["result"]["pid"]) for t in ticks} == {(ticks[0]["result"]["host"],
                                                                          ticks[0]["result"]["pid"])}
    assert [t["result"]["n"] for t in ticks] == list(range(1, 21))
    # From the engine: exactly one tool sandbox for this run while it lasted, none after it.
    assert len(watch.seen) == 1 and watch.most_at_once == 1, watch.seen
    assert next(iter(watch.seen)).startswith(ticks[0]["result"]["host"])
    assert _tool_boxes(docker_client, result.run_id) == []
    labels = [f"{LABEL_SLUG}=ctools", LABEL_RUN]
    assert docker_client.api.containers(all=True, filters={"label": labels}) == []
    (rec,) = setup.audit()
    assert rec["tool_calls"] == rec["tool_calls_tool_sandbox"] == 21
    assert rec["tool_calls_host_worker"] == 0 and rec["tool_sandboxes_started"] == 1
    assert verify_audit(setup.dir / "audit.jsonl").ok
    for stage in ("verified", "socket_ready", "created", "started", "connected", "first_reply"):
        assert result.stages[f"tool_sandbox_{stage}"] > 0, result.stages
    assert result.stages["tool_sandbox_connected"] <= result.stages["tool_sandbox_first_reply"]


def test_results_are_those_of_the_host_worker(setup: HostState) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"a": 1, "b": [1.5, "x", None], "c": {"d": True}}),
        ("nested", {"k": 2**53 + 1}),
        ("boom", {}),
        ("unserializable", {}),
        ("big", {}),
        ("prints", {}),
        ("no_such_function", {"x": 1}),  # not declared: the pack's default function runs (§3.3)
        ("", {"y": 2}),  # no name: the package entrypoint's default function
    ]
    calls = [[slug, name, arguments] for name, arguments in cases for slug in ("ttools", "ctools")]
    result = _run(setup, calls)
    assert result.success, (result.error_code, result.error, result.logs)
    for index, (name, _) in enumerate(cases):
        trusted, community = result.result[2 * index : 2 * index + 2]
        assert trusted.get("mode_used") == "host_worker", (name, trusted)
        assert community.get("mode_used") == "tool_sandbox", (name, community)
        assert {**community, "mode_used": ""} == {**trusted, "mode_used": ""}, name
    by_name = {name: result.result[2 * i] for i, (name, _) in enumerate(cases)}
    assert by_name["boom"]["error"] == "tool raised ValueError"
    assert by_name["big"]["error"] == "tool result too large"
    assert by_name["nested"]["result"]["int"] == 2**60
    assert by_name["no_such_function"]["result"] == {"default": True, "kw": {"x": 1}}
    assert "never leaves" not in json.dumps(result.result)
    (rec,) = setup.audit()
    assert rec["tool_calls_host_worker"] == rec["tool_calls_tool_sandbox"] == len(cases)
    assert rec["tool_sandboxes_started"] == 1


def test_the_tool_sandbox_is_isolated_as_seen_from_inside(
    setup: HostState, tmp_path: Path, runtime: str, engine_kind: EngineKind
) -> None:
    host_paths = [str(setup.dir), str(tmp_path), "/var/run/docker.sock", "/run/agentnode-sandbox"]
    calls = [["ctools", "probe", {"host_paths": host_paths}]]
    # The agent passes its own run id, so the tool can look for it in its mounts and environment.
    source = CALLER.replace("for slug, tool_name, arguments in calls:",
                            "for slug, tool_name, arguments in calls:\n"
                            "        arguments = dict(arguments, agent_run_id=context.run_id)")
    (setup.root / "packs" / "caller" / "agent.py").write_text(textwrap.dedent(source))
    setup.install(setup.root / "packs" / "caller")
    result = _run(setup, calls)
    assert result.success, (result.error_code, result.error, result.logs)
    (probe,) = result.result
    assert probe["success"], probe
    seen = probe["result"]
    assert seen["uid"] == seen["gid"] == 65532
    assert int(seen["cap_eff"], 16) == 0
    if runtime != "runsc":  # gVisor's /proc does not show it (test_hardening checks the spec for both)
        assert seen["no_new_privs"] == "1"
    assert seen["interfaces"] == ["lo"]
    assert seen["connect_out"] != "ok"
    assert seen["write_pack"] != "ok" and seen["write_root"] != "ok" and seen["write_socket_dir"] != "ok"
    assert seen["pack_mount"] == ["ro"]
    # Its own socket directory (one socket, which takes no second connection), not the agent's.
    assert seen["socket_dir"] == ["sandbox.sock"]
    assert seen["second_connection"] == "ConnectionRefusedError"
    assert seen["agent_run_id_seen"] is False
    assert seen["host_paths_seen"] == []
    wrapper = wrapper_env(home="", path="", pythonpath="", socket="", import_root="")
    engine_own = ENGINE_ENV[engine_kind]
    # the wrapper's own, the engine's hostname and the engine's own markers (with their fixed values)
    assert set(seen["env"]) == {*wrapper, "HOSTNAME", *engine_own}
    assert {name: seen["env"][name] for name in engine_own} == engine_own
    assert CANARY not in json.dumps(result.result) and CANARY not in result.logs


def test_a_hanging_tool_is_killed_at_its_timeout_and_the_run_goes_on(
    setup: HostState, docker_client: docker.DockerClient, short_tool_timeout: float
) -> None:
    watch = _Watch(docker_client)
    calls = [["ctools", "tick", {}], ["ctools", "hang", {}], ["ctools", "tick", {}], ["ttools", "tick", {}]]
    t = time.monotonic()
    result = _run(setup, calls, watch=watch)
    assert result.success, (result.error_code, result.error, result.logs)
    first, hung, again, trusted = result.result
    timed_out = f"tool timed out after {short_tool_timeout:.1f} s"
    assert hung == {"success": False, "result": None, "error": timed_out, "mode_used": "tool_sandbox"}
    # The hung sandbox was destroyed; the pack's next call got a fresh one (a new container, state reset).
    assert again["success"] and again["result"]["n"] == 1
    assert again["result"]["host"] != first["result"]["host"]
    assert trusted["success"] and trusted["mode_used"] == "host_worker"
    assert time.monotonic() - t < short_tool_timeout + 30
    assert len(watch.seen) == 2 and watch.most_at_once == 1, watch.seen
    assert _tool_boxes(docker_client, result.run_id) == []
    (rec,) = setup.audit()
    assert rec["tool_sandboxes_started"] == 2 and rec["tool_calls_tool_sandbox"] == 3


def test_a_crashing_tool_fails_only_its_call(setup: HostState, docker_client: docker.DockerClient) -> None:
    calls = [["ctools", "tick", {}], ["ctools", "boom", {}], ["ctools", "tick", {}], ["ctools", "crash", {}],
             ["ctools", "tick", {}]]
    result = _run(setup, calls)
    assert result.success, (result.error_code, result.error, result.logs)
    first, raised, second, crashed, third = result.result
    assert raised["error"] == "tool raised ValueError"
    assert second["result"]["n"] == 2 and second["result"]["host"] == first["result"]["host"]  # it survived
    assert crashed == {"success": False, "result": None, "error": "tool sandbox crashed",
                       "mode_used": "tool_sandbox"}
    assert third["success"] and third["result"]["n"] == 1
    assert third["result"]["host"] != first["result"]["host"]
    assert _tool_boxes(docker_client, result.run_id) == []
    (rec,) = setup.audit()
    assert rec["reason"] == "agent_completed" and rec["tool_sandboxes_started"] == 2


@pytest.mark.parametrize("ending", ["cancelled", "agent_crash", "deadline"])
def test_tool_sandboxes_go_with_the_run_however_it_ends(
    setup: HostState, docker_client: docker.DockerClient, make_agent: Callable[..., Path], ending: str
) -> None:
    if ending == "deadline":  # a 3 s budget, then the agent sleeps past it
        pack = setup.root / "packs" / "caller"
        manifest = pack / "agentnode.yaml"
        manifest.write_text(manifest.read_text() + "  limits: {max_runtime_seconds: 3}\n")
        setup.install(pack)
    host = setup.host()
    seen: dict[str, Any] = {}

    def started(run_id: str) -> None:
        seen["run_id"] = run_id

    def go() -> None:
        seen["result"] = host.run("caller", kwargs={"calls": [["ctools", "tick", {}]],
                                                    "then": "crash" if ending == "agent_crash" else "sleep"},
                                  on_start=started)

    runner = threading.Thread(target=go)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            "run_id" in seen and (_tool_boxes(docker_client, seen["run_id"]) or "result" in seen)
        ):
            time.sleep(0.05)
        assert "run_id" in seen
        if ending == "cancelled":
            assert _tool_boxes(docker_client, seen["run_id"])
            assert host.cancel(seen["run_id"])
        runner.join(60)
        assert not runner.is_alive()
    finally:
        host.close()
        runner.join(60)
    result: RunResult = seen["result"]
    expected = {"cancelled": {"cancelled"}, "agent_crash": {"exited_before_result", "sandbox_crashed"},
                "deadline": {"timeout"}}[ending]
    assert not result.success and result.reason is not None and result.reason.value in expected, (
        result.error_code, result.error)
    assert _tool_boxes(docker_client, seen["run_id"]) == []
    (rec,) = setup.audit()
    assert rec["tool_sandboxes_started"] == 1 and rec["tool_calls_tool_sandbox"] == 1


def test_a_host_path_run_uses_a_tool_sandbox_when_the_sandbox_is_on(
    setup: HostState, docker_client: docker.DockerClient
) -> None:
    setup.install(setup.root / "packs" / "caller", trust="trusted")  # now a host-path agent
    result = _run(setup, [["ctools", "tick", {}], ["ctools", "tick", {}], ["ttools", "tick", {}]])
    assert result.success and result.mode_used == "agent_host", (result.error_code, result.error)
    first, second, trusted = result.result
    assert first["mode_used"] == second["mode_used"] == "tool_sandbox" and second["result"]["n"] == 2
    assert trusted["mode_used"] == "host_worker"
    assert _tool_boxes(docker_client, result.run_id) == []
    (rec,) = setup.audit()
    assert rec["source"] == "agent_host" and rec["tool_sandboxes_started"] == 1


def test_community_tool_packs_are_refused_while_the_sandbox_is_off(
    setup: HostState, docker_client: docker.DockerClient
) -> None:
    setup.install(setup.root / "packs" / "caller", trust="trusted")
    setup.env["AGENTNODE_AGENT_SANDBOX"] = "0"
    result = _run(setup, [["ctools", "tick", {}], ["ttools", "tick", {}]])
    assert result.success and result.mode_used == "agent_host", (result.error_code, result.error)
    refused, trusted = result.result
    assert refused["raised"] == "PermissionError"
    assert refused["error"].startswith("TOOL_PACK_UNTRUSTED:")
    assert "AGENTNODE_AGENT_SANDBOX=1" in refused["error"]
    assert trusted["success"] and trusted["mode_used"] == "host_worker"
    assert _tool_boxes(docker_client, result.run_id) == []
    (rec,) = setup.audit()
    assert rec["tool_refusals"] == 1 and rec["tool_sandboxes_started"] == 0


def test_the_community_toolpack_example_runs_in_a_tool_sandbox_per_run(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    host_state.install(REPO / "examples" / "community-toolpack")  # the default trust: unverified
    agent = """
    def run(context, **kwargs):
        slug = "community-text-stats"
        freq = context.run_tool(slug, "word_frequencies", text="b a B c b a", top=2)
        bad = context.run_tool(slug, "word_frequencies", text="x", top=0)
        counts = [context.run_tool(slug, "calls_in_this_run").result["calls"] for _ in range(2)]
        return {"freq": [freq.success, freq.result, freq.mode_used], "bad": bad.error, "counts": counts}
    """
    allowed = "tool_access:\n  allowed_packages: [community-text-stats]\n"
    host_state.install(make_agent("stats", agent, extra=allowed))
    host = host_state.host()
    try:
        results = [host.run("stats") for _ in range(2)]
    finally:
        host.close()
    for result in results:
        assert result.success, (result.error_code, result.error, result.logs)
        words = [{"word": "b", "count": 3}, {"word": "a", "count": 2}]
        assert result.result["freq"] == [True, {"words": words, "distinct": 3}, "tool_sandbox"]
        assert result.result["bad"].startswith("TOOL_ARGUMENTS_INVALID:")
        assert result.result["counts"] == [2, 3]  # the module state of one sandbox, fresh in each run
    assert [r["tool_sandboxes_started"] for r in host_state.audit()] == [1, 1]
