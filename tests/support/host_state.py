"""An isolated host for tests against the real engine: its own config dir, lockfile, audit log and env."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import docker
import docker.errors

from host.engine.engine import open_engine
from host.packs.install import LABEL_PACK, install_pack
from host.runtime.runner import SandboxHost
from host.spec.config import load_config
from host.spec.lockfile import LockEntry, Lockfile


class HostState:
    """An isolated host: its own config dir, lockfile, audit log and environment."""

    def __init__(self, root: Path, image: str, client: docker.DockerClient) -> None:
        self.root = root
        self.dir = root / "agentnode"
        self.dir.mkdir(parents=True)
        self.image = image
        self.client = client
        self.env: dict[str, str] = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "AGENTNODE_CONFIG": str(self.dir),
            "AGENTNODE_AGENT_SANDBOX": "1",
        }
        if os.environ.get("DOCKER_HOST"):  # the engine under test (Podman's pass names its socket)
            self.env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
        self.write_config({})
        self.engine = open_engine(self.env)
        """The host's own engine client (what a SandboxHost made here uses); `client` is the SDK's."""
        # A pack volume's name is its content's: one already there (the demo's hello-agent) is shared.
        self._volumes_before = {v.name for v in client.volumes.list(filters={"label": LABEL_PACK})}

    def write_config(self, agent_sandbox: dict[str, Any]) -> None:
        section = {"image": self.image, **agent_sandbox}
        (self.dir / "config.json").write_text(json.dumps({"agent_sandbox": section}))

    def install(self, pack: Path, trust: str = "unverified") -> LockEntry:
        cfg = load_config(self.env)
        return install_pack(
            pack, trust=trust, paths=cfg.paths, client=self.client, image=cfg.agent_sandbox.image
        )

    def host(self, **kwargs: Any) -> SandboxHost:
        kwargs.setdefault("client_factory", lambda: self.engine)
        return SandboxHost(env=self.env, **kwargs)

    def run_once(self, pack: Path, slug: str, runtime: str) -> Any:
        """Install `pack`, run `slug` once on a host of its own under `runtime`, and return what the agent
        returned (the run must succeed)."""
        self.install(pack)
        host = self.host()
        try:
            result = host.run(slug, runtime=runtime)
        finally:
            host.close()
        assert result.success, (result.error_code, result.error, result.logs)
        return result.result

    def remove_volumes(self) -> list[str]:
        """Remove the pack volumes this host's lockfile names that were not on the engine when it was made,
        however they were installed (API, CLI, via a serve host): the engine keeps a volume until told, and
        one that was there before may be another config's (same pack, same content, same name). A volume
        still in use, or already gone, is left; returns the names removed."""
        removed = []
        lock = self.dir / "agentnode.lock"
        names = {e.sandbox_volume for e in Lockfile(lock).entries().values()} if lock.is_file() else set()
        for name in sorted(n for n in names if n and n not in self._volumes_before):
            with contextlib.suppress(docker.errors.APIError):
                self.client.volumes.get(name).remove()
                removed.append(name)
        return removed

    def audit(self) -> list[dict[str, Any]]:
        """The runs' end records (`agent_run`), oldest first; `audit_all` includes the start records."""
        return [r for r in self.audit_all() if r.get("event") == "agent_run"]

    def audit_all(self) -> list[dict[str, Any]]:
        path = self.dir / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
