"""A real run server alone in its own process, so tests can measure what a request costs the host.

Usage: `python -m tests.support.run_server_probe SOCKET CONFIG_JSON`. It serves one fetched run on SOCKET
and answers line commands on stdin: `mark` resets the baseline (CPU time, peak RSS), `report` prints one
JSON line of what the process spent since the mark (CPU seconds, peak RSS growth, current RSS and
descriptor counts) plus the session's counters. Nothing else runs in the process, so every CPU second
and every byte is the server's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from host.llm.broker import LlmBroker
from host.policy.rules import LlmPolicy, RunPolicy
from host.runtime.runserver import build_run_server
from host.runtime.session import RunSession, RunTask
from host.spec.config import LlmHostConfig
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from host.tools.calls import InstalledToolpack
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner
from sandbox_wrapper import PROTOCOL_VERSION

REPO = Path(__file__).resolve().parents[2]


class ServerProbe:
    """The test side: starts the probe process on a fresh socket and sends it commands."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.dir = tempfile.mkdtemp(prefix="prb-", dir="/tmp")  # a socket path must fit in 108 bytes
        self.socket_path = f"{self.dir}/s.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.run_server_probe", self.socket_path, json.dumps(config)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def command(self, name: str) -> dict[str, Any]:
        """`mark` or `report`; the probe's JSON answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def __enter__(self) -> ServerProbe:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _status(key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux clear_refs "5"), so the peak is measured from the mark on."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main(argv: list[str]) -> None:
    socket_path, config = argv[1], json.loads(argv[2])
    llm = LlmPolicy(**config.get("llm", {}))
    allowed = tuple(config.get("allowed", ()))
    policy = RunPolicy(allowed, int(config.get("max_tool_calls", 5)), 60, 5, llm, ())
    runner = ToolRunner()
    packs: dict[str, InstalledToolpack] = {}
    if "pack_root" in config:  # one trusted pack with an `echo` tool, its module written by the test
        schema = config.get("schema")
        echo = ToolSpec(name="echo", entrypoint="tools:echo", description="", input_schema=schema)
        manifest = ToolpackManifest(
            slug="probe-tools", version="1", name="probe-tools", entrypoint="tools", tools=(echo,),
            dependencies=(),
        )  # fmt: skip
        root = Path(config["pack_root"])
        packs["probe-tools"] = InstalledToolpack("probe-tools", "1", "trusted", root, manifest)
    gate = ToolGate(
        allowed_packages=allowed,
        max_tool_calls=policy.max_tool_calls,
        lookup=packs.get,
        runner=runner,
        deadline=time.monotonic() + 600,
    )
    broker = LlmBroker(LlmHostConfig(), env=config.get("env", {}))
    task = RunTask("probe", "agent:run", "", "{}", policy, "")
    session = RunSession(task=task, tools=gate, llm=broker.session(llm))
    session.fetch(PROTOCOL_VERSION)
    server = build_run_server(session, socket_path)
    server.start()
    cpu0, activity0 = time.process_time(), session.last_activity
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "mark":
            _reset_peak()
            cpu0, activity0 = time.process_time(), session.last_activity
            reply: dict[str, Any] = {"rss": _status("VmRSS")}
        elif command == "report":
            rss = _status("VmRSS")
            reply = {
                "cpu_s": round(time.process_time() - cpu0, 4),
                "peak_rss": _status("VmHWM"),
                "rss": rss,
                "fds": len(os.listdir("/proc/self/fd")),
                "llm": session.llm.usage() if session.llm else {},
                "tool_refusals": gate.refusals,
                "throttled": session.throttled,
                "inflight": session.inflight,
                "activity_moved": session.last_activity != activity0,
            }
        else:
            break
        print(json.dumps(reply), flush=True)
    server.stop(grace=None).wait(5)
    runner.close()


if __name__ == "__main__":
    main(sys.argv)
