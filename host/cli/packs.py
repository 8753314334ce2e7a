"""The pack commands: `install`, `uninstall`, `list` and `init`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from host.cli.output import EXIT_OK, UsageError, emit, progress, say
from host.cli.parser import PROG
from host.core.errors import AuditReason, EngineError, EngineNotFound, PackError
from host.core.terminal import safe_line, safe_token


def _pack_payload(entry: Any) -> dict[str, Any]:
    return {k: v for k, v in entry.to_json().items() if k != "manifest"}


def _engine() -> tuple[Any, EngineError | None]:
    """The engine client, or None and the reason it is unreachable (installing trusted packs needs none)."""
    from host.engine.sdk import connect

    try:
        return connect(), None
    except EngineError as exc:
        return None, exc


def cmd_install(args: argparse.Namespace) -> int:
    from host.packs.install import install_pack
    from host.packs.requirements import Source
    from host.spec.config import load_config

    cfg = load_config()
    path = Path(args.path)
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory")
    for links in args.find_links:
        if not Path(links).is_dir():
            raise UsageError(f"--find-links {links}: not a directory")
    source = Source(offline=args.offline, find_links=tuple(Path(d).resolve() for d in args.find_links))
    client, engine_error = _engine()
    warnings: list[str] = []  # terminal-safe and bounded by install_pack; escaped again when printed
    try:
        entry = install_pack(
            path,
            trust=args.trust,
            paths=cfg.paths,
            client=client,
            image=cfg.agent_sandbox.image,
            warnings=warnings,
            source=source,
            progress=progress(args),
            egress=cfg.agent_sandbox.egress,
        )
    except PackError as exc:
        # Without an engine, say why there is none (unavailable vs permission denied), not just "needed".
        if engine_error is not None and exc.reason == AuditReason.ENGINE_UNAVAILABLE:
            raise engine_error from None
        raise
    finally:
        if client is not None:
            client.close()

    def human() -> None:
        for warning in warnings:
            say(f"warning: {safe_line(warning)}", err=True)
        say(
            f"installed {safe_token(entry.slug)} {safe_token(entry.version)} "
            f"({safe_token(entry.package_type)}, trust {safe_token(entry.trust_level)})"
            + (f" into volume {safe_token(entry.sandbox_volume)}" if entry.sandbox_volume else "")
        )

    emit(args, {**_pack_payload(entry), "warnings": [safe_line(w) for w in warnings]}, human)
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    from host.packs.install import uninstall_pack
    from host.spec.config import load_config

    client, _ = _engine()
    leftover: str | None = None
    why = ""
    try:
        entry = uninstall_pack(args.slug, paths=load_config().paths, client=client)
        if client is None:
            leftover, why = entry.sandbox_volume, "the engine is not reachable"
        elif entry.sandbox_volume:
            users = _volume_users(client, entry.sandbox_volume)
            if users is not None:  # the volume is still there: say why, and who will drop it
                leftover = entry.sandbox_volume
                why = (
                    f"it is in use by {users} container(s); a running serve destroys its warm members of "
                    "this pack and then removes the volume, a run removes it when it ends"
                    if users
                    else "the engine refused to remove it"
                )
    finally:
        if client is not None:
            client.close()
    payload = {**_pack_payload(entry), "volume_left_behind": leftover, "left_behind_reason": why or None}

    def human() -> None:
        say(f"uninstalled {safe_token(entry.slug)} {safe_token(entry.version)}")
        if leftover:
            volume = safe_token(leftover)
            say(
                f"warning: volume {volume} was kept: {why} (check later: docker volume rm {volume})",
                err=True,
            )

    emit(args, payload, human)
    return EXIT_OK


def _volume_users(client: Any, name: str) -> int | None:
    """How many containers use the volume `name`: None when it is gone, 0 when that cannot be seen."""
    from host.engine.errors import engine_errors

    try:
        with engine_errors():
            client.volumes.get(name)
            return len(client.api.containers(all=True, filters={"volume": name}))
    except EngineNotFound:
        return None
    except EngineError:
        return 0


def cmd_list(args: argparse.Namespace) -> int:
    from host.spec.config import load_config
    from host.spec.lockfile import Lockfile

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
            say(f"no packs installed ({PROG} install PATH)")
        for r in rows:
            slug, version, kind, trust = (
                safe_token(r[k]) for k in ("slug", "version", "package_type", "trust_level")
            )
            say(f"{slug:<32} {version:<12} {kind:<9} {trust}")

    emit(args, rows, human)
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    from host.packs.scaffold import next_steps, scaffold
    from host.spec.manifest.model import SLUG_RE

    if not SLUG_RE.fullmatch(args.name):
        raise UsageError(
            f"NAME must be a pack slug ({SLUG_RE.pattern}: lower case, digits, '.', '_', '-'), "
            f"got {args.name!r}"
        )
    parent = Path(args.dir) if args.dir else Path.cwd()
    target, files = scaffold(args.name, kind=args.type, parent=parent)
    say(f"created {args.type} pack {args.name} in {safe_line(target)}:")
    for f in files:
        say(f"  {safe_line(f.relative_to(target))}")
    say("next:")
    for step in next_steps(args.name, args.type, target):
        say(f"  {safe_line(step)}")
    return EXIT_OK
