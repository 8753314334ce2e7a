"""Attacks on the egress path, from inside a community tool sandbox that was granted one local origin: every
way around the grant (a client that ignores the proxy, DNS, the host's own addresses, an ungranted name, port
or literal, a granted name leading to a private address, the metadata endpoint, SNI that is not the CONNECT's,
a CONNECT relayed inside a granted tunnel, a second request smuggled on one plain connection), every way to
make the host pay (header and line floods, a slow writer, a slow reader, 10,000 connections at the egress
socket) is refused or bounded; the sandbox still serves the run's later calls, and the run's one audit record
counts each refusal by its fixed reason and never names what was refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from host.spec.egress import EgressLimits
from tests.hostile.conftest import Lab, Ledger, brief
from tests.support.egress import (
    CALLER,
    HEAD_SECONDS,
    IDLE_SECONDS,
    NAME,
    OTHER_NAME,
    PRIVATE_NAME,
    Site,
    egress_config,
    host_addresses,
    serve_site,
    write_toolpack,
)
from tests.support.origins import LocalCa, Origin, make_ca
from tests.support.packs import write_agent

pytestmark = [pytest.mark.docker, pytest.mark.podman]

MAX_CONNECTIONS = EgressLimits().max_connections
"""The run's total-connection cap (the test config leaves it at its default)."""


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCa:
    return make_ca(tmp_path_factory.mktemp("egress-ca"), [NAME, OTHER_NAME])


@pytest.fixture
def origins(ca: LocalCa) -> Iterator[Site]:
    with serve_site(ca) as served:
        yield served


def _paths(o: Origin) -> list[str]:
    return [str(s["path"]) for s in o.seen]


