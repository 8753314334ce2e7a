"""`serve` (the long-running host, or with --node the Kubernetes node agent) and `k8s-controller`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from host.cli.output import EXIT_OK, UsageError, json_line, say
from host.cli.parser import option_given
from host.core.terminal import safe_line, safe_token

SERVE_LOCAL_ONLY = (("socket", "--socket"), ("warm", "--warm"), ("drain_seconds", "--drain-seconds"),
                    ("metrics", "--metrics"), ("json", "--json"))  # fmt: skip
"""`serve` options about the local admin socket (and its ready line): refused with --node."""
DEFAULT_DRAIN_SECONDS = 30.0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.node:
        for dest, flag in SERVE_LOCAL_ONLY:
            if option_given(getattr(args, dest)):
                raise UsageError(f"{flag} cannot be used with --node (the node agent has no admin socket)")
        from host.k8s.node import serve_node

        return serve_node(os.environ)

    from host.api.server import parse_address, serve
    from host.spec.config import load_config

    drain_seconds = DEFAULT_DRAIN_SECONDS if args.drain_seconds is None else args.drain_seconds
    if args.metrics is not None:
        try:
            parse_address(args.metrics)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    socket_path = Path(args.socket) if args.socket else load_config().paths.admin_socket

    def ready(path: str) -> None:
        if args.json:
            line = {"socket": path, "warm": args.warm, "metrics": args.metrics}
            sys.stdout.write(json_line(line) + "\n")
            sys.stdout.flush()
        warm = ", ".join(safe_token(slug) for slug in args.warm) or "none"
        metrics = f", metrics on http://{safe_line(args.metrics)}/metrics" if args.metrics else ""
        say(f"serving on {safe_line(path)} (warm: {warm}){metrics}; stop with SIGTERM", err=True)

    serve(socket_path, warm=args.warm, ready=ready, drain_seconds=drain_seconds,
          metrics_address=args.metrics)  # fmt: skip
    return EXIT_OK


def cmd_k8s_controller(args: argparse.Namespace) -> int:
    from host.k8s.client import is_dns_label

    namespaces = tuple(dict.fromkeys(args.namespace or ()))
    for namespace in namespaces:
        if not is_dns_label(namespace):
            raise UsageError("--namespace must be a DNS label (1-63 of a-z 0-9 -)")
    if namespaces and args.all_namespaces:
        raise UsageError("--namespace and --all-namespaces cannot be used together")
    if args.json:
        raise UsageError("--json cannot be used with k8s-controller (it prints no JSON: it logs on stderr)")
    from host.k8s.controller import run_controller

    # Neither option: every namespace, as the deployed controller runs it (no options, a ClusterRole).
    return run_controller(os.environ, namespaces=namespaces, clusterwide=not namespaces)
