"""Egress the host controls, against the real engine and image, under runc and runsc: a community toolpack
that declares `restricted` network reaches a local origin from its tool sandbox with urllib, requests,
httpx and aiohttp (HTTPS with a CA this test makes, and plain HTTP), and nothing else; the hostile suite
runs from inside the tool sandbox itself; agent sandboxes, cold and warm, get exactly the egress a grant
gives them. Origins listen on 127.0.0.1 only; test names resolve through `egress.hosts`; the loopback
exception is the origins' one address (`private_cidrs: [127.0.0.1/32]`). No traffic leaves the machine.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from host.policy.caller import RunOverrides
from host.runtime.pool import PoolSettings
from host.runtime.rundir import run_root
from tests.support.host_state import HostState
from tests.support.origins import LocalCa, Origin, make_ca, origin

pytestmark = [pytest.mark.docker, pytest.mark.podman]

NAME = "api.egress.test"
PRIVATE_NAME = "private.egress.test"
REQUIREMENTS = ["requests==2.34.2", "httpx==0.29.0", "aiohttp==3.14.5"]
CLIENTS = ("urllib", "requests", "httpx", "aiohttp", "curl")

FETCH_TOOLS = r"""
import asyncio, json, os, socket, ssl, subprocess, time, urllib.request

CA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ca.pem")


def fetch(client="urllib", url="", **kwargs):
    if client == "urllib":
        context = ssl.create_default_context(cafile=CA)
        with urllib.request.urlopen(url, timeout=20, context=context) as response:
            return {"status": response.status, "body": response.read().decode()}
    if client == "requests":
        import requests
        response = requests.get(url, timeout=20, verify=CA)
        return {"status": response.status_code, "body": response.text}
    if client == "httpx":
        import httpx
        response = httpx.get(url, timeout=20, verify=ssl.create_default_context(cafile=CA))
        return {"status": response.status_code, "body": response.text}
    if client == "aiohttp":
        import aiohttp

        async def get():
            async with aiohttp.ClientSession(trust_env=True) as session:
                async with session.get(url, ssl=ssl.create_default_context(cafile=CA)) as response:
                    return {"status": response.status, "body": await response.text()}

        return asyncio.run(get())
    if client == "curl":  # honours https_proxy / http_proxy (lower case for http) like any other client
        done = subprocess.run(["curl", "-sS", "--max-time", "20", "--cacert", CA, "-w", "%{http_code}", url],
                              capture_output=True, text=True, timeout=30)
        body, code = done.stdout[:-3], done.stdout[-3:]
        return {"status": int(code) if code.isdigit() else 0, "body": body or done.stderr}
    raise ValueError(client)


def proxy():
    url = os.environ.get("HTTPS_PROXY", "")
    return url.rsplit(":", 1) if url else None


def _ask(request, read=65536):
    host, port = proxy()
    with socket.create_connection((host.removeprefix("http://"), int(port)), timeout=20) as sock:
        sock.sendall(request)
        out = b""
        try:
            while True:
                chunk = sock.recv(read)
                if not chunk:
                    break
                out += chunk
        except OSError:
            pass
    return out


def _reason(answer):
    for line in answer.split(b"\r\n"):
        if line.lower().startswith(b"x-agentnode-egress:"):
            return line.split(b":", 1)[1].strip().decode()
    return answer[:12].decode("latin-1") or "closed"


def _attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return type(exc).__name__


