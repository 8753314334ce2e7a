"""Who asked for a run and how tightly: caller metadata and per-run limits, validated before it starts.

An operator's service tags each run so its own logs, bills and traces can be joined with the audit record.
The values are the operator's, never the agent's, but they still reach a terminal (`audit`) and log files,
so they are held to short, fixed alphabets (no spaces, quotes, control or non-ASCII characters) and a
bounded count: a bad value is refused with a message naming the field and the rule, before anything runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from host.policy.rules import RunPolicy

MAX_TENANT_CHARS = 64
MAX_REQUEST_ID_CHARS = 128
MAX_LABELS = 16
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 128

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
_LABEL_KEY = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9._:/+=@-]{0,128}")


class InvalidCaller(ValueError):
    """A caller metadata value broke its rule; the message names the field and the rule, never the value."""


@dataclass(frozen=True)
class CallerInfo:
    """The caller's metadata for one run (all optional); construct it with `CallerInfo.parse` to validate."""

    tenant: str = ""
    request_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, tenant: Any = "", request_id: Any = "", labels: Any = None) -> CallerInfo:
        """Validated metadata; raises InvalidCaller naming the first rule broken.

        - tenant: empty, or 1-64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit;
        - request_id: empty, or 1-128 of `A-Z a-z 0-9 . _ : / + = -` (UUIDs, ULIDs, trace ids);
        - labels: at most 16; keys 1-63 of lower-case `a-z 0-9 . _ -`, starting and ending with a letter or
          digit; values 0-128 of `A-Z a-z 0-9 . _ : / + = @ -`.
        """
        if not isinstance(tenant, str) or (tenant and not _TENANT.fullmatch(tenant)):
            raise InvalidCaller(
                f"tenant must be 1-{MAX_TENANT_CHARS} characters of A-Z a-z 0-9 . _ : - "
                "starting with a letter or digit"
            )
        if not isinstance(request_id, str) or (request_id and not _REQUEST_ID.fullmatch(request_id)):
            raise InvalidCaller(
                f"request_id must be 1-{MAX_REQUEST_ID_CHARS} characters of A-Z a-z 0-9 . _ : / + = -"
            )
        raw = {} if labels is None else labels
        if not isinstance(raw, Mapping):
            raise InvalidCaller("labels must be a mapping of label names to values")
        if len(raw) > MAX_LABELS:
            raise InvalidCaller(f"at most {MAX_LABELS} labels")
        checked: dict[str, str] = {}
        for key, value in raw.items():
            if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
                raise InvalidCaller(
                    f"a label name must be 1-{MAX_LABEL_KEY_CHARS} characters of a-z 0-9 . _ - "
                    "starting and ending with a letter or digit"
                )
            if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
                raise InvalidCaller(
                    f"label {key}: a value must be 0-{MAX_LABEL_VALUE_CHARS} characters of "
                    "A-Z a-z 0-9 . _ : / + = @ -"
                )
            checked[key] = value
        return cls(tenant=tenant, request_id=request_id, labels=dict(sorted(checked.items())))

    @property
    def empty(self) -> bool:
        return not (self.tenant or self.request_id or self.labels)

    def record(self) -> dict[str, Any]:
        """The audit record's `caller` object: every field, empty ones as "" and {}."""
        return {"tenant": self.tenant, "request_id": self.request_id, "labels": dict(self.labels)}


NO_CALLER = CallerInfo()

_MAX_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class RunOverrides:
    """Tighter limits for one run, asked by its caller. They can only lower what the manifest and the host
    allow (each effective limit becomes the lower of the two); None leaves a limit as it is. Construct it
    with `RunOverrides.parse` to validate."""

    max_runtime_seconds: int | None = None
    max_tool_calls: int | None = None
    max_iterations: int | None = None
    max_llm_calls: int | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    egress: tuple[str, ...] | None = None
    """The run's egress grant, as normalized `NAME[:PORT]` rules: replaces the standing grants for this run
    within what the operator lets a caller grant (host/policy/egress.py `ceiling`); () is no egress."""

    @classmethod
    def parse(cls, **limits: Any) -> RunOverrides:
        """Validated overrides; raises InvalidCaller naming the limit. Whole limits are 1..2**31-1 (tool
        and LLM calls may be 0: none), the cost a positive finite number of US dollars."""
        checked: dict[str, Any] = {}
        for name, value in limits.items():
            if name not in cls.__dataclass_fields__:
                raise InvalidCaller(f"{name} is not a limit a caller can set")
            if value is None:
                continue
            if name == "egress":
                checked[name] = _egress_rules(value)
                continue
            if name == "max_cost_usd":
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if not number or not math.isfinite(value) or not 0 < value < 1e9:
                    raise InvalidCaller("max_cost_usd must be a positive number of US dollars")
                checked[name] = float(value)
                continue
            floor = 0 if name in ("max_tool_calls", "max_llm_calls") else 1
            if isinstance(value, bool) or not isinstance(value, int) or not floor <= value <= _MAX_LIMIT:
                raise InvalidCaller(f"{name} must be a whole number from {floor} to {_MAX_LIMIT}")
            checked[name] = value
        return cls(**checked)

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__dataclass_fields__)

    def tighten(self, policy: RunPolicy) -> RunPolicy:
        """`policy` with each limit lowered to this override where it is lower (never raised)."""

        def lower(current: int | None, wanted: int | None) -> int | None:
            if wanted is None:
                return current
            return wanted if current is None else min(current, wanted)

        llm = policy.llm
        cost = llm.max_cost_usd
        if self.max_cost_usd is not None:
            cost = self.max_cost_usd if cost is None else min(cost, self.max_cost_usd)
        llm = replace(
            llm,
            max_calls=llm.max_calls if self.max_llm_calls is None else min(llm.max_calls, self.max_llm_calls),
            max_total_tokens=lower(llm.max_total_tokens, self.max_total_tokens),
            max_cost_usd=cost,
        )
        return replace(
            policy,
            max_runtime_seconds=lower(policy.max_runtime_seconds, self.max_runtime_seconds) or 1,
            max_tool_calls=lower(policy.max_tool_calls, self.max_tool_calls) or 0,
            max_iterations=lower(policy.max_iterations, self.max_iterations) or 1,
            llm=llm,
        )


def _egress_rules(value: Any) -> tuple[str, ...]:
    """A caller's egress grant as normalized rule texts; InvalidCaller says what is wrong, quoting nothing."""
    from host.spec.egress import MAX_RULES, BadName, merge, parse_rule  # noqa: PLC0415

    if isinstance(value, str) or not isinstance(value, list | tuple) or len(value) > MAX_RULES:
        raise InvalidCaller(f"egress must be a list of at most {MAX_RULES} NAME[:PORT] rules")
    try:
        rules = merge(parse_rule(item) for item in value)
    except BadName as exc:
        raise InvalidCaller(f"egress: expected NAME[:PORT], *.SUFFIX[:PORT] or an address: {exc}") from None
    return tuple(text for rule in rules for text in rule.texts())


NO_OVERRIDES = RunOverrides()


__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_KEY_CHARS",
    "MAX_LABEL_VALUE_CHARS",
    "MAX_REQUEST_ID_CHARS",
    "MAX_TENANT_CHARS",
    "NO_CALLER",
    "NO_OVERRIDES",
    "CallerInfo",
    "InvalidCaller",
    "RunOverrides",
]
