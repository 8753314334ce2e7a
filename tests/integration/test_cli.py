"""The installed command against the real engine: run --json, doctor's fix for each refusal, explain vs a run.

Every command runs as a subprocess of .venv/bin/agentnode-sandbox with its own state directory. Agents get
unique slugs, so the volumes a test creates (and removes) are its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from host.engine.image import BUILD_HINT
from host.spec.lockfile import Lockfile
from tests.support.cli import assert_error_lines, cli, json_out
from tests.support.fake_llm import FakeLlmServer
from tests.support.host_state import HostState
from tests.support.paths import REPO
from tests.support.schema import check_schema

pytestmark = [pytest.mark.docker, pytest.mark.podman]

EXAMPLES = REPO / "examples"
OWN = "clitest-"
CANARY = "sk-canary-cli-e2e-1a2b3c4d"
ENGINE_ROWS = ["engine", "memory_limit", "runtime", "image_pinned", "image_present", "image_matches_pin",
               "image_protocol"]  # fmt: skip
PLAIN_AGENT = """
def run(context, **kwargs):
    return {"goal": context.goal}
"""


def unique() -> str:
    return f"{OWN}{uuid.uuid4().hex[:10]}"


def remove_own_volumes(state: HostState, client: docker.DockerClient) -> None:
    """Remove the volumes of this state's uniquely named packs (never a shared one such as hello-agent's)."""
    for entry in Lockfile(state.dir / "agentnode.lock").entries().values():
        if entry.sandbox_volume and entry.slug.startswith(OWN):
            with contextlib.suppress(docker.errors.NotFound):
                client.volumes.get(entry.sandbox_volume).remove(force=True)


@pytest.fixture
def state(host_state: HostState, docker_client: docker.DockerClient) -> Iterator[HostState]:
    yield host_state
    remove_own_volumes(host_state, docker_client)


@pytest.fixture
def fake_llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as srv:
        yield srv


def install(env: dict[str, str], pack: Path, trust: str = "unverified") -> dict[str, Any]:
    proc = cli(env, "install", pack, "--trust", trust, "--json")
    assert proc.returncode == 0, proc.stderr
    entry: dict[str, Any] = json_out(proc)
    check_schema("install", entry)
    return entry


def doctor(env: dict[str, str], *slug: str) -> tuple[int, dict[str, dict[str, Any]]]:
    proc = cli(env, "doctor", *slug, "--json")
    report = json_out(proc)
    check_schema("doctor", report)
    assert report["ready"] is (proc.returncode == 0)
    return proc.returncode, {row["check"]: row for row in report["checks"]}


def failed(rows: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name, row in rows.items() if not row["ok"]]


def run_json(env: dict[str, str], slug: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = cli(env, "run", slug, *args, "--json")
    out: dict[str, Any] = json_out(proc)
    check_schema("run", out)
    return proc.returncode, out


def test_install_and_run_the_example_agent(state: HostState, fake_llm: FakeLlmServer) -> None:
    env = {**state.env, "OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": fake_llm.base_url_openai}
    tools = install(env, EXAMPLES / "word-tools", "trusted")
    assert tools["package_type"] == "toolpack" and tools["sandbox_volume"] is None
    agent = install(env, EXAMPLES / "hello-agent")
    assert agent["trust_level"] == "unverified" and agent["sandbox_volume"] and agent["host_path"] is None

    proc = cli(env, "run", "hello-agent", "--goal", "count these five words please", "--json")
    assert proc.returncode == 0, proc.stderr
    assert CANARY not in proc.stdout + proc.stderr
    out = json_out(proc)
    check_schema("run", out)
    assert out["success"] is True and out["mode_used"] == "agent_sandbox" and out["error"] is None
    assert out["result"]["word_count"] == 5 and out["result"]["greeting"] and out["result"]["refusals"] == []

    listed = json_out(cli(env, "list", "--json"))
    check_schema("list", listed)
    assert [r["slug"] for r in listed] == ["hello-agent", "word-tools"]
    records = json_out(cli(env, "audit", "--json", "--slug", "hello-agent"))
    check_schema("audit", records)
    (rec,) = records
    assert rec["run_id"] == out["run_id"] and rec["tool_calls"] == 1 and rec["llm"]["ok"] == 1
    verified = cli(env, "audit", "verify", "--json")
    report = json_out(verified)  # the chain holds and no run is left open
    assert verified.returncode == 0 and report["problems"] == [] and report["open_runs"] == []
    # The run's start and end records. (A host's start also closes runs of hosts that died on this
    # machine, with a `host_lost` record in its own log: another test's leftovers may add one here.)
    own = [json.loads(line) for line in (state.dir / "audit.jsonl").read_text().splitlines()]
    assert [r["event"] for r in own if r.get("run_id") == out["run_id"]] == ["agent_run_start", "agent_run"]
    assert report["records"] == len(own)


def test_doctor_is_ready_with_and_without_a_slug(state: HostState, make_agent: Callable[..., Path]) -> None:
    slug = unique()
    install(state.env, make_agent(slug, PLAIN_AGENT))
    code, rows = doctor(state.env)
    assert code == 0, rows
    assert list(rows) == ["config", "feature_flag", *ENGINE_ROWS, "leftover_containers"]
    code, rows = doctor(state.env, slug)
    assert code == 0, rows
    assert list(rows) == ["config", "feature_flag", *ENGINE_ROWS, "installed", "agent", "route", "manifest",
                          "egress", "volume", "leftover_containers"]  # fmt: skip
    assert rows["route"]["detail"].startswith("sandbox")
    assert rows["egress"]["detail"].startswith(f"{slug}: none (permissions.network none)")
    assert rows["volume"]["detail"].startswith("agentnode-pack-")
    assert all(row["fix"] == "" for name, row in rows.items() if name != "leftover_containers")
    human = cli(state.env, "doctor", slug)
    assert human.returncode == 0 and human.stdout.splitlines()[-1] == "ready"


@pytest.fixture(scope="module")
def odd_images(docker_client: docker.DockerClient, pinned_image: str) -> Iterator[dict[str, str]]:
    """Two images this module builds and removes: a foreign one, and the pinned one relabelled protocol 99."""
    built = {}
    for name, dockerfile in (
        ("mismatch", "FROM scratch\nLABEL io.agentnode.test=cli-foreign\n"),
        ("protocol", f"FROM {pinned_image}\nLABEL io.agentnode.sandbox.protocol=99\n"),
    ):
        image, _ = docker_client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()), rm=True, network_mode="none",
            labels={"io.agentnode.test": name},
        )  # fmt: skip
        built[name] = image.id
    yield built
    for image_id in built.values():
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(image_id, force=True)


@pytest.mark.parametrize(
    "case",
    [
        ("not_pinned", "image_pinned", "image_not_pinned"),
        ("missing", "image_present", "image_missing"),
        ("mismatch", "image_matches_pin", "image_mismatch"),
        ("protocol", "image_protocol", "protocol_mismatch"),
    ],
    ids=lambda case: case[0],
)
def test_doctor_names_the_image_fix_the_run_gives(
    state: HostState, make_agent: Callable[..., Path], odd_images: dict[str, str], case: tuple[str, str, str]
) -> None:
    name, row, code = case
    slug = unique()
    install(state.env, make_agent(slug, PLAIN_AGENT))
    pin = {"not_pinned": None, "missing": "sha256:" + "0" * 64, **odd_images}[name]
    (state.dir / "config.json").write_text(json.dumps({"agent_sandbox": {"image": pin} if pin else {}}))

    code_, rows = doctor(state.env, slug)
    assert code_ == 1 and failed(rows) == [row], rows
    assert rows[row]["fix"] == BUILD_HINT
    image_rows = [name for name in rows if name.startswith("image_")]
    assert image_rows == ENGINE_ROWS[3 : ENGINE_ROWS.index(row) + 1]  # nothing judged past the refusal

    exit_code, out = run_json(state.env, slug)
    assert exit_code == 1 and out["error_code"] == code
    assert out["hint"] == rows[row]["fix"] and out["error"] == rows[row]["detail"]

    proc = cli(state.env, "image", "status", "--json")
    status = json_out(proc)
    check_schema("image-status", status)
    assert proc.returncode == 1 and status["usable"] is False and status["problem"] == rows[row]["detail"]


def test_doctor_respects_the_feature_flag_for_a_community_agent(
    state: HostState, make_agent: Callable[..., Path]
) -> None:
    slug = unique()
    install(state.env, make_agent(slug, PLAIN_AGENT))
    env = {**state.env, "AGENTNODE_AGENT_SANDBOX": "0"}
    exit_code, out = run_json(env, slug)
    assert exit_code == 1 and out["error_code"] == "refused_flag_off"
    code, rows = doctor(env, slug)
    assert code == 1 and failed(rows) == ["feature_flag", "route"]
    assert rows["feature_flag"]["fix"] == rows["route"]["fix"] == out["hint"]
    code, rows = doctor(env)
    assert code == 1 and failed(rows) == ["feature_flag"]


def test_doctor_names_a_missing_volume(
    state: HostState, make_agent: Callable[..., Path], docker_client: docker.DockerClient
) -> None:
    slug = unique()
    volume = install(state.env, make_agent(slug, PLAIN_AGENT))["sandbox_volume"]
    docker_client.volumes.get(volume).remove(force=True)  # this test's own volume
    code, rows = doctor(state.env, slug)
    assert code == 1 and failed(rows) == ["volume"]
    exit_code, out = run_json(state.env, slug)
    assert exit_code == 1 and out["error_code"] == "volume_missing"
    assert rows["volume"]["fix"] == out["hint"] and rows["volume"]["detail"] == out["error"]


GREEDY_AGENT = """
from sandbox_wrapper import AgentLimitExceeded, LlmAccessError

