"""A run's LLM token and cost budgets, and the retry schedule for transient provider failures.

`LlmBudget` is reserved before each provider call and settled from the provider's reported usage after it.
One lock guards all of its state and `reserve` checks and reserves in one step under it, so concurrent calls
can never together reserve more than a budget holds: of 50 calls racing for a budget that covers 7, exactly
7 get a reservation (and with it a provider call) and 43 are refused before anything is sent.

Caps, checked in this order (the first that fails names itself in the refusal):

- `max_input_tokens` (per call): the call's input bound may not exceed it (LLM_INPUT_TOO_LARGE).
- `max_cost_usd` with no price for the model: refused, fail closed (LLM_COST_BUDGET); add the model to
  `agent_sandbox.llm.prices`.
- `max_total_tokens` (per run): settled tokens plus open reservations plus this call's input bound plus
  at least one output token must fit (LLM_TOKEN_BUDGET).
- `max_cost_usd` (per run): settled cost plus reserved cost plus the bound's input cost plus at least
  one output token's cost must fit (LLM_COST_BUDGET).

`Reservation.max_tokens` (the output tokens to ask the provider for) is what is left: the least of the
caller's own bound (`output_limit`, else DEFAULT_MAX_OUTPUT_TOKENS), `max_output_tokens`, the run's tokens
left after the input bound, and the output tokens the cost left buys at the model's output price.

Input bound (`estimate_input_tokens`): an upper bound of the tokens a request can be, not a guess. The
providers' tokenizers (byte-level BPE: OpenAI's, Anthropic's; SentencePiece with byte fallback on
OpenAI-compatible servers) never make a token of less than one byte of UTF-8, so the bound is the UTF-8
bytes of every text the request carries, plus TOKENS_PER_MESSAGE (4) per message for the role and framing
tokens, TOKENS_PER_REQUEST (3), TOKENS_PER_TOOL (20) per tool definition and TOKENS_PER_TOOL_CALL (10) per
tool call in the conversation for the framing the provider renders around them (OpenAI's own counting
guide gives 7 + 12 per function), and TOOL_PROMPT_TOKENS (400) when the request defines tools or asks for
JSON (providers add a hidden tool-use prompt: Anthropic documents up to 346 tokens). No text can make the
provider's count exceed it, so `max_input_tokens`, `max_total_tokens` and `max_cost_usd` hold as ceilings,
not as estimates; the price is that ordinary English (about 4 bytes a token) is reserved at about 4 times
what it will cost until the provider's count settles it.

Accounting after the call (never negative; later calls see the true totals):

- `settle(r, input, output)`: the provider's counts replace the reservation and the unused part returns to
  the budget. A provider that reports more than was reserved is charged all of it and the excess is
  recorded as overshoot (`overshoot_tokens`), so the budget may end above its cap by that much but never
  admits another call once spent. A usage without input tokens (None or 0: a real request always has
  some) counts as not reported and charges the whole reservation.
- `release(r)`: the provider call failed (after retries) before usage was known. It may still have cost
  something, so it is charged conservatively: the input bound, no output.
- `cancel(r)`: nothing was sent (a later check refused the call); nothing is charged.

Retries of one call share its reservation: a call is charged once, for its final outcome. Rate limits and
server errors are not billed by the providers the broker speaks to; the attempts are counted as retries.
A connection that failed once the request may have reached the provider (anything but a connection that
was never made, `may_have_reached_provider`) may have been billed in full: `renew` charges that attempt
its whole reservation and reserves the retry anew, which the budget refuses, naming its cap, when it no
longer covers it.

Nothing here sees a prompt, a completion or a tool argument: only counts, the host-side model name (to find
its price) and the caps. Costs are exact (fractions of the decimal prices as written); the audit gets them
as rounded floats.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from host.core.errors import CallRefusal
from host.core.strictjson import utf8_len
from host.core.vocab import WireReason
from host.spec.config import ModelPrice

if TYPE_CHECKING:
    from host.policy.rules import LlmPolicy

_T = TypeVar("_T")

TOKENS_PER_MESSAGE = 4
"""Tokens each message may add besides its text (role and framing tokens)."""
TOKENS_PER_REQUEST = 3
"""Tokens every request adds (the reply's priming)."""
TOKENS_PER_TOOL = 20
"""Tokens each tool definition may add besides its name, description and schema text (its framing)."""
TOKENS_PER_TOOL_CALL = 10
"""Tokens each tool call in the conversation may add besides its id, name and arguments (its framing)."""
TOOL_PROMPT_TOKENS = 400
"""Tokens a provider may add to a request that defines tools or a JSON answer (its hidden tool-use prompt)."""
MIN_CALL_TOKENS = TOKENS_PER_REQUEST + TOKENS_PER_MESSAGE + len("user") + 1
"""The smallest bound a call can reserve: one user message of no text, and one output token."""
DEFAULT_MAX_OUTPUT_TOKENS = 16_384
"""Output tokens asked for when neither the caller nor a cap bounds them."""
_MILLION = 1_000_000

CAP_INPUT = "max_input_tokens"
CAP_OUTPUT = "max_output_tokens"
CAP_TOTAL = "max_total_tokens"
CAP_COST = "max_cost_usd"

# Fixed wording per cap: a refusal never carries the model name, a price or any count.
_REFUSALS: dict[str, tuple[WireReason, str]] = {
    CAP_INPUT: (
        WireReason.LLM_INPUT_TOO_LARGE,
        "LLM request exceeds the allowed input tokens (max_input_tokens)",
    ),
    CAP_TOTAL: (WireReason.LLM_TOKEN_BUDGET, "the run's LLM token budget is used up (max_total_tokens)"),
    CAP_COST: (WireReason.LLM_COST_BUDGET, "the run's LLM cost budget is used up (max_cost_usd)"),
}
_UNPRICED_MESSAGE = (
    "the run's LLM cost budget cannot be checked: the host has no price for its model (max_cost_usd)"
)
UNPRICED_HINT = "add the host's model to agent_sandbox.llm.prices (USD per million input and output tokens)"


class BudgetRefusal(CallRefusal):
    """A call the budget refused before anything was sent; `cap` names the cap, `message` is fixed text that
    never names the model, and `hint` (for the operator's log only) says what to change."""

    def __init__(self, cap: str, *, unpriced: bool = False) -> None:
        reason, message = _REFUSALS[cap]
        super().__init__(reason, _UNPRICED_MESSAGE if unpriced else message)
        self.cap = cap
        self.unpriced = unpriced
        self.hint = UNPRICED_HINT if unpriced else f"raise {cap} (llm_access, agent_sandbox.llm) or use less"


def exact(value: float) -> Fraction:
    """A config number as the exact decimal it was written as (0.15 is 3/20, not the nearest double)."""
    return Fraction(repr(value))


def estimate_input_tokens(
    messages: Iterable[Mapping[str, Any]], extra: Iterable[str] = (), *, tools: bool = False
) -> int:
    """The input-token bound of a request (see the module doc).

    Every string of each message counts as its UTF-8 bytes (content, tool-call names and arguments, call
    ids, nested keys); the message's own keys are structure and covered by TOKENS_PER_MESSAGE. `extra` is
    other text the provider is sent (tool definitions or a response format as JSON text), counted whole;
    `tools`: the request defines tools or asks for JSON (TOOL_PROMPT_TOKENS).
    """
    texts: list[str] = list(extra)
    count = 0
    for message in messages:
        count += 1
        stack: list[Any] = list(message.values())
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping):
                texts.extend(str(key) for key in item)
                stack.extend(item.values())
            elif isinstance(item, list | tuple):
                stack.extend(item)
            elif item is not None:
                texts.append(str(item))
    return estimate_tokens(texts, messages=count, tools=tools)


