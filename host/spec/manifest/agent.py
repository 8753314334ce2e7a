"""The parser's `package_type: agent` part: the agent block, orchestration, verification, llm_access."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from host.spec.manifest.model import (
    _AGENT_KEYS,
    _CASE_KEYS,
    _ENTRYPOINT_RE,
    _EXPECTED_KEYS,
    _LLM_ACCESS_KEYS,
    _STEP_KEYS,
    _TERMINATION_KEYS,
    FORMAT_ENTRYPOINT_RE,
    LIMITS,
    LLM_CAP_KEYS,
    LLM_COST_CAP_KEY,
    LLM_TOKEN_CAP_KEYS,
    MAX_COST_USD,
    MAX_VERIFICATION_CASES,
    STOP_ON_CONSECUTIVE_ERRORS,
    TIERS,
    AgentManifest,
    OrchestrationStep,
)
from host.spec.manifest.reader import _describe, _describe_text, _Reader


def _when_problem(expr: str) -> str | None:
    """What is wrong with a step's `when` (the publisher's grammar), or None."""
    expr = expr.strip()
    if not expr:
        return "expected a condition, got an empty string"
    left: str | None = None
    for suffix in (" is not null", " is null"):
        if expr.endswith(suffix):
            left = expr[: -len(suffix)]
            break
    else:
        for op in ("!=", "=="):  # in this order, as the publisher checks them
            if f" {op} " in expr:
                left = expr.split(f" {op} ", 1)[0]
                break
    if left is None:
        return "expected $ref == value, $ref != value, $ref is null or $ref is not null"
    if not left.strip().startswith("$"):
        return "the left side must be a $reference ($input.<key> or $steps.<name>)"
    return None


class _AgentParser(_Reader):
    """An agent pack's `agent` block, read into an AgentManifest; a part of `_Parser`."""

    # --- agents ----------------------------------------------------------------------------------------

    def agent(self, data: Mapping[str, Any], common: dict[str, Any]) -> AgentManifest:
        if data.get("agent") is None:
            raise self.fail("agent", "required for package_type agent")
        agent = self.mapping(data["agent"], "agent")
        self.keys(agent, _AGENT_KEYS | {"max_tokens", "planning"}, "agent")
        for unsupported in ("max_tokens", "planning"):
            if unsupported in agent:
                raise self.fail(f"agent.{unsupported}", "not supported by the agentnode format; remove it")
        orchestration = self.orchestration(agent.get("orchestration"))
        tool_access = self.mapping(agent.get("tool_access"), "agent.tool_access")
        self.keys(tool_access, frozenset({"allowed_packages"}), "agent.tool_access")
        allowed = tool_access.get("allowed_packages")
        limits = self.mapping(agent.get("limits"), "agent.limits")
        self.keys(limits, frozenset(LIMITS), "agent.limits")
        termination = self.mapping(agent.get("termination"), "agent.termination")
        self.keys(termination, _TERMINATION_KEYS, "agent.termination")
        stop_final = termination.get("stop_on_final_answer")
        if stop_final is not None and not isinstance(stop_final, bool):
            raise self.fail(
                "agent.termination.stop_on_final_answer",
                f"expected true or false, got {_describe(stop_final)}",
            )
        state = self.mapping(agent.get("state"), "agent.state")
        self.keys(state, frozenset({"persistence"}), "agent.state")
        if state.get("persistence") is not None:
            self.choice(state["persistence"], "agent.state.persistence", ("none", "session"))
        if agent.get("isolation") is not None:
            self.choice(agent["isolation"], "agent.isolation", ("process", "thread"))
        llm = self.mapping(agent.get("llm"), "agent.llm")  # free-form: only `required` is read
        tier = agent.get("tier")
        self.agent_verification(agent.get("verification"))
        return AgentManifest(
            **common,
            entrypoint=self.agent_entrypoint(agent.get("entrypoint"), sequential=orchestration is not None),
            goal=self.goal(agent.get("goal")),
            system_prompt=self.system_prompt(agent.get("system_prompt")),
            allowed_packages=None if allowed is None else self.allowed(allowed),
            max_tool_calls=self.bounded_int(
                limits.get("max_tool_calls"), "agent.limits.max_tool_calls", LIMITS["max_tool_calls"],
                zero="no tool calls",
            ),
            max_runtime_seconds=self.bounded_int(
                limits.get("max_runtime_seconds"), "agent.limits.max_runtime_seconds",
                LIMITS["max_runtime_seconds"],
            ),
            max_iterations=self.bounded_int(
                limits.get("max_iterations"), "agent.limits.max_iterations", LIMITS["max_iterations"]
            ),
            llm_access=self.llm_access(agent.get("llm_access")),
            llm_required=bool(llm.get("required")),
            tier="" if tier is None else self.choice(tier, "agent.tier", TIERS),
            stop_on_consecutive_errors=self.bounded_int(
                termination.get("stop_on_consecutive_errors"),
                "agent.termination.stop_on_consecutive_errors",
                STOP_ON_CONSECUTIVE_ERRORS,
            ),
            orchestration=orchestration,
        )

    def agent_entrypoint(self, value: Any, *, sequential: bool) -> str:
        """module:function (the format's v2 form in 0.1/0.2); not needed by a sequential orchestration."""
        if sequential and not value:
            return ""
        if self.published:
            if not value:
                raise self.fail(
                    "agent.entrypoint",
                    f'expected an entrypoint like "package.module:function", got {_describe_text(value)}',
                )
            return self.text(
                value,
                "agent.entrypoint",
                pattern=FORMAT_ENTRYPOINT_RE,
                expected='an entrypoint like "package.module:function" (lower case, at least two '
                "module segments)",
            )
        return self.text(
            value,
            "agent.entrypoint",
            pattern=_ENTRYPOINT_RE,
            expected='an entrypoint like "package.module:function"',
        )

    def goal(self, value: Any) -> str:
        if self.published:  # required, and a string: it is sent as text
            return self.text(value, "agent.goal")
        return self.string(value, "agent.goal")

    def system_prompt(self, value: Any) -> str:
        """A string; a falsy value (null, "", an empty list) is no system prompt (the publisher's reading)."""
        if not value:
            return ""
        return self.string(value, "agent.system_prompt")

    def allowed(self, value: Any) -> tuple[str, ...]:
        """The allowlist: strings, stripped; an empty entry can name no package and is dropped."""
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(
                "agent.tool_access.allowed_packages",
                f"expected a list of package slugs, got {_describe(value)}",
            )
        return tuple(v.strip() for v in value if v.strip())

    def orchestration(self, value: Any) -> tuple[OrchestrationStep, ...] | None:
        """Sequential steps, or None (no orchestration, or one without a mode, which the SDK ignores)."""
        block = self.mapping(value, "agent.orchestration")
        self.keys(block, frozenset({"mode", "steps"}), "agent.orchestration")
        mode = block.get("mode")
        if mode is None:
            return None
        if mode != "sequential":
            raise self.fail("agent.orchestration.mode", f'expected "sequential", got {_describe(mode)}')
        steps = block.get("steps")
        if not steps:
            raise self.fail(
                "agent.orchestration.steps", f"required for mode sequential, got {_describe_text(steps)}"
            )
        if not isinstance(steps, list):
            raise self.fail("agent.orchestration.steps", f"expected a list, got {_describe(steps)}")
        out: list[OrchestrationStep] = []
        for i, item in enumerate(steps):
            key = f"agent.orchestration.steps[{i}]"
            step = self.item(item, key)
            self.keys(step, _STEP_KEYS, key)
            tool = self.text(step.get("tool"), f"{key}.tool")
            name = step.get("name")
            if name is not None:
                name = self.string(name, f"{key}.name")
                if any(s.name == name for s in out):
                    raise self.fail(f"{key}.name", "duplicate step name")
            mapping = self.mapping(step.get("input_mapping"), f"{key}.input_mapping")
            self.json_data(mapping, f"{key}.input_mapping")
            when = step.get("when")
            if when is not None:
                when = self.string(when, f"{key}.when")
                problem = _when_problem(when)
                if problem:
                    raise self.fail(f"{key}.when", problem)
            out.append(OrchestrationStep(tool=tool, name=name, input_mapping=mapping, when=when))
        return tuple(out)

    def agent_verification(self, value: Any) -> None:
        """agent.verification.cases (server verification only): checked, not stored."""
        block = self.mapping(value, "agent.verification")
        self.keys(block, frozenset({"cases"}), "agent.verification")
        cases = self.listing(block.get("cases"), "agent.verification.cases")
        if len(cases) > MAX_VERIFICATION_CASES:
            raise self.fail(
                "agent.verification.cases",
                f"expected at most {MAX_VERIFICATION_CASES} cases, got {len(cases)}",
            )
        names: set[str] = set()
        goals: set[str] = set()
        for i, item in enumerate(cases):
            key = f"agent.verification.cases[{i}]"
            case = self.item(item, key)
            self.keys(case, _CASE_KEYS, key)
            for field_name, low, seen in (("name", 3, names), ("goal", 20, goals)):
                text = self.sized(case.get(field_name), f"{key}.{field_name}", low)
                if text in seen:
                    raise self.fail(f"{key}.{field_name}", f"duplicate case {field_name}")
                seen.add(text)
            expected = self.mapping(case.get("expected"), f"{key}.expected")
            self.keys(expected, _EXPECTED_KEYS, f"{key}.expected")
            self.strings(expected.get("required_keys"), f"{key}.expected.required_keys")
            self.strings(expected.get("llm_prompt_contains"), f"{key}.expected.llm_prompt_contains")
            done = expected.get("done")
            if done is not None and not isinstance(done, bool):
                raise self.fail(f"{key}.expected.done", f"expected true or false, got {_describe(done)}")
            lengths = self.mapping(expected.get("min_lengths"), f"{key}.expected.min_lengths")
            for length in lengths.values():
                if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                    raise self.fail(
                        f"{key}.expected.min_lengths",
                        f"expected positive integers as values, got {_describe(length)}",
                    )

    def llm_access(self, value: Any) -> Mapping[str, Any]:
        """The validated block: caps and model list type-checked, other keys dropped.

        `enabled` is deliberately not type-checked: only a literal `true` enables, so it is kept as that bool.
        """
        block = self.mapping(value, "agent.llm_access")
        self.keys(block, _LLM_ACCESS_KEYS, "agent.llm_access")
        out: dict[str, Any] = {}
        if "enabled" in block:
            out["enabled"] = block["enabled"] is True
        for cap in (*LLM_CAP_KEYS, *LLM_TOKEN_CAP_KEYS):
            if block.get(cap) is not None:
                out[cap] = self.positive_int(block[cap], f"agent.llm_access.{cap}", 0)
        cost = block.get(LLM_COST_CAP_KEY)
        if cost is not None:
            number = isinstance(cost, int | float) and not isinstance(cost, bool)
            if not number or not math.isfinite(cost) or not 0 < cost <= MAX_COST_USD:
                raise self.fail(
                    f"agent.llm_access.{LLM_COST_CAP_KEY}",
                    f"expected a positive number of USD up to {MAX_COST_USD:.0f}, got {_describe(cost)}",
                )
            out[LLM_COST_CAP_KEY] = float(cost)
        if block.get("allowed_models") is not None:
            out["allowed_models"] = list(
                self.names(block["allowed_models"], "agent.llm_access.allowed_models")
            )
        return out


__all__ = [
    "_AgentParser",
]
