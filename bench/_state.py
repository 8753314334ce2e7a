"""An isolated, disposable host for the benchmarks: own config dir, bench packs, a local fake provider."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors

from bench._roots import REPO
from host.core.owner import owner_token
from host.engine.labels import LABEL_SLUG
from host.packs.install import install_pack, uninstall_pack
from host.spec.config import load_config

BENCH_LABEL = "io.agentnode.bench"
"""Every container the benchmark itself creates (floors, echo, stdio) carries this label with its run tag."""

FAKE_KEY = "bench-fake-provider-key"
"""The local fake provider takes any key; this one is not a secret."""

TRIVIAL = """
    import os
    import time


    def _age():
        # Seconds since this process started, from /proc (10 ms resolution): splits boot from exec.
        try:
            with open("/proc/self/stat") as fh:
                start = int(fh.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/uptime") as fh:
                up = float(fh.read().split()[0])
            return up - start / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


    def run(context, **kwargs):
        return {"entered": time.time(), "age": _age()}
"""

TOOL_CALLER = """
    import time

    from sandbox_wrapper._proto.agentnode.sandbox.v1 import tools_pb2


    def run(context, slug="", n=100, warmup=5, **kwargs):
        # Interleaved: context.run_tool as agents call it, and the bare generated stub on the same channel
        # (the difference is the AgentContext's own work).
        request = tools_pb2.RunToolRequest(package_slug=slug, tool_name="noop", arguments_json="{}")
        ms, stub_ms = [], []
        for i in range(warmup + n):
            t = time.perf_counter()
            result = context.run_tool(slug, "noop")
            mid = time.perf_counter()
            context._tools.RunTool(request)
            end = time.perf_counter()
            if not result.success:
                raise RuntimeError(result.error)
            if i >= warmup:
                ms.append((mid - t) * 1000)
                stub_ms.append((end - mid) * 1000)
        return {"ms": ms, "stub_ms": stub_ms}
"""

TOOLBOX_CALLER = """
    import time


    def run(context, trusted="", community="", n=100, warmup=5, **kwargs):
        # The same no-op tool as a trusted pack (host worker) and as a community pack (tool sandbox),
        # interleaved; the community pack's first call (its sandbox's start) is timed apart.
        t = time.perf_counter()
        first = context.run_tool(community, "noop")
        first_ms = (time.perf_counter() - t) * 1000
        trusted_ms, community_ms, modes = [], [], set()
        for i in range(warmup + n):
            for slug, out in ((trusted, trusted_ms), (community, community_ms)):
                t = time.perf_counter()
                result = context.run_tool(slug, "noop")
                ms = (time.perf_counter() - t) * 1000
                if not result.success:
                    raise RuntimeError(result.error)
                modes.add(result.mode_used)
                if i >= warmup:
                    out.append(ms)
        return {"first_ms": first_ms, "first_ok": first.success, "trusted_ms": trusted_ms,
                "community_ms": community_ms, "modes": sorted(modes)}
"""

LLM_CALLER = """
    import time

    MESSAGES = [{"role": "user", "content": "ping"}]
    TOOL_MESSAGES = [
        {"role": "system", "content": "You are a bench agent."},
        {"role": "user", "content": "Look up the records and answer as the schema says."},
    ]


    def run(context, n=20, warmup=3, schema=None, **kwargs):
        # schema: offer every allowed tool and ask for a JSON answer of this schema (the broker_tools call)
        messages, options = MESSAGES, {}
        if schema is not None:
            messages = TOOL_MESSAGES
            options = {"tool_context": context.allowed_tool_context(),
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "bench_answer", "schema": schema}}}
        for _ in range(warmup):
            context.call_llm(messages, **options)
        calls, firsts, floor = [], [], []
        from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2
        for _ in range(n):  # the RPC floor: the smallest call on the same socket and server (ListTools)
            t = time.perf_counter()
            context._llm.ListTools(llm_pb2.ListToolsRequest())
            floor.append((time.perf_counter() - t) * 1000)
        for _ in range(n):
            t = time.perf_counter()
            context.call_llm(messages, **options)
            calls.append((time.perf_counter() - t) * 1000)
        for _ in range(n):
            t = time.perf_counter()
            chunks = context.stream_llm(messages, **options)
            next(chunks)
            firsts.append((time.perf_counter() - t) * 1000)
            for _ in chunks:
                pass
        return {"call_ms": calls, "first_chunk_ms": firsts, "rpc_floor_ms": floor}