def estimate_tokens(
    texts: Iterable[str], *, messages: int, tools: bool = False, definitions: int = 0, calls: int = 0
) -> int:
    """The bound of `texts` (everything a request sends: contents, roles, names, ids, arguments, tool
    definitions) in `messages` messages with `definitions` tool definitions and `calls` tool calls: their
    UTF-8 bytes + TOKENS_PER_MESSAGE per message + TOKENS_PER_REQUEST + TOKENS_PER_TOOL per definition +
    TOKENS_PER_TOOL_CALL per call, + TOOL_PROMPT_TOKENS when `tools` (the request defines tools or asks for
    JSON)."""
    text_bytes = sum(utf8_len(text) for text in texts)
    overhead = TOKENS_PER_MESSAGE * messages + TOKENS_PER_REQUEST + (TOOL_PROMPT_TOKENS if tools else 0)
    return text_bytes + overhead + TOKENS_PER_TOOL * definitions + TOKENS_PER_TOOL_CALL * calls


@dataclass(frozen=True)
class Reservation:
    """What one admitted call holds of the budget until it is settled, released or cancelled."""

    serial: int
    model: str
    input_tokens: int
    """The input bound reserved."""
    max_tokens: int
    """The output tokens to ask the provider for (at least 1)."""
    cost: Fraction | None
    """The reserved cost in USD (input estimate and max_tokens at the model's prices); None: unpriced."""

    @property
    def tokens(self) -> int:
        """Tokens reserved in all."""
        return self.input_tokens + self.max_tokens


