"""The command line: every command's options (docs/cli.md), parsed with the contract's usage-error shape."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from host.cli.output import EXIT_USAGE, print_error
from host.core.vocab import Runtime, Trust

PROG = "agentnode-sandbox"


def _version() -> str:
    """The installed distribution's version (a bare checkout that was never installed: "unknown")."""
    import importlib.metadata

    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`, with the version looked up only when asked: reading the installed distribution's
    metadata cost every command ~25 ms."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{PROG} {_version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's error shape: `error: …` and `hint: …` on stderr, exit 2; no
    abbreviated options (`--vi` is not `--via`: what a script says is what runs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print_error(message, f"see: {self.prog} --help")
        sys.exit(EXIT_USAGE)


def option_given(value: Any) -> bool:
    """Whether an option was given: its default is None, False (a flag) or [] (a repeatable one)."""
    return value is not None and value is not False and value != []


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
    p.add_argument("--version", action=_VersionAction, nargs=0, help="show program's version number and exit")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="the host's own log lines on stderr: escaped text, or one JSON object per line")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=[common])

    r = command("run", "run an installed agent")
    r.add_argument("slug")
    r.add_argument("--goal", help="the goal text (default: the manifest's agent.goal)")
    r.add_argument("--arg", action="append", metavar="KEY=JSON", help="a keyword argument for the entrypoint")
    runtimes = [runtime.value for runtime in Runtime]
    r.add_argument("--runtime", choices=runtimes, help="override agent_sandbox.runtime for this run")
    r.add_argument("--via", metavar="SOCKET", help="submit to a running `serve` host via its admin socket")
    r.add_argument("--no-serve", action="store_true",
                   help="run in this process even when a `serve` host is running for this config (by "
                   "default `run` submits to it: its warm pool, same audit record)")  # fmt: skip
    r.add_argument("--backend", choices=("local", "kubernetes"), default="local",
                   help="local: run it here (or --via a `serve` host); kubernetes: submit it as an AgentRun "
                   "to a cluster and wait for its end (docs/kubernetes.md)")  # fmt: skip
    r.add_argument("--namespace", metavar="NS",
                   help="(kubernetes) the AgentRun's namespace (default: the context's, else default)")
    r.add_argument("--kubeconfig", metavar="PATH",
                   help="(kubernetes) the kubeconfig (default: in a pod its service account, else "
                   "KUBECONFIG or ~/.kube/config)")  # fmt: skip
    r.add_argument("--context", metavar="NAME", help="(kubernetes) the kubeconfig context (default: current)")
    r.add_argument("--wait-seconds", type=float, metavar="N",
                   help="(kubernetes) wait at most this long, then delete the AgentRun (default 3780: the "
                   "longest run a host allows, plus its pod's start and a margin)")  # fmt: skip
    r.add_argument("--follow", action="store_true",
                   help="show the agent's output lines on stderr as it writes them (escaped)")
    r.add_argument("--tenant", help="the caller's tenant, recorded in the audit record")
    r.add_argument("--request-id", help="the caller's request id, recorded in the audit record")
    r.add_argument("--label", action="append", metavar="KEY=VALUE",
                   help="a free label recorded in the audit record (repeatable, at most 16)")
    for flag, kind, what in (
        ("--max-runtime-seconds", int, "wall-clock seconds"), ("--max-tool-calls", int, "tool calls"),
        ("--max-iterations", int, "next_iteration() calls"), ("--max-llm-calls", int, "LLM calls"),
        ("--max-total-tokens", int, "LLM tokens"), ("--max-cost-usd", float, "LLM cost in USD"),
    ):  # fmt: skip
        r.add_argument(flag, type=kind, metavar="N", help=f"at most this many {what} for this run "
                       "(only lowers what the manifest and host allow)")  # fmt: skip
    reach = r.add_mutually_exclusive_group()
    reach.add_argument("--allow-egress", dest="egress", action="append", metavar="NAME[:PORT]",
                       help="this run's egress grant, repeatable (replaces the standing grants; only "
                       "what agent_sandbox.egress lets a caller grant; each pack gets only what it declares)")
    reach.add_argument("--no-egress", dest="egress", action="store_const", const=(),
                       help="no egress for this run, whatever the config grants")  # fmt: skip
    files = r.add_argument_group("files (a sandboxed agent; docs/files.md)")
    files.add_argument("--workspace", metavar="DIR",
                       help="hand the run a snapshot of DIR at /workspace (the pack must declare "
                       "workspace_read or workspace_write); DIR itself is never mounted")  # fmt: skip
    files.add_argument("--apply", action="store_true",
                       help="apply a workspace_write run's changes to DIR when it succeeds (per file; a file "
                       "changed in DIR since the snapshot is left as it is and reported)")  # fmt: skip
    files.add_argument("--export-tar", metavar="FILE",
                       help="write the run's changes as a tar to FILE (new) instead of applying them")
    files.add_argument("--export-patch", metavar="FILE",
                       help="write the run's text changes as a unified patch to FILE (new; git apply -p1)")
    files.add_argument("--input", dest="inputs", action="append", metavar="NAME=PATH",
                       help="hand the run the file PATH, read-only at /inputs/NAME (repeatable)")
    files.add_argument("--output-dir", metavar="DIR",
                       help="write the artifacts the agent leaves in /outputs to DIR (created; nothing in "
                       "it is replaced), each verified by SHA-256")  # fmt: skip

    sv = command("serve", "run a long-running host with warm pools on an owner-only admin socket")
    sv.add_argument("--socket", help="the admin socket (default: <config dir>/agentnode-admin.sock)")
    sv.add_argument("--warm", action="append", metavar="SLUG", default=[], help="keep a warm pool for SLUG")
    sv.add_argument("--drain-seconds", type=float,
                    help="on SIGTERM, let runs finish this long (default 30)")  # fmt: skip
    sv.add_argument("--metrics", metavar="HOST:PORT",
                    help="serve Prometheus metrics at http://HOST:PORT/metrics (opt-in; :PORT: 127.0.0.1)")
    sv.add_argument("--node", action="store_true",
                    help="run the Kubernetes node agent instead (a DaemonSet's command: docs/kubernetes.md); "
                    "none of the admin socket's options apply")  # fmt: skip

    kc = command("k8s-controller",
                 "run the Kubernetes AgentRun controller (a Deployment's command: docs/kubernetes.md)")
    kc.add_argument("--namespace", action="append", metavar="NS",
                    help="watch AgentRuns in NS only (repeatable; default: every namespace)")  # fmt: skip
    kc.add_argument("--all-namespaces", action="store_true", help="watch AgentRuns in every namespace")

    i = command("install", "install an agent pack or toolpack")
    i.add_argument("path")
    levels = [level.value for level in Trust]
    i.add_argument("--trust", default=Trust.UNVERIFIED.value, type=str.lower, choices=levels)
    i.add_argument(
        "--offline", action="store_true", help="resolve Python requirements from --find-links only (no index)"
    )
    i.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory of wheels for the pack's Python requirements (repeatable)",
    )

    u = command("uninstall", "remove an installed pack")
    u.add_argument("slug")
    ls = command("list", "list installed packs")

    n = sub.add_parser("init", help="scaffold a new pack", description="scaffold a new pack")
    n.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    n.add_argument("name", help="the pack's slug, also the directory name")
    n.add_argument("--type", choices=["agent", "toolpack"], default="agent")
    n.add_argument("--dir", help="create NAME inside this directory (default: the current directory)")
    n.set_defaults(json=False)

    im = sub.add_parser("image", help="build, pull or inspect the pinned sandbox image")
    ims = im.add_subparsers(dest="image_cmd", required=True, metavar="ACTION")
    b = ims.add_parser("build", help="build the image from docker/ and pin it", parents=[common])
    b.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    ims.add_parser("pull", help="pull REF from a registry and pin it", parents=[common]).add_argument("ref")
    ims.add_parser("status", help="is the pinned image present and current", parents=[common])

    d = command("doctor", "check that sandboxed runs (of SLUG) can start; changes nothing")
    d.add_argument("slug", nargs="?")

    po = sub.add_parser("policy", help="explain the effective policy of an agent")
    pos = po.add_subparsers(dest="policy_cmd", required=True, metavar="ACTION")
    pe = pos.add_parser(
        "explain", help="the tools, limits, LLM access and route a run would get", parents=[common]
    )
    pe.add_argument("slug")
    for admin in (i, u, ls, d, pe):
        admin.add_argument("--via", metavar="SOCKET", help="run this command on the `serve` host at SOCKET")

    co = sub.add_parser("completion", help="print a shell completion script (source it in your shell's rc)",
                        description='print a shell completion script: eval "$(agentnode-sandbox completion '
                        'bash)"')  # fmt: skip
    co.add_argument("shell", choices=("bash", "zsh"))

    a = command("audit", "show or verify the audit trail")
    a.add_argument("audit_cmd", nargs="?", choices=["show", "verify"], default="show")
    a.add_argument("--last", type=int, default=20, help="how many records (default 20)")
    a.add_argument("--slug", help="only this agent's records")
    return p


__all__ = ["PROG", "build_parser", "option_given"]
