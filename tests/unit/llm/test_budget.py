"""Token and cost budgets (exact arithmetic, each cap's refusal, settlement, races) and the retry schedule."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from host.core.errors import CallRefusal
from host.llm.admission import LlmRefusal
from host.llm.broker import LlmBroker
from host.llm.budget import (
    CAP_COST,
    CAP_INPUT,
    CAP_TOTAL,
    DEFAULT_MAX_OUTPUT_TOKENS,
    MIN_CALL_TOKENS,
    TOOL_PROMPT_TOKENS,
    BudgetRefusal,
    LlmBudget,
    RetryCounts,
    RetryPolicy,
    Transient,
    call_with_retries,
    estimate_input_tokens,
    estimate_tokens,
    may_have_reached_provider,
    retry_after_seconds,
    transient_kind,
)
from host.llm.session import LlmSession
from host.policy.rules import LlmPolicy
from host.spec.config import LlmHostConfig, ModelPrice
from tests.support.fake_llm import Behaviour, FakeLlmServer

MODEL = "host-model-7"
# USD per million tokens, as an operator writes them: 0.15 and 0.6 must be exact, not nearest doubles.
PRICE = ModelPrice(input_per_million=0.15, output_per_million=0.6)
PRICES = {MODEL: PRICE}


def refused(fn: Callable[[], Any]) -> BudgetRefusal:
    with pytest.raises(BudgetRefusal) as info:
        fn()
    return info.value


# --- estimation -------------------------------------------------------------------------------------------


def test_the_bound_is_utf8_bytes_plus_overheads() -> None:
    # "user" + "abcdef" = 10 bytes, + 4 for the message, + 3 for the request
    assert estimate_input_tokens([{"role": "user", "content": "abcdef"}]) == 17
    two = [{"role": "system", "content": "x" * 30}, {"role": "user", "content": ""}]
    assert estimate_input_tokens(two) == (6 + 30 + 4) + 2 * 4 + 3
    assert estimate_input_tokens([]) == 3
    # a request that defines tools or asks for JSON carries the providers' hidden tool prompt
    assert estimate_input_tokens([], tools=True) == 3 + TOOL_PROMPT_TOKENS
    assert MIN_CALL_TOKENS == estimate_input_tokens([{"role": "user", "content": ""}]) + 1


def test_the_bound_counts_utf8_bytes_nested_text_and_extra_definitions() -> None:
    # A token is never less than one byte: 3 bytes a CJK character, 4 an emoji.
    assert estimate_input_tokens([{"role": "user", "content": "日本語"}]) == 4 + 9 + 4 + 3
    assert estimate_input_tokens([{"role": "user", "content": "🙂"}]) == 4 + 4 + 4 + 3
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]}  # fmt: skip
    # strings: assistant (9); nested keys id, name, arguments (15); values c1, f, {} (5) = 29
    assert estimate_input_tokens([call]) == 29 + 4 + 3
    tools = '{"name":"search","parameters":{}}'
    assert estimate_input_tokens([], extra=[tools]) == len(tools) + 3
    assert estimate_tokens(["user", "abcdef", "é"], messages=2) == 12 + 8 + 3  # 12 bytes


# --- reservation arithmetic ----------------------------------------------------------------------------


def test_max_tokens_is_the_least_of_what_is_left() -> None:
    assert LlmBudget().reserve(10, MODEL).max_tokens == DEFAULT_MAX_OUTPUT_TOKENS
    assert LlmBudget().reserve(10, MODEL, output_limit=77).max_tokens == 77
    assert LlmBudget(max_output_tokens=50).reserve(10, MODEL, output_limit=77).max_tokens == 50
    budget = LlmBudget(max_output_tokens=50, max_total_tokens=100)
    first = budget.reserve(10, MODEL)
    assert (first.input_tokens, first.max_tokens, first.tokens) == (10, 50, 60)
    second = budget.reserve(10, MODEL)  # 100 - 60 reserved - 10 input = 30 left for output
    assert second.max_tokens == 30 and budget.tokens_left == 0


def test_cost_left_bounds_max_tokens_exactly() -> None:
    # 0.0001 USD: 100 input tokens cost 100 * 0.15e-6 = 0.000015; the rest buys 0.000085 / 0.6e-6 = 141.67
    budget = LlmBudget(max_cost_usd=0.0001, prices=PRICES)
    r = budget.reserve(100, MODEL)
    assert r.max_tokens == 141
    assert r.cost == Fraction(100 * 15 + 141 * 60, 10**8)
    assert budget.cost_left == Fraction(1, 10**4) - r.cost


def test_every_cap_refuses_naming_itself_before_anything_is_reserved() -> None:
    budget = LlmBudget(max_input_tokens=100, max_total_tokens=150, max_cost_usd=1.0, prices=PRICES)
    too_big = refused(lambda: budget.reserve(101, MODEL))
    assert (too_big.cap, too_big.reason) == (CAP_INPUT, "LLM_INPUT_TOO_LARGE")
    assert isinstance(too_big, CallRefusal) and "max_input_tokens" in too_big.message
    budget.reserve(100, MODEL, output_limit=40)  # 140 of 150
    spent = refused(lambda: budget.reserve(10, MODEL))  # 10 input + at least 1 output does not fit
    assert (spent.cap, spent.reason) == (CAP_TOTAL, "LLM_TOKEN_BUDGET")
    assert budget.reserve(9, MODEL).max_tokens == 1  # exactly one output token still fits
    cheap = LlmBudget(max_cost_usd=0.000001, prices=PRICES)  # 1e-6 USD: 6 input + 0 output is 0.9e-6
    poor = refused(lambda: cheap.reserve(6, MODEL))
    assert (poor.cap, poor.reason) == (CAP_COST, "LLM_COST_BUDGET")
    assert cheap.reserve(2, MODEL).max_tokens == 1  # 0.3e-6 + 0.6e-6 <= 1e-6; two outputs would not
    totals = budget.totals()
    refusals = (totals["refused_input_tokens"], totals["refused_total_tokens"], totals["refused_cost"])
    assert refusals == (1, 1, 0)
    assert cheap.totals()["refused_cost"] == 1
    for refusal in (too_big, spent, poor):
        assert MODEL not in refusal.message and MODEL not in refusal.hint


def test_a_cost_cap_without_a_price_for_the_model_fails_closed() -> None:
    budget = LlmBudget(max_cost_usd=5.0, prices=PRICES)
    unpriced = refused(lambda: budget.reserve(1, "another-model"))
    assert (unpriced.cap, unpriced.reason, unpriced.unpriced) == (CAP_COST, "LLM_COST_BUDGET", True)
    assert "agent_sandbox.llm.prices" in unpriced.hint and "another-model" not in unpriced.message
    assert budget.totals()["refused_cost"] == 1 and budget.totals()["reservations"] == 0
    # Without a cost cap an unpriced model is served, and its run's cost is unknown, not 0.
    free = LlmBudget(max_total_tokens=1000)
    free.settle(free.reserve(1, "another-model"), 5, 5)
    assert free.totals()["cost_usd"] is None and free.totals()["input_tokens"] == 5


def test_a_zero_output_price_leaves_max_tokens_to_the_other_caps() -> None:
    budget = LlmBudget(max_cost_usd=0.000001, prices={MODEL: ModelPrice(1.0, 0.0)})
    assert budget.reserve(1, MODEL, output_limit=500).max_tokens == 500
    assert refused(lambda: budget.reserve(1, MODEL)).cap == CAP_COST  # 1e-6 of 1e-6 already reserved


# --- settlement -------------------------------------------------------------------------------------------


def test_settle_replaces_the_reservation_with_the_providers_counts() -> None:
    budget = LlmBudget(max_total_tokens=1000, max_cost_usd=1.0, prices=PRICES)
    r = budget.reserve(100, MODEL, output_limit=400)
    assert budget.tokens_left == 500
    assert budget.settle(r, 80, 20) is True
    assert budget.tokens_left == 900
    assert budget.cost == Fraction(80 * 15 + 20 * 60, 10**8)
    totals = budget.totals()
    assert (totals["input_tokens"], totals["output_tokens"], totals["overshoot_tokens"]) == (80, 20, 0)
    assert totals["cost_usd"] == pytest.approx(0.000024) and totals["reservations"] == 1
    assert budget.settle(r, 80, 20) is False  # settled once only
    assert budget.release(r) is False and budget.cancel(r) is False
    assert budget.totals()["input_tokens"] == 80


def test_overshoot_is_charged_and_recorded_and_later_calls_see_it() -> None:
    budget = LlmBudget(max_total_tokens=100)
    r = budget.reserve(10, MODEL, output_limit=20)
    budget.settle(r, 50, 70)  # the provider reports 120 where 30 were reserved
    assert budget.totals()["overshoot_tokens"] == 90
    assert budget.tokens_left == 0  # never negative
    assert refused(lambda: budget.reserve(0, MODEL)).cap == CAP_TOTAL


def test_unreported_and_negative_usage_is_conservative() -> None:
    budget = LlmBudget()
    budget.settle(budget.reserve(10, MODEL, output_limit=20), None, None)  # no usage: the whole reservation
    budget.settle(budget.reserve(10, MODEL, output_limit=20), 0, 3)  # 0 input means not reported either
    budget.settle(budget.reserve(10, MODEL, output_limit=20), 7, None)  # output unknown: max_tokens
    budget.settle(budget.reserve(10, MODEL, output_limit=20), 7, -5)  # negative counts as 0
    totals = budget.totals()
    assert (totals["input_tokens"], totals["output_tokens"]) == (10 + 10 + 7 + 7, 20 + 20 + 20 + 0)


def test_release_charges_the_input_estimate_and_cancel_charges_nothing() -> None:
    budget = LlmBudget(max_total_tokens=100, max_cost_usd=1.0, prices=PRICES)
    failed = budget.reserve(30, MODEL, output_limit=10)
    assert budget.release(failed) is True
    unsent = budget.reserve(5, MODEL, output_limit=10)
    assert budget.cancel(unsent) is True
    totals = budget.totals()
    assert (totals["input_tokens"], totals["output_tokens"], budget.tokens_left) == (30, 0, 70)
    assert budget.cost == Fraction(30 * 15, 10**8) and budget.cost_left == 1 - budget.cost


def test_budget_from_policy_and_bad_arguments() -> None:
    policy = LlmPolicy(
        enabled=True, max_calls=5, max_input_chars=10, max_output_chars=10,
        max_input_tokens=7, max_output_tokens=8, max_total_tokens=9, max_cost_usd=0.5,
    )  # fmt: skip
    budget = LlmBudget.for_policy(policy, PRICES)
    assert (budget.max_input_tokens, budget.max_output_tokens, budget.max_total_tokens) == (7, 8, 9)
    assert budget.max_cost_usd == 0.5 and budget.priced(MODEL) and not budget.priced("x")
    with pytest.raises(ValueError):
        LlmBudget(max_total_tokens=0)
    with pytest.raises(ValueError):
        LlmBudget(max_cost_usd=float("inf"))
    with pytest.raises(ValueError):
        budget.reserve(-1, MODEL)
    with pytest.raises(ValueError):
        budget.reserve(1, MODEL, output_limit=0)


# --- races ------------------------------------------------------------------------------------------------


def _race(reserve: Callable[[], Any], threads: int = 50) -> tuple[int, list[str]]:
    """`threads` calls of `reserve` released at once; how many got a reservation and the refused caps."""
    barrier = threading.Barrier(threads)
    lock = threading.Lock()
    admitted: list[Any] = []
    caps: list[str] = []

    def worker() -> None:
        barrier.wait()
        try:
            r = reserve()
        except BudgetRefusal as refusal:
            with lock:
                caps.append(refusal.cap)
        else:
            with lock:
                admitted.append(r)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(admitted), caps


def test_fifty_concurrent_calls_get_exactly_the_reservations_max_total_tokens_covers() -> None:
    budget = LlmBudget(max_output_tokens=90, max_total_tokens=1050)
    # 10 calls of 10 + 90, then one of 10 + 40; nothing fits after that whatever the interleaving
    admitted, caps = _race(lambda: budget.reserve(10, MODEL))
    assert (admitted, caps) == (11, [CAP_TOTAL] * 39)
    assert budget.tokens_left == 0 and budget.totals()["refused_total_tokens"] == 39


def test_fifty_concurrent_calls_get_exactly_the_reservations_max_cost_usd_covers() -> None:
    # Each call: 100 input (15e-6) + 100 output (60e-6) = 75e-6 USD; 0.0006 USD covers exactly 8.
    budget = LlmBudget(max_output_tokens=100, max_cost_usd=0.0006, prices=PRICES)
    admitted, caps = _race(lambda: budget.reserve(100, MODEL))
    assert (admitted, caps) == (8, [CAP_COST] * 42)
    assert budget.cost_left == 0


def test_concurrent_reserve_and_settle_never_pass_the_cap() -> None:
    budget = LlmBudget(max_output_tokens=90, max_total_tokens=1050)

    def call() -> None:
        r = budget.reserve(10, MODEL)
        budget.settle(r, r.input_tokens, r.max_tokens)  # the provider used all it was given

    admitted, _ = _race(call)
    totals = budget.totals()
    assert admitted == 11 and totals["input_tokens"] + totals["output_tokens"] == 1050
    assert totals["overshoot_tokens"] == 0


# --- retries ----------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Status(Exception):
    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        super().__init__("provider body sk-secret")
        self.status_code = status_code
        headers = {} if retry_after is None else {"retry-after": retry_after}
        self.response = type("Response", (), {"headers": headers})()


def test_backoff_schedule_is_bounded_in_attempts_delay_and_deadline() -> None:
    assert RetryPolicy().schedule() == [0.5, 1.0]  # 3 attempts: 2 waits
    assert RetryPolicy(max_attempts=6, max_delay=3.0).schedule() == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert RetryPolicy(max_attempts=1).schedule() == []
    policy = RetryPolicy(max_attempts=6)
    # deadline 4.0 s away with 1 s needed to try again: 0.5 (1.5 left), 1.0 (2.5 left)... 2.0 would end at
    # 3.5 + 1 > 4.0
    assert policy.schedule(now=0.0, deadline=4.0) == [0.5, 1.0]
    assert policy.delay(1, now=0.0, deadline=1.4) is None
    assert policy.delay(1, now=0.0, deadline=None, retry_after=3.0) == 3.0
    assert policy.delay(1, now=0.0, deadline=None, retry_after=60.0) == 4.0  # never past max_delay
    assert policy.delay(3, now=0.0, deadline=None, retry_after=0.1) == 2.0  # never below the backoff
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=float("nan"))


def test_transient_failures_are_retried_and_counted_then_succeed() -> None:
    clock, counts = FakeClock(), RetryCounts()
    failures = [Status(429, retry_after="0.8"), Status(503)]

    def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "ok"

    got = call_with_retries(attempt, policy=RetryPolicy(), counts=counts, deadline=clock.now + 60,
                            clock=clock, sleep=clock.sleep)  # fmt: skip
    assert got == "ok" and clock.slept == [0.8, 1.0]
    assert counts.totals() == {
        "retries": 2, "retries_rate_limited": 1, "retries_server_error": 1, "retries_connection": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("error", "retries"),
    [
        (Status(400), 0),  # not transient
        (TimeoutError(), 0),  # a timeout's time is spent
        (ValueError("garbage"), 0),
        (Status(500), 2),  # transient until the attempts run out: the last failure is raised
        (ConnectionResetError(), 2),
    ],
)
def test_the_last_failure_is_raised_as_is(error: Exception, retries: int) -> None:
    clock, counts = FakeClock(), RetryCounts()
    calls = 0

    def attempt() -> str:
        nonlocal calls
        calls += 1
        raise error

    with pytest.raises(type(error)) as info:
        call_with_retries(attempt, policy=RetryPolicy(), counts=counts, deadline=None, clock=clock,
                          sleep=clock.sleep)  # fmt: skip
    assert info.value is error and calls == retries + 1 and counts.totals()["retries"] == retries


def test_no_retry_starts_too_close_to_the_deadline() -> None:
    clock, counts = FakeClock(), RetryCounts()
    calls = 0

    def attempt() -> str:
        nonlocal calls
        calls += 1
        raise Status(502)

    with pytest.raises(Status):
        call_with_retries(attempt, policy=RetryPolicy(), counts=counts, deadline=clock.now + 2.0,
                          clock=clock, sleep=clock.sleep)  # fmt: skip
    assert calls == 2 and clock.slept == [0.5]  # a second wait of 1.0 would leave < 1 s
    assert clock.now <= 102.0


def test_sdk_exceptions_are_classified() -> None:
    request = httpx2.Request("POST", "http://provider.invalid/v1/chat/completions")

    def response(status: int, **headers: str) -> httpx2.Response:
        return httpx2.Response(status, request=request, headers=headers)

    rate = openai.RateLimitError("m", response=response(429, **{"retry-after": "2"}), body=None)
    assert transient_kind(rate) is Transient.RATE_LIMITED and retry_after_seconds(rate) == 2.0
    overloaded = anthropic.InternalServerError("m", response=response(529), body=None)
    assert transient_kind(overloaded) is Transient.SERVER_ERROR
    assert transient_kind(openai.BadRequestError("m", response=response(400), body=None)) is None
    assert transient_kind(openai.APIConnectionError(request=request)) is Transient.CONNECTION
    assert transient_kind(anthropic.APIConnectionError(request=request)) is Transient.CONNECTION
    assert transient_kind(openai.APITimeoutError(request=request)) is None
    assert transient_kind(anthropic.APITimeoutError(request=request)) is None
    assert transient_kind(httpx2.RemoteProtocolError("reset", request=request)) is Transient.CONNECTION
    assert transient_kind(httpx2.ReadTimeout("slow", request=request)) is None
    assert retry_after_seconds(openai.RateLimitError("m", response=response(429), body=None)) is None
    for bad in ("soon", "-1", "nan", "Wed, 21 Oct 2015 07:28:00 GMT"):
        assert retry_after_seconds(Status(429, retry_after=bad)) is None


# --- the broker: budgets reserved before the provider is called, by the provider's own count ---------------

PROMPT = [{"role": "user", "content": "x" * 30}]
PROMPT_ESTIMATE = estimate_tokens(["x" * 30, "user", ""], messages=1)  # content, role, tool_call_id


@pytest.fixture
def srv() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as server:
        yield server


def _session(srv: FakeLlmServer, retry: RetryPolicy | None = None, **caps: Any) -> LlmSession:
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": srv.base_url_openai}
    host = LlmHostConfig(prices={"gpt-4o-mini": ModelPrice(1.0, 2.0)}, timeout_seconds=5)
    policy = LlmPolicy(enabled=True, max_calls=50, max_input_chars=10_000, max_output_chars=10_000, **caps)
    return LlmBroker(host, env=env, retry=retry or RetryPolicy(base_delay=0.0)).session(policy)


def _bounds(srv: FakeLlmServer) -> list[int]:
    return sorted(r.body["max_completion_tokens"] for r in srv.requests)


def _concurrent_calls(sess: LlmSession, threads: int = 50) -> list[str]:
    """`threads` calls at once; the outcome of each: "ok" or the refusal's reason."""
    barrier = threading.Barrier(threads)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            sess.call(PROMPT)
            outcome = "ok"
        except LlmRefusal as refusal:
            outcome = refusal.reason
        with lock:
            outcomes.append(outcome)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sorted(outcomes)