def run(context, **kwargs):
    tools = 0
    while tools < 100:
        try:
            out = context.run_tool("word-tools", "count_words", text="a b c")
        except AgentLimitExceeded:
            break
        assert out.success, out.error
        tools += 1
    llm, refusal = 0, None
    while llm < 100:
        try:
            context.call_llm_text("hello")
        except LlmAccessError as exc:
            refusal = exc.reason
            break
        llm += 1
    return {"tools": tools, "llm": llm, "llm_refusal": refusal, "max_tool_calls": context.max_tool_calls}
"""


def test_policy_explain_agrees_with_what_a_run_enforces(
    state: HostState, make_agent: Callable[..., Path], fake_llm: FakeLlmServer
) -> None:
    state.write_config({"limits": {"max_tool_calls": 3}, "llm": {"max_calls": 2}})
    env = {**state.env, "OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": fake_llm.base_url_openai}
    install(env, EXAMPLES / "word-tools", "trusted")
    slug = unique()
    install(env, make_agent(slug, GREEDY_AGENT, extra=(
        "tool_access:\n  allowed_packages: [word-tools]\nlimits:\n  max_tool_calls: 40\n"
        "llm_access:\n  enabled: true\n  max_calls: 20\n"
    )))  # fmt: skip

    proc = cli(env, "policy", "explain", slug, "--json")
    assert proc.returncode == 0, proc.stderr
    p = json_out(proc)
    check_schema("policy-explain", p)
    assert p["route"] == "sandbox" and p["image"] == state.image and p["allowed_packages"] == ["word-tools"]
    assert p["max_tool_calls"] == 3 and p["requested"]["max_tool_calls"] == 40
    assert p["llm"]["enabled"] is True and p["llm"]["max_calls"] == 2
    assert p["requested"]["llm"]["max_calls"] == 20
    assert {"max_tool_calls", "llm.max_calls"} <= set(p["clamped"]) and p["llm"]["clamped"] == ["max_calls"]
    assert p["llm"]["provider"] == "openai" and CANARY not in proc.stdout

    exit_code, out = run_json(env, slug)
    assert exit_code == 0, out
    assert out["result"] == {
        "tools": p["max_tool_calls"], "llm": p["llm"]["max_calls"], "llm_refusal": "LLM_CALL_LIMIT",
        "max_tool_calls": p["max_tool_calls"],
    }  # fmt: skip
    assert len(fake_llm.requests) == 2
    rec = json_out(cli(env, "audit", "--json", "--last", "1"))[0]
    assert rec["run_id"] == out["run_id"] and rec["tool_calls"] == 3 and rec["llm"]["ok"] == 2
    assert rec["llm"]["max_calls"] == 2 and rec["llm"]["refused_limit"] == 1


def test_image_build_status_and_pull(state: HostState) -> None:
    (state.dir / "config.json").write_text(json.dumps({"other_tool": {"keep": True}}))
    proc = cli(state.env, "image", "build", "--json", timeout=3600)
    assert proc.returncode == 0, proc.stderr
    built = json_out(proc)
    check_schema("image-build", built)
    assert built["image_id"] == state.image and built["built"] is False
    config = json.loads((state.dir / "config.json").read_text())
    assert config == {"other_tool": {"keep": True}, "agent_sandbox": {"image": state.image}}

    proc = cli(state.env, "image", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    status = json_out(proc)
    check_schema("image-status", status)
    assert status["usable"] is True and status["pin"] == state.image and status["image_id"] == state.image

    ref = "127.0.0.1:9/agentnode-sandbox@sha256:" + "0" * 64  # nothing listens on port 9
    proc = cli(state.env, "image", "pull", ref, "--json")
    assert_error_lines(proc, 1)
    out = json_out(proc)
    check_schema("error", out)
    assert out["error_code"] == "image_missing" and "image build" in out["hint"] and ref in out["error"]
    assert json.loads((state.dir / "config.json").read_text())["agent_sandbox"]["image"] == state.image


def test_uninstall_removes_the_volume(
    state: HostState, make_agent: Callable[..., Path], docker_client: docker.DockerClient
) -> None:
    slug = unique()
    volume = install(state.env, make_agent(slug, PLAIN_AGENT))["sandbox_volume"]
    proc = cli(state.env, "uninstall", slug, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json_out(proc)
    check_schema("uninstall", out)
    assert out["sandbox_volume"] == volume and out["volume_left_behind"] is None
    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(volume)
    assert json_out(cli(state.env, "list", "--json")) == []


def test_run_follow_shows_escaped_lines_live_and_the_caller_reaches_the_audit(
    state: HostState, make_agent: Callable[..., Path]
) -> None:
    slug = unique()
    install(state.env, make_agent(slug, """
        def run(context, **kwargs):
            print("plain line", flush=True)
            print("\\x1b]0;pwned\\x07 title", flush=True)
            return {"ok": True}
    """))  # fmt: skip
    proc = cli(state.env, "run", slug, "--follow", "--json", "--tenant", "acme", "--request-id", "r-1",
               "--label", "team=search")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json_out(proc)["result"] == {"ok": True}  # stdout: exactly the one JSON value
    assert "| plain line\n" in proc.stderr and "| \\x1b]0;pwned\\x07 title\n" in proc.stderr
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    (record,) = json_out(cli(state.env, "audit", "--json", "--slug", slug))
    check_schema("audit", [record])
    assert record["caller"] == {"tenant": "acme", "request_id": "r-1", "labels": {"team": "search"}}
    bad = cli(state.env, "run", slug, "--tenant", "a b")
    assert bad.returncode == 2 and "tenant must be" in bad.stderr
    assert len(json_out(cli(state.env, "audit", "--json", "--slug", slug))) == 1  # nothing ran


def test_per_run_limits_only_tighten_and_bind_the_sandboxed_run(
    state: HostState, make_agent: Callable[..., Path]
) -> None:
    slug = unique()
    install(state.env, EXAMPLES / "word-tools", "trusted")
    install(state.env, make_agent(slug, """
        import time
        def run(context, nap=0, **kwargs):
            counted = context.try_tool("word-tools", "count_words", text="a b c")
            time.sleep(nap)
            return {"tool": counted.result if counted else None, "left": context.max_tool_calls}
    """, extra="tool_access:\n  allowed_packages: [word-tools]\n"))  # fmt: skip
    code, out = run_json(state.env, slug, "--max-tool-calls", "0")
    assert code == 0 and out["result"]["tool"] is None and out["result"]["left"] == 0  # refused: no calls
    code, out = run_json(state.env, slug, "--max-tool-calls", "999")  # looser than the manifest: no effect
    assert code == 0 and out["result"]["tool"] == {"count": 3} and out["result"]["left"] < 999
    code, out = run_json(state.env, slug, "--max-runtime-seconds", "2", "--arg", "nap=30")
    assert code == 1 and out["error_code"] == "timeout" and out["duration_ms"] < 20_000
    bad = cli(state.env, "run", slug, "--max-cost-usd", "-1")
    assert bad.returncode == 2 and "max_cost_usd must be" in bad.stderr


RUN_NEEDS = ("grpc", "google.protobuf")
RUN_NEEDS_NOT = (
    "docker", "requests", "urllib3", "openai", "anthropic", "httpx", "prometheus_client",
    "opentelemetry", "kubernetes", "kopf", "host.packs.install", "host.engine.image",
    "host.engine.recipe", "host.packs.requirements", "sandbox_wrapper._context", "sandbox_wrapper._runner",
    "host.api.server", "host.api.client", "host.k8s.client", "host.k8s.api",
    "host.runtime.telemetry.metrics", "host.cli.doctor", "host.packs.scaffold", "host.aio", "host.api.aio",
    "yaml", "packaging.requirements"
)  # fmt: skip
IMPORT_PROBE = """
import contextlib, io, json, sys
from host.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "out": json.loads(out.getvalue()),
                  "loaded": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)}))
"""


def test_a_trivial_run_loads_only_what_it_uses(
    host_state: HostState, make_agent: Callable[..., Path]
) -> None:
    """A one-shot `run` of an agent that calls no tool and no model needs gRPC (the engine is spoken to with
    the standard library: host.engine.http); not the docker SDK or its HTTP stack, the install and image
    builder machinery, the providers' SDKs, metrics, tracing, Kubernetes, the serve host or its client,
    doctor, the scaffolder, nor the YAML and requirement parsers (the lockfile holds the validated
    manifest)."""
    host_state.install(make_agent("trivial-imports", "def run(context, **kwargs):\n    return {'ok': 1}\n"))
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, json.dumps(["run", "trivial-imports", "--json"]),
         json.dumps(RUN_NEEDS + RUN_NEEDS_NOT)],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False, env=host_state.env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["code"] == 0 and probe["out"]["success"] is True and probe["out"]["path"] == "local"
    assert set(probe["loaded"]) == set(RUN_NEEDS), " ".join(probe["loaded"])
