"""One run's LLM session: every call checked against the run's `LlmPolicy` before any spend, the provider
called through the broker's adapter (retried within the call's one slot), the answer held to the output cap
and the budget settled from the provider's own usage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from host.core.calltrace import CallTrace
from host.core.vocab import WireReason
from host.llm.admission import (
    FRAMING_BYTES_PER_MESSAGE,
    MAX_MESSAGES,
    Admitted,
    LlmRefusal,
    RunCatalog,
    UsageCounters,
    admit,
    maybe_billed,
)
from host.llm.budget import BudgetRefusal, LlmBudget, RetryCounts, RetryPolicy
from host.llm.credentials import Binding, Resolution
from host.llm.providers import Adapter, Completion, StreamItem
from host.llm.retrying import retrying, retrying_stream
from host.llm.toolcalls import MAX_TOOL_CALLS, MAX_TOOLS, LlmCall, ToolCatalog
from host.llm.translate import CallDelta, TooManyToolCalls
from host.policy.rules import LlmPolicy
from host.spec.config import LlmHostConfig

_T = TypeVar("_T")


class _Broker(Protocol):
    """What a session uses of its LlmBroker (host/llm/broker.py, which imports this module)."""

    _host: LlmHostConfig
    _retry: RetryPolicy
    _default: Resolution

    def _client(self, binding: Binding) -> Adapter: ...


class LlmSession:
    """One run's LLM budget; thread-safe. Checks run before any spend, and a call slot is reserved before
    the provider is called, so concurrent calls can never exceed `max_calls`.

    Order: granted → message count → tools on the run's catalog → well-formed → input size → provider
    configured → model allowed → token/cost budget (host/llm/budget.py: reserved, settled after the call) →
    call slot. Only the last two consume anything: a request refused earlier cost nothing and is not
    charged. A transient provider failure (429, 5xx, a reset connection) is retried within the call's one
    slot, with bounded backoff, never past the run's deadline nor after the run ended; the retry keeps the
    reservation unless the failed attempt may have been billed (see `_retrying`). The RPC layer runs
    `screen` first, on a request it has not even decoded yet.
    """

    def __init__(
        self,
        broker: _Broker,
        policy: LlmPolicy,
        resolution: Resolution | None = None,
        *,
        deadline: float | None = None,
    ) -> None:
        self._broker = broker
        self._policy = policy
        self._resolution = broker._default if resolution is None else resolution
        # Token and cost budgets and provider retries (host/llm/budget.py): reserved in _admit, settled in
        # _settled; counts only, for the audit (budget_usage).
        self._budget = LlmBudget.for_policy(policy, broker._host.prices)
        self._retries = RetryCounts()
        self._deadline = deadline
        self._closed = threading.Event()  # the run ended: a provider retry waiting to start gives up
        self.trace = CallTrace()  # each admitted or refused call's timing, for the run's trace
        self._catalog = RunCatalog()
        self._usage = UsageCounters()

    def close(self) -> None:
        """The run ended: a call waiting to retry its provider gives up at once with its last failure."""
        self._closed.set()

    def use_tools(self, catalog: Callable[[], ToolCatalog]) -> None:
        """Where the run's tool catalog comes from (host/runtime/wiring.py); built on first use, once per run.
        Without it the run has no tools to offer a model."""
        self._catalog.use(catalog)

    def tool_catalog(self) -> ToolCatalog:
        """The tools this run may hand to a model (ListTools), built once; needs no LLM grant. A build that
        failed (the lockfile unreadable) fails every later ask the same way without building again."""
        return self._catalog.get()

    @property
    def max_request_bytes(self) -> int:
        """The most bytes an admissible input can take encoded: the input size counts every text a request
        carries at least as its UTF-8 bytes (what protobuf carries), and each of at most MAX_MESSAGES
        messages, MAX_TOOLS tool definitions and MAX_TOOL_CALLS tool calls adds at most
        FRAMING_BYTES_PER_MESSAGE of framing."""
        if not self._policy.enabled:
            return 0
        framed = MAX_MESSAGES + MAX_TOOLS + MAX_TOOL_CALLS
        return self._policy.max_input_chars + FRAMING_BYTES_PER_MESSAGE * framed + 256

    def screen(
        self,
        *,
        request_bytes: int | None = None,
        message_count: int | None = None,
        tool_count: int | None = None,
    ) -> None:
        """The checks that need no message at all, so a request that cannot pass costs nothing to refuse.

        Granted, a call left, a token and cost budget not used up, an encoded size that could fit the input
        cap (`max_request_bytes`), at most MAX_MESSAGES messages and MAX_TOOLS tools. A refusal counts
        exactly as it would in `call`; passing counts nothing.
        """
        if not self._policy.enabled:
            self._usage.refuse_request(WireReason.LLM_NOT_GRANTED, "refused_disabled")
        if self.calls_remaining == 0:
            self._usage.refuse_request(WireReason.LLM_CALL_LIMIT, "refused_limit")
        try:
            self._budget.screen()
        except BudgetRefusal as refusal:
            self._usage.count("requests")
            raise LlmRefusal(refusal.reason, refusal.message) from None
        too_many_bytes = request_bytes is not None and request_bytes > self.max_request_bytes
        if too_many_bytes or (message_count is not None and message_count > MAX_MESSAGES):
            self._usage.refuse_request(WireReason.LLM_INPUT_TOO_LARGE, "refused_input")
        if tool_count is not None and tool_count > MAX_TOOLS:
            self._usage.refuse_request(WireReason.LLM_TOOL_NOT_ALLOWED, "refused_tool")

    def call(
        self, request: LlmCall | Sequence[Mapping[str, Any]], *, on_admit: Callable[[], None] | None = None
    ) -> Completion:
        """One completion; raises LlmRefusal. `request` is an LlmCall or just its messages. `on_admit` runs
        once every check passed and a call was reserved, before the provider is called (the RPC layer counts
        the run as active from there)."""
        start = time.monotonic()
        try:
            completion = self._call(request, on_admit)
        except LlmRefusal as refusal:
            _traced(self.trace, start, str(refusal.reason), None, streamed=False)
            raise
        _traced(self.trace, start, "ok", completion, streamed=False)
        return completion

    def _call(
        self, request: LlmCall | Sequence[Mapping[str, Any]], on_admit: Callable[[], None] | None
    ) -> Completion:
        admitted = self._admit(_as_call(request), on_admit)
        reason = WireReason.LLM_OUTPUT_TOO_LARGE

        def complete() -> Completion:
            return admitted.adapter.complete(admitted.request, admitted.reservation.max_tokens)

        try:
            completion = self._retrying(complete, admitted)
        except BudgetRefusal as refusal:  # a retry the budget no longer covers (its attempt was charged)
            self._usage.provider_failed(WireReason.LLM_UNAVAILABLE, refusal.__context__ or refusal)
            raise LlmRefusal(refusal.reason, refusal.message) from None
        except TooManyToolCalls:
            self._settled(admitted, None, generated=True)
            self._usage.count("refused_output")
        except Exception as exc:  # noqa: BLE001  any provider failure becomes a generic refusal
            kind = admitted.adapter.reason_for(exc)
            # A call that timed out, or lost its connection once the request was sent, may have been
            # generating (and billed) all along: charge its whole reservation.
            self._settled(admitted, None, generated=maybe_billed(kind, exc))
            reason = self._usage.provider_failed(kind, exc)
        else:
            self._settled(admitted, completion)
            if completion.output_chars > self._policy.max_output_chars:
                self._usage.refuse(WireReason.LLM_OUTPUT_TOO_LARGE, "refused_output")
            self._usage.delivered(completion)
            return completion
        raise LlmRefusal(reason)  # outside the handler: the provider exception is not chained

    def stream(
        self, request: LlmCall | Sequence[Mapping[str, Any]], *, on_admit: Callable[[], None] | None = None
    ) -> Iterator[StreamItem]:
        """Text chunks and tool-call pieces (CallDelta) as they arrive, then one Completion with content ""
        (the text was already sent) and the completed tool calls.

        The output cap counts text and tool-call argument pieces together: at the cap it yields up to exactly
        `max_output_chars`, closes the provider stream and raises LlmRefusal(LLM_OUTPUT_TOO_LARGE). Closing
        this generator closes the provider stream. As a generator, it checks and sends nothing until the
        first `next()`; `on_admit` is as for `call`.
        """
        start = time.monotonic()
        outcome, final = "closed", None  # closed: the consumer stopped reading before the end
        try:
            with contextlib.closing(self._stream(request, on_admit)) as items:  # closing this closes it
                for item in items:
                    if isinstance(item, Completion):
                        outcome, final = "ok", item
                    yield item
        except LlmRefusal as refusal:
            outcome = str(refusal.reason)
            raise
        finally:
            _traced(self.trace, start, outcome, final, streamed=True)

    def _stream(
        self, request: LlmCall | Sequence[Mapping[str, Any]], on_admit: Callable[[], None] | None
    ) -> Generator[StreamItem, None, None]:
        admitted = self._admit(_as_call(request), on_admit)
        sent = 0
        final: Completion | None = None
        failed = started = False
        try:
            with contextlib.closing(self._retrying_stream(admitted)) as chunks:
                while True:
                    try:
                        item = next(chunks)
                    except BudgetRefusal as refusal:  # a retry the budget no longer covers
                        self._usage.provider_failed(
                            WireReason.LLM_UNAVAILABLE, refusal.__context__ or refusal
                        )
                        raise LlmRefusal(refusal.reason, refusal.message) from None
                    except TooManyToolCalls:
                        reason = WireReason.LLM_OUTPUT_TOO_LARGE
                        self._usage.count("refused_output")
                        break
                    except Exception as exc:  # noqa: BLE001  any provider failure becomes a generic refusal
                        kind = admitted.adapter.reason_for(exc)
                        failed = not started and not maybe_billed(kind, exc)  # else it may have generated
                        reason = self._usage.provider_failed(kind, exc)
                        break
                    started = True
                    if isinstance(item, Completion):
                        final = item
                        self._settled(admitted, final)
                        if final.output_chars > self._policy.max_output_chars:
                            # the final chunk re-sends the calls' canonical arguments: the cap holds there too
                            self._usage.refuse(WireReason.LLM_OUTPUT_TOO_LARGE, "refused_output")
                        self._usage.delivered(final)
                        yield final
                        return
                    size = len(item) if isinstance(item, str) else len(item.arguments)
                    room = self._policy.max_output_chars - sent
                    if size > room:
                        chunks.close()  # stop the spend now, even if the consumer never asks for more
                        self._usage.count("refused_output")
                        if isinstance(item, str) and room:
                            yield item[:room]
                        elif isinstance(item, CallDelta) and (room or item.name):
                            yield dataclasses.replace(item, arguments=item.arguments[:room])
                        raise LlmRefusal(WireReason.LLM_OUTPUT_TOO_LARGE)
                    sent += size
                    yield item
        finally:
            if final is None:  # failed, cut at the cap, or closed by the consumer: usage never came
                self._settled(admitted, None, generated=not failed)
        raise LlmRefusal(reason)

    def usage(self) -> dict[str, Any]:
        """Counters and the host-side model name, for the audit record only (never sent to the sandbox)."""
        return self._usage.snapshot()

    def budget_usage(self) -> dict[str, Any]:
        """Token, cost and retry counts (host/llm/budget.py), for the audit record only."""
        return {**self._budget.totals(), **self._retries.totals()}

    def _retrying(self, attempt: Callable[[], _T], admitted: Admitted) -> _T:
        """`attempt()`, retried on transient provider failures (host/llm/retrying.py) inside the run's
        deadline and never after the run ended; the call keeps its one call slot, and its reservation unless
        the failed attempt may have reached the provider."""
        # A retry starts only if a whole attempt (up to the provider timeout) fits before the run's deadline.
        span = self._broker._host.timeout_seconds
        deadline = None if self._deadline is None else self._deadline - span
        return retrying(
            attempt,
            admitted,
            budget=self._budget,
            retry=self._broker._retry,
            counts=self._retries,
            deadline=deadline,
            sleep=self._closed.wait,
        )

    def _retrying_stream(self, admitted: Admitted) -> Generator[StreamItem, None, None]:
        """The adapter's stream, its opening (up to the first item) retried like a call; later failures are
        not (the agent may already have text)."""
        return retrying_stream(admitted, lambda first: self._retrying(first, admitted))

    @property
    def tokens_remaining(self) -> int | None:
        """The run's max_total_tokens left (settled and reserved tokens taken off); None without the cap."""
        return self._budget.tokens_left

    @property
    def calls_remaining(self) -> int:
        """Provider calls this run may still make."""
        if not self._policy.enabled:
            return 0
        return self._usage.calls_left(self._policy.max_calls)

    def _admit(self, call: LlmCall, on_admit: Callable[[], None] | None) -> Admitted:
        """Run every check, reserve a call slot and return what the provider call needs (admission.admit)."""
        return admit(
            call,
            on_admit,
            policy=self._policy,
            usage=self._usage,
            tool_catalog=self.tool_catalog,
            resolution=self._resolution,
            client=self._broker._client,
            budget=self._budget,
        )

    def _settled(self, admitted: Admitted, completion: Completion | None, *, generated: bool = False) -> None:
        """The provider call of `admitted` is over: `completion` carries the provider's own usage, None when
        it failed, was cut at the output cap or was closed early, before usage was known. Only the first
        call per admitted call counts (the budget ignores the rest).

        Settled from the provider's counts; without them a failed call is charged its input estimate and no
        output, one that `generated` output (cut at a cap, closed early) its whole reservation.
        """
        if completion is not None:
            self._budget.settle(admitted.reservation, completion.input_tokens, completion.output_tokens)
        elif generated:
            self._budget.settle(admitted.reservation, None, None)
        else:
            self._budget.release(admitted.reservation)


def _traced(
    trace: CallTrace, start: float, outcome: str, completion: Completion | None, *, streamed: bool
) -> None:
    """Record one call's timing for the run's trace: its outcome and counts, never its text."""
    attributes: dict[str, str | int | bool] = {
        "agentnode.outcome": outcome,
        "agentnode.llm.streamed": streamed,
    }
    if completion is not None:
        attributes["agentnode.llm.input_tokens"] = max(0, completion.input_tokens)
        attributes["agentnode.llm.output_tokens"] = max(0, completion.output_tokens)
        attributes["agentnode.llm.tool_calls"] = len(completion.tool_calls)
    trace.add("agentnode.llm_call", start, attributes)


def _as_call(request: LlmCall | Sequence[Mapping[str, Any]]) -> LlmCall:
    return request if isinstance(request, LlmCall) else LlmCall(messages=request)


__all__ = ["LlmSession"]
