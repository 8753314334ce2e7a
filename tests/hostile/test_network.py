"""Network attacks from inside the sandbox: every route out, checked from inside and from the host."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from tests.hostile.conftest import HostListener, Lab, Ledger, brief

DNS_QUERY = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
"""The query the agent sends (its copy is in AGENT); the UDP control echoes it back whole."""
DENIED = ("EPERM", "EACCES")
"""A refusal by the kernel (or gVisor): anything else, e.g. a timeout, is not evidence of one."""

pytestmark = [pytest.mark.docker, pytest.mark.podman]

AGENT = r'''
import errno, os, socket, struct, threading

def attempt(family, kind, address, payload=None, proto=0):
    """Connect (TCP/unix) or send+receive (UDP); returns what the agent actually achieved."""
    s = None
    try:
        s = socket.socket(family, kind, proto)
        s.settimeout(2)
        if kind == socket.SOCK_DGRAM:
            s.sendto(payload or b"x", address)
            data, _ = s.recvfrom(512)
            return {"reached": True, "got": len(data)}
        s.connect(address)
        return {"reached": True}
    except (OSError, socket.timeout) as exc:
        return {"reached": False, "error": type(exc).__name__ + ":" + errno.errorcode.get(exc.errno or 0, "")}
    finally:
        if s is not None:
            s.close()

DNS_QUERY = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"

def newlink():
    """Ask the kernel (or gVisor's netstack) to create a dummy interface over rtnetlink."""
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    except OSError as exc:
        return {"created": False, "error": "socket:" + errno.errorcode.get(exc.errno or 0, "")}
    def attr(kind, data):
        size = 4 + len(data)
        return struct.pack("HH", size, kind) + data + b"\0" * ((4 - size % 4) % 4)
    payload = struct.pack("BxHiII", 0, 0, 0, 0, 0) + attr(3, b"evil0\0") + attr(18, attr(1, b"dummy\0"))
    flags = 0x1 | 0x4 | 0x200 | 0x400  # REQUEST | ACK | EXCL | CREATE
    try:
        s.bind((0, 0))
        s.settimeout(2)
        s.send(struct.pack("IHHII", 16 + len(payload), 16, flags, 1, 0) + payload)  # RTM_NEWLINK
        reply = s.recv(65536)
    except OSError as exc:
        return {"created": False, "error": errno.errorcode.get(exc.errno or 0, "")}
    finally:
        s.close()
    kind = struct.unpack("H", reply[4:6])[0]
    code = struct.unpack("i", reply[16:20])[0] if kind == 2 else None
    return {"created": code == 0, "ack": errno.errorcode.get(-(code or 0), str(code))}

def interfaces():
    return sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:])

def raw(family, kind, proto):
    try:
        socket.socket(family, kind, proto).close()
        return {"opened": True}
    except OSError as exc:
        return {"opened": False, "error": errno.errorcode.get(exc.errno or 0, "")}

