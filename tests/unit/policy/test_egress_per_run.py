"""A caller's per-run egress grant (`run --allow-egress`, the Runner RPC's `limits.egress`, host.aio): checked
as rules, held to what the operator lets a caller grant, and then the run's grant for every pack of the run,
each pack still getting only what it declares of it."""

from __future__ import annotations

import pytest

from host._proto.agentnode.sandbox.v1 import runner_pb2
from host.api.events import run_request
from host.core.errors import InvalidRequest
from host.policy.caller import InvalidCaller, RunOverrides
from host.policy.egress import pack_grant
from host.runtime.egress import EGRESS_LISTENER_FDS, caller_grant, egress_fds
from host.spec.egress import EgressConfig, EgressLimits, parse_rule

CONFIG = EgressConfig(
    allow=(parse_rule("api.example.com"), parse_rule("*.cdn.example.com:443")),
    grantable=(parse_rule("extra.example.org:443"),),
)


def test_a_caller_grant_is_read_as_normalized_rules() -> None:
    limits = RunOverrides.parse(egress=["API.Example.com.", "extra.example.org:443", "api.example.com:80"])
    assert limits.egress == ("api.example.com", "extra.example.org:443")
    assert not limits.empty
    assert RunOverrides.parse(egress=[]).egress == ()


@pytest.mark.parametrize(
    "bad", ["api.example.com", ["http://x.com/"], ["127.1"], ["a" * 300], [1], ["x"] * 300]
)
def test_a_malformed_caller_grant_is_refused_without_quoting_it(bad: object) -> None:
    with pytest.raises(InvalidCaller) as caught:
        RunOverrides.parse(egress=bad)
    assert "http://x.com" not in str(caught.value)


def test_a_caller_narrows_or_widens_within_the_ceiling_only() -> None:
    narrowed = caller_grant(("api.example.com:443",), CONFIG, slug="p", trust="unverified")
    grant = pack_grant("unrestricted", (), CONFIG, slug="p", trust="unverified", per_run=narrowed)
    assert grant.texts() == ("api.example.com:443",)
    widened = caller_grant(
        ("extra.example.org:443", "a.cdn.example.com:443"), CONFIG, slug="p", trust="unverified"
    )
    declared = ("extra.example.org", "a.cdn.example.com")
    grant = pack_grant("restricted", declared, CONFIG, slug="p", trust="unverified", per_run=widened)
    assert set(grant.texts()) == {"extra.example.org:443", "a.cdn.example.com:443"}
    # what the pack does not declare it does not get, whoever grants it
    assert pack_grant("restricted", ("api.example.com",), CONFIG, slug="p", trust="unverified",
                      per_run=widened).empty  # fmt: skip
    # no egress at all
    assert pack_grant("unrestricted", (), CONFIG, slug="p", trust="unverified", per_run=()).empty


@pytest.mark.parametrize(
    "beyond", ["evil.example.net", "extra.example.org:80", "*.example.com", "cdn.example.com:443"]
)
def test_a_caller_grant_beyond_the_ceiling_refuses_the_run(beyond: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        caller_grant((beyond,), CONFIG, slug="p", trust="unverified")
    assert "does not let a caller grant" in caught.value.message and "grantable" in caught.value.hint


def test_the_runner_rpc_carries_the_grant_and_reads_it_back() -> None:
    request = run_request(
        runner_pb2.SubmitRunRequest, "p", {"limits": RunOverrides.parse(egress=["a.example.com"])}
    )
    assert request.limits.HasField("egress") and list(request.limits.egress.allow) == ["a.example.com"]
    none = run_request(runner_pb2.SubmitRunRequest, "p", {"limits": RunOverrides.parse(egress=[])})
    assert none.limits.HasField("egress") and list(none.limits.egress.allow) == []
    assert not run_request(runner_pb2.SubmitRunRequest, "p", {}).limits.HasField("egress")


def test_a_host_that_can_grant_egress_budgets_its_descriptors() -> None:
    from host.runtime.toolsandbox import MAX_LIVE_SANDBOXES

    assert EGRESS_LISTENER_FDS == 1 + MAX_LIVE_SANDBOXES  # the agent's listener and each live tool sandbox's
    assert egress_fds(EgressConfig()) == 0  # nothing grantable: no run ever opens an egress path
    granted = egress_fds(CONFIG)
    assert granted == 2 * EgressLimits().max_concurrent + EGRESS_LISTENER_FDS
    assert egress_fds(EgressConfig(grantable=CONFIG.grantable)) == granted  # a caller may open one
    assert egress_fds(EgressConfig(packs={"p": CONFIG.allow})) == granted
    small = EgressConfig(allow=CONFIG.allow, limits=EgressLimits(max_concurrent=2))
    assert egress_fds(small) == 4 + EGRESS_LISTENER_FDS
