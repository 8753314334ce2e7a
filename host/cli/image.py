"""`image build|pull|status`: the pinned sandbox image."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from host.cli.output import EXIT_FAILED, EXIT_OK, emit, print_error, progress, say
from host.core.errors import EngineError
from host.core.terminal import safe_line, safe_token

REPO_ROOT = Path(__file__).resolve().parents[2]


def cmd_image(args: argparse.Namespace) -> int:
    from host.engine.image import build_image, image_status, pull_image, verify_pinned_image
    from host.engine.sdk import connect
    from host.spec.config import load_config, set_image_pin

    cfg = load_config()
    client = connect()
    try:
        if args.image_cmd == "build":
            res = build_image(client, repo_root=REPO_ROOT, progress=progress(args), force=args.force)
            set_image_pin(cfg.paths, res.image_id)
            payload = {
                "image_id": res.image_id,
                "tag": res.tag,
                "inputs_hash": res.inputs_hash,
                "built": res.built,
                "pinned_in": str(cfg.paths.config_file),
            }
            emit(
                args,
                payload,
                lambda: say(
                    f"{'built' if res.built else 'up to date'}: {safe_token(res.tag)} "
                    f"{safe_token(res.image_id)} (pinned in {safe_line(cfg.paths.config_file)})"
                ),
            )
            return EXIT_OK
        if args.image_cmd == "pull":
            pulled = pull_image(client, args.ref, progress=progress(args), bars=sys.stderr.isatty())
            set_image_pin(cfg.paths, pulled.pin)
            where = str(cfg.paths.config_file)
            emit(
                args,
                {"ref": pulled.ref, "image_id": pulled.image_id, "pin": pulled.pin, "pinned_in": where},
                lambda: say(
                    f"pulled {safe_line(pulled.ref)}: pinned {safe_line(pulled.pin)} in {safe_line(where)}"
                ),
            )
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
            say(
                f"pin: {safe_line(cfg.agent_sandbox.image or '(none)')}\n"
                f"present: {st.present}  matches pin: {st.matches_pin}  "
                f"protocol: {safe_line(st.protocol)}  up to date: {st.up_to_date}"
            )
            if problem is not None:
                print_error(problem.message, problem.hint)

        emit(args, status, human)
        return EXIT_OK if problem is None else EXIT_FAILED
    finally:
        client.close()