class LlmBudget:
    """One run's token and cost budgets; thread-safe (one lock, reserve checks and reserves atomically).

    A cap that is None is not enforced. `prices` maps host-side model names to their prices.
    """

    def __init__(
        self,
        *,
        max_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_total_tokens: int | None = None,
        max_cost_usd: float | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
    ) -> None:
        for name, cap in ((CAP_INPUT, max_input_tokens), (CAP_OUTPUT, max_output_tokens),
                          (CAP_TOTAL, max_total_tokens)):  # fmt: skip
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
                raise ValueError(f"{name} must be a positive integer or None")
        if max_cost_usd is not None and not (math.isfinite(max_cost_usd) and max_cost_usd > 0):
            raise ValueError(f"{CAP_COST} must be a positive finite number or None")
        self.max_input_tokens = max_input_tokens
        self.max_output_tokens = max_output_tokens
        self.max_total_tokens = max_total_tokens
        self.max_cost_usd = max_cost_usd
        self._max_cost = None if max_cost_usd is None else exact(max_cost_usd)
        self._prices: dict[str, tuple[Fraction, Fraction]] = {
            model: (exact(p.input_per_million) / _MILLION, exact(p.output_per_million) / _MILLION)
            for model, p in (prices or {}).items()
        }
        self._lock = threading.Lock()
        self._serial = 0
        self._open: dict[int, Reservation] = {}
        self._reserved_tokens = 0
        self._reserved_cost = Fraction(0)
        self._input_tokens = 0
        self._output_tokens = 0
        self._cost = Fraction(0)
        self._unpriced_calls = 0
        self._overshoot_tokens = 0
        self._reservations = 0
        self._refused = {CAP_INPUT: 0, CAP_TOTAL: 0, CAP_COST: 0}

    @classmethod
    def for_policy(cls, policy: LlmPolicy, prices: Mapping[str, ModelPrice] | None) -> LlmBudget:
        """The budget of a run from its LlmPolicy (host/policy/rules.py) and the host's price table."""
        return cls(
            max_input_tokens=policy.max_input_tokens,
            max_output_tokens=policy.max_output_tokens,
            max_total_tokens=policy.max_total_tokens,
            max_cost_usd=policy.max_cost_usd,
            prices=prices,
        )

    def priced(self, model: str) -> bool:
        """The host has a price for `model`."""
        return model in self._prices

    def reserve(
        self, estimated_input_tokens: int, model: str, *, output_limit: int | None = None
    ) -> Reservation:
        """Check every cap and reserve the call's share in one step; raises BudgetRefusal naming the cap.

        `estimated_input_tokens` is the call's input bound (estimate_input_tokens), `model` the host-side
        model it goes to, `output_limit` the caller's own bound on the output tokens (at least 1).
        """
        if isinstance(estimated_input_tokens, bool) or not isinstance(estimated_input_tokens, int):
            raise TypeError("estimated_input_tokens must be an int")
        if estimated_input_tokens < 0:
            raise ValueError("estimated_input_tokens must not be negative")
        if output_limit is not None and output_limit < 1:
            raise ValueError("output_limit must be at least 1")
        estimate = estimated_input_tokens
        price = self._prices.get(model)
        with self._lock:
            if self.max_input_tokens is not None and estimate > self.max_input_tokens:
                self._refuse(CAP_INPUT)
            if self._max_cost is not None and price is None:
                self._refuse(CAP_COST, unpriced=True)
            limit = DEFAULT_MAX_OUTPUT_TOKENS if output_limit is None else output_limit
            if self.max_output_tokens is not None:
                limit = min(limit, self.max_output_tokens)
            if self.max_total_tokens is not None:
                spent = self._input_tokens + self._output_tokens + self._reserved_tokens
                room = self.max_total_tokens - spent - estimate
                if room < 1:
                    self._refuse(CAP_TOTAL)
                limit = min(limit, room)
            if self._max_cost is not None:
                assert price is not None  # refused above
                per_input, per_output = price
                left = self._max_cost - self._cost - self._reserved_cost - estimate * per_input
                if left < 0 or (per_output and left < per_output):
                    self._refuse(CAP_COST)
                if per_output:
                    limit = min(limit, math.floor(left / per_output))
            cost = None if price is None else estimate * price[0] + limit * price[1]
            self._serial += 1
            reservation = Reservation(self._serial, model, estimate, limit, cost)
            self._open[reservation.serial] = reservation
            self._reserved_tokens += reservation.tokens
            self._reserved_cost += cost or 0
            self._reservations += 1
            return reservation

    def screen(self) -> None:
        """Refuse (BudgetRefusal, counted like reserve's) when even the smallest call can no longer fit: fewer
        tokens left than MIN_CALL_TOKENS, or no cost left; so a run whose budget is spent is told so before
        its request is read."""
        with self._lock:
            if self.max_total_tokens is not None:
                spent = self._input_tokens + self._output_tokens + self._reserved_tokens
                if self.max_total_tokens - spent < MIN_CALL_TOKENS:
                    self._refuse(CAP_TOTAL)
            if self._max_cost is not None and self._max_cost - self._cost - self._reserved_cost <= 0:
                self._refuse(CAP_COST)

    def settle(self, reservation: Reservation, input_tokens: int | None, output_tokens: int | None) -> bool:
        """Replace the reservation with the provider's reported usage; False when it was already closed.

        Input tokens None or 0 mean the provider reported no usage: the whole reservation is charged. Output
        tokens None (with input tokens reported) charge the reserved max_tokens. Negative counts count as 0.
        """
        if not input_tokens or input_tokens < 0:
            used_in, used_out = reservation.input_tokens, reservation.max_tokens
        else:
            used_in = input_tokens
            used_out = reservation.max_tokens if output_tokens is None else max(0, output_tokens)
        return self._close(reservation, used_in, used_out)

    def renew(self, reservation: Reservation) -> Reservation:
        """Charge `reservation` in full (an attempt that may have been billed) and reserve the same call
        again for a retry; raises BudgetRefusal (naming the cap) when the budget no longer covers it."""
        self.settle(reservation, None, None)
        return self.reserve(reservation.input_tokens, reservation.model, output_limit=reservation.max_tokens)

    def release(self, reservation: Reservation) -> bool:
        """The provider call failed before usage was known: charge the input estimate and no output."""
        return self._close(reservation, reservation.input_tokens, 0)

    def cancel(self, reservation: Reservation) -> bool:
        """Nothing was sent for this reservation: return all of it."""
        return self._close(reservation, 0, 0, charged=False)

    def _close(self, reservation: Reservation, used_in: int, used_out: int, *, charged: bool = True) -> bool:
        with self._lock:
            if self._open.pop(reservation.serial, None) is None:
                return False
            self._reserved_tokens -= reservation.tokens
            self._reserved_cost -= reservation.cost or 0
            if not charged:
                return True
            self._input_tokens += used_in
            self._output_tokens += used_out
            self._overshoot_tokens += max(0, used_in + used_out - reservation.tokens)
            price = self._prices.get(reservation.model)
            if price is None:
                self._unpriced_calls += 1
            else:
                self._cost += used_in * price[0] + used_out * price[1]
            return True

    def _refuse(self, cap: str, *, unpriced: bool = False) -> NoReturn:
        """Count a refusal (the lock is held) and raise it."""
        self._refused[cap] += 1
        raise BudgetRefusal(cap, unpriced=unpriced)

    @property
    def tokens_left(self) -> int | None:
        """max_total_tokens minus settled and reserved tokens (never negative); None without the cap."""
        if self.max_total_tokens is None:
            return None
        with self._lock:
            spent = self._input_tokens + self._output_tokens + self._reserved_tokens
            return max(0, self.max_total_tokens - spent)

    @property
    def cost_left(self) -> Fraction | None:
        """max_cost_usd minus settled and reserved cost (never negative); None without the cap."""
        if self._max_cost is None:
            return None
        with self._lock:
            return max(Fraction(0), self._max_cost - self._cost - self._reserved_cost)

    @property
    def cost(self) -> Fraction:
        """The exact settled cost of the priced calls."""
        with self._lock:
            return self._cost

    def totals(self) -> dict[str, Any]:
        """Counts for the audit record: settled tokens, the cost (None when a settled call had no price),
        overshoot, reservations made and refusals by cap. Never text of any kind but the key names."""
        with self._lock:
            return {
                "input_tokens": self._input_tokens,
                "output_tokens": self._output_tokens,
                "cost_usd": None if self._unpriced_calls else round(float(self._cost), 9),
                "overshoot_tokens": self._overshoot_tokens,
                "reservations": self._reservations,
                "refused_input_tokens": self._refused[CAP_INPUT],
                "refused_total_tokens": self._refused[CAP_TOTAL],
                "refused_cost": self._refused[CAP_COST],
            }


