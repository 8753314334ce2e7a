"""A cold `run`'s container created and started from the request its last run sent, before any other import.

A new `run` process spends ~100 ms importing and checking before it can ask the engine for its container
(host/runtime/prelaunch.py), and the engine then takes ~200 ms (runc) to start it. When the same command ran
before with the same config, lockfile and environment, its create request is known: `remember` keeps it (with
the run id, owner and socket directory as placeholders) in the config directory, and `begin` replays it on a
thread at the process's first step. Up to that request only builtin modules are imported (no `json`,
`socket` or `threading`: their imports would come first); the CLI's imports and checks then overlap the
engine's work.

Nothing here is trusted. The replayed container has no preload, so its wrapper imports nothing of the pack:
it waits for its socket, which the host serves only after it has admitted the run, verified the pin and
the volume, and found that the request replayed is exactly the one it would send for this run
(`host.runtime.prelaunch`). Any difference, a failure or a refusal removes the container (verified) and the
run takes the usual path. A record is read only if this user owns it and its directory and no one else may
write either: writing one takes what running `docker` takes. Bounded: a record is at most
`MAX_RECORD_BYTES`, an engine answer at most `MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import _socket
import _thread
import os
import stat
import time

from host.core.owner import owner_token
from host.core.paths import ADMIN_SOCKET_NAME, config_file_location

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~3 ms to import, and this module runs before the container is asked for
    from collections.abc import Callable, Mapping, Sequence
    from hashlib import sha256
    from typing import Any
else:
    try:  # the builtin module: hashlib loads OpenSSL first (~3 ms)
        from _sha256 import sha256
    except ImportError:  # Python 3.12+ names it _sha2
        from hashlib import sha256

RECORD_VERSION = "agentnode-headstart 1"
"""The first line of a record; any other means no head start."""
MAX_RECORD_BYTES = 256 * 1024
"""A create request is a few KiB; anything larger is not one of ours."""
MAX_ANSWER_BYTES = 64 * 1024
ASK_WAIT_SECONDS = 0.25
"""How long `begin` waits for the start to be asked for (~15 ms: a volume check and a create); a slower
engine goes on answering while the CLI's imports proceed."""
ENGINE_TIMEOUT_SECONDS = 30.0
"""How long the replay waits for each of the engine's answers: a hung engine fails the usual path too."""
RECORD_DIR = "headstart"
"""Under the config directory: one record per (agent, --runtime)."""

# What differs per run, as placeholders in a record's strings. A control character never occurs in the JSON
# text of a request (json.dumps escapes them), nor in the run directory's path (`remember` checks).
_NAME, _DIR, _OWNER = "\x01name\x01", "\x01dir\x01", "\x01owner\x01"
_RUN, _RUN20 = "\x01run\x01", "\x01run20\x01"
_FIELDS = ("key", "engine_socket", "volume", "create", "start", "name", "rundir", "owner_file", "body")
"""A record's lines after its version, in order, then one `file` line per file it stands on."""

_FLAGS = frozenset({"--json", "--follow", "--no-serve", "--debug"})
"""`run` options that change nothing about the sandbox."""
_VALUED = frozenset({
    "--goal", "--arg", "--runtime", "--tenant", "--request-id", "--label", "--max-runtime-seconds",
    "--max-tool-calls", "--max-iterations", "--max-llm-calls", "--max-total-tokens", "--max-cost-usd",
})  # fmt: skip
"""`run` options with a value; of them only --runtime changes the sandbox (the limits only tighten the
policy the host enforces, never the container's)."""
_KEY_ENV = ("HOME", "XDG_RUNTIME_DIR", "TMPDIR")
_KEY_ENV_PREFIXES = ("AGENTNODE_", "DOCKER_", "CONTAINER_HOST")


def plan(argv: Sequence[str]) -> tuple[str, str] | None:
    """(agent, --runtime or "") when `argv` is a local `run` this module may start early, else None.

    Deliberately narrower than the parser: anything it does not know (a global option, --via, --backend, an
    abbreviation) means no head start, never a wrong one."""
    if len(argv) < 2 or argv[0] != "run":
        return None
    slug, runtime = "", ""
    rest = list(argv[1:])
    while rest:
        token = rest.pop(0)
        name, eq, value = token.partition("=")
        if token in _FLAGS:
            continue
        if name in _VALUED:
            if not eq:
                if not rest or rest[0].startswith("-"):
                    return None
                value = rest.pop(0)
            if name == "--runtime":
                runtime = value
            continue
        if token.startswith("-") or slug:
            return None
        slug = token
    return (slug, runtime) if slug else None


