"""`init`: scaffolds agent packs and toolpacks whose code runs in the sandbox (or on the host) as is."""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

from host.core.errors import PackError
from host.spec.manifest.model import SLUG_RE

KINDS = ("agent", "toolpack")
# The agent template calls the toolpack template's tool, so `init my-tools --type toolpack` pairs with it.
EXAMPLE_TOOLPACK = "my-tools"
EXAMPLE_TOOL = "echo"
# Importable next to a pack (in the image or the host's worker): a pack module must not shadow these.
_IMPORTABLE = frozenset({"grpc", "google", "sandbox_wrapper", "host"})

_AGENT_MANIFEST = """\
# {slug}: an agent pack (scaffolded by `agentnode-sandbox init`).
package_id: "{slug}"
version: "0.1.0"               # quote versions: YAML would read 0.1 as a float
name: "{title}"
package_type: agent

agent:
  # module:function, imported from the pack root (this directory).
  entrypoint: "{module}:run"
  goal: Describe what this agent should achieve
  # Prepended as the system message of every LLM call the agent makes through its context.
  system_prompt: |
    You are a helpful agent. Answer briefly.

  tool_access:
    # The only tool packages this agent may call; the host refuses every other one (the agent sees
    # PermissionError). The host config can narrow this list further. For example: [{toolpack}]
    allowed_packages: []

  limits:
    max_tool_calls: 10          # the next run_tool raises AgentLimitExceeded
    max_runtime_seconds: 60     # wall-clock budget of the whole run
    max_iterations: 5           # context.next_iteration() raises AgentLimitExceeded past this

  llm_access:
    # Host-brokered LLM access is opt-in: unless enabled is true, every call_llm raises LlmAccessError
    # (reason LLM_NOT_GRANTED), which the agent can catch; the run goes on. API keys stay on the host,
    # and the agent never picks the model: the host does. The host's ceiling (agent_sandbox.llm in its
    # config) ALWAYS wins: it can lower these caps, restrict models, or disable access entirely.
    enabled: false
    max_calls: 20               # LLM calls per run
    max_input_chars: 24000      # message text per call (system prompt included)
    max_output_chars: 24000     # longest completion accepted per call
    # Optional token and money budgets, reserved before each call (omit: only the host's, if any):
    # max_total_tokens: 50000   # input + output tokens per run, as the provider counts them
    # max_output_tokens: 2000   # output tokens asked for per call
    # max_cost_usd: 0.10        # provider cost per run, at the host's prices for its model
    # Optionally restrict which host-chosen models may serve this agent (omit: any host model;
    # an empty list: no model is acceptable).
    # allowed_models: ["gpt-4o-mini", "claude-3-5-haiku-latest"]
"""

_AGENT_MODULE = '''\
"""{slug}: an agent that may call one tool and the host's LLM, and reports refusals instead of failing."""

from __future__ import annotations

from typing import Any

from sandbox_wrapper import AgentContext, AgentLimitExceeded, LlmAccessError

# A toolpack this agent may call: list it in agent.tool_access.allowed_packages (agentnode.yaml) and
# install it on the host as trusted (e.g. `agentnode-sandbox init {toolpack} --type toolpack`).
TOOL_PACKAGE = "{toolpack}"
TOOL_NAME = "{tool}"


def run(context: AgentContext, **kwargs: Any) -> dict[str, Any]:
    """Do one step toward the goal; whatever this returns must be JSON (a dict, list, str, number)."""
    answer: dict[str, Any] = {{"goal": context.goal, "run_id": context.run_id, "refusals": []}}
    context.next_iteration()

    if context.is_tool_available(TOOL_PACKAGE):
        try:
            out = context.run_tool(TOOL_PACKAGE, TOOL_NAME, text=context.goal)
            answer["tool"] = out.result if out.success else {{"error": out.error}}
        except (PermissionError, AgentLimitExceeded) as exc:
            answer["refusals"].append({{"step": "tool", "error": str(exc)}})

    try:
        answer["reply"] = context.call_llm_text(f"In one sentence, how would you approach: {{context.goal}}")
    except LlmAccessError as exc:  # not granted (llm_access), over a cap, or the host has no provider
        answer["refusals"].append({{"step": "llm", "reason": exc.reason}})

    answer["tool_calls_made"] = context.tool_calls_made
    return answer
'''

