"""An admitted LLM call's provider call, retried on transient failures within its one call slot, apart from
LlmSession (which gives it the run's deadline and its retry policy and counts)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

from host.llm.admission import Admitted
from host.llm.budget import (
    LlmBudget,
    RetryCounts,
    RetryPolicy,
    Transient,
    call_with_retries,
    may_have_reached_provider,
)
from host.llm.providers import StreamItem

_T = TypeVar("_T")


def retrying(
    attempt: Callable[[], _T],
    admitted: Admitted,
    *,
    budget: LlmBudget,
    retry: RetryPolicy,
    counts: RetryCounts,
    deadline: float | None,
    sleep: Callable[[float], object],
) -> _T:
    """`attempt()`, retried on transient provider failures (429, 5xx, a reset connection) with bounded
    backoff before `deadline`, sleeping with `sleep`; the call keeps its one call slot. It keeps its budget
    reservation too, unless the failed attempt may have reached the provider (a connection lost after it
    was made): that attempt is charged in full and the retry reserves anew, or raises BudgetRefusal when
    the budget no longer covers it."""

    def before_retry(kind: Transient, exc: BaseException) -> None:
        if kind is Transient.CONNECTION and may_have_reached_provider(exc):
            admitted.reservation = budget.renew(admitted.reservation)

    return call_with_retries(
        attempt,
        policy=retry,
        counts=counts,
        deadline=deadline,
        sleep=sleep,
        before_retry=before_retry,
    )


def retrying_stream(
    admitted: Admitted, retried: Callable[[Callable[[], StreamItem]], StreamItem]
) -> Generator[StreamItem, None, None]:
    """The adapter's stream, its opening (up to the first item) retried like a call by `retried`; later
    failures are not (the agent may already have text)."""
    opened: list[Generator[StreamItem, None, None]] = []

    def first() -> StreamItem:
        if opened:
            opened.pop().close()
        opened.append(admitted.adapter.stream(admitted.request, admitted.reservation.max_tokens))
        return next(opened[0])

    try:
        item = retried(first)
        yield item
        yield from opened[0]
    finally:
        for chunks in opened:
            chunks.close()


__all__ = ["retrying", "retrying_stream"]
