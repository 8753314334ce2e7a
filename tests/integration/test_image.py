"""The real pinned image: what a container of it holds, how it is labelled, and when a build is skipped."""

from __future__ import annotations

import importlib.metadata
import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from host.core.errors import AuditReason, EngineError
from host.core.owner import owner_token
from host.engine.image import build_image, image_status, verify_pinned_image
from host.engine.labels import LABEL_OWNER
from host.engine.recipe import image_inputs_hash
from sandbox_wrapper import PROTOCOL_VERSION
from tests.support.paths import REPO

pytestmark = [pytest.mark.docker, pytest.mark.podman]

RunPython = Callable[..., dict[str, Any]]


@pytest.fixture
def run_python(docker_client: docker.DockerClient, pinned_image: str) -> Iterator[RunPython]:
    """Run a Python snippet in a network-less container of the pinned image as its default user.

    The snippet prints one JSON document, which is returned; every container is removed afterwards.
    """
    created: list[Any] = []

    def run(code: str, **kwargs: Any) -> dict[str, Any]:
        container = docker_client.containers.run(
            pinned_image,
            entrypoint=["/usr/bin/python3", "-c", code],
            network_mode="none",
            labels={LABEL_OWNER: owner_token()},
            detach=True,
            **kwargs,
        )
        created.append(container)
        status = container.wait(timeout=60)
        output = container.logs(stdout=True, stderr=True).decode()
        assert status["StatusCode"] == 0, output
        result: dict[str, Any] = json.loads(output)
        return result

    yield run
    for container in created:
        container.remove(force=True)


def test_the_wrapper_and_the_grpc_runtime_import_as_the_sandbox_user(run_python: RunPython) -> None:
    facts = run_python(
        "import grpc, google.protobuf, sandbox_wrapper, json, os\n"
        "print(json.dumps({'grpc': grpc.__version__, 'protobuf': google.protobuf.__version__,"
        " 'protocol': sandbox_wrapper.PROTOCOL_VERSION, 'uid': os.getuid(), 'gid': os.getgid(),"
        " 'groups': os.getgroups(), 'cwd': os.getcwd(), 'home': os.environ.get('HOME')}))"
    )
    assert facts == {
        "grpc": importlib.metadata.version("grpcio"),
        "protobuf": importlib.metadata.version("protobuf"),
        "protocol": PROTOCOL_VERSION,
        "uid": 65532,
        "gid": 65532,
        "groups": [65532],
        "cwd": "/home/sandbox",
        "home": "/home/sandbox",
    }


def test_everything_the_wrapper_imports_has_bytecode_in_the_image(run_python: RunPython) -> None:
    """The root is read-only, so a module without bytecode would be compiled again by every sandbox."""
    facts = run_python(
        "import grpc, sandbox_wrapper._runner, sandbox_wrapper._context, sys, os, json\n"
        "found = [m.__spec__.cached for m in list(sys.modules.values())\n"
        "         if getattr(m, '__spec__', None) is not None and m.__spec__.cached]\n"
        "missing = sorted(c for c in found if not os.path.exists(c))\n"
        "print(json.dumps({'checked': len(found), 'missing': missing}))"
    )
    assert facts["checked"] > 100  # the stdlib, grpc, protobuf and the wrapper
    assert facts["missing"] == []


def test_the_wrapper_stays_importable_when_pythonpath_is_replaced(run_python: RunPython) -> None:
    facts = run_python(
        "import json, sandbox_wrapper\nprint(json.dumps({'file': sandbox_wrapper.__file__}))",
        environment={"PYTHONPATH": "/pack"},
    )
    assert facts == {"file": "/opt/agentnode/site/sandbox_wrapper/__init__.py"}


ROOTFS_PROBE = """
import importlib.util, json, os, pwd, shutil, stat

def files(top):
    for d, _, names in os.walk(top):
        for name in names:
            path = os.path.join(d, name)
            if not os.path.islink(path):
                yield path

me = pwd.getpwuid(os.getuid())
print(json.dumps({
    "tools": {t: shutil.which(t) for t in ("pip", "pip3", "apt", "apt-get", "sh", "bash", "dash", "perl")},
    "pip_module": importlib.util.find_spec("pip") is not None,
    "ensurepip": importlib.util.find_spec("ensurepip") is not None,
    "special": [p for top in ("/usr", "/etc", "/opt") for p in files(top)
                if os.lstat(p).st_mode & (stat.S_ISUID | stat.S_ISGID)],
    "user": [me.pw_name, me.pw_dir, me.pw_shell],
    "site_writable": os.access("/opt/agentnode/site", os.W_OK),
    "home_owner": os.stat("/home/sandbox").st_uid,
    "mountpoints": [os.path.isdir(p) for p in ("/pack", "/run/agentnode")],
    "apt_lists": [n for n in os.listdir("/var/lib/apt/lists") if n not in ("lock", "partial")]
                 if os.path.isdir("/var/lib/apt/lists") else [],
    "docs": [p for p in files("/usr/share/doc") if os.path.basename(p) != "copyright"],
    "man": list(files("/usr/share/man")),
}))
"""