def test_the_egress_path_refuses_or_bounds_every_attack_from_inside(
    lab: Lab, ledger: Ledger, ca: LocalCa, origins: Site
) -> None:
    secure, plain = origins.secure, origins.plain
    granted = [f"{NAME}:{secure.port}", f"{NAME}:{plain.port}", f"{PRIVATE_NAME}:443"]
    lab.configure(egress=egress_config(granted))
    lab.state.install(write_toolpack(lab.root / "toolpacks", ca, granted), trust="unverified")
    agent = write_agent(lab.root / "packs", "egress-attacker", CALLER, goal="hostile",
                        agent="  tool_access: {allowed_packages: [web-fetch]}\n")  # fmt: skip
    entry = lab.state.install(agent)
    if entry.sandbox_volume:
        lab.volumes.add(entry.sandbox_volume)
    calls: list[list[Any]] = [
        ["hostile", {"name": NAME, "port": secure.port, "plain_port": plain.port,
                     "private_name": PRIVATE_NAME, "idle": IDLE_SECONDS, "host_addresses": host_addresses()}],
        ["proxy", {}],  # the tool sandbox still serves the run's later calls
    ]  # fmt: skip
    result = lab.run("egress-attacker", kwargs={"calls": calls})
    assert result.success, (result.error_code, result.error, result.logs)
    hostile, later = result.result
    assert hostile["success"], hostile
    seen: dict[str, Any] = hostile["result"]
    ledger.attack(
        "egress.control", expected="the granted HTTPS origin answers through the path (the probes can see)",
        observed=brief({"status": seen["control"], "origin_saw": _paths(secure)[:1]}),
        ok=seen["control"] == 200 and _paths(secure)[:1] == ["/control"],
    )  # fmt: skip
    ledger.attack(
        "egress.ignores_proxy",
        expected="a client ignoring the proxy variables reaches neither the origin nor the host's addresses",
        observed=brief({"origin": seen["direct_origin"], "host": seen["direct_host"]}),
        ok=seen["direct_origin"] != "ok" and all(v != "ok" for v in seen["direct_host"].values()),
    )
    ledger.attack("egress.dns", expected="no resolver inside: the granted name does not resolve",
                  observed=seen["dns"], ok=seen["dns"] != "ok")  # fmt: skip
    refusals = {
        "ungranted_name": ("a CONNECT to a name outside the grant", "name_not_granted"),
        "ungranted_port": ("a CONNECT to a granted name on another port", "port_not_granted"),
        "ip_literal": ("a CONNECT to the origin's IP literal", "address_not_granted"),
        "private_name": ("a granted name that resolves to a private address", "private_address"),
        "metadata": ("a plain request to the metadata endpoint", "address_not_granted"),
        "header_flood": ("a 40 KB header", "head_too_large"),
    }
    for key, (what, reason) in refusals.items():
        ledger.attack(f"egress.{key}", expected=f"{what}: refused with {reason}", observed=seen[key],
                      ok=seen[key] == reason)  # fmt: skip
    ledger.attack(
        "egress.line_flood", expected="a 40 KB request line: refused (head_too_large or bad_request)",
        observed=seen["line_flood"], ok=seen["line_flood"] in ("head_too_large", "bad_request"),
    )  # fmt: skip
    ledger.attack(
        "egress.sni_mismatch",
        expected="a tunnel to the granted name whose ClientHello names another: cut before the origin",
        observed=seen["sni_mismatch"], ok=seen["sni_mismatch"] != "ok",
    )  # fmt: skip
    relayed = seen["relayed_connect"]
    ledger.attack(
        "egress.relayed_connect",
        expected="a CONNECT sent inside a granted tunnel: the tunnel is closed (its first bytes are not TLS)",
        observed=brief(relayed[:80]), ok=relayed.startswith("HTTP/1.1 200") and "evil" not in relayed,
    )  # fmt: skip
    ledger.attack(
        "egress.smuggled_request",
        expected="two requests on one plain connection: only the first reaches the origin",
        observed=brief({"answers": seen["smuggled_answers"], "origin_saw": _paths(plain)}),
        ok=seen["smuggled_answers"] == 1 and "/one" in _paths(plain) and "/two" not in _paths(plain),
    )
    ledger.attack(
        "egress.slow_writer",
        expected=f"a request head trickled a byte each 0.5 s: cut at the head deadline ({HEAD_SECONDS} s), "
        "never reaching the origin",
        observed=brief({"result": seen["slow_writer"], "seconds": seen["slow_writer_seconds"]}),
        ok=seen["slow_writer"] == "cut" and seen["slow_writer_seconds"] < HEAD_SECONDS + 10
        and "/slow" not in _paths(plain),
    )  # fmt: skip
    ledger.attack(
        "egress.slow_reader",
        expected=f"a 64 MiB download left unread: cut when idle ({IDLE_SECONDS} s), never buffered whole",
        observed=brief({"bytes_received": seen["slow_reader_bytes"]}),
        ok=1 << 16 < seen["slow_reader_bytes"] < 64 << 20,
    )
    (record,) = [r for r in lab.audit() if r["run_id"] == result.run_id]
    egress = record["egress"] or {}
    reasons = ("name_not_granted", "port_not_granted", "address_not_granted", "private_address",
               "head_too_large", "sni_mismatch", "not_tls", "slow_request", "connection_cap")  # fmt: skip
    missing = [r for r in reasons if not egress.get("refused", {}).get(r)]
    capped = egress.get("refused", {}).get("connection_cap", 0)
    ledger.attack(
        "egress.connection_flood",
        expected=f"10,000 connections at the egress socket: past the run's cap ({MAX_CONNECTIONS}) each is "
        "refused at once, and the sandbox still serves the run's later calls",
        observed=brief({"refused_by_the_cap": capped, "later_call": later["success"]}),
        ok=capped >= 10_000 - MAX_CONNECTIONS and later["success"] and later["result"] is not None,
    )
    audit_text = (lab.state.dir / "audit.jsonl").read_text()
    ledger.attack(
        "egress.audit",
        expected="one record counts every refusal by fixed reason and the idle cut, naming no refused name",
        observed=brief({"refused": egress.get("refused"), "cut": egress.get("cut"), "missing": missing}),
        ok=not missing and egress.get("cut", {}).get("idle", 0) >= 1
        and "evil" not in audit_text and OTHER_NAME not in audit_text,
    )  # fmt: skip