# --- transient provider failures -------------------------------------------------------------------------


class Transient(enum.StrEnum):
    """The provider failures worth retrying."""

    RATE_LIMITED = "rate_limited"
    """HTTP 429."""
    SERVER_ERROR = "server_error"
    """HTTP 5xx (including Anthropic's 529 overloaded)."""
    CONNECTION = "connection"
    """The connection failed or was reset before a response (not a timeout: its time is already spent)."""


_CONNECTION_ERRORS = frozenset({"APIConnectionError", "ConnectError", "RemoteProtocolError", "ReadError"})
_TIMEOUT_ERRORS = frozenset({"APITimeoutError", "TimeoutException"})


def transient_kind(exc: BaseException) -> Transient | None:
    """Which transient failure `exc` is, or None (not retried).

    Read from the SDKs' exceptions without importing them: an HTTP status (`status_code`, as openai's and
    anthropic's APIStatusError carry) of 429 or 5xx, or a connection error by class name (the SDKs'
    APIConnectionError, httpx's ConnectError/RemoteProtocolError/ReadError, ConnectionError). Timeouts
    (APITimeoutError, httpx's TimeoutException, TimeoutError) are never retried.
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _TIMEOUT_ERRORS or isinstance(exc, TimeoutError):
        return None
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        if status == 429:
            return Transient.RATE_LIMITED
        if 500 <= status <= 599:
            return Transient.SERVER_ERROR
        return None
    if names & _CONNECTION_ERRORS or isinstance(exc, ConnectionError):
        return Transient.CONNECTION
    return None


_NEVER_CONNECTED = frozenset({"ConnectError", "ConnectTimeout", "ConnectionRefusedError"})


def may_have_reached_provider(exc: BaseException) -> bool:
    """False only when `exc` (or an exception it was raised from) says the connection was never made, so
    the provider cannot have seen, or billed, the request."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        if {cls.__name__ for cls in type(current).__mro__} & _NEVER_CONNECTED:
            return False
        current = current.__cause__ or current.__context__
    return True


