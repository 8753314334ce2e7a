"""Pack install against the real engine: per-version labelled volumes, contents checked from a container,
no pack code on the host, reuse of identical content, and runs that mount only the lockfile's volume."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from docker.types import Mount

from host.core.owner import owner_token
from host.engine.labels import LABEL_ARTIFACT, LABEL_OWNER, LABEL_SLUG
from host.engine.tararchive import upload_tar
from host.engine.volumes import volume_name
from host.packs.files import artifact_hash
from host.packs.install import LABEL_PACK, LABEL_PACK_VERSION, install_pack
from host.spec.config import load_config
from host.spec.egress import egress_config
from host.spec.lockfile import Lockfile
from tests.support.host_state import HostState

pytestmark = [pytest.mark.docker, pytest.mark.podman]

LIST_PACK = r"""
import json, os
files = {}
for root, _, names in os.walk("/pack"):
    for name in names:
        path = os.path.join(root, name)
        with open(path, encoding="utf-8") as fh:
            files[os.path.relpath(path, "/pack")] = fh.read()
try:
    open("/pack/.probe", "w").close()
    writable = True
except OSError:
    writable = False
print(json.dumps({"files": files, "writable": writable}))
"""

MARKER_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("pack code ran on the host")
"""


@pytest.fixture
def volumes(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Volumes a test made (through install); removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            docker_client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass


def volume_contents(client: docker.DockerClient, image: str, volume: str) -> dict[str, Any]:
    """The files of a volume, read by a throwaway container that mounts it read-only (then removed)."""
    container = client.containers.create(
        image,
        ["-c", LIST_PACK],
        entrypoint=["/usr/bin/python3"],
        user="65532:65532",
        network_mode="none",
        read_only=True,
        labels={LABEL_OWNER: owner_token()},
        mounts=[Mount(target="/pack", source=volume, type="volume", read_only=True)],
    )
    try:
        container.start()
        status = container.wait(timeout=120)
        out = container.logs(stdout=True, stderr=False).decode()
        assert status["StatusCode"] == 0, container.logs().decode()
    finally:
        container.remove(force=True)
    return dict(json.loads(out))


def write_pack(
    base: Path, slug: str, files: dict[str, str], *, version: str = "1.0.0", extra: str = ""
) -> Path:
    d = base / slug
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    (d / "agentnode.yaml").write_text(
        f'package_id: {slug}\nversion: "{version}"\npackage_type: agent\n'
        f'agent:\n  entrypoint: "agent:run"\n{extra}'
    )
    return d


def pack_files(pack: Path) -> dict[str, str]:
    return {p.relative_to(pack).as_posix(): p.read_text() for p in pack.rglob("*") if p.is_file()}


@pytest.mark.parametrize("layout", ["flat", "src"])
def test_install_copies_the_pack_into_a_labelled_per_version_volume(
    host_state: HostState, tmp_path: Path, volumes: list[str], layout: str
) -> None:
    slug = f"pk-layout-{layout}"
    prefix = "src/" if layout == "src" else ""
    pack = write_pack(
        tmp_path,
        slug,
        {
            f"{prefix}agent.py": "def run(context, **kwargs):\n    return 'hi'\n",
            f"{prefix}helpers/util.py": "VALUE = 1\n",
            "README.md": "docs\n",
        },
    )
    (pack / prefix / "__pycache__").mkdir()
    (pack / prefix / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\0junk")
    entry = host_state.install(pack)
    assert entry.sandbox_volume is not None
    volumes.append(entry.sandbox_volume)

    digest = artifact_hash(pack)
    assert entry.artifact_hash == digest
    assert (
        entry.sandbox_volume
        == volume_name(slug, "1.0.0", digest)
        == f"agentnode-pack-{slug}-1.0.0-{digest[:16]}"
    )
    assert entry.import_subdir == ("src" if layout == "src" else "")
    labels = host_state.client.volumes.get(entry.sandbox_volume).attrs["Labels"]
    assert labels == {LABEL_ARTIFACT: digest, LABEL_PACK: slug, LABEL_PACK_VERSION: "1.0.0"}

    seen = volume_contents(host_state.client, host_state.image, entry.sandbox_volume)
    expected = {rel: text for rel, text in pack_files(pack).items() if "__pycache__" not in rel}
    assert seen["files"] == expected
    assert seen["writable"] is False
    # The container that carried the files in is gone.
    assert host_state.client.api.containers(all=True, filters={"label": f"{LABEL_PACK}={slug}"}) == []


def test_install_runs_no_pack_code_on_the_host(
    host_state: HostState, tmp_path: Path, volumes: list[str]
) -> None:
    marker = tmp_path / "marker"
    code = MARKER_CODE.format(marker=str(marker))
    pack = write_pack(
        tmp_path,
        "pk-no-exec",
        {
            "agent.py": code + "def run(context, **kwargs):\n    return 1\n",
            "__init__.py": code,
            "setup.py": code,
            "conftest.py": code,
            "sitecustomize.py": code,
            "usercustomize.py": code,
            "pk_no_exec.pth": f"import pathlib; pathlib.Path({str(marker)!r}).write_text('pth')\n",
        },
    )
    entry = host_state.install(pack)
    assert entry.sandbox_volume is not None
    volumes.append(entry.sandbox_volume)
    trusted = host_state.install(pack, trust="trusted")  # the host copy is a byte copy, too
    assert trusted.host_path is not None and Path(trusted.host_path, "setup.py").read_text() == code
    assert not marker.exists()


def test_reinstalling_identical_content_reuses_the_volume(
    host_state: HostState, tmp_path: Path, volumes: list[str]
) -> None:
    pack = write_pack(tmp_path, "pk-reuse", {"agent.py": "def run(context, **kwargs):\n    return 1\n"})
    first = host_state.install(pack)
    assert first.sandbox_volume is not None
    volumes.append(first.sandbox_volume)
    client = host_state.client
    # Leave a sentinel in the volume: a recreated volume would not have it.
    holder = client.api.create_container(
        host_state.image,
        entrypoint=["/bin/true"],
        labels={LABEL_OWNER: owner_token()},
        host_config=client.api.create_host_config(
            mounts=[Mount(target="/pack", source=first.sandbox_volume, type="volume")], network_mode="none"
        ),
    )
    try:
        buf = io.BytesIO()
        with upload_tar(buf) as tar:
            info = tarfile.TarInfo("sentinel.txt")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"kept"))
        assert client.api.put_archive(holder["Id"], "/pack", buf.getvalue())
    finally:
        client.api.remove_container(holder["Id"], force=True)
    # Read after the sentinel went in: Docker's local driver reports the data directory's change time as
    # CreatedAt, so our own write moves it (the old order failed whenever the write crossed a second).
    created_at = client.volumes.get(first.sandbox_volume).attrs["CreatedAt"]

    again = host_state.install(pack)
    assert again.sandbox_volume == first.sandbox_volume
    assert client.volumes.get(first.sandbox_volume).attrs["CreatedAt"] == created_at
    files = volume_contents(client, host_state.image, first.sandbox_volume)["files"]
    assert files.get("sentinel.txt") == "kept"


