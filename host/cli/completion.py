"""Shell completion for the CLI, generated from its own parser so it never drifts from the commands.

`agentnode-sandbox completion bash` (or `zsh`, through bash's completion) prints a script to source:
commands, subcommands and options complete from what the parser defines; a slug argument completes from
the installed packs (`list --json`, read when asked, so a newly installed pack completes at once).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from host.cli.output import EXIT_OK
from host.cli.parser import build_parser

PROG = "agentnode-sandbox"
SLUG_COMMANDS = ("run", "uninstall", "doctor", "explain")
"""Commands (or subcommands) whose positional argument is an installed pack's slug."""


def _tree(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], list[str]]]:
    """`command path` -> (subcommands, options), for the root ("") and every (sub)command."""
    out: dict[str, tuple[list[str], list[str]]] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        options = sorted(o for a in p._actions for o in a.option_strings if o.startswith("--"))
        subs: list[str] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    subs.append(name)
                    walk(child, f"{path} {name}".strip())
        out[path] = (sorted(subs), options)

    walk(parser, "")
    return out


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion script for `parser` (zsh sources it after `bashcompinit`)."""
    cases = []
    for path, (subs, options) in sorted(_tree(parser).items()):
        words = " ".join(subs + options)
        slug = "1" if path.split(" ")[-1] in SLUG_COMMANDS else "0"
        cases.append(f"    {shlex.quote(path)}) words={shlex.quote(words)}; slugs={slug} ;;")
    body = "\n".join(cases)
    return f"""# {PROG} completion (bash; zsh: autoload -U bashcompinit && bashcompinit first)
_agentnode_sandbox() {{
  local cur path="" w i words="" slugs=0
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${{COMP_WORDS[i]}}"
    case "$w" in -*) continue ;; esac
    case "${{path:+$path }}$w" in
{_path_cases(parser)}
    esac
  done
  case "$path" in
{body}
  esac
  if [[ "$cur" != -* && $slugs == 1 ]]; then
    words="$words $({PROG} list --json 2>/dev/null | python3 -c "{_SLUGS}" 2>/dev/null)"
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _agentnode_sandbox {PROG}
"""


_SLUGS = "import json,sys; print(' '.join(p['slug'] for p in json.load(sys.stdin)))"
"""Reads `list --json` on stdin, prints the installed slugs."""


def _path_cases(parser: argparse.ArgumentParser) -> str:
    """The case arms that extend the command path word by word (only known (sub)commands do)."""
    paths = [p for p in _tree(parser) if p]
    return "\n".join(f"      {shlex.quote(p)}) path={shlex.quote(p)} ;;" for p in sorted(paths))


def cmd_completion(args: argparse.Namespace) -> int:
    script = bash_script(build_parser())
    if args.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    sys.stdout.write(script)
    return EXIT_OK


__all__ = ["SLUG_COMMANDS", "bash_script", "cmd_completion"]
