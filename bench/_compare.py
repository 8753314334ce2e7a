"""`python -m bench.run --compare REV`: two revisions measured side by side in one run.

REV is checked out as a detached `git worktree` in a temporary directory (removed afterwards). Each side
gets a worker process (bench/_worker) whose working directory is its import root: for the candidate this
checkout; for the base an overlay directory whose `host` and `sandbox_wrapper` link into REV's tree while
`bench` links here, so the same measuring code drives both. Each worker builds its revision's
pinned image (`build_image(repo_root=<that tree>)`) and its own bench state. The loop (bench._drive) asks
base and candidate in turn for every section, repetition and runtime, alternating which goes first.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._drive import drive, say
from bench._plan import Plan
from bench._roots import REPO
from bench.report.compare import SIDES, finish_compare
from bench.report.machine import machine_facts
from host.engine.sdk import connect

START_TIMEOUT_S = 3600.0
"""Building a revision's image may fetch packages and wheels."""

MEASURE_TIMEOUT_S = 3 * 3600.0
MAX_STARTS = 3


def _git(*argv: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


@dataclass
class Worker:
    """One revision's measuring process, started lazily and again if it died (at most MAX_STARTS)."""

    name: str
    label: str
    commit: str
    code_root: Path
    image_root: Path
    plan: Plan
    info: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[str] | None = None
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    pump: threading.Thread | None = None
    starts: int = 0
    broken: str = ""

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "commit": self.commit, "code_root": str(self.code_root),
                "image_root": str(self.image_root), "starts": self.starts, "error": self.broken, **self.info}

    def _read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self._kill()
            raise RuntimeError(f"the {self.name} worker did not answer within {timeout:.0f} s") from None
        if line is None:
            code = self.proc.wait() if self.proc is not None else None
            self._kill()
            raise RuntimeError(f"the {self.name} worker exited (code {code}); its traceback is on stderr")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def start(self) -> None:
        self.starts += 1
        env = {**os.environ, "PYTHONPATH": str(self.code_root),
               "AGENTNODE_BENCH_CODE_ROOT": str(self.code_root),
               "AGENTNODE_BENCH_IMAGE_ROOT": str(self.image_root)}
        env.pop("PYTHONSAFEPATH", None)  # the working directory must come first on sys.path
        self.lines = queue.Queue()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench._worker", json.dumps(self.plan.to_json())], cwd=self.code_root,
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.proc = proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.put(line)
            self.lines.put(None)

        self.pump = threading.Thread(target=pump, daemon=True, name=f"bench-{self.name}-worker")
        self.pump.start()
        say(f"{self.name}: starting its worker (building its image if needed)")
        answer = self._read(START_TIMEOUT_S)
        if "error" in answer:
            self._kill()
            raise RuntimeError(answer["error"])
        host_module = Path(answer["host_module"]).resolve()
        if not host_module.is_relative_to(self.image_root.resolve()):
            self._kill()
            raise RuntimeError(f"imported host from {host_module}, not from {self.image_root}")
        self.info = {k: answer[k] for k in ("image", "host_module", "wrapper_module")}

    def measure(self, section: str, runtime: str) -> dict[str, Any]:
        if self.broken:
            raise RuntimeError(f"the {self.name} revision could not be set up: {self.broken}")
        if self.proc is None or self.proc.poll() is not None:
            if self.starts >= MAX_STARTS:
                raise RuntimeError(f"the {self.name} worker died {self.starts} times; not started again")
            try:
                self.start()
            except Exception as exc:
                if self.starts == 1:  # a revision that cannot even start will not start later either
                    self.broken = f"{type(exc).__name__}: {exc}"
                raise
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"section": section, "runtime": runtime}) + "\n")
        self.proc.stdin.flush()
        answer = self._read(MEASURE_TIMEOUT_S)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        result: dict[str, Any] = answer["ok"]
        return result

    def close(self) -> int | None:
        """Ask the worker to clean up and leave; its count of leftover containers, if it said."""
        proc, leftovers = self.proc, None
        if proc is None or proc.poll() is not None:
            self._kill()
            return None
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"quit": True}) + "\n")
            proc.stdin.flush()
            proc.stdin.close()
            leftovers = self._read(600).get("leftovers")
            proc.wait(timeout=600)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            pass
        self._kill()
        return leftovers if isinstance(leftovers, int) else None

    def _kill(self) -> None:
        """Kill the process if it still runs, let the reader see its end, close the pipes."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if self.pump is not None:
            self.pump.join(timeout=10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


FLAT_NAMES = {
    "host.api.client": "host._client",
    "host.api.events": "host._events",
    "host.api.server": "host._serve",
    "host.audit.chain": "host._audit",  # split out of it after the move
    "host.audit.log": "host._audit",
    "host.audit.records": "host._audit",  # split out of it after the move
    "host.audit.verify": "host._audit",  # split out of it after the move
    "host.cli.audit": "host._cli",  # split out of it after the move
    "host.cli.completion": "host._completion",
    "host.cli.doctor": "host._doctor",
    "host.cli.explain": "host._explain",
    "host.cli.image": "host._cli",  # split out of it after the move
    "host.cli.main": "host._cli",
    "host.cli.output": "host._cli",  # split out of it after the move
    "host.cli.packs": "host._cli",  # split out of it after the move
    "host.cli.parser": "host._cli",  # split out of it after the move
    "host.cli.run": "host._cli",  # split out of it after the move
    "host.cli.serve": "host._cli",  # split out of it after the move
    "host.core.calltrace": "host._calltrace",
    "host.core.errors": "host._errors",
    "host.core.logs": "host._logs",
    "host.core.owner": "host._owner",
    "host.core.paths": "host._paths",
    "host.core.strictjson": "host._json",
    "host.core.strictyaml": "host._yaml",
    "host.core.terminal": "host._terminal",
    "host.core.vocab": "host._vocab",
    "host.engine.contract": "host._engine",  # split out of it after the move
    "host.engine.engine": "host._engine",
    "host.engine.errors": "host._engine",  # split out of it after the move
    "host.engine.facts": "host._engine",  # split out of it after the move
    "host.engine.http": "host._engine_http",
    "host.engine.image": "host._image",
    "host.engine.labels": "host._engine",  # split out of it after the move
    "host.engine.launch": "host._launch",
    "host.engine.pin": "host._pin",
    "host.engine.probes": "host._engine",  # split out of it after the move
    "host.engine.recipe": "host._image",  # split out of it after the move
    "host.engine.sdk": "host._engine_sdk",
    "host.engine.seccomp": "host._seccomp",
    "host.engine.spec": "host._engine",  # split out of it after the move
    "host.engine.tararchive": "host._tararchive",
    "host.engine.volumes": "host._volumes",
    "host.engine.wrapper_env": "host._wrapper_env",
    "host.k8s.api": "host._k8s_api",
    "host.k8s.client": "host._k8s_client",
    "host.k8s.controller": "host._k8s_controller",
    "host.k8s.node": "host._k8s_node",
    "host.k8s.objects.admission": "host._k8s_objects",  # host.k8s.objects, split after the move
    "host.k8s.objects.agentrun": "host._k8s_objects",
    "host.k8s.objects.deploy": "host._k8s_objects",
    "host.k8s.objects.names": "host._k8s_objects",
    "host.k8s.objects.pod": "host._k8s_objects",  # pod_for came from host._k8s_pod
    "host.k8s.run": "host._k8s_run",
    "host.llm.admission": "host._broker",  # split out of it after the move
    "host.llm.broker": "host._broker",
    "host.llm.budget": "host._budget",
    "host.llm.credentials": "host._broker",  # split out of it after the move
    "host.llm.providers": "host._broker",  # split out of it after the move
    "host.llm.retrying": "host._broker",  # split out of it after the move
    "host.llm.session": "host._broker",  # split out of it after the move
    "host.llm.toolcalls": "host._llmtools",
    "host.llm.translate": "host._llmtools",  # split out of it after the move
    "host.packs.declared": "host._requirements",  # split out of it after the move
    "host.packs.files": "host._packs",  # split out of it after the move
    "host.packs.install": "host._packs",
    "host.packs.requirements": "host._requirements",
    "host.packs.scaffold": "host._scaffold",
    "host.packs.site": "host._requirements",  # split out of it after the move
    "host.policy.admission": "host._admission",
    "host.policy.caller": "host._caller",
    "host.policy.rules": "host._policy",
    "host.runtime.backends.container": "host._sandbox",
    "host.runtime.backends.hostproc": "host._hostproc",
    "host.runtime.backends.sequential": "host._sequential",
    "host.runtime.fdbudget": "host._fdbudget",
    "host.runtime.headstart": "host._headstart",
    "host.runtime.outcome": "host._outcome",
    "host.runtime.pool": "host._pool",
    "host.runtime.prelaunch": "host._prelaunch",
    "host.runtime.result": "host._result",
    "host.runtime.rpcwire": "host._session",  # split out of it after the move
    "host.runtime.runaudit": "host._runaudit",
    "host.runtime.rundir": "host._rundir",
    "host.runtime.runner": "host._runner",
    "host.runtime.runserver": "host._session",  # split out of it after the move
    "host.runtime.session": "host._session",
    "host.runtime.telemetry.metrics": "host._metrics",
    "host.runtime.telemetry.tracing": "host._tracing",
    "host.runtime.toolsandbox": "host._toolsandbox",
    "host.runtime.wiring": "host._wiring",
    "host.runtime.workload": "host._workload",
    "host.spec.config": "host._config",
    "host.spec.lockfile": "host._lockfile",
    "host.spec.manifest.agent": "host._manifest",  # host.spec.manifest, split after the move
    "host.spec.manifest.load": "host._manifest",
    "host.spec.manifest.metadata": "host._manifest",
    "host.spec.manifest.model": "host._manifest",
    "host.spec.manifest.parser": "host._manifest",
    "host.spec.manifest.reader": "host._manifest",
    "host.spec.manifest.toolpack": "host._manifest",
    "host.spec.wheels": "host._wheels",
    "host.tools.arguments": "host._tools",  # split out of it after the move
    "host.tools.calls": "host._tools",  # split out of it after the move
    "host.tools.gate": "host._tools",
    "host.tools.link": "host._toollink",
    "host.tools.workers": "host._tools",  # split out of it after the move
}
"""The module names host/ had before it became sub-packages (issue 36): under --compare against a revision
from before, the overlay's sitecustomize maps each name the measuring code imports to that revision's
module."""

SITECUSTOMIZE = '''"""Written by bench/_compare into a revision's import roots: this checkout's editable
install (a finder consulted after sys.path) must not fill in the modules that revision lacks."""
import sys

sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if not p.startswith("__editable__")]
'''

FLAT_ALIASES = '''
# A revision from before host/ became sub-packages: the measuring code's module names, mapped to its own.
import importlib, importlib.abc, importlib.machinery, os

FLAT = %r
PACKAGES = {name.rsplit(".", 1)[0] for name in FLAT} | {"host.runtime.backends", "host.runtime.telemetry"}


class _FlatNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in FLAT or name in PACKAGES:
            return importlib.machinery.ModuleSpec(name, self, is_package=name in PACKAGES)
        return None

    def create_module(self, spec):
        return None if spec.name in PACKAGES else importlib.import_module(FLAT[spec.name])

    def exec_module(self, module):
        pass


if os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "host", "_cli.py")):
    sys.meta_path.insert(0, _FlatNames())
'''


def _overlay(root: Path, tree: Path) -> Path:
    """An import root whose host/ and sandbox_wrapper/ are the revision's and bench/ is this checkout's.

    Both it and the revision's tree (the PYTHONPATH `serve` gives its own children) get a sitecustomize
    that turns off the editable install's finder in every process started with either on PYTHONPATH: it
    would otherwise resolve `host.x`, missing in the revision, to this checkout's `host/x.py`."""
    root.mkdir()
    for name in ("host", "sandbox_wrapper"):
        (root / name).symlink_to(tree / name, target_is_directory=True)
    (root / "bench").symlink_to(REPO / "bench", target_is_directory=True)
    for where in (root, tree):
        (where / "sitecustomize.py").write_text(SITECUSTOMIZE + FLAT_ALIASES % (FLAT_NAMES,))
    return root


