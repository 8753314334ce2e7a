"""The egress tests' shared parts: a community web-fetching toolpack (its tools fetch with a named client,
probe the egress path as an attacker would, and report the proxy variables), the agent that calls it, and the
host config that grants it local origins. Test names resolve through `egress.hosts`; the loopback exception
is the origins' one address (`private_cidrs: [127.0.0.1/32]`), so no traffic leaves the machine."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.origins import LocalCa, Origin, origin

NAME = "api.egress.test"
"""The granted name; `hosts` maps it to the origins' 127.0.0.1."""
PRIVATE_NAME = "private.egress.test"
"""A granted name that `hosts` maps to a private address no `private_cidrs` holds."""
OTHER_NAME = "other.egress.test"
"""On the origin's certificate too, never granted: the name a fronting ClientHello carries."""
IDLE_SECONDS, HEAD_SECONDS = 3, 2
"""Short enough that the slow reader and the slow writer are cut within a test."""

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
        "control": fetch("urllib", f"https://{name}:{port}/control")["status"],  # the path itself works
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


def write_toolpack(
    parent: Path, ca: LocalCa, domains: Sequence[str], requirements: Sequence[str] = ()
) -> Path:
    """The `web-fetch` toolpack under `parent`: `restricted` network to `domains`, its tools trusting `ca`."""
    pack = parent / "web-fetch"
    (pack / "src" / "web_fetch").mkdir(parents=True)
    (pack / "src" / "web_fetch" / "__init__.py").write_text(FETCH_TOOLS)
    shutil.copy(ca.ca_pem, pack / "src" / "web_fetch" / "ca.pem")
    deps = ", ".join(f'"{r}"' for r in requirements)
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


def egress_config(grants: Sequence[str]) -> dict[str, Any]:
    """`agent_sandbox.egress` granting `grants` to any pack that asks, with the test names' addresses."""
    return {
        "allow": list(grants),
        "hosts": {NAME: "127.0.0.1", PRIVATE_NAME: "10.255.0.1"},
        "private_cidrs": ["127.0.0.1/32"],
        "limits": {"idle_seconds": IDLE_SECONDS, "head_seconds": HEAD_SECONDS},
    }


def host_addresses() -> list[str]:
    """This machine's own non-loopback IPv4 addresses (the engine's bridge, if any, included)."""
    found = set()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    return sorted(a for a in found if not a.startswith("127."))[:3]


@dataclass(frozen=True)
class Site:
    """The test's CA and its two origins on 127.0.0.1, HTTPS and plain HTTP."""

    ca: LocalCa
    secure: Origin
    plain: Origin


@contextlib.contextmanager
def serve_site(ca: LocalCa) -> Iterator[Site]:
    """Both origins, up for the block."""
    with origin(ca) as secure, origin() as plain:
        yield Site(ca, secure, plain)