def controls():
    """The probes against listeners inside the sandbox, where reaching them is allowed: each must reach."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(5)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0agentnode-control-" + str(os.getpid()))
    unix.listen(4)

    def echo():
        try:
            data, peer = udp.recvfrom(512)
            udp.sendto(data, peer)
        except OSError:
            pass

    echoer = threading.Thread(target=echo)
    echoer.start()
    out = {"tcp": attempt(socket.AF_INET, socket.SOCK_STREAM, tcp.getsockname()),
           "udp": attempt(socket.AF_INET, socket.SOCK_DGRAM, udp.getsockname(), DNS_QUERY),
           "unix": attempt(socket.AF_UNIX, socket.SOCK_STREAM, unix.getsockname())}
    echoer.join()
    try:
        out["dns_localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, socket.AF_INET)})
    except OSError as exc:
        out["dns_localhost"] = type(exc).__name__
    for s in (tcp, udp, unix):
        s.close()
    return out

def run(context, host_port, llm_port, abstract, **kwargs):
    out = {"control": controls()}
    out["tcp_internet"] = [attempt(socket.AF_INET, socket.SOCK_STREAM, a)
                           for a in (("1.1.1.1", 53), ("1.1.1.1", 443), ("8.8.8.8", 53))]
    out["udp_internet"] = [attempt(socket.AF_INET, socket.SOCK_DGRAM, a, DNS_QUERY)
                           for a in (("1.1.1.1", 53), ("8.8.8.8", 53))]
    dns = []
    for name in ("example.com", "host.docker.internal", "pypi.org"):
        try:
            dns.append({"name": name, "resolved": sorted({a[4][0] for a in socket.getaddrinfo(name, 80)})})
        except OSError as exc:
            dns.append({"name": name, "resolved": [], "error": type(exc).__name__})
    out["dns"] = dns
    out["dns_embedded"] = attempt(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.11", 53), DNS_QUERY)
    out["host_loopback"] = [attempt(socket.AF_INET, socket.SOCK_STREAM, (ip, host_port))
                            for ip in ("127.0.0.1", "172.17.0.1", "10.0.2.2")]
    out["llm_direct"] = [attempt(socket.AF_INET, socket.SOCK_STREAM, (ip, llm_port))
                         for ip in ("127.0.0.1", "172.17.0.1")]
    out["ipv6"] = [attempt(socket.AF_INET6, socket.SOCK_STREAM, a)
                   for a in (("::1", host_port), ("2606:4700:4700::1111", 53))]
    out["raw_icmp"] = raw(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    out["packet"] = raw(socket.AF_PACKET, socket.SOCK_RAW, 0)
    out["newlink"] = newlink()
    out["interfaces"] = interfaces()
    out["abstract_unix"] = attempt(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + abstract)
    return out
'''


def test_network_is_unreachable(lab: Lab, ledger: Ledger) -> None:
    listener = HostListener()
    abstract = f"agentnode-hostile-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0" + abstract)
    unix.listen(4)
    unix.settimeout(0.1)
    try:
        # The controls on the host side: each listener counts a connection the host itself makes.
        socket.create_connection(("127.0.0.1", listener.port), timeout=5).close()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as own:
            own.connect("\0" + abstract)
            unix.accept()[0].close()
        unix_control = 1
        deadline = time.monotonic() + 10
        while listener.accepted < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        host_control = listener.accepted
        lab.agent("net-attacker", AGENT)
        result = lab.run(
            "net-attacker",
            kwargs={"host_port": listener.port, "llm_port": lab.llm.port, "abstract": abstract},
        )
        try:
            unix.accept()[0].close()
            unix_accepted = 1
        except OSError:
            unix_accepted = 0
    finally:
        listener.close()
        unix.close()
    assert result.success, (result.error_code, result.error, result.logs[-2000:])
    out = result.result
    control = out["control"]
    # The same probes reach listeners inside the sandbox: "not reached" below is the boundary, not a
    # broken probe. The host's listeners counted the host's own connection (1 each) before the run.
    tcp_ok = control["tcp"]["reached"] is True
    udp_ok = control["udp"].get("got") == len(DNS_QUERY)
    assert host_control == 1 and unix_control == 1, (host_control, unix_control)

    def none_reached(key: str) -> bool:
        items = out[key] if isinstance(out[key], list) else [out[key]]
        return not any(item.get("reached") for item in items)

    ledger.attack(
        "net.tcp_internet",
        expected="TCP to 1.1.1.1:53/443 and 8.8.8.8:53 fails (the probe reaches a listener in the sandbox)",
        observed=brief({"agent": out["tcp_internet"], "control": control["tcp"]}),
        ok=none_reached("tcp_internet") and tcp_ok,
    )
    ledger.attack(
        "net.udp_internet",
        expected="UDP DNS query to 1.1.1.1 and 8.8.8.8 gets no answer (an echo in the sandbox answers it)",
        observed=brief({"agent": out["udp_internet"], "control": control["udp"]}),
        ok=none_reached("udp_internet") and udp_ok,
    )
    resolved = [d for d in out["dns"] if d["resolved"]]
    ledger.attack(
        "net.dns",
        expected="no name resolves (no resolver reachable, embedded DNS silent); localhost does, from "
        "/etc/hosts",
        observed=brief(
            {
                "getaddrinfo": out["dns"],
                "127.0.0.11": out["dns_embedded"],
                "localhost": control["dns_localhost"],
            },
            limit=600,
        ),
        ok=not resolved
        and none_reached("dns_embedded")
        and udp_ok
        and control["dns_localhost"] == ["127.0.0.1"],
    )
    ledger.attack(
        "net.host_loopback_listener",
        expected="a listener on the host's 127.0.0.1 is unreachable (it accepts only the host's own control "
        "connection)",
        observed=brief({"agent": out["host_loopback"], "host_accepted": listener.accepted}),
        ok=none_reached("host_loopback") and listener.accepted == host_control == 1 and tcp_ok,
    )
    ledger.attack(
        "net.llm_provider_direct",
        expected="the provider on the host's loopback is unreachable; it receives 0 requests",
        observed=brief({"agent": out["llm_direct"], "provider_requests": len(lab.llm.requests)}),
        ok=none_reached("llm_direct") and not lab.llm.requests and tcp_ok,
    )
    ledger.attack(
        "net.ipv6",
        expected="IPv6 to ::1 (host port) and 2606:4700:4700::1111 fails",
        observed=brief(out["ipv6"]),
        ok=none_reached("ipv6") and tcp_ok,
    )
    ledger.attack(
        "net.raw_socket",
        expected="raw ICMP socket refused (EPERM)",
        observed=brief(out["raw_icmp"]),
        ok=not out["raw_icmp"]["opened"] and out["raw_icmp"]["error"] in DENIED,
    )
    ledger.attack(
        "net.packet_socket",
        expected="AF_PACKET socket refused (EPERM)",
        observed=brief(out["packet"]),
        ok=not out["packet"]["opened"] and out["packet"]["error"] in DENIED,
    )
    newlink = out["newlink"]
    ledger.attack(
        "net.netlink_newlink",
        expected="RTM_NEWLINK (create a dummy interface) refused (EPERM/EACCES, not unanswered); only lo "
        "exists",
        observed=brief({"newlink": newlink, "interfaces": out["interfaces"]}),
        ok=not newlink["created"]
        and (newlink.get("ack") in DENIED or newlink.get("error") in DENIED)
        and out["interfaces"] == ["lo"],
    )
    ledger.attack(
        "net.host_abstract_unix",
        expected="a host abstract Unix socket is unreachable (host accepts 0 connections); the probe reaches "
        "an abstract socket inside the sandbox",
        observed=brief(
            {"agent": out["abstract_unix"], "host_accepted": unix_accepted, "control": control["unix"]}
        ),
        ok=not out["abstract_unix"]["reached"] and unix_accepted == 0 and control["unix"]["reached"] is True,
    )