def record_path(env: Mapping[str, str], slug: str, runtime: str) -> str:
    """Where the record of (slug, runtime) lives: beside the config, named by a digest (a fixed-length file
    name whatever the slug holds)."""
    directory = os.path.join(os.path.dirname(config_file_location(env)), RECORD_DIR)
    digest = sha256(f"{slug}\x00{runtime}".encode()).hexdigest()[:32]
    return os.path.join(directory, f"{digest}.rec")


def _key(env: Mapping[str, str], slug: str, runtime: str) -> str:
    """What a record holds for: the command, this user and every variable the host reads its paths, engine
    and switches from (digested: none of them is written down)."""
    picked = sorted(f"{k}={v}" for k, v in env.items() if k in _KEY_ENV or k.startswith(_KEY_ENV_PREFIXES))
    material = "\x00".join([RECORD_VERSION, slug, runtime, str(os.geteuid()), *picked])
    return sha256(material.encode("utf-8", "surrogateescape")).hexdigest()


def _stamp(path: str) -> str:
    """A file's identity and version (inode, size, mtime and ctime in ns); "" when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def load_record(env: Mapping[str, str], slug: str, runtime: str) -> dict[str, str] | None:
    """The record of this command if it exists, is private (file and directory) and still holds: the same
    key, and every file it was made from unchanged."""
    path = record_path(env, slug, runtime)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and _private(st) and _private(os.stat(os.path.dirname(path)))):
            return None
        if st.st_size > MAX_RECORD_BYTES:
            return None
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    if len(lines) < len(_FIELDS) + 1 or lines[0] != RECORD_VERSION:
        return None
    record: dict[str, str] = {}
    for name, line in zip(_FIELDS, lines[1 : len(_FIELDS) + 1], strict=True):
        label, _, value = line.partition(" ")
        if label != name:
            return None
        record[name] = value
    if record["key"] != _key(env, slug, runtime):
        return None
    if any(ch in record[k] for k in ("engine_socket", "volume", "create", "start") for ch in " \t\r\x00"):
        return None  # these go into a request line: nothing that could end it early
    for line in lines[len(_FIELDS) + 1 :]:
        if not line:
            continue
        parts = line.split(" ", 5)  # file, the stamp's four numbers, then the path (which may hold spaces)
        if len(parts) != 6 or parts[0] != "file" or _stamp(parts[5]) != " ".join(parts[1:5]):
            return None
    return record


def remember(
    env: Mapping[str, str],
    slug: str,
    runtime: str,
    *,
    files: Sequence[str],
    engine_socket: str,
    volume_target: str,
    create_target: str,
    start_target: str,
    body: Mapping[str, Any],
    run_id: str,
    name: str,
    owner: str,
    rundir: str,
    owner_file: str,
) -> bool:
    """Keep a verified run's create request for the next `run` of the same command (written privately and
    atomically); whether it was. The per-run strings become placeholders, and a record that would not give
    back exactly this request, or that holds something of this run as is, is not kept."""
    import json  # noqa: PLC0415 (the host has it loaded by now; a replay never needs it)

    text = json.dumps(body, sort_keys=True)

    def template(value: str, *, paths: bool = True) -> str:
        """`value` with the per-run strings as placeholders (`paths`: the run directory's too)."""
        pairs = [(name, _NAME), (rundir, _DIR)] if paths else []
        for real, mark in (*pairs, (run_id, _RUN), (f'"{owner}"', f'"{_OWNER}"')):
            value = value.replace(real, mark)
        return value

    record = {
        "key": _key(env, slug, runtime),
        "engine_socket": engine_socket,
        "volume": volume_target,
        "create": template(create_target),
        "start": template(start_target),
        "name": name.replace(run_id[:20], _RUN20),
        "rundir": template(rundir, paths=False),
        "owner_file": template(owner_file, paths=False),
        "body": template(text),
    }
    stamps = [(_stamp(f), f) for f in files]
    values = [text, create_target, start_target, rundir, owner_file, name, owner, engine_socket,
              volume_target, *files]  # fmt: skip
    if any(ch in v for v in values for ch in "\n\r\x01") or not all(stamp for stamp, _ in stamps):
        return False  # a line break or placeholder character in a value, or a file that is missing
    sent = {"create": create_target, "start": start_target, "rundir": rundir, "owner_file": owner_file,
            "body": text}  # fmt: skip
    per_run = {"name": name, "rundir": rundir, "run_id": run_id, "owner": owner}
    replayed = _instantiate({k: record[k] for k in sent}, **per_run)
    if replayed != sent or _RUN20 not in record["name"] or run_id[:12] in record["body"]:
        return False
    path = record_path(env, slug, runtime)
    directory = os.path.dirname(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    lines = [RECORD_VERSION, *(f"{k} {record[k]}" for k in _FIELDS), *(f"file {st} {f}" for st, f in stamps)]
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _private(os.stat(directory)):
            return False
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def forget(env: Mapping[str, str], slug: str, runtime: str) -> None:
    """Drop the record of a command whose replay did not fit: the next run records a fresh one."""
    try:
        os.unlink(record_path(env, slug, runtime))
    except OSError:
        pass


def _instantiate(
    record: Mapping[str, str], *, name: str, rundir: str, run_id: str, owner: str
) -> dict[str, str]:
    def fill(value: str) -> str:
        value = value.replace(f'"{_OWNER}"', f'"{owner}"').replace(_NAME, name)
        return value.replace(_DIR, rundir).replace(_RUN, run_id)

    return {k: fill(v) for k, v in record.items()}


class Headstart:
    """A container being created and started from a record, on a thread of its own; adopted by the host
    (host/runtime/prelaunch.py) or discarded (`discard`, verified removal)."""

    def __init__(self, slug: str, runtime: str, record: Mapping[str, str]) -> None:
        self.slug, self.runtime = slug, runtime
        self.run_id = os.urandom(16).hex()
        self.owner = owner_token()
        self.name = record["name"].replace(_RUN20, self.run_id[:20])
        self.engine_socket, self.volume_target = record["engine_socket"], record["volume"]
        self.launched_at = time.monotonic()
        self.container_id = ""
        self.error = ""
        self.started_ok = False
        self.adopted = False
        """Taken by the run as its sandbox (host/runtime/prelaunch.py): then never discarded."""
        self._settled = False
        per_run = {"name": self.name, "run_id": self.run_id, "owner": self.owner}
        self.rundir = _instantiate({"rundir": record["rundir"]}, rundir="", **per_run)["rundir"]
        early = {k: record[k] for k in ("create", "start", "owner_file", "body")}
        filled = _instantiate(early, rundir=self.rundir, **per_run)
        self.owner_file, self.body_text = filled["owner_file"], filled["body"]
        self.create_target, self.start_target = filled["create"], filled["start"]
        # _thread's locks as events (threading is not imported yet): each is held until its moment has come
        self._created, self._finished = _thread.allocate_lock(), _thread.allocate_lock()
        self._asked, self._was_asked = _thread.allocate_lock(), False
        for lock in (self._created, self._finished, self._asked):
            lock.acquire()

    def _asked_now(self) -> None:
        """The start is asked for (or never will be): `begin` may return. Called on this thread only."""
        if not self._was_asked:
            self._was_asked = True
            self._asked.release()

    def begin(self) -> None:
        """Start the thread, and wait until it has asked the engine to start the container (or failed): the
        interpreter's lock, held by the caller's imports, would otherwise make each of the thread's three
        steps wait up to a switch interval (5 ms) for it."""
        _thread.start_new_thread(self._go, ())
        self._wait(self._asked, ASK_WAIT_SECONDS)

    def body(self) -> Any:
        """The create request sent, as JSON."""
        import json  # noqa: PLC0415 (the host has it loaded by now)

        return json.loads(self.body_text)

    def _go(self) -> None:
        created: _thread.LockType | None = self._created
        try:
            os.mkdir(self.rundir, 0o700)
            fd = os.open(self.owner_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, self.owner.encode())
            finally:
                os.close(fd)
            # An engine creates a missing named volume on create: the pack's must exist already, or the
            # usual path meets (and reports) its absence, with no empty volume made in its name.
            status, _ = _call(self.engine_socket, "GET", self.volume_target, None)
            if status != 200:
                raise OSError(f"the pack volume answered {status}")
            status, answer = _call(self.engine_socket, "POST", self.create_target, self.body_text.encode())
            if status != 201:
                raise OSError(f"create answered {status}")
            self.container_id = _container_id(answer)
            self._created.release()
            created = None
            status, _ = _call(self.engine_socket, "POST", self.start_target, None, sent=self._asked_now)
            if status != 204:
                raise OSError(f"start answered {status}")
            self.started_ok = True
        except Exception as exc:  # noqa: BLE001 (the host's path meets and reports any real failure)
            self.error = type(exc).__name__
        finally:
            if created is not None:
                created.release()
            self._asked_now()
            self._finished.release()

    @staticmethod
    def _wait(lock: _thread.LockType, timeout: float) -> bool:
        if lock.acquire(timeout=timeout):
            lock.release()
            return True
        return False

    def created(self, timeout: float = ENGINE_TIMEOUT_SECONDS) -> str:
        """The container's id once the engine created it ("" if it did not)."""
        self._wait(self._created, timeout)
        return self.container_id

    def started(self, timeout: float = 2 * ENGINE_TIMEOUT_SECONDS + 1) -> bool:
        """Whether the engine started it (waits for its answer)."""
        return self._wait(self._finished, timeout) and self.started_ok

    def discard(self) -> None:
        """Remove the container (verified) and its run directory, unless the host adopted it; never raises
        (a failure is left to the startup sweep: its owner, this process, is gone by then)."""
        if self.adopted or self._settled:
            return
        self._settled = True
        self._wait(self._finished, 2 * ENGINE_TIMEOUT_SECONDS + 1)
        from pathlib import Path  # noqa: PLC0415 (only for a discard, as below)

        from host.engine.engine import open_engine, remove_and_verify  # noqa: PLC0415
        from host.runtime.rundir import RunDir  # noqa: PLC0415

        try:
            client = open_engine({**os.environ, "DOCKER_HOST": f"unix://{self.engine_socket}"})  # its engine
            try:
                remove_and_verify(client, self.container_id or self.name, self.name)
            finally:
                client.close()
        except Exception:  # noqa: BLE001,S110 (the startup sweep removes it)
            pass
        try:
            RunDir(Path(self.rundir)).remove()
            Path(self.owner_file).unlink(missing_ok=True)  # the owner file this thread wrote, as named
        except OSError:
            pass


def begin(argv: Sequence[str], env: Mapping[str, str]) -> Headstart | None:
    """Start a cold run's container now if this command has a record that still holds and no `serve` host
    is running for the config (that host takes the run); never raises."""
    try:
        planned = plan(argv)
        if planned is None:
            return None
        slug, runtime = planned
        if os.path.exists(os.path.join(os.path.dirname(config_file_location(env)), ADMIN_SOCKET_NAME)):
            return None
        record = load_record(env, slug, runtime)
        if record is None:
            return None
        early = Headstart(slug, runtime, record)
        early.begin()
        return early
    except Exception:  # noqa: BLE001 (no head start; the usual path does the run)
        return None


def _container_id(answer: bytes) -> str:
    """The `Id` of a create answer (`{"Id":"<64 hex>","Warnings":[...]}`), read without `json` (imported
    only after the request)."""
    at = answer.find(b'"Id"')
    rest = answer[at + 4 :].lstrip(b" \t\r\n:") if at >= 0 else b""
    found = rest[1:65] if rest[:1] == b'"' and rest[65:66] == b'"' else b""
    if len(found) != 64 or found.strip(b"0123456789abcdef"):
        raise OSError("create answered no id")
    return found.decode()


def _call(
    path: str, method: str, target: str, body: bytes | None, *, sent: Callable[[], None] | None = None
) -> tuple[int, bytes]:
    """One HTTP/1.1 request on the engine's Unix socket, the connection closed after it: (status, body).
    `sent` is called once the request is out."""
    head = [f"{method} {target} HTTP/1.1", "Host: docker", "Connection: close"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(ENGINE_TIMEOUT_SECONDS)
        conn.connect(path)
        conn.sendall(request)
        if sent is not None:
            sent()
        chunks: list[bytes] = []
        size = 0
        while chunk := conn.recv(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise OSError("the engine's answer is too large")
    finally:
        conn.close()
    header, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    status = header.split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or not status[1].isdigit():
        raise OSError("not an HTTP answer")
    if b"\r\ntransfer-encoding: chunked" in header.lower():
        payload = _dechunk(payload)
    return int(status[1]), payload


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)


__all__ = ["Headstart", "begin", "forget", "load_record", "plan", "record_path", "remember"]