def test_the_rootfs_has_no_package_manager_no_setuid_and_a_read_only_site(
    run_python: RunPython, record_property: Callable[[str, object], None]
) -> None:
    facts = run_python(ROOTFS_PROBE)
    tools = facts["tools"]
    record_property("shells_present", [t for t in ("sh", "bash", "dash") if tools[t]])
    print(f"\nimage tools: {tools}")
    assert [tools[t] for t in ("pip", "pip3", "apt", "apt-get")] == [None] * 4
    assert facts["pip_module"] is False and facts["ensurepip"] is False
    assert facts["special"] == []
    assert facts["user"] == ["sandbox", "/home/sandbox", "/usr/sbin/nologin"]
    assert facts["site_writable"] is False
    assert facts["home_owner"] == 65532
    assert facts["mountpoints"] == [True, True]
    assert facts["apt_lists"] == [] and facts["docs"] == [] and facts["man"] == []


def test_labels_and_config_describe_the_image(docker_client: docker.DockerClient, pinned_image: str) -> None:
    attrs = docker_client.images.get(pinned_image).attrs
    config = attrs["Config"]
    labels = config["Labels"]
    assert labels["io.agentnode.sandbox.protocol"] == str(PROTOCOL_VERSION)
    assert labels["io.agentnode.sandbox.inputs-hash"] == image_inputs_hash(REPO)
    for key in ("title", "description", "version", "created", "licenses"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert config["User"] == "65532:65532"
    assert config["WorkingDir"] == "/home/sandbox"
    assert config["Entrypoint"] == ["/usr/bin/python3", "-m", "sandbox_wrapper"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]
    print(f"\nimage {pinned_image}: {attrs['Size'] / 2**20:.1f} MiB")


def test_a_rebuild_with_unchanged_inputs_is_skipped(
    docker_client: docker.DockerClient, pinned_image: str
) -> None:
    lines: list[str] = []
    start = time.monotonic()
    result = build_image(docker_client, repo_root=REPO, progress=lines.append)
    elapsed = time.monotonic() - start
    assert result.built is False
    assert result.image_id == pinned_image
    assert result.inputs_hash == image_inputs_hash(REPO)
    assert elapsed < 5, elapsed
    assert any("up to date" in line for line in lines)
    assert docker_client.images.get("agentnode-sandbox:latest").id == pinned_image


def test_the_pinned_image_verifies_and_reports_up_to_date(
    docker_client: docker.DockerClient, pinned_image: str
) -> None:
    assert verify_pinned_image(docker_client, pinned_image).id == pinned_image
    status = image_status(docker_client, pinned_image, repo_root=REPO)
    assert (status.present, status.matches_pin, status.up_to_date) == (True, True, True)
    assert status.protocol == PROTOCOL_VERSION


def test_wrong_or_missing_pins_are_refused(docker_client: docker.DockerClient, pinned_image: str) -> None:
    base = docker_client.images.list(name="agentnode-sandbox-base")[0]  # a real image, but not a sandbox one
    cases: list[tuple[str | None, AuditReason]] = [
        (None, AuditReason.IMAGE_NOT_PINNED),
        ("agentnode-sandbox:latest", AuditReason.IMAGE_NOT_PINNED),
        ("sha256:" + "0" * 64, AuditReason.IMAGE_MISSING),
        ("agentnode-sandbox@sha256:" + "0" * 64, AuditReason.IMAGE_MISSING),
        (base.id, AuditReason.IMAGE_MISMATCH),
    ]
    for pin, reason in cases:
        with pytest.raises(EngineError) as err:
            verify_pinned_image(docker_client, pin)
        assert err.value.reason is reason, pin
        assert "agentnode-sandbox image build" in err.value.hint


def test_an_image_with_another_protocol_is_refused(
    docker_client: docker.DockerClient, pinned_image: str
) -> None:
    dockerfile = io.BytesIO(f"FROM {pinned_image}\nLABEL io.agentnode.sandbox.protocol=999\n".encode())
    image, _ = docker_client.images.build(fileobj=dockerfile, network_mode="none", rm=True, forcerm=True)
    try:
        with pytest.raises(EngineError) as err:
            verify_pinned_image(docker_client, image.id)
        assert err.value.reason is AuditReason.PROTOCOL_MISMATCH
    finally:
        docker_client.images.remove(image.id)