def run_compare(rev: str, plan: Plan, runtimes: list[str], sections: tuple[str, ...], *, mode: str,
                command: str) -> dict[str, Any]:
    """Base = REV, candidate = this working tree; see the module docstring."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    head = _git("rev-parse", "--short=12", "HEAD")
    dirty = bool(_git("--no-optional-locks", "status", "--porcelain", "--untracked-files=no"))
    tmp = Path(tempfile.mkdtemp(prefix="agentnode-bench-compare-"))
    tree = tmp / "tree"
    data: dict[str, Any] = {
        "mode": f"compare {mode}", "command": command, "plan": plan.to_json(), "runtimes": runtimes,
        "sections": list(sections), "raw": {side: {} for side in SIDES},
        "errors": {side: [] for side in SIDES},
        "load_by_section": {}, "measurements": [],
    }
    workers: dict[str, Worker] = {}
    try:
        say(f"base: git worktree of {rev} ({commit[:12]}) in {tree}")
        _git("worktree", "add", "--detach", str(tree), commit)
        workers = {
            "base": Worker("base", rev, commit[:12], _overlay(tmp / "root", tree), tree, plan),
            "candidate": Worker("candidate", "the working tree", head + ("+dirty" if dirty else ""), REPO,
                                REPO, plan),
        }
        client = connect()
        try:
            data["machine"] = machine_facts(client)
        finally:
            client.close()
        for worker in workers.values():
            try:
                worker.start()
            except Exception as exc:  # noqa: BLE001 (recorded; the other revision is still measured)
                worker.broken = f"{type(exc).__name__}: {str(exc)[:1500]}"
                say(f"{worker.name}: could not start: {worker.broken}")
        stores = {side: {"raw": data["raw"][side], "errors": data["errors"][side]} for side in SIDES}
        drive(plan, sections, runtimes, sides={side: workers[side].measure for side in SIDES}, stores=stores,
              log=data)
    finally:
        for side, worker in workers.items():
            leftovers = worker.close()
            data.setdefault("leftovers", {})[side] = leftovers
        for side, worker in workers.items():
            data[side] = worker.describe()
        data.setdefault("machine", {})["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        try:
            _git("worktree", "remove", "--force", str(tree))
        except RuntimeError as exc:
            say(f"could not remove the worktree: {exc}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True, timeout=60,
                       check=False)
    return finish_compare(data)


__all__ = ["Worker", "run_compare"]
