"""The broker section: call_llm from the sandbox against LlmSession and the SDK straight to the provider."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc

from bench._state import FAKE_KEY, BenchState
from bench._stats import med, summary
from bench.measure.broker_tools import tools_call
from bench.measure.shared import bare_server, first_chunk, interleaved, rpc_from_container, succeeded, timed
from host.llm.broker import LlmBroker
from host.policy.rules import LlmPolicy
from host.runtime.runner import SandboxHost
from host.spec.config import load_config

RELAY_CALL = "/bench.Relay/Call"
RELAY_STREAM = "/bench.Relay/Stream"


def _relay_server(call: Callable[[], Any],
                  stream: Callable[[], Iterable[str | None]]) -> Callable[[str], grpc.Server]:
    """A bare server whose handlers make the direct SDK call: `Call` waits for
    `call()` and answers empty, `Stream` relays `stream()`'s text chunks as they come. From the sandbox,
    it is the hop of a brokered call, waiting on the provider as that one does, without the broker: a
    handler that waits milliseconds costs more than an echo (the threads on both sides wake from idle)."""

    def build(socket_path: str) -> grpc.Server:
        return bare_server(socket_path, "bench.Relay", {
            "Call": grpc.unary_unary_rpc_method_handler(lambda _request, _ctx: (call(), b"")[1]),
            "Stream": grpc.unary_stream_rpc_method_handler(
                lambda _request, _ctx: (chunk.encode() for chunk in stream() if chunk)),
        })

    return build


BROKER_ROUNDS = 4
"""A repetition's broker samples come in this many rounds, each the direct paths (interleaved) and then one
sandbox run of each kind, so direct and sandbox samples are never taken minutes apart."""


def broker(state: BenchState, runtime: str, n: int, warmup: int) -> dict[str, Any]:
    """CallLlm from the sandbox, the host's LlmSession, and the openai SDK straight to the provider; the
    same from the sandbox for the broker_tools call (8 tools, a 2 KiB schema) against the SDK sending it.

    The `n` samples of each path come in BROKER_ROUNDS rounds (fewer when n is smaller), each the direct
    paths in turn and then one sandbox run of each kind, so load drift reaches both sides of an overhead."""
    import openai  # noqa: PLC0415 (only the broker section needs the SDK)

    llm = LlmBroker(load_config(state.env).agent_sandbox.llm, state.env)
    model = str(llm.describe()["model"])
    rounds = max(1, min(BROKER_ROUNDS, n))
    per_round = -(-n // rounds)
    session = llm.session(LlmPolicy(enabled=True, max_calls=4 * rounds * (per_round + warmup),
                                    max_input_chars=24000, max_output_chars=24000))
    sdk = openai.OpenAI(api_key=FAKE_KEY, base_url=state.provider.base_url, max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": "ping"}]
    tools = tools_call(state)

    def direct_stream(**request: Any) -> Iterator[str | None]:
        with sdk.chat.completions.create(model=model, **request, stream=True,
                                         stream_options={"include_usage": True}) as chunks:
            yield from (c.choices[0].delta.content for c in chunks if c.choices)

    plain = {"messages": messages, "max_completion_tokens": 100}
    paths: dict[str, Callable[[], float]] = {
        "direct_ms": lambda: timed(lambda: sdk.chat.completions.create(model=model, **plain)),
        "session_ms": lambda: timed(lambda: session.call(messages)),
        "direct_first_chunk_ms": lambda: first_chunk(lambda: direct_stream(**plain)),
        "session_first_chunk_ms": lambda: first_chunk(
            lambda: (x for x in session.stream(messages) if isinstance(x, str))),
        "direct_tools_ms": lambda: timed(lambda: sdk.chat.completions.create(model=model, **tools.sent)),
        "direct_tools_first_chunk_ms": lambda: first_chunk(lambda: direct_stream(**tools.sent)),
    }
    relays = {  # the same direct calls, each behind a bare gRPC hop from the sandbox (_relay_server)
        "relay_ms": (RELAY_CALL, False, plain), "relay_first_chunk_ms": (RELAY_STREAM, True, plain),
        "relay_tools_ms": (RELAY_CALL, False, tools.sent),
        "relay_tools_first_chunk_ms": (RELAY_STREAM, True, tools.sent),
    }
    # what the agent's run reports -> the figure it feeds, for the plain call and the broker_tools call
    inside = {"call_ms": "sandbox_ms", "first_chunk_ms": "sandbox_first_chunk_ms",
              "rpc_floor_ms": "sandbox_rpc_floor_ms"}
    inside_tools = {"call_ms": "sandbox_tools_ms", "first_chunk_ms": "sandbox_tools_first_chunk_ms"}
    samples: dict[str, list[float]] = {
        key: [] for key in [*paths, *inside.values(), *inside_tools.values(), *relays]
    }
    host = SandboxHost(env=state.env)
    try:
        for _ in range(rounds):
            for key, values in interleaved(paths, n=per_round, warmup=warmup).items():
                samples[key] += values
            kwargs = {"n": per_round, "warmup": warmup}
            for run_kwargs, figures in ((kwargs, inside), ({**kwargs, "schema": tools.schema}, inside_tools)):
                reported = succeeded(host.run(state.llm_caller, runtime=runtime, kwargs=run_kwargs)).result
                for key, name in figures.items():
                    samples[name] += reported[key]
            for key, (method, streamed, request) in relays.items():
                relay = _relay_server(functools.partial(sdk.chat.completions.create, model=model, **request),
                                      functools.partial(direct_stream, **request))
                samples[key] += rpc_from_container(state, runtime, relay, method=method, n=per_round,
                                                   warmup=warmup, stream=streamed)
    finally:
        sdk.close()
        host.close()
    out: dict[str, Any] = {"model": model, **{key: summary(v) for key, v in samples.items()}}

    def over(key: str, floor: str) -> float | None:
        a, b = med(out[key]), med(out[floor])
        return None if a is None or b is None else round(a - b, 3)

    out["overhead_ms"] = over("sandbox_ms", "direct_ms")
    out["first_chunk_overhead_ms"] = over("sandbox_first_chunk_ms", "direct_first_chunk_ms")
    out["session_overhead_ms"] = over("session_ms", "direct_ms")
    out["tools_overhead_ms"] = over("sandbox_tools_ms", "direct_tools_ms")
    out["tools_first_chunk_overhead_ms"] = over("sandbox_tools_first_chunk_ms", "direct_tools_first_chunk_ms")
    # The floor of each overhead: the same direct call behind a bare hop from the sandbox (no broker); what
    # that hop costs over the direct call, and what the brokered call costs beyond it (the broker's own).
    for kind in ("", "tools_"):
        for what in ("ms", "first_chunk_ms"):
            relayed, direct, sandbox = f"relay_{kind}{what}", f"direct_{kind}{what}", f"sandbox_{kind}{what}"
            out[f"{relayed}_over_direct"] = over(relayed, direct)
            out[f"{sandbox}_over_relay"] = over(sandbox, relayed)
    hop = med(out["sandbox_rpc_floor_ms"])  # the sandbox-to-host hop alone, measured in the same runs
    for key in ("overhead_ms", "tools_overhead_ms"):
        if out[key] is not None and hop is not None:
            out[key.replace("overhead_ms", "overhead_beyond_hop_ms")] = round(out[key] - hop, 3)
    return out


__all__ = ["BROKER_ROUNDS", "broker"]