"""

NOOP_TOOL = '''
    def noop(**kwargs):
        """Does nothing: the round trip is what is measured."""
        return {}
'''


LLM_TOOL_COUNT = 8
"""Tools in the bench's tool-definitions pack: what the broker's tool-calling overhead is measured with."""


def _llm_tools_manifest() -> str:
    """`capabilities.tools` of the tool-definitions pack: LLM_TOOL_COUNT no-op tools, each with a described
    object schema of a few typed properties (as real packs declare them)."""
    lines = ["entrypoint: bench_tools", "capabilities:", "  tools:"]
    for i in range(LLM_TOOL_COUNT):
        lines += [
            f"    - name: tool_{i}",
            f'      description: "Bench tool {i}: looks up records by query, with paging and filters."',
            '      entrypoint: "bench_tools:noop"',
            "      input_schema:",
            "        type: object",
            "        properties:",
            '          query: {type: string, description: "What to look for."}',
            "          limit: {type: integer, minimum: 1, maximum: 100}",
            "          tags: {type: array, items: {type: string}}",
            "        required: [query]",
        ]
    return "\n".join(lines) + "\n"


class FakeProvider:
    """tests/support/fake_llm in its own process, so its work never shares the host's GIL."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fake_llm"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("FAKE_LLM_URL="):
            self.close()
            raise RuntimeError("the fake provider did not start")
        self.base_url = line.split("=", 1)[1] + "/v1"

    def close(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    """End a helper process the benchmark started: its stdin closed (what some wait on), then terminated,
    killed if it does not go within `timeout` s; its pipes closed."""
    if proc.stdin is not None:
        proc.stdin.close()
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class BenchState:
    """A throwaway host: config pinned to the image, the bench agent packs and no-op toolpacks installed.

    Slugs carry a per-run tag, so pack volumes never collide with another benchmark or test running at
    the same time, and cleanup removes exactly what this run created.
    """

    def __init__(self, client: docker.DockerClient, image: str) -> None:
        self.client = client
        self.image = image
        self.tag = uuid.uuid4().hex[:8]
        self.owner = owner_token()
        self.root = Path(tempfile.mkdtemp(prefix="agentnode-bench-"))
        self.dir = self.root / "agentnode"
        self.dir.mkdir()
        self.provider = FakeProvider()
        self.env: dict[str, str] = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "AGENTNODE_CONFIG": str(self.dir),
            "AGENTNODE_AGENT_SANDBOX": "1",
            "OPENAI_API_KEY": FAKE_KEY,
            "OPENAI_BASE_URL": self.provider.base_url,
        }
        self.trivial = f"bench-trivial-{self.tag}"
        self.tools = f"bench-tools-{self.tag}"
        self.tool_caller = f"bench-toolcaller-{self.tag}"
        self.community_tools = f"bench-ctools-{self.tag}"
        self.toolbox_caller = f"bench-toolboxcaller-{self.tag}"
        self.llm_caller = f"bench-llmcaller-{self.tag}"
        self.llm_tools = f"bench-llmtools-{self.tag}"
        self.installed: list[str] = []
        self.volume = ""
        self.egress: Any = None
        """The egress section's origin and agent (bench.measure.egress.EgressSite), made on first use."""
        self.egress_config: dict[str, Any] | None = None
        try:
            self.configure("runc")
            self._install(self.tools, NOOP_TOOL, "toolpack", "bench_tools", trust="trusted",
                          extra='entrypoint: bench_tools\ncapabilities:\n  tools:\n'
                                '    - name: noop\n      entrypoint: "bench_tools:noop"\n')
            self.volume = self._install(self.trivial, TRIVIAL, "agent", "agent")
            self._install(self.tool_caller, TOOL_CALLER, "agent", "agent",
                          agent=f"  tool_access: {{allowed_packages: [{self.tools}]}}\n")
            self._install(self.community_tools, NOOP_TOOL, "toolpack", "bench_tools",
                          extra='entrypoint: bench_tools\ncapabilities:\n  tools:\n'
                                '    - name: noop\n      entrypoint: "bench_tools:noop"\n')
            self._install(self.toolbox_caller, TOOLBOX_CALLER, "agent", "agent",
                          agent=f"  tool_access: {{allowed_packages: [{self.tools}, "
                                f"{self.community_tools}]}}\n")
            self._install(self.llm_tools, NOOP_TOOL, "toolpack", "bench_tools", trust="trusted",
                          extra=_llm_tools_manifest())
            self._install(self.llm_caller, LLM_CALLER, "agent", "agent",
                          agent="  llm_access: {enabled: true, max_calls: 100000}\n"
                                f"  tool_access: {{allowed_packages: [{self.llm_tools}]}}\n")
        except BaseException:  # a failed setup leaves no provider process or pack behind
            self.close()
            raise

    def configure(self, runtime: str, pool: dict[str, Any] | None = None) -> None:
        """Rewrite the host config: the pin, the runtime, generous budgets and (for `serve`) the pool."""
        section: dict[str, Any] = {
            "image": self.image,
            "runtime": runtime,
            "idle_timeout_seconds": 600,
            "llm": {"max_calls": 100000},
        }
        if pool is not None:
            section["pool"] = pool
        if self.egress_config is not None:
            section["egress"] = self.egress_config
        (self.dir / "config.json").write_text(json.dumps({"agent_sandbox": section}))

    def _install(self, slug: str, source: str, kind: str, module: str, *, trust: str = "unverified",
                 agent: str = "", extra: str = "") -> str:
        pack = self.root / "packs" / slug
        pack.mkdir(parents=True)
        (pack / f"{module}.py").write_text(textwrap.dedent(source))
        manifest = f'package_id: {slug}\nversion: "1.0.0"\npackage_type: {kind}\n' + extra
        if kind == "agent":
            manifest += (f'agent:\n  entrypoint: "{module}:run"\n  goal: bench\n'
                         "  limits: {max_runtime_seconds: 600, max_tool_calls: 500}\n" + agent)
        (pack / "agentnode.yaml").write_text(manifest)
        cfg = load_config(self.env)
        entry = install_pack(pack, trust=trust, paths=cfg.paths, client=self.client, image=self.image)
        self.installed.append(slug)
        return entry.sandbox_volume or ""

    def install_agent(self, slug: str, source: str, *, extra: str = "") -> str:
        """Install one more sandboxed agent pack (`extra`: top-level manifest keys); its volume."""
        return self._install(slug, source, "agent", "agent", extra=extra)

    def leftovers(self) -> list[str]:
        """Containers of this run's agents (whichever process launched them) or carrying its bench tag."""
        labels = [f"{LABEL_SLUG}={slug}" for slug in self.installed] + [f"{BENCH_LABEL}={self.tag}"]
        listed = (self.client.api.containers(all=True, filters={"label": label}) for label in labels)
        return sorted({c["Id"] for found in listed for c in found})

    def close(self) -> None:
        """Remove what this run created: its containers (if any survived), pack volumes, config dir.

        Best effort: an engine too busy to answer must not hide the results; what stays is named.
        """
        left: list[str] = []
        if self.egress is not None:
            self.egress.close()
        for cid in self.leftovers():
            try:
                self.client.api.remove_container(cid, force=True)
            except Exception:  # noqa: BLE001 (named below; the next run's sweep is the backstop)
                left.append(cid[:12])
        cfg = load_config(self.env)
        for slug in reversed(self.installed):
            try:
                uninstall_pack(slug, paths=cfg.paths, client=self.client)
            except Exception:  # noqa: BLE001 (named below)
                left.append(f"pack {slug}")
        self.provider.close()
        shutil.rmtree(self.root, ignore_errors=True)
        if left:
            print(f"[bench] could not remove: {', '.join(left)}", file=sys.stderr)


__all__ = ["BENCH_LABEL", "FAKE_KEY", "LLM_TOOL_COUNT", "BenchState", "FakeProvider", "stop_process"]
