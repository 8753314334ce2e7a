"""Tool sandboxes without a daemon: the spec as data, the frames and their mapping, the host's end of the
link against the real tool server and against hostile peers, and one run's sandboxes with a stand-in
backend whose "containers" are tool-server processes on real Unix sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from host.engine.labels import LABEL_TOOL_FOR, LABEL_WARM
from host.engine.spec import container_spec
from host.runtime.toolsandbox import (
    MAX_LIVE_SANDBOXES,
    MAX_STARTS_PER_PACK,
    ToolSandboxes,
    ToolSandboxLauncher,
)
from host.runtime.workload import Teardowns
from host.spec.config import load_config
from host.spec.manifest.model import ToolpackManifest
from host.tools.calls import (
    MODE_TOOL_SANDBOX,
    InstalledToolpack,
    ResolvedTool,
    ToolRefusal,
    reply_outcome,
)
from host.tools.gate import ToolGate
from host.tools.link import MAX_REPLY_BYTES, LinkBroken, LinkTimeout, ToolLink, reply_dict
from host.tools.workers import ToolRunner
from sandbox_wrapper import PROTOCOL_VERSION
from sandbox_wrapper._tool_exec import handle
from sandbox_wrapper._tool_server import FRAME_HEADER, frame, reply_message
from sandbox_wrapper.protocol import toolsandbox_pb2
from tests.support.paths import REPO

TOOLS = textwrap.dedent(
    """
    import os, sys, time

    N = 0
    ACTIVE = 0
    MOST = 0

    def tick(**kwargs):
        global N
        N += 1
        return {"pid": os.getpid(), "n": N}

    def slow(**kwargs):
        global ACTIVE, MOST
        ACTIVE += 1
        MOST = max(MOST, ACTIVE)
        time.sleep(0.05)
        ACTIVE -= 1
        return MOST

    def echo(**kwargs):
        return kwargs

    def boom(**kwargs):
        raise KeyError("not shown")

    def hang(**kwargs):
        time.sleep(60)

    def crash(**kwargs):
        os._exit(9)

    def huge(**kwargs):
        return "x" * (2 << 20)

    def weird(**kwargs):
        return {1, 2}

    def run(**kwargs):
        return {"default": kwargs}
    """
)


def _spec(**extra: Any) -> dict[str, Any]:
    return container_spec(
        image="sha256:" + "0" * 64, run_id="t" * 32, name="n", owner="o", slug="ctools", runtime="runsc",
        pack_volume="v", import_root="/pack", socket_dir="/run/x", **extra,
    )  # fmt: skip


# -- the spec ---------------------------------------------------------------------------------------


def test_a_tool_sandbox_spec_differs_from_a_runs_only_in_its_mode_and_label() -> None:
    run, tool = _spec(), _spec(tool_for="a" * 32)
    assert tool["labels"] == {**run["labels"], LABEL_TOOL_FOR: "a" * 32}
    assert tool["command"] == [*run["command"], "tool-server"]
    assert {k: v for k, v in tool.items() if k not in ("labels", "command")} == {
        k: v for k, v in run.items() if k not in ("labels", "command")
    }
    # The hardening that matters, spelled out (the same dict as an agent's, so the same values).
    assert tool["network_mode"] == "none" and tool["read_only"] is True and tool["cap_drop"] == ["ALL"]
    assert tool["security_opt"] == ["no-new-privileges"] and tool["runtime"] == "runsc"
    assert LABEL_WARM not in tool["labels"]


# -- frames and their mapping -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        {"ok": True, "result_json": '{"a": [1, 2.5, null]}'},
        {"ok": True, "result_json": ""},
        {"ok": False, "failure": "load", "error_type": "ModuleNotFoundError"},
        {"ok": False, "failure": "raised", "error_type": "ValueError"},
        {"ok": False, "failure": "not_serializable", "error_type": ""},
        {"ok": False, "failure": "too_large", "error_type": ""},
    ],
)
def test_a_reply_crosses_as_the_same_dict(reply: dict[str, Any]) -> None:
    message = toolsandbox_pb2.ToolReply.FromString(reply_message(7, reply).SerializeToString())
    assert message.call_id == 7
    back = reply_dict(message)
    assert back == {"error_type": "", **reply} if not reply["ok"] else back == reply
    assert reply_outcome(back) == reply_outcome(reply)


def test_a_reply_without_an_outcome_or_with_an_unknown_failure_is_not_serializable() -> None:
    assert reply_dict(toolsandbox_pb2.ToolReply(call_id=1))["failure"] == "not_serializable"
    odd = toolsandbox_pb2.ToolReply.FromString(b"\x08\x01\x18\x63")  # failure = 99 (open enum)
    assert reply_dict(odd)["failure"] == "not_serializable"
    assert not reply_outcome(reply_dict(odd)).success


def test_the_executor_replies_map_to_the_host_workers_outcomes(tmp_path: Path) -> None:
    (tmp_path / "t_exec.py").write_text(TOOLS)
    sys.path.insert(0, str(tmp_path))
    try:
        for name in ("echo", "boom", "weird", "huge", "missing_module"):
            entrypoint = "nope_mod:x" if name == "missing_module" else f"t_exec:{name}"
            direct = handle({"entrypoint": entrypoint, "fallback": "", "arguments": {"k": 1}})
            crossed = reply_dict(toolsandbox_pb2.ToolReply.FromString(
                reply_message(1, direct).SerializeToString()))  # fmt: skip
            assert reply_outcome(crossed) == reply_outcome(direct), name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("t_exec", None)


# -- the link, against the real tool server -----------------------------------------------------------


def _server_env(socket_path: Path, root: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
            "AGENTNODE_SOCKET": str(socket_path), "AGENTNODE_IMPORT_ROOT": str(root)}  # fmt: skip


@dataclass
class FakeBox:
    """A tool sandbox stand-in: the real tool server as a local process on the link's socket."""

    link: ToolLink
    proc: subprocess.Popen[bytes]
    name: str = "fake-tool-sandbox"
    launched_at: float = field(default_factory=time.monotonic)
    stages: dict[str, float] = field(default_factory=dict)
    destroyed: bool = False

    @property
    def exited(self) -> bool:
        return self.proc.poll() is not None

    def mark(self, stage: str) -> None:
        self.stages[stage] = round((time.monotonic() - self.launched_at) * 1000, 2)

    def destroy(self) -> None:
        self.destroyed = True
        self.link.stop(None)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _launch(tmp_path: Path, root: Path) -> FakeBox:
    sock = tmp_path / f"s-{time.monotonic_ns()}.sock"
    link = ToolLink(str(sock))
    link.start()
    proc = subprocess.Popen([sys.executable, "-s", "-m", "sandbox_wrapper", "tool-server"],
                            env=_server_env(sock, root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    box = FakeBox(link, proc)
    box.mark("socket_ready")
    return box


@pytest.fixture
def pack_root(tmp_path: Path) -> Path:
    root = tmp_path / "pack"
    root.mkdir()
    (root / "t_tools.py").write_text(TOOLS)
    return root


@pytest.fixture
def box(tmp_path: Path, pack_root: Path) -> Iterator[FakeBox]:
    b = _launch(tmp_path, pack_root)
    b.link.connect(time.monotonic() + 30, alive=lambda: not b.exited)
    yield b
    b.destroy()


def test_the_link_runs_calls_in_one_process_in_order(box: FakeBox) -> None:
    deadline = time.monotonic() + 30
    replies = [box.link.call("t_tools:tick", "", "{}", deadline) for _ in range(5)]
    assert all(r["ok"] for r in replies)
    assert [reply_outcome(r).result["n"] for r in replies] == [1, 2, 3, 4, 5]
    assert len({reply_outcome(r).result["pid"] for r in replies}) == 1
    assert box.link.calls == 5 and box.link.idle_ok()
    fallback = box.link.call("t_tools:nope", "run", '{"a": 1}', deadline)
    assert reply_outcome(fallback).result == {"default": {"a": 1}}
    assert reply_outcome(box.link.call("t_tools:boom", "", "{}", deadline)).error == "tool raised KeyError"
    assert reply_outcome(box.link.call("t_tools:huge", "", "{}", deadline)).error == "tool result too large"


def test_a_slow_reply_times_out_and_a_dead_server_breaks_the_link(box: FakeBox) -> None:
    with pytest.raises(LinkTimeout):
        box.link.call("t_tools:hang", "", "{}", time.monotonic() + 0.3)
    box.proc.kill()
    box.proc.wait()
    assert not box.link.idle_ok()  # the leftover reply or the end of the connection
    with pytest.raises(LinkBroken):
        box.link.call("t_tools:tick", "", "{}", time.monotonic() + 5)


def test_a_crashing_tool_breaks_the_link(box: FakeBox) -> None:
    with pytest.raises(LinkBroken):
        box.link.call("t_tools:crash", "", "{}", time.monotonic() + 10)


def test_no_second_connection_is_accepted(box: FakeBox, tmp_path: Path) -> None:
    sock_path = next(tmp_path.glob("s-*.sock"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second, pytest.raises(ConnectionRefusedError):
        second.connect(str(sock_path))


def test_stop_wakes_a_waiting_call(box: FakeBox) -> None:
    errors: list[BaseException] = []

    def call() -> None:
        try:
            box.link.call("t_tools:hang", "", "{}", time.monotonic() + 30)
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.2)
    t = time.monotonic()
    box.link.stop(None)
    caller.join(5)
    assert not caller.is_alive() and time.monotonic() - t < 2
    assert [type(e) for e in errors] == [LinkBroken]


# -- the link, against hostile peers ----------------------------------------------------------------------


def _peer(tmp_path: Path, script: Callable[[socket.socket], None]) -> tuple[ToolLink, threading.Thread]:
    """A link and a thread that connects to it and runs `script` on the connection."""
    path = tmp_path / f"h-{time.monotonic_ns()}.sock"
    link = ToolLink(str(path))
    link.start()

    def go() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
            script(sock)
            time.sleep(0.5)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return link, thread


def _hello(version: int = PROTOCOL_VERSION) -> bytes:
    return frame(toolsandbox_pb2.ToolServerHello(protocol_version=version))


def _reply_to_next(sock: socket.socket, **fields: Any) -> None:
    header = sock.recv(FRAME_HEADER.size, socket.MSG_WAITALL)
    (size,) = FRAME_HEADER.unpack(header)
    call = toolsandbox_pb2.SandboxToolCall.FromString(sock.recv(size, socket.MSG_WAITALL))
    sock.sendall(frame(toolsandbox_pb2.ToolReply(**{"call_id": call.call_id, **fields})))


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(lambda s: s.sendall(_hello(PROTOCOL_VERSION + 1)), id="other-protocol"),
        pytest.param(lambda s: s.sendall(b"\xff\xff\xff\xff"), id="huge-hello"),
        pytest.param(lambda s: s.sendall(FRAME_HEADER.pack(3) + b"\xff\xff\xff"), id="garbage-hello"),
        pytest.param(lambda s: s.close(), id="closes"),
    ],
)
def test_a_bad_hello_breaks_the_link(tmp_path: Path, script: Callable[[socket.socket], None]) -> None:
    link, _ = _peer(tmp_path, script)
    with pytest.raises(LinkBroken):
        link.connect(time.monotonic() + 5, alive=lambda: True)
    link.stop(None)


def test_silence_times_out_and_a_dead_workload_ends_the_wait(tmp_path: Path) -> None:
    link, _ = _peer(tmp_path, lambda s: None)
    with pytest.raises(LinkTimeout):
        link.connect(time.monotonic() + 0.3, alive=lambda: True)
    link.stop(None)
    never = ToolLink(str(tmp_path / "never.sock"))
    never.start()
    t = time.monotonic()
    with pytest.raises(LinkBroken):
        never.connect(time.monotonic() + 30, alive=lambda: time.monotonic() - t < 0.2)
    never.stop(None)


@pytest.mark.parametrize(
    ("script", "broken"),
    [
        pytest.param(lambda s: _reply_to_next(s, result_json="1"), False, id="good"),
        pytest.param(lambda s: _reply_to_next(s, call_id=99, result_json="1"), True, id="other-call"),
        pytest.param(lambda s: (s.recv(1 << 16), s.sendall(FRAME_HEADER.pack(MAX_REPLY_BYTES + 1))), True,
                     id="oversize"),
        pytest.param(lambda s: (s.recv(1 << 16), s.sendall(FRAME_HEADER.pack(2) + b"\x0a\xff")), True,
                     id="undecodable"),
        pytest.param(lambda s: (s.recv(1 << 16), s.shutdown(socket.SHUT_WR)), True, id="closes"),
    ],
)
def test_only_the_reply_to_the_call_in_flight_is_taken(
    tmp_path: Path, script: Callable[[socket.socket], None], broken: bool
) -> None:
    link, _ = _peer(tmp_path, lambda s: (s.sendall(_hello()), script(s)))
    link.connect(time.monotonic() + 5, alive=lambda: True)
    try:
        if broken:
            with pytest.raises(LinkBroken):
                link.call("m:f", "", "{}", time.monotonic() + 5)
        else:
            assert link.call("m:f", "", "{}", time.monotonic() + 5) == {"ok": True, "result_json": "1"}
    finally:
        link.stop(None)


def test_anything_sent_between_calls_makes_the_link_unusable(tmp_path: Path) -> None:
    def chatty(sock: socket.socket) -> None:
        sock.sendall(_hello())
        _reply_to_next(sock, result_json="1")
        sock.sendall(frame(toolsandbox_pb2.ToolReply(call_id=2, result_json="2")))  # nobody asked yet

    link, _ = _peer(tmp_path, chatty)
    link.connect(time.monotonic() + 5, alive=lambda: True)
    assert link.call("m:f", "", "{}", time.monotonic() + 5)["ok"]
    deadline = time.monotonic() + 5
    while link.idle_ok() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not link.idle_ok()
    link.stop(None)


def test_a_peer_that_never_reads_cannot_block_a_send_past_its_deadline(tmp_path: Path) -> None:
    link, _ = _peer(tmp_path, lambda s: (s.sendall(_hello()), time.sleep(3)))
    link.connect(time.monotonic() + 5, alive=lambda: True)
    t = time.monotonic()
    with pytest.raises(LinkTimeout):
        link.call("m:f", "", '"' + "x" * (8 << 20) + '"', time.monotonic() + 0.5)
    assert time.monotonic() - t < 2
    link.stop(None)


# -- one run's tool sandboxes ---------------------------------------------------------------------------


@dataclass
class Entry:
    package_type: str = "toolpack"
    version: str = "1.0.0"


class FakeBackend:
    """Launches FakeBoxes and counts what it started and what was disposed of."""

    def __init__(self, tmp_path: Path, root: Path) -> None:
        self.tmp_path, self.root = tmp_path, root
        self.launched: list[FakeBox] = []
        self.launch_delay = 0.0
        self.lock = threading.Lock()

    def launch_tool_sandbox(
        self, entry: Entry, runtime: str, *, tool_for: str, egress: object = None, files: object = None
    ) -> FakeBox:
        time.sleep(self.launch_delay)
        box = _launch(self.tmp_path, self.root)
        with self.lock:
            self.launched.append(box)
        return box

    @property
    def live(self) -> list[FakeBox]:
        return [b for b in self.launched if not b.destroyed]


class Lockfile:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def get(self, slug: str) -> Entry | None:
        return self.entries.get(slug, Entry())


def _pack(slug: str = "ctools", root: Path = Path("/nonexistent")) -> InstalledToolpack:
    manifest = ToolpackManifest(slug=slug, version="1.0.0", name=slug, entrypoint="t_tools", tools=(),
                                dependencies=())
    return InstalledToolpack(slug=slug, version="1.0.0", trust="unverified", root=root, manifest=manifest)


@pytest.fixture
def backend(tmp_path: Path, pack_root: Path) -> Iterator[FakeBackend]:
    b = FakeBackend(tmp_path, pack_root)
    yield b
    for box in b.launched:
        box.destroy()


@pytest.fixture
def sandboxes(backend: FakeBackend) -> Iterator[ToolSandboxes]:
    stages: dict[str, float] = {}
    boxes = ToolSandboxes(backend, lockfile=Lockfile(), run_id="r1", runtime="runc",  # type: ignore[arg-type]
                          dispose=lambda box: box.destroy(), stages=stages)  # fmt: skip
    yield boxes
    boxes.close()


def _call(boxes: ToolSandboxes, name: str, *, slug: str = "ctools", timeout: float = 30) -> Any:
    return boxes.run(_pack(slug), ResolvedTool(f"t_tools:{name}"), {}, timeout=timeout)


def test_one_sandbox_serves_every_call_of_its_pack(sandboxes: ToolSandboxes, backend: FakeBackend) -> None:
    outcomes = [_call(sandboxes, "tick") for _ in range(20)]
    assert all(o.success and o.mode_used == MODE_TOOL_SANDBOX for o in outcomes)
    assert [o.result["n"] for o in outcomes] == list(range(1, 21))
    assert len(backend.launched) == sandboxes.started == 1
    assert {f"tool_sandbox_{s}" for s in ("verified", "socket_ready", "connected", "first_reply")} <= set(
        sandboxes.stages)


def test_calls_of_one_pack_are_serialized_and_packs_get_their_own(
    sandboxes: ToolSandboxes, backend: FakeBackend
) -> None:
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(_call(sandboxes, "slow"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [o.result for o in results] == [1] * 6  # never two at once in the sandbox
    assert _call(sandboxes, "tick", slug="other").success
    assert len(backend.launched) == 2


def test_a_timeout_or_crash_replaces_the_sandbox_up_to_the_limit(
    sandboxes: ToolSandboxes, backend: FakeBackend
) -> None:
    first = _call(sandboxes, "tick")
    hung = _call(sandboxes, "hang", timeout=1.0)
    assert hung.error == "tool timed out after 1.0 s" and backend.launched[0].destroyed
    again = _call(sandboxes, "tick")
    assert again.result["n"] == 1 and again.result["pid"] != first.result["pid"]
    assert _call(sandboxes, "crash").error == "tool sandbox crashed"
    assert _call(sandboxes, "tick").result["n"] == 1  # a third start
    assert _call(sandboxes, "crash").error == "tool sandbox crashed"
    assert sandboxes.started == MAX_STARTS_PER_PACK == 3
    refused = _call(sandboxes, "tick")
    assert not refused.success and "failed 3 times" in refused.error
    assert len(backend.launched) == 3 and backend.live == []


def test_a_sandbox_that_died_between_calls_is_replaced(
    sandboxes: ToolSandboxes, backend: FakeBackend
) -> None:
    assert _call(sandboxes, "tick").success
    backend.launched[0].proc.kill()
    backend.launched[0].proc.wait()
    again = _call(sandboxes, "tick")
    assert again.success and again.result["n"] == 1 and len(backend.launched) == 2


def test_a_run_has_at_most_so_many_sandboxes(sandboxes: ToolSandboxes) -> None:
    for i in range(MAX_LIVE_SANDBOXES):
        assert _call(sandboxes, "tick", slug=f"p{i}").success
    refused = _call(sandboxes, "tick", slug="one-more")
    assert not refused.success and f"{MAX_LIVE_SANDBOXES} tool sandboxes" in refused.error


def test_a_run_starts_at_most_so_many_sandboxes_in_all(
    sandboxes: ToolSandboxes, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("host.runtime.toolsandbox.MAX_STARTS_PER_RUN", 2)
    assert _call(sandboxes, "crash").error == "tool sandbox crashed"
    assert _call(sandboxes, "tick", slug="b").success
    refused = _call(sandboxes, "tick")
    assert not refused.success and "started 2 tool sandboxes" in refused.error and len(backend.launched) == 2


def test_close_destroys_everything_and_nothing_starts_after(
    sandboxes: ToolSandboxes, backend: FakeBackend
) -> None:
    assert _call(sandboxes, "tick").success and _call(sandboxes, "tick", slug="b").success
    sandboxes.close()
    assert backend.live == []
    late = _call(sandboxes, "tick")
    assert not late.success and late.error == "the run has ended" and len(backend.launched) == 2


def test_close_waits_for_a_start_under_way_and_removes_it(
    sandboxes: ToolSandboxes, backend: FakeBackend
) -> None:
    backend.launch_delay = 0.5
    results: list[Any] = []
    caller = threading.Thread(target=lambda: results.append(_call(sandboxes, "tick")))
    caller.start()
    time.sleep(0.1)
    sandboxes.close()
    assert backend.live == []  # whatever the start made is gone when close returns
    caller.join(10)
    assert results[0].error in ("the run has ended", "tool sandbox failed to start")


def test_a_replaced_pack_is_not_started(sandboxes: ToolSandboxes, backend: FakeBackend) -> None:
    sandboxes._lockfile.entries["ctools"] = Entry(version="2.0.0")  # type: ignore[attr-defined]
    outcome = _call(sandboxes, "tick")
    assert not outcome.success and "replaced" in outcome.error and backend.launched == []


# -- the gate -----------------------------------------------------------------------------------------


def test_the_gate_refuses_community_packs_without_sandboxes_and_routes_them_with(
    sandboxes: ToolSandboxes,
) -> None:
    def gate(with_sandboxes: bool) -> ToolGate:
        return ToolGate(allowed_packages=("ctools",), max_tool_calls=5, lookup=_pack,
                        runner=ToolRunner(), deadline=time.monotonic() + 60,
                        sandboxes=sandboxes if with_sandboxes else None)  # fmt: skip

    off = gate(False)
    with pytest.raises(ToolRefusal) as refused:
        off.call("ctools", "tick", "{}")
    assert refused.value.reason == "TOOL_PACK_UNTRUSTED"
    assert "AGENTNODE_AGENT_SANDBOX=1" in refused.value.message
    assert off.refusals == 1 and off.calls_made == 0 and off.sandboxes_started == 0
    on = gate(True)
    outcome = on.call("ctools", "tick", "{}")
    assert outcome.success and outcome.mode_used == MODE_TOOL_SANDBOX
    assert on.calls_in(MODE_TOOL_SANDBOX) == on.calls_made == 1 and on.sandboxes_started == 1
    on.close()
    assert not on.call("ctools", "tick", "{}").success  # closed with the run


@pytest.mark.parametrize(("flag", "enabled"), [("1", True), ("0", False), ("bogus", False)])
def test_runs_get_tool_sandboxes_only_while_the_hosts_sandbox_is_on(
    tmp_path: Path, backend: FakeBackend, flag: str, enabled: bool
) -> None:
    env = {"AGENTNODE_CONFIG": str(tmp_path / "cfg"), "AGENTNODE_AGENT_SANDBOX": flag}
    backend.lockfile = Lockfile()  # type: ignore[attr-defined]
    launcher = ToolSandboxLauncher(
        backend, Teardowns(background=False), load_config(env), env  # type: ignore[arg-type]
    )
    boxes = launcher.for_run("run-1", None, {})
    assert (boxes is not None) is enabled
    if boxes is not None:
        assert boxes._runtime == "runc"  # the host's runtime for a run that has none (the host path)
        boxes.close()
