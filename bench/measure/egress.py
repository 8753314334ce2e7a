"""The egress section: one HTTPS request, and a 64 MiB download, through a sandbox's egress path against the
same request made directly from the host, to the same local origin (its own process on 127.0.0.1); and, as
the floor, the same client inside the sandbox against a TLS server on the sandbox's own loopback (what the
runtime's loopback and the client cost there, with no egress path at all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._roots import REPO
from bench._state import BenchState, stop_process
from bench._stats import med, ratio, summary
from bench.measure.shared import succeeded
from host.runtime.runner import SandboxHost

NAME = "origin.bench.test"
"""The origin's name: `egress.hosts` maps it to 127.0.0.1 for the sandbox; the direct client goes there."""
DOWNLOAD_BYTES = 64 << 20
EGRESS_ROUNDS = 4
"""A repetition's samples come in this many rounds, each the direct requests and then one sandbox run."""

CLIENT = r'''
import os, socket, ssl, time


def once(name, port, ca, path="/hello", proxy=None, chunk=1 << 20):
    """One HTTPS GET on a new connection: TCP connect (through the proxy's CONNECT when given), TLS
    handshake, request, the whole body read; (ms, body bytes)."""
    context = ssl.create_default_context(cadata=ca)
    buffer = bytearray(chunk)
    t = time.perf_counter()
    sock = socket.create_connection(proxy or ("127.0.0.1", port), timeout=60)
    if proxy:
        sock.sendall(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(4096)
        if not answer.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(answer[:80])
    tls = context.wrap_socket(sock, server_hostname=name)
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
    got = 0
    while True:
        n = tls.recv_into(buffer)
        if not n:
            break
        got += n
    tls.close()
    return (time.perf_counter() - t) * 1000, got


def measure(name, port, ca, n, warmup, download, downloads, proxy=None):
    for _ in range(warmup):
        once(name, port, ca, proxy=proxy)
    ms = [once(name, port, ca, proxy=proxy)[0] for _ in range(n)]
    rates = []
    for _ in range(downloads):
        took, got = once(name, port, ca, f"/bytes/{download}", proxy=proxy)
        if got < download:
            raise RuntimeError(f"short download: {got}")
        rates.append(download / (1 << 20) / (took / 1000))
    return {"ms": ms, "mib_s": rates}
'''

AGENT = CLIENT + r'''

def _serve_locally(cert, key, download):
    # The floor: the same origin's answers from a TLS server on the sandbox's own loopback (no egress path)
    import tempfile, threading
    where = tempfile.mkdtemp()
    with open(where + "/cert.pem", "w") as fh:
        fh.write(cert)
    with open(where + "/key.pem", "w") as fh:
        fh.write(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(where + "/cert.pem", where + "/key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    body = b"x" * 65536

    def answer(conn):
        with conn:
            tls = context.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(4096)
            size = download if b"/bytes/" in head.split(b"\r\n", 1)[0] else 22
            tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
            while size > 0:
                size -= tls.send(body[:min(size, len(body))])
            tls.close()

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def run(context, name="", port=0, ca="", n=10, warmup=2, download=0, downloads=1, cert="", key="", **kwargs):
    host, proxy_port = os.environ["HTTPS_PROXY"].removeprefix("http://").rsplit(":", 1)
    path = measure(name, port, ca, n, warmup, download, downloads, proxy=(host, int(proxy_port)))
    local = _serve_locally(cert, key, download)
    path["floor"] = measure(name, local, ca, n, warmup, download, downloads)
    return path
'''

ORIGIN = r'''
import sys, time
from pathlib import Path
from tests.support.origins import make_ca, origin

ca = make_ca(Path(sys.argv[1]), [sys.argv[2]])
with origin(ca) as served:
    print(f"ORIGIN {served.port}", flush=True)
    sys.stdin.read()  # until the benchmark closes it
'''


@dataclass
class EgressSite:
    """The origin's process, its CA and the agent installed to reach it (made on the section's first use)."""

    proc: subprocess.Popen[str]
    port: int
    ca: str
    cert: str
    key: str
    slug: str
    tmp: Path

    def close(self) -> None:
        stop_process(self.proc)


