"""Engine facts without a daemon: both engines' recorded answers normalized to the same terms
(`facts_from`), and the fail-closed capability checks (`require_capable`)."""

from __future__ import annotations

import dataclasses

import pytest

from host.core.errors import AuditReason, EngineError
from host.engine.engine import open_engine
from host.engine.facts import EngineFacts, EngineKind, engine_facts, engine_kind, facts_from, require_capable
from tests.support.fake_engine import FakeEngine
from tests.unit.engine._support import (
    DOCKERD_INFO,
    DOCKERD_PING,
    PODMAN_INFO,
    PODMAN_LIBPOD,
    PODMAN_PING,
    PODMAN_VERSION,
    ROOTLESS_V1_LIBPOD,
)

# --- require_capable ---------------------------------------------------------------------------------

CAPABLE = EngineFacts(
    server_version="27.0", runtimes=frozenset({"runc", "runsc"}), memory_limit=True, swap_limit=True
)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_capable_engine_passes(runtime: str) -> None:
    require_capable(CAPABLE, runtime)


def refusal(facts: EngineFacts, runtime: str) -> EngineError:
    with pytest.raises(EngineError) as info:
        require_capable(facts, runtime)
    return info.value


def test_unknown_runtime_is_a_config_error() -> None:
    err = refusal(CAPABLE, "kata")
    assert err.reason is AuditReason.CONFIG_INVALID and err.check == "runtime"
    assert "runc or runsc" in err.hint


def test_runsc_not_registered_says_how_to_register_it() -> None:
    err = refusal(EngineFacts("27.0", frozenset({"runc"}), True, True), "runsc")
    assert err.reason is AuditReason.RUNTIME_NOT_REGISTERED and err.check == "runtime"
    assert "--host-uds=open" in err.hint and "docker info" in err.hint


def test_runc_not_registered() -> None:
    err = refusal(EngineFacts("x", frozenset({"crun"}), True, True), "runc")
    assert err.reason is AuditReason.RUNTIME_NOT_REGISTERED and "docker info" in err.hint


@pytest.mark.parametrize(("memory", "swap"), [(False, True), (True, False), (False, False)])
def test_memory_ceiling_unenforceable_fails_closed(memory: bool, swap: bool) -> None:
    err = refusal(EngineFacts("x", frozenset({"runc"}), memory, swap), "runc")
    assert err.reason is AuditReason.MEMORY_LIMIT_UNSUPPORTED and err.check == "memory_limit"
    assert "{{.MemoryLimit}} {{.SwapLimit}}" in err.hint


# --- engine facts, normalized from either engine's answers -------------------------------------------------


def test_the_engine_is_told_by_its_ping_headers_in_any_case() -> None:
    assert engine_kind(DOCKERD_PING) is EngineKind.DOCKER and engine_kind({}) is EngineKind.DOCKER
    assert engine_kind(PODMAN_PING) is EngineKind.PODMAN
    assert engine_kind({"libpod-api-version": "5.0.0"}) is EngineKind.PODMAN
    assert engine_kind({"Libpod-Api-Version": ""}) is EngineKind.DOCKER


def test_both_engines_answers_normalize_to_the_same_terms() -> None:
    docker_facts = facts_from(DOCKERD_INFO, EngineKind.DOCKER)
    podman_facts = facts_from(PODMAN_INFO, EngineKind.PODMAN, PODMAN_LIBPOD)
    assert (docker_facts.kind, podman_facts.kind) == (EngineKind.DOCKER, EngineKind.PODMAN)
    for facts in (docker_facts, podman_facts):
        assert (facts.architecture, facts.os, facts.cgroup_version) == ("x86_64", "linux", "1")
        assert facts.security_options == frozenset({"seccomp"}) and not facts.rootless
        assert facts.memory_limit and facts.swap_limit and facts.pids_limit
    assert docker_facts.runtimes == frozenset({"io.containerd.runc.v2", "runc", "runsc"})
    # Podman lists every runtime its configuration knows (installed or not) but runs each container under
    # its default one: only that one can be had.
    assert podman_facts.runtimes == frozenset({"crun"}) and podman_facts.default_runtime == "crun"
    assert podman_facts.seccomp_profile_path == "/usr/share/containers/seccomp.json"


def test_rootless_podman_without_delegated_controllers_is_refused() -> None:
    """Its compatible /info claims every limit; the run would have none. Refused, naming delegation."""
    facts = facts_from(PODMAN_INFO, EngineKind.PODMAN, ROOTLESS_V1_LIBPOD)
    assert facts.rootless and "rootless" in facts.security_options
    assert not (facts.memory_limit or facts.swap_limit or facts.pids_limit)
    err = refusal(facts, "crun")
    assert err.reason is AuditReason.MEMORY_LIMIT_UNSUPPORTED and "Delegate=" in err.hint
    delegated = {
        "host": {**ROOTLESS_V1_LIBPOD["host"], "cgroupVersion": "v2", "cgroupControllers": ["memory", "pids"]}
    }
    require_capable(facts_from({**PODMAN_INFO, "CgroupVersion": "2"}, EngineKind.PODMAN, delegated), "crun")


def test_rootless_and_security_options_are_read_by_name() -> None:
    """Rootless dockerd says so among its security options (Podman's own /libpod/info decides there)."""
    options = ["name=seccomp,profile=default", "name=rootless", "name=cgroupns"]
    facts = facts_from({**DOCKERD_INFO, "SecurityOptions": options}, EngineKind.DOCKER)
    assert facts.rootless and facts.security_options == frozenset({"seccomp", "rootless", "cgroupns"})


def test_podman_offers_only_its_default_runtime() -> None:
    facts = facts_from({**PODMAN_INFO, "DefaultRuntime": "runc"}, EngineKind.PODMAN, PODMAN_LIBPOD)
    require_capable(facts, "runc")
    for runtime, says in (("runsc", "--host-uds=open"), ("crun", 'runtime = "crun"')):
        err = refusal(facts, runtime)
        assert err.reason is AuditReason.RUNTIME_NOT_REGISTERED and "podman 4.3.1" in err.message
        assert says in err.hint and "agent_sandbox.runtime to runc" in err.hint


def test_an_engine_without_pids_accounting_is_refused() -> None:
    facts = dataclasses.replace(
        facts_from(PODMAN_INFO, EngineKind.PODMAN, PODMAN_LIBPOD), pids_limit=False, rootless=True
    )
    err = refusal(facts, "crun")
    assert err.reason is AuditReason.MEMORY_LIMIT_UNSUPPORTED and "pids" in err.message
    assert "rootless Podman" in err.hint and "Delegate=" in err.hint


def test_engine_facts_reads_which_engine_answers() -> None:
    with FakeEngine(info=PODMAN_INFO, version=PODMAN_VERSION, libpod_info=ROOTLESS_V1_LIBPOD) as fake:
        client = open_engine({"DOCKER_HOST": fake.docker_host})
        try:
            facts = engine_facts(client)
        finally:
            client.close()
        assert "/v4.0.0/libpod/info" in fake.paths  # Podman's own answer is asked for
    assert facts == facts_from(PODMAN_INFO, EngineKind.PODMAN, ROOTLESS_V1_LIBPOD) and facts.rootless