def hostile(name="", port=0, plain_port=0, host_addresses=(), **kwargs):
    connect = lambda target: _reason(_ask(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()))
    out = {
        "proxy_variables": sorted(k for k in os.environ if k.lower().endswith("_proxy")),
        "direct_origin": _attempt(lambda: socket.create_connection(("127.0.0.1", port), timeout=3).close()),
        "direct_host": {a: _attempt(lambda: socket.create_connection((a, 443), timeout=3).close())
                        for a in host_addresses},
        "dns": _attempt(lambda: socket.getaddrinfo(name, 443)),
        "ungranted_name": connect("evil.test:443"),
        "ungranted_port": connect(f"{name}:8443"),
        "ip_literal": connect(f"127.0.0.1:{port}"),
        "private_name": connect(f"{kwargs.get('private_name')}:443"),
        "metadata": _reason(_ask(b"GET http://169.254.169.254/latest/ HTTP/1.1\r\nHost: x\r\n\r\n")),
        "header_flood": _reason(_ask(b"GET http://" + name.encode() + b"/ HTTP/1.1\r\nX: " + b"a" * 40000
                                     + b"\r\n\r\n")),
        "line_flood": _reason(_ask(b"GET http://" + name.encode() + b"/" + b"a" * 40000 + b" HTTP/1.1\r\n")),
    }
    # SNI that is not the CONNECT's name: the tunnel is cut before a byte reaches the origin
    host, proxy_port = proxy()
    raw = socket.create_connection((host.removeprefix("http://"), int(proxy_port)), timeout=20)
    raw.sendall(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
    raw.recv(4096)
    context = ssl.create_default_context(cafile=CA)
    try:
        context.wrap_socket(raw, server_hostname="other.egress.test").close()
        out["sni_mismatch"] = "ok"
    except (OSError, ssl.SSLError) as exc:
        out["sni_mismatch"] = type(exc).__name__
    # a CONNECT relayed inside a granted tunnel: the first bytes must be a ClientHello
    inner = _ask(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}\r\n\r\n"
                 f"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode())
    out["relayed_connect"] = inner.decode("latin-1")
    # two requests on one plain connection: only the first reaches the origin
    smuggled = _ask(f"GET http://{name}:{plain_port}/one HTTP/1.1\r\nHost: {name}\r\n\r\n"
                    f"GET http://{name}:{plain_port}/two HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
    out["smuggled_answers"] = smuggled.count(b"HTTP/1.1 200")
    # a slow writer: a request head trickled a byte at a time is cut at the head deadline
    raw = socket.create_connection((host.removeprefix("http://"), int(proxy_port)), timeout=30)
    started = time.monotonic()
    try:
        for byte in f"GET http://{name}:{plain_port}/slow HTTP/1.1\r\n".encode():
            raw.sendall(bytes([byte]))
            time.sleep(0.5)
        out["slow_writer"] = "finished"
    except OSError:
        out["slow_writer"] = "cut"
    out["slow_writer_seconds"] = round(time.monotonic() - started, 1)
    raw.close()
    # a slow reader: a 64 MiB download read 64 KiB and then left unread is cut when it idles
    raw = socket.create_connection((host.removeprefix("http://"), int(proxy_port)), timeout=30)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    raw.sendall(f"GET http://{name}:{plain_port}/bytes/{64 << 20} HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
    got = len(raw.recv(65536))
    time.sleep(kwargs.get("idle", 3) + 3)
    try:
        while chunk := raw.recv(1 << 20):
            got += len(chunk)
    except OSError:
        pass
    raw.close()
    out["slow_reader_bytes"] = got
    # last (the run's connection cap ends every later attempt): a flood straight at the egress socket
    path = os.path.join(os.path.dirname(os.environ["AGENTNODE_SOCKET"]), "egress.sock")
    failures = 0
    for _ in range(10_000):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            failures += 1
        finally:
            sock.close()
    out["flood_failures"] = failures
    return out
"""

CALLER = """
def run(context, calls=(), **kwargs):
    out = []
    for tool_name, arguments in calls:
        r = context.run_tool("web-fetch", tool_name, **arguments)
        out.append({"success": r.success, "result": r.result, "error": r.error})
    return out
"""

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


def _toolpack(parent: Path, ca: LocalCa, domains: list[str]) -> Path:
    pack = parent / "web-fetch"
    (pack / "src" / "web_fetch").mkdir(parents=True)
    (pack / "src" / "web_fetch" / "__init__.py").write_text(FETCH_TOOLS)
    shutil.copy(ca.ca_pem, pack / "src" / "web_fetch" / "ca.pem")
    deps = ", ".join(f'"{r}"' for r in REQUIREMENTS)
    (pack / "pyproject.toml").write_text(
        f'[project]\nname = "web-fetch"\nversion = "1.0.0"\ndependencies = [{deps}]\n'
    )
    tools = "".join(
        f'    - name: {n}\n      entrypoint: "web_fetch:{n}"\n' for n in ("fetch", "hostile", "proxy")
    )
    allowed = ", ".join(json.dumps(d) for d in domains)
    (pack / "agentnode.yaml").write_text(
        'package_id: web-fetch\nversion: "1.0.0"\npackage_type: toolpack\nentrypoint: web_fetch\n'
        f"permissions:\n  network:\n    level: restricted\n    allowed_domains: [{allowed}]\n"
        f"capabilities:\n  tools:\n{tools}"
    )
    return pack


IDLE_SECONDS, HEAD_SECONDS = 3, 2
"""Short enough that the slow reader and the slow writer are cut within the test."""


def _egress_config(grants: list[str]) -> dict[str, Any]:
    return {
        "allow": grants,
        "hosts": {NAME: "127.0.0.1", PRIVATE_NAME: "10.255.0.1"},
        "private_cidrs": ["127.0.0.1/32"],
        "limits": {"idle_seconds": IDLE_SECONDS, "head_seconds": HEAD_SECONDS},
    }


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCa:
    return make_ca(tmp_path_factory.mktemp("egress-ca"), [NAME, "other.egress.test"])


@dataclass(frozen=True)
class Site:
    """The test's CA and its two origins on 127.0.0.1."""

    ca: LocalCa
    secure: Origin
    plain: Origin


@pytest.fixture
def site(ca: LocalCa) -> Iterator[Site]:
    with origin(ca) as secure, origin() as plain:
        yield Site(ca, secure, plain)


@pytest.fixture
def state(host_state: HostState, runtime: str) -> HostState:
    """The host, its config naming the run's runtime (each test adds its egress with `configure`)."""
    host_state.write_config({"runtime": runtime})
    return host_state


def configure(state: HostState, grants: list[str]) -> None:
    runtime = json.loads((state.dir / "config.json").read_text())["agent_sandbox"]["runtime"]
    state.write_config({"runtime": runtime, "egress": _egress_config(grants)})


def _host_addresses() -> list[str]:
    """This machine's own non-loopback IPv4 addresses (the engine's bridge, if any, included)."""
    import socket

    found = set()
    with __import__("contextlib").suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    return sorted(a for a in found if not a.startswith("127."))[:3]


def _run(state: HostState, slug: str, **kwargs: Any) -> Any:
    host = state.host()
    try:
        return host.run(slug, **kwargs)
    finally:
        host.close()


def test_a_community_toolpack_reaches_exactly_its_granted_origin_from_its_tool_sandbox(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path, site: Site
) -> None:
    ca, secure, plain = site.ca, site.secure, site.plain
    granted = [f"{NAME}:{secure.port}", f"{NAME}:{plain.port}", f"{PRIVATE_NAME}:443"]
    configure(state, granted)
    state.install(_toolpack(tmp_path / "toolpacks", ca, granted), trust="unverified")
    state.install(
        make_agent("egress-caller", CALLER, extra="tool_access:\n  allowed_packages: [web-fetch]\n")
    )
    https_url, http_url = f"https://{NAME}:{secure.port}/hello", f"http://{NAME}:{plain.port}/hello"
    calls = [["fetch", {"client": c, "url": u}] for c in CLIENTS for u in (https_url, http_url)]
    calls.append(["hostile", {"name": NAME, "port": secure.port, "plain_port": plain.port,
                              "private_name": PRIVATE_NAME, "idle": IDLE_SECONDS,
                              "host_addresses": _host_addresses()}])  # fmt: skip
    calls.append(["proxy", {}])  # the tool sandbox still serves the run's later calls
    result = _run(state, "egress-caller", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    fetches = 2 * len(CLIENTS)
    fetched, hostile, after = result.result[:fetches], result.result[fetches], result.result[fetches + 1]
    for call in fetched:
        assert call["success"], call
        assert call["result"] == {"status": 200, "body": "hello from the origin\n"}
    assert after["success"] and after["result"], after
    assert hostile["success"], hostile
    seen = hostile["result"]
    assert seen["proxy_variables"] == sorted(
        ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"]
    )
    assert seen["direct_origin"] != "ok" and all(v != "ok" for v in seen["direct_host"].values())
    assert seen["dns"] != "ok"
    assert seen["ungranted_name"] == "name_not_granted"
    assert seen["ungranted_port"] == "port_not_granted"
    assert seen["ip_literal"] == "address_not_granted"
    assert seen["private_name"] == "private_address"
    assert seen["metadata"] == "address_not_granted"
    assert seen["header_flood"] == "head_too_large" and seen["line_flood"] in (
        "head_too_large",
        "bad_request",
    )
    assert seen["sni_mismatch"] != "ok"
    assert seen["relayed_connect"].startswith("HTTP/1.1 200") and "evil" not in seen["relayed_connect"]
    assert seen["smuggled_answers"] == 1
    assert [s["path"] for s in plain.seen].count("/two") == 0
    assert seen["slow_writer"] == "cut" and seen["slow_writer_seconds"] < HEAD_SECONDS + 10
    assert "/slow" not in [s["path"] for s in plain.seen]
    assert 1 << 16 < seen["slow_reader_bytes"] < 64 << 20  # cut, and never buffered whole on the host

    records = state.audit()
    assert len(records) == 1
    egress = records[0]["egress"]
    https_rule, http_rule = egress["rules"][f"{NAME}:{secure.port}"], egress["rules"][f"{NAME}:{plain.port}"]
    # one fetch each way per client, plus the smuggling and the slow-reading plain connections (refused
    # tunnels never connected)
    assert (https_rule["connections"], http_rule["connections"]) == (len(CLIENTS), len(CLIENTS) + 2), egress
    assert https_rule["bytes_in"] > 0 and egress["cut"].get("idle", 0) >= 1, egress
    refused = egress["refused"]
    for reason in ("name_not_granted", "port_not_granted", "address_not_granted", "private_address",
                   "head_too_large", "sni_mismatch", "not_tls", "connection_cap",
                   "slow_request"):  # fmt: skip
        assert refused.get(reason, 0) >= 1, (reason, refused)
    log = (state.dir / "audit.jsonl").read_text()
    assert "evil" not in log and "other.egress" not in log
    assert not any(run_root(state.env).glob("run-*/egress.sock"))


def test_a_pack_without_a_grant_gets_no_egress_path_at_all(
    state: HostState, make_agent: Callable[..., Path], tmp_path: Path, site: Site
) -> None:
    ca, secure = site.ca, site.secure
    configure(state, [])  # the pack asks; none is given
    state.install(_toolpack(tmp_path / "toolpacks", ca, [f"{NAME}:{secure.port}"]), trust="unverified")
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