def test_a_changed_pack_gets_a_new_volume(host_state: HostState, tmp_path: Path, volumes: list[str]) -> None:
    pack = write_pack(tmp_path, "pk-change", {"agent.py": "def run(context, **kwargs):\n    return 1\n"})
    first = host_state.install(pack)
    assert first.sandbox_volume is not None
    volumes.append(first.sandbox_volume)
    (pack / "agent.py").write_text("def run(context, **kwargs):\n    return 2\n")
    second = host_state.install(pack)
    assert second.sandbox_volume is not None
    volumes.append(second.sandbox_volume)
    assert second.version == first.version and second.artifact_hash != first.artifact_hash
    assert second.sandbox_volume != first.sandbox_volume
    assert second.sandbox_volume.endswith(second.artifact_hash[:16])
    lock = Lockfile(host_state.dir / "agentnode.lock").get("pk-change")
    assert lock is not None and lock.sandbox_volume == second.sandbox_volume
    files = volume_contents(host_state.client, host_state.image, second.sandbox_volume)["files"]
    assert files["agent.py"].endswith("return 2\n")


def test_pack_dependencies_are_recorded_and_never_installed(
    host_state: HostState, tmp_path: Path, volumes: list[str]
) -> None:
    """`dependencies` reference other packs (the agentnode format); like the SDK, install fetches none."""
    pack = write_pack(
        tmp_path,
        "pk-deps",
        {"agent.py": "def run(context, **kwargs):\n    return 1\n"},
        extra="dependencies:\n  - package_id: pk-absent\n    role: search\n    is_required: true\n"
        "  - requests>=2\n",
    )
    entry = host_state.install(pack)
    assert entry.sandbox_volume is not None
    volumes.append(entry.sandbox_volume)
    assert entry.manifest["dependencies"] == [
        {"package_slug": "pk-absent", "role": "search", "required": True, "min_version": None}
    ]
    assert Lockfile(host_state.dir / "agentnode.lock").get("pk-absent") is None
    assert host_state.client.volumes.list(filters={"label": f"{LABEL_PACK}=pk-absent"}) == []


