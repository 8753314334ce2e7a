"""The `agentnode-sandbox` command: one scriptable entry point with a stable exit-code and --json contract."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from host._errors import SandboxError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

REPO_ROOT = Path(__file__).resolve().parent.parent


class _UsageError(Exception):
    """Bad command-line input (exit 2)."""


def _emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(payload, sort_keys=True, default=str) + "\n")
    else:
        human()


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    quiet = getattr(args, "json", False) and not sys.stderr.isatty()

    def show(line: str) -> None:
        if not quiet:
            sys.stderr.write(f"  {line}\n")
            sys.stderr.flush()

    return show


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
    from host._runner import SandboxHost

    kwargs = _parse_args_kv(args.arg or [])
    host = SandboxHost()
    try:
        host.startup_sweep()
        result = host.run(args.slug, goal=args.goal, kwargs=kwargs, runtime=args.runtime)
    finally:
        host.close()
    payload = result.to_json()
    if host.audit_failures:
        payload["audit_error"] = "the audit record could not be written"

    def human() -> None:
        if result.success:
            print(json.dumps(result.result, indent=2))
            print(
                f"ok: {args.slug} ({result.mode_used}, run {result.run_id[:12]}, {result.duration_ms} ms)",
                file=sys.stderr,
            )
        else:
            print(f"error: {result.error} [{result.error_code}]", file=sys.stderr)
            if result.hint:
                print(f"hint: {result.hint}", file=sys.stderr)
        if host.audit_failures:
            print("warning: the audit record could not be written", file=sys.stderr)

    _emit(args, payload, human)
    return EXIT_OK if result.success else EXIT_FAILED


def _client_or_none() -> Any:
    from host._engine import connect

    try:
        return connect()
    except SandboxError:
        return None


def cmd_install(args: argparse.Namespace) -> int:
    from host._config import load_config
    from host._packs import install_pack

    cfg = load_config()
    path = Path(args.path)
    if not path.is_dir():
        raise _UsageError(f"{path} is not a directory")
    entry = install_pack(
        path, trust=args.trust, paths=cfg.paths, client=_client_or_none(), image=cfg.agent_sandbox.image
    )
    payload = {k: v for k, v in entry.to_json().items() if k != "manifest"}
    _emit(
        args,
        payload,
        lambda: print(
            f"installed {entry.slug} {entry.version} ({entry.package_type}, trust {entry.trust_level})"
            + (f" into volume {entry.sandbox_volume}" if entry.sandbox_volume else "")
        ),
    )
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    from host._config import load_config
    from host._packs import uninstall_pack

    entry = uninstall_pack(args.slug, paths=load_config().paths, client=_client_or_none())
    print(f"uninstalled {entry.slug} {entry.version}")
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
            print("no packs installed (agentnode-sandbox install PATH)")
        for r in rows:
            print(f"{r['slug']:<32} {r['version']:<12} {r['package_type']:<9} {r['trust_level']}")

    _emit(args, rows, human)
    return EXIT_OK


def cmd_image(args: argparse.Namespace) -> int:
    from host._config import load_config, set_image_pin
    from host._engine import connect
    from host._image import build_image, image_status

    cfg = load_config()
    client = connect()
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
    if args.image_cmd == "status":
        st = image_status(client, cfg.agent_sandbox.image, repo_root=REPO_ROOT)
        payload = dict(st.__dict__)
        payload["pin"] = cfg.agent_sandbox.image
        ok = bool(st.present and st.matches_pin)
        _emit(
            args,
            payload,
            lambda: print(
                f"pin: {cfg.agent_sandbox.image or '(none)'}\n"
                f"present: {st.present}  matches pin: {st.matches_pin}  "
                f"protocol: {st.protocol}  up to date: {st.up_to_date}"
            ),
        )
        return EXIT_OK if ok else EXIT_FAILED
    raise _UsageError("image pull: no registry is configured for the sandbox image; use: image build")


def cmd_audit(args: argparse.Namespace) -> int:
    from host._audit import AuditLog, verify_audit
    from host._config import load_config

    path = load_config().paths.audit_file
    if args.audit_cmd == "verify":
        rep = verify_audit(path)
        payload = {"ok": rep.ok, "records": rep.records, "problems": rep.problems}

        def human() -> None:
            print(f"{'ok' if rep.ok else 'FAILED'}: {rep.records} records in {path}")
            for p in rep.problems:
                print(f"  {p}")

        _emit(args, payload, human)
        return EXIT_OK if rep.ok else EXIT_FAILED
    records = AuditLog(path).tail(args.last, slug=args.slug)

    def human_list() -> None:
        for r in records:
            print(
                f"{r.get('ts')} {r.get('slug')} {r.get('action')} {r.get('reason')} "
                f"run={str(r.get('request_id'))[:12]} {r.get('duration_ms')}ms"
            )

    _emit(args, records, human_list)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentnode-sandbox",
        description="Run untrusted community agents in hardened, network-less sandboxes.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run an installed agent")
    r.add_argument("slug")
    r.add_argument("--goal", help="the goal text (default: the manifest's agent.goal)")
    r.add_argument("--arg", action="append", metavar="KEY=JSON", help="a keyword argument for the entrypoint")
    r.add_argument("--runtime", choices=["runc", "runsc"], help="override agent_sandbox.runtime for this run")
    r.add_argument("--json", action="store_true", help="print exactly one JSON object")
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("install", help="install an agent pack or toolpack")
    i.add_argument("path")
    i.add_argument("--trust", default="unverified", choices=["curated", "trusted", "verified", "unverified"])
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_install)

    u = sub.add_parser("uninstall", help="remove an installed pack")
    u.add_argument("slug")
    u.set_defaults(func=cmd_uninstall)

    ls = sub.add_parser("list", help="list installed packs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    im = sub.add_parser("image", help="build or inspect the pinned sandbox image")
    ims = im.add_subparsers(dest="image_cmd", required=True)
    b = ims.add_parser("build", help="build the image from docker/ and pin it")
    b.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    b.add_argument("--json", action="store_true")
    ims.add_parser("pull", help="(no registry configured)").add_argument("--json", action="store_true")
    ims.add_parser("status", help="is the pinned image present and current").add_argument(
        "--json", action="store_true"
    )
    im.set_defaults(func=cmd_image)

    a = sub.add_parser("audit", help="show or verify the audit trail")
    a.add_argument("audit_cmd", nargs="?", choices=["show", "verify"], default="show")
    a.add_argument("--last", type=int, default=20)
    a.add_argument("--slug")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_audit)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SandboxError as exc:
        if args.debug:
            raise
        if getattr(args, "json", False):
            print(
                json.dumps(
                    {
                        "success": False,
                        "error": exc.message,
                        "error_code": exc.reason.value,
                        "hint": exc.hint or None,
                    }
                )
            )
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"error: unexpected {type(exc).__name__} (re-run with --debug for details)", file=sys.stderr)
        return EXIT_FAILED
    finally:
        sys.stdout.flush()


__all__ = ["build_parser", "main"]