_TOOLPACK_MANIFEST = """\
# {slug}: a toolpack (scaffolded by `agentnode-sandbox init`). Its tools run on the host, in a worker
# process, for agents that list {slug} in tool_access.allowed_packages; install it as trusted or curated.
package_id: "{slug}"
version: "0.1.0"               # quote versions: YAML would read 0.1 as a float
name: "{title}"
package_type: toolpack
# src/ layout: modules live under src/, the pack's import root.
entrypoint: "{module}"

capabilities:
  tools:
    - name: {tool}
      description: Return the text and its length.
      entrypoint: "{module}:{tool}"
      # The host checks arguments against this schema before the tool runs (TOOL_ARGUMENTS_INVALID).
      input_schema:
        type: object
        properties:
          text: {{type: string}}
        required: [text]
        additionalProperties: false
"""

_TOOLPACK_MODULE = '''\
"""{slug}: tools an agent calls through context.run_tool("{slug}", "<tool name>", **arguments)."""

from __future__ import annotations


def {tool}(text: str) -> dict[str, object]:
    """Return `text` and its length; a tool returns JSON, which the agent receives as ToolResult.result."""
    return {{"text": text, "length": len(text)}}
'''


def module_name(slug: str, kind: str) -> str:
    """A Python module name for `slug` that is an identifier and shadows no standard-library module."""
    name = re.sub(r"[^a-z0-9_]", "_", slug)
    taken = name in sys.stdlib_module_names or name in _IMPORTABLE
    if not name.isidentifier() or keyword.iskeyword(name) or taken:
        name = f"{kind}_{name}"
    return name


def scaffold(slug: str, *, kind: str, parent: Path) -> tuple[Path, list[Path]]:
    """Write a new pack into `parent/slug`; returns the pack directory and the files written.

    Refuses (PackError) to write into an existing directory that is not empty.
    """
    if not SLUG_RE.fullmatch(slug):
        raise ValueError(f"not a slug: {slug!r}")
    if kind not in KINDS:
        raise ValueError(f"unknown pack type {kind!r}")
    target = parent / slug
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PackError(
            f"{target} already exists and is not an empty directory",
            hint="choose another NAME or --dir, or remove it first",
        )
    module = module_name(slug, kind)
    fields = {
        "slug": slug,
        "title": slug.replace("-", " ").replace("_", " ").title(),
        "module": module,
        "toolpack": EXAMPLE_TOOLPACK,
        "tool": EXAMPLE_TOOL,
    }
    if kind == "agent":
        files = {"agentnode.yaml": _AGENT_MANIFEST, f"{module}.py": _AGENT_MODULE}
    else:
        files = {"agentnode.yaml": _TOOLPACK_MANIFEST, f"src/{module}.py": _TOOLPACK_MODULE}
    written: list[Path] = []
    for rel, template in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**fields))
        written.append(path)
    return target, written


def next_steps(slug: str, kind: str, target: Path) -> list[str]:
    """What to do after `init`, as shell commands with a short reason each."""
    if kind == "agent":
        return [
            f"agentnode-sandbox install {target}        # community trust (unverified): runs sandboxed",
            f"agentnode-sandbox run {slug} --json        # needs the sandbox on: AGENTNODE_AGENT_SANDBOX=1",
            f"agentnode-sandbox policy explain {slug}    # the tools, limits and LLM access it gets",
        ]
    return [
        f"agentnode-sandbox install {target} --trust trusted   # tools run on the host: trusted or curated",
        f"then list {slug} in an agent's tool_access.allowed_packages and call "
        f'context.run_tool("{slug}", "{EXAMPLE_TOOL}", text="...")',
    ]


__all__ = ["KINDS", "module_name", "next_steps", "scaffold"]