def test_a_run_mounts_exactly_the_lockfile_volume(
    host_state: HostState, make_agent: Callable[..., Path], volumes: list[str], runtime: str
) -> None:
    agent = make_agent(
        "pk-mounts",
        """
        import time
        def run(context, **kwargs):
            time.sleep(2)
            with open("/pack/data.txt") as fh:
                return fh.read()
        """,
    )
    (agent / "data.txt").write_text("installed content")
    entry = host_state.install(agent)
    assert entry.sandbox_volume is not None
    volumes.append(entry.sandbox_volume)
    client = host_state.client
    seen: list[dict[str, Any]] = []

    def inspect_while_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen:
            for c in client.api.containers(filters={"label": f"{LABEL_SLUG}=pk-mounts"}):
                seen.extend(client.api.inspect_container(c["Id"])["Mounts"])
            time.sleep(0.1)

    watcher = threading.Thread(target=inspect_while_running)
    watcher.start()
    host = host_state.host()
    try:
        result = host.run("pk-mounts", runtime=runtime)
    finally:
        host.close()
        watcher.join()
    assert result.success and result.result == "installed content", (result.error_code, result.error)
    by_target = {m["Destination"]: m for m in seen}
    assert set(by_target) == {"/pack", "/run/agentnode"}
    pack_mount, socket_mount = by_target["/pack"], by_target["/run/agentnode"]
    assert pack_mount["Type"] == "volume" and pack_mount["Name"] == entry.sandbox_volume
    assert pack_mount["RW"] is False and socket_mount["RW"] is False
    assert socket_mount["Type"] == "bind" and socket_mount["Source"].endswith(f"run-{result.run_id}")
    labels = client.volumes.get(entry.sandbox_volume).attrs["Labels"]
    assert labels[LABEL_ARTIFACT] == entry.artifact_hash


def test_install_warns_of_network_the_config_does_not_grant(
    host_state: HostState, tmp_path: Path, volumes: list[str]
) -> None:
    """A sandboxed pack's declared network is checked against agent_sandbox.egress at install: what is not
    granted is named (normalized, so a pack cannot put control text in it); what is granted is not."""
    pack = write_pack(
        tmp_path,
        "pk-net",
        {"agent.py": "def run(context, **kwargs):\n    return 1\n"},
        extra="permissions:\n  network:\n    level: restricted\n"
        "    allowed_domains: [API.granted.example, other.example, \"bad\\u001b[31m.example\"]\n",
    )
    cfg = load_config(host_state.env)
    egress = egress_config({"allow": ["api.granted.example"]}, "e", lambda *a: ValueError(a))
    warnings: list[str] = []
    entry = install_pack(pack, trust="unverified", paths=cfg.paths, client=host_state.client,
                         image=cfg.agent_sandbox.image, warnings=warnings, egress=egress)  # fmt: skip
    assert entry.sandbox_volume is not None
    volumes.append(entry.sandbox_volume)
    assert entry.manifest["permissions"]["network"] == {
        "level": "restricted", "allowed_domains": ["api.granted.example", "other.example"]}  # fmt: skip
    network = [line for line in warnings if "agent_sandbox.egress" in line]
    assert len(network) == 1 and "other.example" in network[0] and "api.granted.example" not in network[0]
    assert any("allowed_domains[2]" in line for line in warnings)  # the unreadable entry, not echoed
    assert all("\x1b" not in line for line in warnings)
