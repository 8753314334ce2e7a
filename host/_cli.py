"""The `agentnode-sandbox` command: one scriptable entry point with a stable exit-code and --json contract.

docs/cli.md is the contract: every command, option, exit code and --json schema.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from host._errors import AuditReason, EngineError, PackError, SandboxError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

REPO_ROOT = Path(__file__).resolve().parent.parent
PROG = "agentnode-sandbox"


class _UsageError(Exception):
    """Bad command-line input (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's error shape: `error: …` and `hint: …` on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        _print_error(message, f"see: {self.prog} --help")
        sys.exit(EXIT_USAGE)


def _print_error(message: str, hint: str | None) -> None:
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def _emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(payload, sort_keys=True, default=str) + "\n")
    else:
        human()


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress lines on stderr: always on a TTY, off a TTY only without --json."""
    if args.json and not sys.stderr.isatty():
        return lambda _line: None

    def show(line: str) -> None:
        sys.stderr.write(f"  {line}\n")
        sys.stderr.flush()

    return show


def _pack_payload(entry: Any) -> dict[str, Any]:
    return {k: v for k, v in entry.to_json().items() if k != "manifest"}


# -- run ----------------------------------------------------------------------------------------------


def _parse_args_kv(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise _UsageError(f"--arg expects KEY=JSON with KEY a Python identifier, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            raise _UsageError(
                f"--arg {key}: the value is not JSON (quote strings: {key}='\"text\"')"
            ) from None
    return out


def cmd_run(args: argparse.Namespace) -> int:
    kwargs = _parse_args_kv(args.arg or [])
    audit_failures = 0
    if args.via:
        from host._client import RunnerClient

        with RunnerClient(args.via) as client:
            result = client.submit(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime)
    else:
        from host._runner import SandboxHost

        host = SandboxHost()
        try:
            host.startup_sweep()
            result = host.run(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime)
        finally:
            host.close()
        audit_failures = host.audit_failures
    payload = result.to_json()
    if audit_failures:
        payload["audit_error"] = "the audit record could not be written"

    def human() -> None:
        if result.success:
            print(json.dumps(result.result, indent=2))
            print(
                f"ok: {args.slug} ({result.mode_used}, run {result.run_id[:12]}, {result.duration_ms} ms)",
                file=sys.stderr,
            )
        else:
            _print_error(f"{result.error} [{result.error_code}]", result.hint)
        if audit_failures:
            print("warning: the audit record could not be written", file=sys.stderr)

    _emit(args, payload, human)
    return EXIT_OK if result.success else EXIT_FAILED


def cmd_serve(args: argparse.Namespace) -> int:
    from host._config import load_config
    from host._serve import default_admin_socket, serve

    socket_path = Path(args.socket) if args.socket else default_admin_socket(load_config().paths.dir)

    def ready(path: str) -> None:
        if args.json:
            sys.stdout.write(json.dumps({"socket": path, "warm": args.warm}) + "\n")
            sys.stdout.flush()
        warm = ", ".join(args.warm) or "none"
        print(f"serving on {path} (warm: {warm}); stop with SIGTERM", file=sys.stderr)

    serve(socket_path, warm=args.warm, ready=ready, drain_seconds=args.drain_seconds)
    return EXIT_OK


# -- packs --------------------------------------------------------------------------------------------


def _engine() -> tuple[Any, EngineError | None]:
    """The engine client, or None and the reason it is unreachable (installing trusted packs needs none)."""
    from host._engine import connect

    try:
        return connect(), None
    except EngineError as exc:
        return None, exc


def cmd_install(args: argparse.Namespace) -> int:
    from host._config import load_config
    from host._packs import install_pack

    cfg = load_config()
    path = Path(args.path)
    if not path.is_dir():
        raise _UsageError(f"{path} is not a directory")
    client, engine_error = _engine()
    try:
        entry = install_pack(
            path, trust=args.trust, paths=cfg.paths, client=client, image=cfg.agent_sandbox.image
        )
    except PackError as exc:
        # Without an engine, say why there is none (unavailable vs permission denied), not just "needed".
        if engine_error is not None and exc.reason == AuditReason.ENGINE_UNAVAILABLE:
            raise engine_error from None
        raise
    finally:
        if client is not None:
            client.close()
    _emit(
        args,
        _pack_payload(entry),
        lambda: print(
            f"installed {entry.slug} {entry.version} ({entry.package_type}, trust {entry.trust_level})"
            + (f" into volume {entry.sandbox_volume}" if entry.sandbox_volume else "")
        ),
    )
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    from host._config import load_config
    from host._packs import uninstall_pack

    client, _ = _engine()
    try:
        entry = uninstall_pack(args.slug, paths=load_config().paths, client=client)
    finally:
        if client is not None:
            client.close()
    leftover = entry.sandbox_volume if client is None else None
    payload = {**_pack_payload(entry), "volume_left_behind": leftover}

    def human() -> None:
        print(f"uninstalled {entry.slug} {entry.version}")
        if leftover:
            print(
                f"warning: the engine is not reachable, so volume {leftover} was kept "
                f"(remove it later: docker volume rm {leftover})",
                file=sys.stderr,
            )

    _emit(args, payload, human)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from host._config import load_config
    from host._packs import Lockfile

    entries = Lockfile(load_config().paths.lockfile).entries()
    rows = [
        {
            "slug": e.slug,
            "version": e.version,
            "package_type": e.package_type,
            "trust_level": e.trust_level,
            "artifact_hash": e.artifact_hash,
            "sandbox_volume": e.sandbox_volume,
        }
        for e in sorted(entries.values(), key=lambda e: e.slug)
    ]

    def human() -> None:
        if not rows:
            print(f"no packs installed ({PROG} install PATH)")
        for r in rows:
            print(f"{r['slug']:<32} {r['version']:<12} {r['package_type']:<9} {r['trust_level']}")

    _emit(args, rows, human)
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    from host._manifest import SLUG_RE
    from host._scaffold import next_steps, scaffold

    if not SLUG_RE.fullmatch(args.name):
        raise _UsageError(
            f"NAME must be a pack slug ({SLUG_RE.pattern}: lower case, digits, '.', '_', '-'), "
            f"got {args.name!r}"
        )
    parent = Path(args.dir) if args.dir else Path.cwd()
    target, files = scaffold(args.name, kind=args.type, parent=parent)
    print(f"created {args.type} pack {args.name} in {target}:")
    for f in files:
        print(f"  {f.relative_to(target)}")
    print("next:")
    for step in next_steps(args.name, args.type, target):
        print(f"  {step}")
    return EXIT_OK


# -- image --------------------------------------------------------------------------------------------


def _pull(client: Any, ref: str, progress: Callable[[str], None], *, bars: bool) -> None:
    """`docker pull REF` through the SDK, relaying status lines (and progress bars on a TTY)."""
    import docker.errors
    import requests.exceptions

    from host._engine import classify_engine_exception

    hint = (
        "check the reference and that the engine can reach its registry (docker pull REF); "
        f"without a registry, build the image here: {PROG} image build"
    )
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if "error" in event:
                raise EngineError(
                    f"could not pull {ref}: {str(event['error']).strip()[:200]}",
                    reason=AuditReason.IMAGE_MISSING, hint=hint, check="image",
                )  # fmt: skip
            status = str(event.get("status", "")).strip()
            bar = str(event.get("progress", "")) if bars else ""
            if status and (bars or not event.get("progressDetail")):
                layer = f"{event['id']}: " if event.get("id") else ""
                progress(f"pull: {layer}{status} {bar}".rstrip())
    except docker.errors.APIError as exc:
        if exc.status_code in (400, 404, 500):
            explanation = str(exc.explanation or "").strip()[:200]
            raise EngineError(
                f"could not pull {ref} ({exc.status_code}): {explanation}",
                reason=AuditReason.IMAGE_MISSING, hint=hint, check="image",
            ) from None  # fmt: skip
        raise classify_engine_exception(exc) from None
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise classify_engine_exception(exc) from None


def cmd_image(args: argparse.Namespace) -> int:
    from host._config import load_config, set_image_pin
    from host._engine import connect
    from host._image import build_image, image_status, verify_pinned_image

    cfg = load_config()
    client = connect()
    try:
        if args.image_cmd == "build":
            res = build_image(client, repo_root=REPO_ROOT, progress=_progress(args), force=args.force)
            set_image_pin(cfg.paths, res.image_id)
            payload = {
                "image_id": res.image_id,
                "tag": res.tag,
                "inputs_hash": res.inputs_hash,
                "built": res.built,
                "pinned_in": str(cfg.paths.config_file),
            }
            _emit(
                args,
                payload,
                lambda: print(
                    f"{'built' if res.built else 'up to date'}: {res.tag} {res.image_id} "
                    f"(pinned in {cfg.paths.config_file})"
                ),
            )
            return EXIT_OK
        if args.image_cmd == "pull":
            _pull(client, args.ref, _progress(args), bars=sys.stderr.isatty())
            # A digest reference is itself a pin; a tag is pinned by the id of what was pulled.
            pin = args.ref if "@sha256:" in args.ref else client.images.get(args.ref).id
            image = verify_pinned_image(client, pin)
            set_image_pin(cfg.paths, pin)
            where = str(cfg.paths.config_file)
            pulled = {"ref": args.ref, "image_id": image.id, "pin": pin, "pinned_in": where}
            _emit(args, pulled, lambda: print(f"pulled {args.ref}: pinned {pin} in {where}"))
            return EXIT_OK
        st = image_status(client, cfg.agent_sandbox.image, repo_root=REPO_ROOT)
        problem: EngineError | None = None
        try:
            verify_pinned_image(client, cfg.agent_sandbox.image)
        except EngineError as exc:
            if exc.check != "image":
                raise
            problem = exc
        status = {
            **st.__dict__,
            "pin": cfg.agent_sandbox.image,
            "usable": problem is None,
            "problem": problem.message if problem else None,
        }

        def human() -> None:
            print(
                f"pin: {cfg.agent_sandbox.image or '(none)'}\n"
                f"present: {st.present}  matches pin: {st.matches_pin}  "
                f"protocol: {st.protocol}  up to date: {st.up_to_date}"
            )
            if problem is not None:
                _print_error(problem.message, problem.hint)

        _emit(args, status, human)
        return EXIT_OK if problem is None else EXIT_FAILED
    finally:
        client.close()


# -- doctor, policy, audit -----------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from host._doctor import run_doctor

    report = run_doctor(args.slug)

    def human() -> None:
        for c in report.checks:
            print(f"  {'ok' if c.ok else 'FAIL':<5} {c.check:<20} {c.detail}")
            if c.fix:
                print(f"  {'':<5} {'':<20} fix: {c.fix}")
        failed = sum(1 for c in report.checks if not c.ok)
        print("ready" if report.ready else f"not ready: {failed} check(s) failed")

    _emit(args, report.to_json(), human)
    return EXIT_OK if report.ready else EXIT_FAILED


def _human_explain(p: Mapping[str, Any]) -> None:
    req, llm = p["requested"], p["llm"]

    def line(label: str, value: Any) -> None:
        print(f"  {label + ':':<21} {value}")

    def capped(key: str) -> str:
        lowered = f" (the host ceiling lowered it from {req[key]})" if key in p["clamped"] else ""
        return f"{p[key]}{lowered}"

    print(f"{p['slug']} {p['version']} (trust {p['trust']})")
    line("route", f"{p['route']}: {p['route_message']}")
    if p["hint"]:
        line("hint", p["hint"])
    if p["runtime"]:
        line("sandbox", f"runtime {p['runtime']}, image {p['image'] or '(not pinned)'}")
    line("tools", ", ".join(p["allowed_packages"]) or "(none)")
    line("max_tool_calls", capped("max_tool_calls"))
    line("max_runtime_seconds", f"{capped('max_runtime_seconds')} (idle limit {p['idle_timeout_seconds']})")
    line("max_iterations", capped("max_iterations"))
    if not llm["enabled"]:
        line("llm", "not granted (llm_access.enabled is not true, or the host disabled it)")
    else:
        if p["route"] == "host":
            line("llm", "host path: llm_access caps do not apply (sanity bounds below)")
        for key in ("max_calls", "max_input_chars", "max_output_chars"):
            lowered = f" (lowered from {req['llm'][key]})" if key in llm["clamped"] else ""
            line(f"llm {key}", f"{llm[key]}{lowered}")
        models = llm["allowed_models"]
        line("llm models", "any host model" if models is None else ", ".join(models) or "none")
    provider = f"{llm['provider'] or '(none)'} {llm['model'] or ''}".strip()
    line("llm provider", f"{provider} ({'configured' if llm['configured'] else 'not configured'})")
    line("clamped by the host", ", ".join(p["clamped"]) or "nothing")


def cmd_policy(args: argparse.Namespace) -> int:
    from host._explain import explain_policy

    payload = explain_policy(args.slug).to_json()
    _emit(args, payload, lambda: _human_explain(payload))
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    from host._audit import AuditLog, verify_audit
    from host._config import load_config

    path = load_config().paths.audit_file
    if args.audit_cmd == "verify":
        rep = verify_audit(path)
        payload = {"ok": rep.ok, "records": rep.records, "problems": rep.problems, "path": str(path)}

        def human() -> None:
            print(f"{'ok' if rep.ok else 'FAILED'}: {rep.records} records in {path}")
            for p in rep.problems:
                print(f"  {p}")

        _emit(args, payload, human)
        return EXIT_OK if rep.ok else EXIT_FAILED
    if args.last <= 0:
        raise _UsageError(f"--last must be a positive number, got {args.last}")
    records = AuditLog(path).tail(args.last, slug=args.slug)

    def human_list() -> None:
        if not records:
            print(f"no audit records in {path}")
        for r in records:
            print(
                f"{r.get('ts')} {r.get('slug')} {r.get('action')} {r.get('reason')} "
                f"run={str(r.get('request_id'))[:12]} {r.get('duration_ms')}ms"
            )

    _emit(args, records, human_list)
    return EXIT_OK


# -- parser -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Every command takes --json and --debug after its name too; SUPPRESS keeps a global --debug.
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON value on stdout")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p = _Parser(
        prog=PROG,
        description="Run untrusted community agents in hardened, network-less sandboxes.",
        epilog="The contract (options, exit codes, --json schemas): docs/cli.md",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, description=help_, parents=[common])
        c.set_defaults(func=func)
        return c

    r = command("run", cmd_run, "run an installed agent")
    r.add_argument("slug")
    r.add_argument("--goal", help="the goal text (default: the manifest's agent.goal)")
    r.add_argument("--arg", action="append", metavar="KEY=JSON", help="a keyword argument for the entrypoint")
    r.add_argument("--runtime", choices=["runc", "runsc"], help="override agent_sandbox.runtime for this run")
    r.add_argument("--via", metavar="SOCKET", help="submit to a running `serve` host via its admin socket")

    sv = command("serve", cmd_serve, "run a long-running host with warm pools on an owner-only admin socket")
    sv.add_argument("--socket", help="the admin socket (default: <config dir>/agentnode-admin.sock)")
    sv.add_argument("--warm", action="append", metavar="SLUG", default=[], help="keep a warm pool for SLUG")
    sv.add_argument("--drain-seconds", type=float, default=30.0, help="on SIGTERM, let runs finish this long")

    i = command("install", cmd_install, "install an agent pack or toolpack")
    i.add_argument("path")
    levels = ["curated", "trusted", "verified", "unverified"]
    i.add_argument("--trust", default="unverified", type=str.lower, choices=levels)

    command("uninstall", cmd_uninstall, "remove an installed pack").add_argument("slug")
    command("list", cmd_list, "list installed packs")

    n = sub.add_parser("init", help="scaffold a new pack", description="scaffold a new pack")
    n.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    n.add_argument("name", help="the pack's slug, also the directory name")
    n.add_argument("--type", choices=["agent", "toolpack"], default="agent")
    n.add_argument("--dir", help="create NAME inside this directory (default: the current directory)")
    n.set_defaults(func=cmd_init, json=False)

    im = sub.add_parser("image", help="build, pull or inspect the pinned sandbox image")
    ims = im.add_subparsers(dest="image_cmd", required=True, metavar="ACTION")
    b = ims.add_parser("build", help="build the image from docker/ and pin it", parents=[common])
    b.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    ims.add_parser("pull", help="pull REF from a registry and pin it", parents=[common]).add_argument("ref")
    ims.add_parser("status", help="is the pinned image present and current", parents=[common])
    im.set_defaults(func=cmd_image)

    d = command("doctor", cmd_doctor, "check that sandboxed runs (of SLUG) can start; changes nothing")
    d.add_argument("slug", nargs="?")

    po = sub.add_parser("policy", help="explain the effective policy of an agent")
    pos = po.add_subparsers(dest="policy_cmd", required=True, metavar="ACTION")
    pos.add_parser(
        "explain", help="the tools, limits, LLM access and route a run would get", parents=[common]
    ).add_argument("slug")
    po.set_defaults(func=cmd_policy)

    a = command("audit", cmd_audit, "show or verify the audit trail")
    a.add_argument("audit_cmd", nargs="?", choices=["show", "verify"], default="show")
    a.add_argument("--last", type=int, default=20, help="how many records (default 20)")
    a.add_argument("--slug", help="only this agent's records")
    return p


def _error_payload(args: argparse.Namespace, error: str, code: str, hint: str) -> dict[str, Any]:
    """The --json object of a failed command; `run` keeps its full result shape."""
    if args.cmd == "run":
        from host._runner import RunResult

        return RunResult(success=False, error=error, error_code=code, hint=hint).to_json()
    return {"success": False, "error": error, "error_code": code, "hint": hint or None}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except _UsageError as exc:
        _print_error(str(exc), f"see: {PROG} {args.cmd} --help")
        return EXIT_USAGE
    except SandboxError as exc:
        if args.debug:
            traceback.print_exc()
        if args.json:
            print(json.dumps(_error_payload(args, exc.message, exc.reason.value, exc.hint), sort_keys=True))
        _print_error(exc.message, exc.hint)
        return EXIT_FAILED
    except KeyboardInterrupt:
        _print_error("interrupted", None)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (the contract: one error line, no traceback without --debug)
        if args.debug:
            traceback.print_exc()
        message = f"unexpected {type(exc).__name__}"
        hint = "re-run with --debug for the traceback"
        if args.json:
            payload = _error_payload(args, message, AuditReason.HOST_LOOP_ERROR.value, hint)
            print(json.dumps(payload, sort_keys=True))
        _print_error(message, hint)
        return EXIT_FAILED
    finally:
        sys.stdout.flush()


__all__ = ["build_parser", "main"]