def test_fifty_concurrent_calls_reach_the_provider_exactly_as_often_as_max_total_tokens_covers(
    srv: FakeLlmServer,
) -> None:
    srv.default = Behaviour(delay=0.5)  # every admitted call is still in flight when the last one is checked
    per_call = PROMPT_ESTIMATE + 81
    sess = _session(srv, max_output_tokens=81, max_total_tokens=10 * per_call + PROMPT_ESTIMATE + 31)
    outcomes = _concurrent_calls(sess)
    assert outcomes == ["LLM_TOKEN_BUDGET"] * 39 + ["ok"] * 11
    assert len(srv.requests) == 11  # the provider's own count
    assert _bounds(srv) == [31] + [81] * 10  # max_tokens is what was left
    usage = sess.budget_usage()
    assert usage["refused_total_tokens"] == 39 and usage["reservations"] == 11
    assert sess.usage()["calls"] == 11  # a budget refusal takes no call slot


def test_fifty_concurrent_calls_reach_the_provider_exactly_as_often_as_max_cost_usd_covers(
    srv: FakeLlmServer,
) -> None:
    srv.default = Behaviour(delay=0.5)
    per_call = PROMPT_ESTIMATE * 1 + 81 * 2  # micro-USD at 1 and 2 USD per million tokens
    sess = _session(srv, max_output_tokens=81, max_cost_usd=5 * per_call / 1e6)
    outcomes = _concurrent_calls(sess)
    assert outcomes == ["LLM_COST_BUDGET"] * 45 + ["ok"] * 5
    assert len(srv.requests) == 5 and _bounds(srv) == [81] * 5
    assert sess.budget_usage()["refused_cost"] == 45