def _site(state: BenchState) -> EgressSite:
    if state.egress is not None:
        return state.egress  # type: ignore[no-any-return]
    tmp = Path(tempfile.mkdtemp(prefix="egress-", dir=state.root))
    proc = subprocess.Popen([sys.executable, "-c", ORIGIN, str(tmp / "ca"), NAME], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if line[:1] != ["ORIGIN"]:
        proc.kill()
        raise RuntimeError("the egress origin did not start")
    port = int(line[1])
    made = tmp / "ca"
    slug = f"bench-egress-{state.tag}"
    site = EgressSite(proc, port, (made / "ca.pem").read_text(), (made / "leaf.pem").read_text(),
                      (made / "leaf.key").read_text(), slug, tmp)  # fmt: skip
    state.egress_config = {"allow": [f"{NAME}:{port}"], "hosts": {NAME: "127.0.0.1"},
                           "private_cidrs": ["127.0.0.1/32"]}  # fmt: skip
    state.configure("runc")
    network = f'permissions:\n  network:\n    level: restricted\n    allowed_domains: ["{NAME}:{port}"]\n'
    try:
        state.install_agent(slug, textwrap.dedent(AGENT), extra=network)
    except BaseException:
        site.close()
        raise
    state.egress = site
    return site


def _direct(site: EgressSite, n: int, warmup: int, downloads: int) -> dict[str, Any]:
    """The same client code, in its own host process with no proxy in its environment."""
    script = CLIENT + "\nimport json, sys\nprint(json.dumps(measure(*json.loads(sys.argv[1]))))\n"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    args = json.dumps([NAME, site.port, site.ca, n, warmup, DOWNLOAD_BYTES, downloads])
    done = subprocess.run([sys.executable, "-c", script, args], capture_output=True, text=True, env=env,
                          check=True, timeout=600)  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def egress(state: BenchState, runtime: str, n: int, warmup: int, downloads: int) -> dict[str, Any]:
    """HTTPS request latency and download throughput, sandbox (through the egress path) against direct,
    in EGRESS_ROUNDS rounds: the direct requests, then one sandbox run making the same ones."""
    site = _site(state)
    rounds = max(1, min(EGRESS_ROUNDS, n))
    per_round = -(-n // rounds)
    direct_ms: list[float] = []
    sandbox_ms: list[float] = []
    floor_ms: list[float] = []
    direct_rate: list[float] = []
    sandbox_rate: list[float] = []
    floor_rate: list[float] = []
    host = SandboxHost(env=state.env)
    try:
        for i in range(rounds):
            loads = 1 if i < downloads else 0  # one download in each of the first `downloads` rounds
            d = _direct(site, per_round, warmup, loads)
            r = succeeded(host.run(site.slug, runtime=runtime, kwargs={
                "name": NAME, "port": site.port, "ca": site.ca, "n": per_round, "warmup": warmup,
                "download": DOWNLOAD_BYTES, "downloads": loads, "cert": site.cert,
                "key": site.key})).result  # fmt: skip
            direct_ms += d["ms"]
            sandbox_ms += r["ms"]
            direct_rate += d["mib_s"]
            sandbox_rate += r["mib_s"]
            floor_ms += r["floor"]["ms"]
            floor_rate += r["floor"]["mib_s"]
    finally:
        host.close()
    direct, sandbox = summary(direct_ms), summary(sandbox_ms)
    d_med, s_med = med(direct), med(sandbox)
    d_rate, s_rate = med(summary(direct_rate)), med(summary(sandbox_rate))
    return {
        "direct_ms": direct,
        "sandbox_ms": sandbox,
        "added_ms": None if d_med is None or s_med is None else round(s_med - d_med, 3),
        "direct_mib_s": summary(direct_rate),
        "sandbox_mib_s": summary(sandbox_rate),
        "throughput_ratio": ratio(s_rate, d_rate),
        "floor_ms": summary(floor_ms),
        "floor_mib_s": summary(floor_rate),
    }


__all__ = ["CLIENT", "DOWNLOAD_BYTES", "NAME", "EgressSite", "egress"]
