"""What an LLM call must pass before its provider is called, apart from LlmSession: the refusal and its fixed
messages, the run's usage counters and tool catalog, and `admit` itself (the checks in order, the budget
reservation and the call slot) with the input-token estimate it reserves from.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from host.core.errors import CallRefusal
from host.core.vocab import WireReason
from host.llm.budget import (
    UNPRICED_HINT,
    BudgetRefusal,
    LlmBudget,
    Reservation,
    Transient,
    estimate_tokens,
    may_have_reached_provider,
    transient_kind,
)
from host.llm.credentials import Binding, Resolution
from host.llm.providers import Adapter, Completion
from host.llm.toolcalls import (
    EMPTY_CATALOG,
    LlmCall,
    Prepared,
    Rejected,
    ToolCatalog,
    check_tools,
    json_string_bytes,
    prepare,
)
from host.policy.rules import LlmPolicy

logger = logging.getLogger("agentnode.sandbox.broker")

MAX_MESSAGES = 256
"""Messages one call may carry; more is LLM_INPUT_TOO_LARGE, refused before any message is looked at."""
MESSAGE_OVERHEAD_CHARS = 4
"""What each message adds to the input size besides its role and content: the structure around it (the
"\\n\\n" that joins system messages for Anthropic, 4 bytes once JSON-escaped, is paid by these and the
6 of "system"). Empty messages are not free, so many of them can never add up to a large request under a
small cap."""
FRAMING_BYTES_PER_MESSAGE = 16
"""Upper bound on the encoding overhead (field tags, length prefixes) of one message, one tool definition
or one tool call in a request."""
_CHARS_PER_TOKEN = 3  # conservative: real text averages ~4 chars/token, so the char cap is what bites
_MAX_TOKENS_CEILING = 16384
_CATALOG_FAILED = "the run's tool definitions cannot be read; the operator's host log says why"

# Fixed wording per wire reason: a refusal can never carry provider text, a key, a URL or the model name.
_REFUSAL_MESSAGES: dict[WireReason, str] = {
    WireReason.LLM_NOT_GRANTED: "LLM access is not granted to this run (llm_access.enabled is not declared "
    "or the host disabled it)",
    WireReason.INVALID_REQUEST: "the LLM request is malformed: messages must be a non-empty list of {role, "
    "content} with role system, user, assistant or tool and string content; tool calls only on assistant "
    "messages (unique ids, tools this request defines, arguments a JSON object), each answered by a tool "
    "message with its tool_call_id right after; tool_choice required needs tools; a response format is "
    "text, a JSON object or an object JSON schema with a name of [A-Za-z0-9_-]",
    WireReason.LLM_INPUT_TOO_LARGE: "LLM request exceeds the allowed input size",
    WireReason.LLM_MODEL_NOT_ALLOWED: "the host-configured LLM model is not allowed for this agent",
    WireReason.LLM_TOOL_NOT_ALLOWED: "the request offers the model a tool that is not among this run's tool "
    "definitions (ListTools: the tools of its allowlist)",
    WireReason.LLM_CALL_LIMIT: "LLM call limit reached for this run",
    WireReason.LLM_OUTPUT_TOO_LARGE: "LLM response exceeds the allowed output size",
    WireReason.LLM_RATE_LIMITED: "the LLM provider is rate-limiting the host; try again later",
    WireReason.LLM_TIMEOUT: "the LLM provider did not answer in time",
    WireReason.LLM_UNAVAILABLE: "the host's LLM provider is unavailable",
    WireReason.LLM_TOKEN_BUDGET: "the run's LLM token budget is used up (max_total_tokens)",
    WireReason.LLM_COST_BUDGET: "the run's LLM cost budget is used up (max_cost_usd)",
}


class LlmRefusal(CallRefusal):
    """A refused or failed LLM call; `message` is a fixed generic text per reason, so nothing leaks (a
    budget refusal's own fixed text names its cap)."""

    def __init__(self, reason: WireReason, message: str | None = None) -> None:
        super().__init__(reason, _REFUSAL_MESSAGES[reason] if message is None else message)


class UsageCounters:
    """One run's LLM counters (LlmSession.usage, for the audit record only); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage: dict[str, Any] = {
            "requests": 0,
            "calls": 0,
            "ok": 0,
            "refused_disabled": 0,
            "refused_limit": 0,
            "refused_input": 0,
            "refused_output": 0,
            "refused_model": 0,
            "refused_tool": 0,
            "provider_errors": 0,
            "tool_calls": 0,
            "tool_calls_refused": 0,
            "model": None,
        }

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._usage)

    def calls_left(self, max_calls: int) -> int:
        with self._lock:
            return max(0, max_calls - int(self._usage["calls"]))

    def model(self, model: str) -> None:
        with self._lock:
            self._usage["model"] = model

    def take_call(self, max_calls: int, cancel: Callable[[], object]) -> None:
        """Take one of `max_calls` call slots; when none is left, run `cancel` and refuse LLM_CALL_LIMIT."""
        with self._lock:
            if self._usage["calls"] >= max_calls:
                self._usage["refused_limit"] += 1
                cancel()
                raise LlmRefusal(WireReason.LLM_CALL_LIMIT)
            self._usage["calls"] += 1

    def delivered(self, completion: Completion) -> None:
        """A completion goes to the agent: count it and the model's tool calls (refused ones apart)."""
        refused = sum(1 for c in completion.tool_calls if c.refused)
        with self._lock:
            self._usage["ok"] += 1
            self._usage["tool_calls"] += len(completion.tool_calls)
            self._usage["tool_calls_refused"] += refused

    def count(self, counter: str) -> None:
        with self._lock:
            self._usage[counter] += 1

    def refuse(self, reason: WireReason, counter: str) -> NoReturn:
        self.count(counter)
        raise LlmRefusal(reason)

    def refuse_request(self, reason: WireReason, counter: str) -> NoReturn:
        """A refusal from `screen`: the request is counted here because it never reaches `admit`."""
        with self._lock:
            self._usage["requests"] += 1
            self._usage[counter] += 1
        raise LlmRefusal(reason)

    def provider_failed(self, reason: WireReason, exc: BaseException) -> WireReason:
        """Count and log a provider failure by exception type only: its text may hold the key or prompt."""
        self.count("provider_errors")
        logger.warning("LLM provider call failed (%s): %s", reason, type(exc).__name__)
        return reason


class RunCatalog:
    """The tools one run may hand to a model, built once, on first use, from where `use` says they come."""

    def __init__(self) -> None:
        self._tools: Callable[[], ToolCatalog] | None = None
        self._catalog: ToolCatalog | None = None
        self._catalog_lock = threading.Lock()
        self._catalog_failed = False

    def use(self, catalog: Callable[[], ToolCatalog]) -> None:
        self._tools = catalog

    def get(self) -> ToolCatalog:
        """The catalog (EMPTY_CATALOG without a source); a build that failed (the lockfile unreadable) fails
        every later ask the same way without building again."""
        with self._catalog_lock:
            if self._catalog_failed:
                raise LlmRefusal(WireReason.LLM_UNAVAILABLE, _CATALOG_FAILED)  # fresh: no frames kept
            if self._catalog is None:
                try:
                    self._catalog = self._tools() if self._tools is not None else EMPTY_CATALOG
                except Exception as exc:  # noqa: BLE001  logged by type; the agent gets a fixed refusal
                    self._catalog_failed = True
                    logger.warning("the run's tool definitions could not be built: %s", type(exc).__name__)
                    raise LlmRefusal(WireReason.LLM_UNAVAILABLE, _CATALOG_FAILED) from None
                if self._catalog.dropped:
                    logger.warning(
                        "%d declared tool(s) left out of this run's tool definitions (too many, too large, "
                        "or not an object schema)", self._catalog.dropped,
                    )  # fmt: skip
            return self._catalog


@dataclass
class Admitted:
    """A call that passed every check and holds a call slot: what its provider call needs. `reservation`
    changes when a retry reserves anew (LlmSession._retrying); its max_tokens is what each attempt asks."""

    adapter: Adapter
    request: Prepared
    reservation: Reservation


def admit(
    call: LlmCall,
    on_admit: Callable[[], None] | None,
    *,
    policy: LlmPolicy,
    usage: UsageCounters,
    tool_catalog: Callable[[], ToolCatalog],
    resolution: Resolution,
    client: Callable[[Binding], Adapter],
    budget: LlmBudget,
) -> Admitted:
    """Run every check, reserve a call slot and return what the provider call needs (LlmSession's order)."""
    usage.count("requests")
    if not policy.enabled:
        usage.refuse(WireReason.LLM_NOT_GRANTED, "refused_disabled")
    if isinstance(call.messages, Sequence) and len(call.messages) > MAX_MESSAGES:
        # before looking at a single message
        usage.refuse(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
    try:
        tools = check_tools(call.tools, tool_catalog()) if call.tools else ()
    except Rejected as rejected:
        if rejected.reason == WireReason.LLM_TOOL_NOT_ALLOWED:
            usage.refuse(rejected.reason, "refused_tool")
        raise LlmRefusal(rejected.reason) from None
    try:
        request = prepare(call, tools)
    except Rejected as rejected:
        raise LlmRefusal(rejected.reason) from None
    if request.chars > policy.max_input_chars:
        usage.refuse(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
    binding = resolution.binding
    if binding is None:
        # Provider, variable names and file paths only: never a key, URL or model.
        logger.warning("LLM call refused: %s", resolution.unavailable)
        usage.refuse(WireReason.LLM_UNAVAILABLE, "provider_errors")
    usage.model(binding.model)
    allowed = policy.allowed_models
    if allowed is not None and binding.model not in allowed:
        logger.warning("LLM call refused: the host model is outside the run's allowed_models")
        usage.refuse(WireReason.LLM_MODEL_NOT_ALLOWED, "refused_model")
    adapter: Adapter | None = None
    try:
        adapter = client(binding)
    except Exception as exc:  # noqa: BLE001  e.g. the SDK is missing; nothing was spent
        usage.provider_failed(WireReason.LLM_UNAVAILABLE, exc)
    if adapter is None:
        raise LlmRefusal(WireReason.LLM_UNAVAILABLE)
    max_tokens = max(1, math.ceil(policy.max_output_chars / _CHARS_PER_TOKEN))
    max_tokens = min(_MAX_TOKENS_CEILING, max_tokens)
    # Budgets (host/llm/budget.py): reserved after every free check and before the call slot, in one step
    # under the budget's lock; max_tokens becomes what is left. A refusal names its cap (nothing spent).
    try:
        reservation = budget.reserve(_estimate(request), binding.model, output_limit=max_tokens)
    except BudgetRefusal as refusal:
        if refusal.unpriced:
            logger.warning("LLM call refused: max_cost_usd is set and %s", UNPRICED_HINT)
        raise LlmRefusal(refusal.reason, refusal.message) from None
    usage.take_call(policy.max_calls, lambda: budget.cancel(reservation))
    if on_admit is not None:
        on_admit()
    return Admitted(adapter, request, reservation)


def _estimate(request: Prepared) -> int:
    """The request's input-token bound (host/llm/budget): every text it sends, roles, names and ids, and the
    providers' hidden tool prompt when it defines tools or asks for JSON."""
    # Catalog names and the provider-safe names actually sent, both: whichever is longer is covered.
    names: list[str] = [x for t in request.tools for x in (t.name, request.names.get(t.name, ""))]
    calls = 0
    for m in request.messages:
        names += [m.role, m.tool_call_id]
        names += [x for c in m.tool_calls for x in (c.id, c.name, request.provider_name(c))]
        calls += len(m.tool_calls)
    return estimate_tokens(
        [*request.texts(), *names],
        messages=len(request.messages),
        tools=bool(request.tools) or request.json_mode,
        definitions=len(request.tools) + (1 if request.json_mode else 0),  # JSON mode: a response tool
        calls=calls,
    )


def maybe_billed(kind: WireReason, exc: BaseException) -> bool:
    """The failed provider call may have generated (and been billed) up to its whole reservation: it timed
    out, or its connection was lost after the request may have reached the provider."""
    lost = transient_kind(exc) is Transient.CONNECTION and may_have_reached_provider(exc)
    return kind is WireReason.LLM_TIMEOUT or lost


def input_chars(messages: Sequence[Mapping[str, str]]) -> int:
    """The input size of plain {role, content} messages, as a call is capped on (`max_input_chars`): every
    role and every content as the bytes it takes in the request body (`json_string_bytes`: JSON-escaped,
    UTF-8), plus MESSAGE_OVERHEAD_CHARS per message. For plain ASCII text without quotes, backslashes or
    control characters that is one per character; text that escaping or UTF-8 makes longer on the wire
    counts what it sends, so no content shape can make a request several times the cap.

    It bounds what either adapter sends of roles and contents: OpenAI gets each as counted; Anthropic gets
    the non-system messages as counted plus the non-empty system contents joined by "\\n\\n" (4 bytes
    escaped), which is less than their roles, contents and overheads together. The rest of the body is
    JSON structure: at most a fixed ~25 bytes a message besides what is counted, and a few fields.

    A request with tools, tool calls, tool results or a response format counts those too
    (host/llm/toolcalls.prepare): tool definitions as the host sends them, call ids, names and arguments,
    result ids, the response schema, each the larger of what the agent sent and what the provider is sent.
    """
    return sum(
        json_string_bytes(m["role"]) + json_string_bytes(m["content"]) + MESSAGE_OVERHEAD_CHARS
        for m in messages
    )


__all__ = [
    "FRAMING_BYTES_PER_MESSAGE",
    "MAX_MESSAGES",
    "MESSAGE_OVERHEAD_CHARS",
    "Admitted",
    "LlmRefusal",
    "RunCatalog",
    "UsageCounters",
    "admit",
    "input_chars",
    "maybe_billed",
]