def test_calls_are_settled_from_the_providers_usage(srv: FakeLlmServer) -> None:
    sess = _session(srv, max_output_tokens=5, max_total_tokens=1000, max_cost_usd=1.0)
    completion = sess.call(PROMPT)
    assert srv.requests[0].body["max_completion_tokens"] == 5
    assert (completion.input_tokens, completion.output_tokens) == (30, 10)  # the fake counts characters
    usage = sess.budget_usage()
    assert (usage["input_tokens"], usage["output_tokens"]) == (30, 10)
    assert usage["cost_usd"] == pytest.approx((30 * 1 + 10 * 2) / 1e6)
    # 40 reported where the bound and max_tokens reserved 41 + 5: the bound held, nothing overshot
    assert PROMPT_ESTIMATE == 41 and usage["overshoot_tokens"] == 0
    srv.default = Behaviour(status=400)
    with pytest.raises(LlmRefusal) as info:
        sess.call(PROMPT)
    assert info.value.reason == "LLM_UNAVAILABLE"
    assert sess.budget_usage()["input_tokens"] == 30 + PROMPT_ESTIMATE  # a failure: its bound, no output


def test_an_unpriced_model_under_a_cost_cap_is_refused_before_the_provider(
    srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": srv.base_url_openai}
    host = LlmHostConfig(model="host-only-model", prices={"gpt-4o-mini": ModelPrice(1.0, 2.0)})
    policy = LlmPolicy(
        enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000, max_cost_usd=1.0
    )
    sess = LlmBroker(host, env=env).session(policy)
    with pytest.raises(LlmRefusal) as info:
        sess.call(PROMPT)
    refusal = info.value
    assert refusal.reason == "LLM_COST_BUDGET" and "max_cost_usd" in refusal.message
    assert "host-only-model" not in refusal.message + caplog.text
    assert "agent_sandbox.llm.prices" in caplog.text
    assert srv.requests == [] and sess.usage()["calls"] == 0


def test_budget_refusals_name_their_cap_over_the_broker(srv: FakeLlmServer) -> None:
    big = [{"role": "user", "content": "y" * 300}]
    sess = _session(srv, max_input_tokens=50)
    with pytest.raises(LlmRefusal) as info:
        sess.call(big)
    assert (info.value.reason, "max_input_tokens" in info.value.message) == ("LLM_INPUT_TOO_LARGE", True)
    with pytest.raises(LlmRefusal) as info:
        list(sess.stream(big))
    assert info.value.reason == "LLM_INPUT_TOO_LARGE" and srv.requests == []


def test_transient_failures_are_retried_once_admitted_and_counted(srv: FakeLlmServer) -> None:
    sess = _session(srv, max_total_tokens=5000)
    srv.script(Behaviour(status=429), Behaviour(status=503))
    assert sess.call(PROMPT).content == "fake reply"
    srv.script(Behaviour(status=502))
    assert "".join(i for i in sess.stream(PROMPT) if isinstance(i, str)) == "fake reply"
    assert len(srv.requests) == 5
    usage = sess.budget_usage()
    assert (usage["retries"], usage["retries_rate_limited"], usage["retries_server_error"]) == (3, 1, 2)
    assert sess.usage()["calls"] == 2 and usage["reservations"] == 2  # one slot and reservation per call
    assert usage["input_tokens"] == 60  # each call charged once, from the answer that came


def test_no_retry_past_the_runs_deadline(srv: FakeLlmServer) -> None:
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": srv.base_url_openai}
    policy = LlmPolicy(enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000)
    sess = LlmBroker(LlmHostConfig(), env=env).session(policy, deadline=time.monotonic() + 1.2)
    srv.script(Behaviour(status=500), Behaviour(status=500))
    with pytest.raises(LlmRefusal) as info:
        sess.call(PROMPT)
    assert info.value.reason == "LLM_UNAVAILABLE" and len(srv.requests) == 1  # 0.5 s + 1 s to spare > 1.2 s
    assert sess.budget_usage()["retries"] == 0


def test_a_timed_out_call_is_charged_its_whole_reservation(srv: FakeLlmServer) -> None:
    # The provider may have been generating (and billing) until the timeout: charge what was reserved.
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": srv.base_url_openai}
    host = LlmHostConfig(prices={"gpt-4o-mini": ModelPrice(1.0, 2.0)}, timeout_seconds=0.3)
    policy = LlmPolicy(enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000,
                       max_output_tokens=50, max_total_tokens=10_000)  # fmt: skip
    sess = LlmBroker(host, env=env, retry=RetryPolicy(base_delay=0.0)).session(policy)
    srv.default = Behaviour(delay=1.0)
    with pytest.raises(LlmRefusal) as info:
        sess.call(PROMPT)
    assert info.value.reason == "LLM_TIMEOUT"
    usage = sess.budget_usage()
    assert (usage["input_tokens"], usage["output_tokens"]) == (PROMPT_ESTIMATE, 50)


def test_a_retry_starts_only_when_a_whole_attempt_fits_before_the_deadline(srv: FakeLlmServer) -> None:
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": srv.base_url_openai}
    policy = LlmPolicy(enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000)
    host = LlmHostConfig(timeout_seconds=30)
    sess = LlmBroker(host, env=env, retry=RetryPolicy(base_delay=0.0)).session(
        policy, deadline=time.monotonic() + 20  # 20 s left: a retry could still be running 30 s from now
    )
    srv.script(Behaviour(status=503), Behaviour(status=503))
    with pytest.raises(LlmRefusal):
        sess.call(PROMPT)
    assert len(srv.requests) == 1 and sess.budget_usage()["retries"] == 0


def test_a_reset_after_the_request_reached_the_provider_is_charged_and_the_retry_reserves_anew(
    srv: FakeLlmServer,
) -> None:
    # The provider may have billed the lost attempt: charge it whole, then reserve the retry afresh.
    sess = _session(srv, max_output_tokens=50, max_total_tokens=10_000)
    srv.script(Behaviour(reset=True))
    assert sess.call(PROMPT).content == "fake reply"
    usage = sess.budget_usage()
    assert len(srv.requests) == 2 and (usage["retries"], usage["retries_connection"]) == (1, 1)
    assert usage["reservations"] == 2 and sess.usage()["calls"] == 1  # one call slot, two reservations
    assert (usage["input_tokens"], usage["output_tokens"]) == (PROMPT_ESTIMATE + 30, 50 + 10)


def test_a_retry_the_budget_no_longer_covers_is_refused_naming_the_cap(srv: FakeLlmServer) -> None:
    per_call = PROMPT_ESTIMATE + 50
    sess = _session(srv, max_output_tokens=50, max_total_tokens=per_call + 5)
    srv.script(Behaviour(reset=True))
    with pytest.raises(LlmRefusal) as info:
        sess.call(PROMPT)
    assert info.value.reason == "LLM_TOKEN_BUDGET" and "max_total_tokens" in info.value.message
    assert len(srv.requests) == 1  # the retry was never sent
    usage = sess.budget_usage()
    assert (usage["input_tokens"], usage["output_tokens"]) == (PROMPT_ESTIMATE, 50)  # the lost attempt
    assert sess.usage()["provider_errors"] == 1  # the lost attempt is a provider failure too
    with pytest.raises(LlmRefusal) as info:  # spent: refused before the request is read
        sess.screen(request_bytes=10)
    assert info.value.reason == "LLM_TOKEN_BUDGET"


def test_a_connection_never_made_keeps_its_reservation_for_the_retry(srv: FakeLlmServer) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens here: every connect is refused
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"}
    policy = LlmPolicy(enabled=True, max_calls=5, max_input_chars=1000, max_output_chars=1000,
                       max_output_tokens=50, max_total_tokens=10_000)  # fmt: skip
    sess = LlmBroker(LlmHostConfig(), env=env, retry=RetryPolicy(base_delay=0.0)).session(policy)
    with pytest.raises(LlmRefusal):
        sess.call(PROMPT)
    usage = sess.budget_usage()
    assert (usage["retries_connection"], usage["reservations"]) == (2, 1)  # three attempts, one reservation
    assert (usage["input_tokens"], usage["output_tokens"]) == (PROMPT_ESTIMATE, 0)  # released: input only


def test_the_run_ending_stops_a_call_waiting_to_retry(srv: FakeLlmServer) -> None:
    sess = _session(srv, retry=RetryPolicy(base_delay=30.0, max_delay=30.0, min_remaining=0.0))
    srv.script(Behaviour(status=503))
    threading.Timer(0.3, sess.close).start()
    started = time.monotonic()
    with pytest.raises(LlmRefusal) as info:
        sess.call(PROMPT)
    assert time.monotonic() - started < 10  # not the 30 s backoff
    assert info.value.reason == "LLM_UNAVAILABLE" and len(srv.requests) == 1


def test_may_have_reached_provider_reads_the_cause_chain() -> None:
    try:
        try:
            raise httpx2.ConnectError("refused")
        except httpx2.ConnectError as inner:
            raise openai.APIConnectionError(request=httpx2.Request("POST", "http://x")) from inner
    except openai.APIConnectionError as exc:
        assert may_have_reached_provider(exc) is False
    assert may_have_reached_provider(httpx2.ReadError("reset")) is True
    assert may_have_reached_provider(ConnectionRefusedError()) is False
    assert may_have_reached_provider(ConnectionResetError()) is True


def test_budget_screen_refuses_only_a_spent_budget() -> None:
    budget = LlmBudget(max_total_tokens=MIN_CALL_TOKENS + 5, max_cost_usd=1e-3, prices=PRICES)
    budget.screen()  # room for the smallest call
    budget.settle(budget.reserve(5, MODEL, output_limit=1), 5, 1)
    assert refused(budget.screen).cap == CAP_TOTAL
    assert budget.totals()["refused_total_tokens"] == 1
    poor = LlmBudget(max_cost_usd=1e-6, prices=PRICES)
    poor.settle(poor.reserve(2, MODEL, output_limit=1), 10, 0)  # 1.5e-6 spent of 1e-6
    assert refused(poor.screen).cap == CAP_COST


@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
def test_a_connection_lost_on_the_last_attempt_is_charged_its_whole_reservation(
    srv: FakeLlmServer, streaming: bool
) -> None:
    sess = _session(srv, retry=RetryPolicy(max_attempts=1), max_output_tokens=50, max_total_tokens=10_000)
    srv.script(Behaviour(reset=True))
    with pytest.raises(LlmRefusal):
        list(sess.stream(PROMPT)) if streaming else sess.call(PROMPT)
    usage = sess.budget_usage()
    assert (usage["input_tokens"], usage["output_tokens"]) == (PROMPT_ESTIMATE, 50)  # it may have generated


def test_a_retry_cut_short_by_the_runs_end_reserves_nothing_more(srv: FakeLlmServer) -> None:
    sess = _session(srv, retry=RetryPolicy(base_delay=30.0, max_delay=30.0, min_remaining=0.0),
                    max_output_tokens=50, max_total_tokens=10_000)  # fmt: skip
    srv.script(Behaviour(reset=True))
    threading.Timer(0.3, sess.close).start()
    with pytest.raises(LlmRefusal):
        sess.call(PROMPT)
    usage = sess.budget_usage()
    assert len(srv.requests) == 1 and usage["reservations"] == 1 and usage["retries"] == 0
    assert (usage["input_tokens"], usage["output_tokens"]) == (PROMPT_ESTIMATE, 50)  # the one lost attempt
