"""One revision's measuring process under `--compare` (`python -m bench._worker PLAN_JSON`).

Started by bench/_compare with its working directory set to the revision's import root, so `host` and
`sandbox_wrapper` come from that revision while `bench` is this checkout's. It builds that revision's
pinned image, sets up a BenchState, then answers one JSON line per JSON line on stdin:
{"section", "runtime"} -> {"ok": result} or {"error": text}; {"quit": true} ends it. The answers go to a
private copy of the original stdout; anything else printed goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def _send(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:1500]}"


def _strays(root: Path) -> list[str]:
    """Loaded host / sandbox_wrapper modules whose file is not under `root`: revisions mixed."""
    out = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name.split(".")[0] in ("host", "sandbox_wrapper") and file:
            if not Path(file).resolve().is_relative_to(root):
                out.append(f"{name} ({file})")
    return sorted(out)


def _sections() -> Callable[..., dict[str, Any]]:
    """bench._sections.measure_one, imported per measurement: its import error (this revision lacks a
    module or name the measuring code uses) is that measurement's answer."""
    try:
        from bench._sections import measure_one  # noqa: PLC0415
    except ImportError as exc:
        raise RuntimeError(f"this revision lacks what the bench code imports: {_error(exc)}") from exc
    return measure_one


def main() -> int:
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the answers
    try:
        # Imported here: an import error of this revision is an answer, not a traceback.
        import host  # noqa: PLC0415
        import sandbox_wrapper  # noqa: PLC0415
        from bench._plan import Plan  # noqa: PLC0415
        from bench._roots import IMAGE_ROOT  # noqa: PLC0415
        from bench._state import BenchState  # noqa: PLC0415
        from host.engine.image import build_image  # noqa: PLC0415
        try:
            from host.engine.sdk import connect  # noqa: PLC0415
        except ImportError:  # a revision from before connect moved beside the SDK it opens
            from host.engine.engine import connect  # type: ignore[attr-defined,no-redef]  # noqa: PLC0415

        plan = Plan.from_json(json.loads(sys.argv[1]))
        client = connect()
    except Exception as exc:  # noqa: BLE001 (reported to the parent, which records it)
        traceback.print_exc()
        _send(channel, {"error": f"could not start: {_error(exc)}"})
        return 1
    state = None
    try:
        try:
            image = build_image(client, repo_root=IMAGE_ROOT, progress=lambda _line: None).image_id
            state = BenchState(client, image)
        except Exception as exc:  # noqa: BLE001 (reported to the parent, which records it)
            traceback.print_exc()
            _send(channel, {"error": f"could not build its image or set up: {_error(exc)}"})
            return 1
        strays = _strays(IMAGE_ROOT.resolve())
        if strays:
            _send(channel, {"error": f"modules from outside {IMAGE_ROOT}: {', '.join(strays[:5])}"})
            return 1
        _send(channel, {"ready": True, "image": image, "host_module": host.__file__,
                        "wrapper_module": sandbox_wrapper.__file__, "pid": os.getpid()})
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("quit"):
                break
            try:
                result = _sections()(state, plan, command["section"], command["runtime"])
                strays = _strays(IMAGE_ROOT.resolve())
                if strays:
                    raise RuntimeError(f"modules from outside {IMAGE_ROOT}: {', '.join(strays[:5])}")
                _send(channel, {"ok": result})
            except Exception as exc:  # noqa: BLE001 (reported per measurement; the worker goes on)
                traceback.print_exc()
                _send(channel, {"error": _error(exc)})
        _send(channel, {"leftovers": len(state.leftovers())})
    finally:
        if state is not None:
            state.close()
        client.close()
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
