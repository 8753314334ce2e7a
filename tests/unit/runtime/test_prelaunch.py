"""The prelaunch's decisions without an engine: which container a run may adopt, and nothing left behind
when the prelaunch cannot start one."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host.core.owner import owner_token
from host.engine.contract import ContainerLimits
from host.engine.http import EngineClient
from host.engine.launch import SandboxSpec
from host.policy.admission import Admission, admit
from host.runtime.prelaunch import Prelaunched, prelaunch
from host.runtime.rundir import RunDir, run_root
from host.spec.config import load_config
from host.spec.lockfile import LockEntry, Lockfile

SLUG = "pre-unit"


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="pl-", dir="/tmp"))
    try:
        (root / "cfg").mkdir()
        (root / "cfg" / "config.json").write_text(
            json.dumps({"agent_sandbox": {"image": "sha256:" + "b" * 64}})
        )
        environ = {
            "PATH": "/usr/bin:/bin",
            "AGENTNODE_CONFIG": str(root / "cfg"),
            "AGENTNODE_RUN_DIR": str(root / "r"),
            "AGENTNODE_AGENT_SANDBOX": "1",
            "DOCKER_HOST": f"unix://{root}/no-engine.sock",
        }
        digest = "a" * 64
        Lockfile(load_config(environ).paths.lockfile).put(
            LockEntry(
                slug=SLUG, version="1.0.0", package_type="agent", trust_level="unverified",
                artifact_hash=digest, import_subdir="src",
                sandbox_volume=f"agentnode-pack-{SLUG}-1.0.0-{digest[:16]}", host_path=None,
                manifest={"package_id": SLUG, "version": "1.0.0", "name": SLUG, "package_type": "agent",
                          "agent": {"entrypoint": "agents.main:run", "goal": "g"}},
                installed_at="2026-01-01T00:00:00Z",
            )
        )  # fmt: skip
        yield environ
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _admission(env: dict[str, str], runtime: str = "runc") -> Admission:
    config = load_config(env)
    admission = admit(SLUG, lockfile=Lockfile(config.paths.lockfile), config=config, env=env, runtime=runtime)
    assert admission.refusal is None and admission.sandboxed
    return admission


def _prelaunched(admission: Admission, **changes: Any) -> Prelaunched:
    """The container the prelaunch would have started for `admission`, with `changes` to its spec."""
    entry, manifest = admission.entry, admission.manifest
    assert entry is not None and manifest is not None and admission.runtime is not None
    spec = SandboxSpec(
        slug=entry.slug, artifact_hash=entry.volume_digest, runtime=admission.runtime,
        pin="sha256:" + "b" * 64, image_id="sha256:" + "b" * 64, volume=entry.sandbox_volume or "",
        import_root="/pack/src", limits=ContainerLimits(), preload=manifest.entrypoint_module,
    )  # fmt: skip
    return Prelaunched(
        run_id="r" * 32, name="agentnode-run-x", spec=dataclasses.replace(spec, **changes),
        container_id="c" * 64, rundir=RunDir(Path("/nonexistent")), client=EngineClient(),
        launched_at=0.0,
    )  # fmt: skip


def test_the_run_adopts_only_the_very_sandbox_it_would_start(env: dict[str, str]) -> None:
    admission = _admission(env)
    pin, limits = "sha256:" + "b" * 64, ContainerLimits()
    assert _prelaunched(admission).serves(admission, pin=pin, limits=limits)
    # a head start's container (host/runtime/headstart.py) has no preload: its wrapper imports the entrypoint
    # later
    assert _prelaunched(admission, preload="").serves(admission, pin=pin, limits=limits)
    unfit: dict[str, dict[str, Any]] = {
        "pack version": {"artifact_hash": "e" * 64},
        "volume": {"volume": "agentnode-pack-other"},
        "import root": {"import_root": "/pack"},
        "runtime": {"runtime": "runsc"},
        "image pin": {"pin": "sha256:" + "d" * 64},
        "entrypoint": {"preload": "other.module"},
        "limits": {"limits": ContainerLimits(pids=128)},
        "slug": {"slug": "another"},
    }
    for what, change in unfit.items():
        assert not _prelaunched(admission, **change).serves(admission, pin=pin, limits=limits), what
    # the host's own view differs (another pin configured, other limits asked): not adopted either
    assert not _prelaunched(admission).serves(admission, pin="sha256:" + "d" * 64, limits=limits)
    assert not _prelaunched(admission).serves(admission, pin=pin, limits=ContainerLimits(memory_bytes=2**28))
    no_entry = dataclasses.replace(admission, entry=None)
    assert not _prelaunched(admission).serves(no_entry, pin=pin, limits=limits)


def test_the_host_reuses_the_prelaunch_admission_only_for_the_very_request_it_decided(
    env: dict[str, str],
) -> None:
    admission, config = _admission(env), load_config(env)
    lockfile = Lockfile(config.paths.lockfile)
    early = dataclasses.replace(_prelaunched(admission), admission=admission,
                                admitted_with=(config, dict(env), "runc"))  # fmt: skip
    assert early.admitted_for(SLUG, "runc", config=config, env=env, lockfile=lockfile) is admission
    assert early.admitted_for("other", "runc", config=config, env=env, lockfile=lockfile) is None
    assert early.admitted_for(SLUG, "runsc", config=config, env=env, lockfile=lockfile) is None
    assert early.admitted_for(SLUG, "runc", config=config, env={**env, "AGENTNODE_AGENT_SANDBOX": "0"},
                              lockfile=lockfile) is None  # fmt: skip
    sandbox = dataclasses.replace(config.agent_sandbox, runtime="runsc")
    other = dataclasses.replace(config, agent_sandbox=sandbox)
    assert early.admitted_for(SLUG, "runc", config=other, env=env, lockfile=lockfile) is None
    unadmitted = _prelaunched(admission)
    assert unadmitted.admitted_for(SLUG, "runc", config=config, env=env, lockfile=lockfile) is None
    entry = lockfile.get(SLUG)
    assert entry is not None
    lockfile.put(dataclasses.replace(entry, artifact_hash="f" * 64))  # reinstalled since: admitted again
    assert early.admitted_for(SLUG, "runc", config=config, env=env, lockfile=lockfile) is None


def test_without_an_engine_nothing_is_prelaunched_and_nothing_is_left(env: dict[str, str]) -> None:
    """The engine is unreachable: no container, no run directory; the run's own path reports the failure."""
    assert prelaunch(SLUG, runtime="runc", owner=owner_token(), env=env, limits=ContainerLimits()) is None
    root = run_root(env)
    assert not root.exists() or list(root.iterdir()) == []


@pytest.mark.parametrize("flag", ["0", ""])
def test_a_run_that_would_be_refused_is_never_prelaunched(env: dict[str, str], flag: str) -> None:
    """Admission first: with the sandbox flag off the prelaunch does not even reach for the engine."""
    off = {**env, "AGENTNODE_AGENT_SANDBOX": flag}
    assert prelaunch(SLUG, runtime="runc", owner=owner_token(), env=off, limits=ContainerLimits()) is None
    assert prelaunch("not-installed", runtime="runc", owner=owner_token(), env=env,
                     limits=ContainerLimits()) is None  # fmt: skip