def retry_after_seconds(exc: BaseException) -> float | None:
    """The provider's `retry-after` header in seconds (a plain non-negative number only), or None."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    get = getattr(headers, "get", None)
    if get is None:
        return None
    try:
        raw = get("retry-after")
        value = float(raw) if isinstance(raw, str) and len(raw) <= 16 else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with bounded exponential backoff, never past a deadline; pure.

    After attempt n (1-based) fails transiently, wait min(max_delay, base_delay * multiplier**(n-1)),
    raised to the provider's retry-after when it asks for longer (still at most max_delay), and try again;
    give up after max_attempts attempts in all, or when the wait would leave less than min_remaining seconds
    before the deadline.
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 4.0
    min_remaining: float = 1.0
    """Seconds a retry needs before the deadline to be worth starting."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        numbers = (self.base_delay, self.multiplier, self.max_delay, self.min_remaining)
        if not all(math.isfinite(x) and x >= 0 for x in numbers) or self.multiplier < 1:
            raise ValueError("delays must be finite and non-negative, the multiplier at least 1")

    def delay(
        self, attempt: int, *, now: float, deadline: float | None, retry_after: float | None = None
    ) -> float | None:
        """Seconds to wait before attempt `attempt + 1` once attempt `attempt` failed; None: give up."""
        if attempt >= self.max_attempts:
            return None
        wait = min(self.max_delay, self.base_delay * self.multiplier ** (attempt - 1))
        if retry_after is not None and math.isfinite(retry_after) and retry_after > wait:
            wait = min(self.max_delay, retry_after)
        if deadline is not None and now + wait + self.min_remaining > deadline:
            return None
        return wait

    def schedule(self, *, now: float = 0.0, deadline: float | None = None) -> list[float]:
        """The waits of a call whose every attempt fails at once (for documentation and tests)."""
        waits: list[float] = []
        attempt = 1
        while (wait := self.delay(attempt, now=now, deadline=deadline)) is not None:
            waits.append(wait)
            now += wait
            attempt += 1
        return waits


