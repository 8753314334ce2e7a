"""Egress the host controls, against the real engine and image, under runc and runsc (and Podman): a community
toolpack that declares `restricted` network reaches a local origin from its tool sandbox with urllib,
requests, httpx, aiohttp and curl (HTTPS with a CA this test makes, and plain HTTP); without a grant it has
no path; agent sandboxes, cold and warm, get exactly the egress a grant gives them, and a caller's per-run
grant stays within the operator's. The attacks on the path are tests/hostile/test_egress_hostile.py.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host.policy.caller import RunOverrides
from host.runtime.pool import PoolSettings
from host.runtime.rundir import run_root
from tests.support.egress import CALLER, NAME, OTHER_NAME, Site, egress_config, serve_site, write_toolpack
from tests.support.host_state import HostState
from tests.support.origins import LocalCa, make_ca

pytestmark = [pytest.mark.docker, pytest.mark.podman]

REQUIREMENTS = ["requests==2.34.2", "httpx==0.29.0", "aiohttp==3.14.5"]
CLIENTS = ("urllib", "requests", "httpx", "aiohttp", "curl")

AGENT_FETCH = r"""
import os, socket, ssl, urllib.request

def run(context, url="", ca="", refused_url="", **kwargs):
    out = {"proxy": sorted(k for k in os.environ if k.lower().endswith("_proxy"))}
    context_ = ssl.create_default_context(cadata=ca) if ca else None
    for key, target in (("granted", url), ("refused", refused_url)):
        if not target:
            continue
        try:
            with urllib.request.urlopen(target, timeout=20, context=context_) as response:
                out[key] = [response.status, response.read().decode()]
        except Exception as exc:
            headers = getattr(exc, "headers", None) or {}
            out[key] = [getattr(exc, "code", None), type(exc).__name__, headers.get("x-agentnode-egress")]
    return out
"""


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCa:
    return make_ca(tmp_path_factory.mktemp("egress-ca"), [NAME, OTHER_NAME])


@pytest.fixture
def site(ca: LocalCa) -> Iterator[Site]:
    with serve_site(ca) as served:
        yield served


@pytest.fixture
def state(host_state: HostState, runtime: str) -> HostState:
    """The host, its config naming the run's runtime (each test adds its egress with `configure`)."""
    host_state.write_config({"runtime": runtime})
    return host_state


def configure(state: HostState, grants: list[str]) -> None:
    runtime = json.loads((state.dir / "config.json").read_text())["agent_sandbox"]["runtime"]
    state.write_config({"runtime": runtime, "egress": egress_config(grants)})


def _run(state: HostState, slug: str, **kwargs: Any) -> Any:
    host = state.host()
    try:
        return host.run(slug, **kwargs)
    finally:
        host.close()