class RetryCounts:
    """Retries made in one run, by kind; thread-safe. Counts only, for the audit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(Transient, 0)

    def record(self, kind: Transient) -> None:
        with self._lock:
            self._counts[kind] += 1

    def totals(self) -> dict[str, int]:
        """`retries` in all and `retries_<kind>` for each kind."""
        with self._lock:
            counts = dict(self._counts)
        return {"retries": sum(counts.values()), **{f"retries_{k.value}": n for k, n in counts.items()}}


def call_with_retries(
    attempt_call: Callable[[], _T],
    *,
    policy: RetryPolicy,
    counts: RetryCounts,
    deadline: float | None,
    classify: Callable[[BaseException], Transient | None] = transient_kind,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    before_retry: Callable[[Transient, BaseException], object] | None = None,
) -> _T:
    """`attempt_call()`, retried on transient failures as `policy` says; the last failure is raised as is.

    `deadline` is on `clock`'s scale (time.monotonic by default). `sleep` returning True (an event's wait:
    the run ended) ends the call with the last failure. `before_retry(kind, exc)` runs after the wait,
    just before the retry is made (and counted); an exception from it ends the call instead (a budget that
    no longer covers the retry).
    """
    attempt = 1
    while True:
        try:
            return attempt_call()
        except Exception as exc:
            kind = classify(exc)
            wait = None
            if kind is not None:
                hint = retry_after_seconds(exc)
                wait = policy.delay(attempt, now=clock(), deadline=deadline, retry_after=hint)
            if kind is None or wait is None or sleep(wait) is True:
                raise
            if before_retry is not None:
                before_retry(kind, exc)
            counts.record(kind)
        attempt += 1


__all__ = [
    "CAP_COST",
    "CAP_INPUT",
    "CAP_OUTPUT",
    "CAP_TOTAL",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "MIN_CALL_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_REQUEST",
    "TOKENS_PER_TOOL",
    "TOKENS_PER_TOOL_CALL",
    "TOOL_PROMPT_TOKENS",
    "UNPRICED_HINT",
    "BudgetRefusal",
    "LlmBudget",
    "Reservation",
    "RetryCounts",
    "RetryPolicy",
    "Transient",
    "call_with_retries",
    "estimate_input_tokens",
    "estimate_tokens",
    "exact",
    "may_have_reached_provider",
    "retry_after_seconds",
    "transient_kind",
]