def test_a_community_toolpack_reaches_its_granted_origin_from_its_tool_sandbox_with_every_client(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path, site: Site
) -> None:
    ca, secure, plain = site.ca, site.secure, site.plain
    granted = [f"{NAME}:{secure.port}", f"{NAME}:{plain.port}"]
    configure(state, granted)
    state.install(write_toolpack(tmp_path / "toolpacks", ca, granted, REQUIREMENTS), trust="unverified")
    state.install(
        make_agent("egress-caller", CALLER, extra="tool_access:\n  allowed_packages: [web-fetch]\n")
    )
    https_url, http_url = f"https://{NAME}:{secure.port}/hello", f"http://{NAME}:{plain.port}/hello"
    calls = [["fetch", {"client": c, "url": u}] for c in CLIENTS for u in (https_url, http_url)]
    calls.append(["proxy", {}])
    result = _run(state, "egress-caller", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    *fetched, proxy = result.result
    for call in fetched:
        assert call["success"], call
        assert call["result"] == {"status": 200, "body": "hello from the origin\n"}
    assert proxy["success"] and proxy["result"][0] == "http://127.0.0.1", proxy
    assert len(secure.seen) == len(plain.seen) == len(CLIENTS)
    assert {s["host"] for s in plain.seen} == {f"{NAME}:{plain.port}"}  # re-sent with the granted Host

    (record,) = state.audit()
    egress = record["egress"]
    https_rule, http_rule = egress["rules"][f"{NAME}:{secure.port}"], egress["rules"][f"{NAME}:{plain.port}"]
    assert https_rule["connections"] == http_rule["connections"] == len(CLIENTS), egress
    assert https_rule["bytes_in"] > 0 and http_rule["bytes_out"] > 0 and egress["refused"] == {}, egress
    assert not any(run_root(state.env).glob("run-*/egress.sock"))


def test_a_pack_without_a_grant_gets_no_egress_path_at_all(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path, site: Site
) -> None:
    ca, secure = site.ca, site.secure
    configure(state, [])  # the pack asks; none is given
    state.install(write_toolpack(tmp_path / "toolpacks", ca, [f"{NAME}:{secure.port}"]), trust="unverified")
    state.install(
        make_agent("egress-caller", CALLER, extra="tool_access:\n  allowed_packages: [web-fetch]\n")
    )
    result = _run(state, "egress-caller", kwargs={"calls": [
        ["proxy", {}],
        ["fetch", {"client": "urllib", "url": f"https://{NAME}:{secure.port}/"}]]})  # fmt: skip
    assert result.success, (result.error_code, result.error, result.logs)
    assert result.result[0] == {"success": True, "result": None, "error": None}
    assert not result.result[1]["success"]
    assert secure.seen == []
    assert state.audit()[0]["egress"] is None


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_an_agent_sandbox_gets_the_same_egress_cold_and_from_a_warm_pool(
    state: HostState, make_agent: Callable[..., Path], site: Site, warm: bool
) -> None:
    ca, secure, plain = site.ca, site.secure, site.plain
    granted = [f"{NAME}:{secure.port}"]
    configure(state, granted)
    network = (
        f'permissions:\n  network:\n    level: restricted\n    allowed_domains: ["{NAME}:{secure.port}"]\n'
    )
    pack = make_agent("egress-agent", AGENT_FETCH)
    manifest = pack / "agentnode.yaml"
    manifest.write_text(manifest.read_text() + network)
    state.install(pack)
    kwargs = {"url": f"https://{NAME}:{secure.port}/hello", "ca": ca.ca_pem.read_text(),
              "refused_url": f"http://{NAME}:{plain.port}/hello"}  # fmt: skip
    host = state.host(pool=PoolSettings(size=1)) if warm else state.host()
    try:
        if warm:
            host.prewarm("egress-agent")
            pools = host.pools
            assert pools is not None
            deadline = time.monotonic() + 120
            while sum(pools.ready_counts().values()) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        results = [host.run("egress-agent", kwargs=kwargs) for _ in range(2 if warm else 1)]
    finally:
        host.close()
    for result in results:
        assert result.success, (result.error_code, result.error, result.logs)
        assert result.result["granted"] == [200, "hello from the origin\n"]
        assert result.result["refused"][0] == 403 and result.result["refused"][2] == "port_not_granted"
    if warm:
        assert any(r.warm for r in results)
    assert plain.seen == []


def test_a_callers_per_run_grant_narrows_widens_and_is_refused_beyond_the_ceiling(
    state: HostState, make_agent: Callable[..., Path], site: Site
) -> None:
    secure, plain = site.secure, site.plain
    https_rule, http_rule = f"{NAME}:{secure.port}", f"{NAME}:{plain.port}"
    configure(state, [https_rule])
    config = json.loads((state.dir / "config.json").read_text())
    config["agent_sandbox"]["egress"]["grantable"] = [http_rule]  # a caller may add this one
    (state.dir / "config.json").write_text(json.dumps(config))
    declared = json.dumps([https_rule, http_rule])
    pack = make_agent("egress-agent", AGENT_FETCH)
    manifest = pack / "agentnode.yaml"
    network = f"permissions:\n  network:\n    level: restricted\n    allowed_domains: {declared}\n"
    manifest.write_text(manifest.read_text() + network)
    state.install(pack)
    kwargs = {"url": f"http://{NAME}:{plain.port}/hello", "refused_url": f"https://{NAME}:{secure.port}/hello",
              "ca": site.ca.ca_pem.read_text()}  # fmt: skip
    host = state.host()
    try:
        standing = host.run("egress-agent", kwargs=kwargs)
        widened = host.run("egress-agent", kwargs=kwargs, limits=RunOverrides.parse(egress=[http_rule]))
        none = host.run("egress-agent", kwargs=kwargs, limits=RunOverrides.parse(egress=[]))
        beyond = host.run("egress-agent", kwargs=kwargs, limits=RunOverrides.parse(egress=["evil.test"]))
    finally:
        host.close()
    # standing: https only; the caller's grant replaces it with http only; then nothing at all
    assert standing.success and standing.result["granted"][0] == 403, standing.result
    assert standing.result["refused"][0] == 200
    assert widened.success and widened.result["granted"] == [200, "hello from the origin\n"]
    assert widened.result["refused"][1] == "URLError"  # its CONNECT refused (urllib: "Tunnel ... 403")
    assert none.success and none.result["proxy"] == [] and none.result["granted"][0] is None
    assert not beyond.success and beyond.error_code == "config_invalid"
    assert "does not let a caller grant" in (beyond.error or "") and "evil" not in json.dumps(state.audit())
