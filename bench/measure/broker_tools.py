"""The broker_tools section: the broker's own overhead, host side, on 8 tools and a 2 KiB schema."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench._state import FAKE_KEY, LLM_TOOL_COUNT, BenchState
from bench._stats import med, summary
from bench.measure.shared import first_chunk, interleaved, timed
from host.llm.broker import LlmBroker
from host.llm.toolcalls import LlmCall, ToolCatalog, build_catalog, check_tools, prepare
from host.llm.translate import openai_request
from host.policy.rules import LlmPolicy
from host.runtime.runner import SandboxHost
from host.runtime.wiring import lookup_toolpack
from host.spec.config import load_config


@dataclass(frozen=True)
class ToolsCall:
    """The broker_tools call: LLM_TOOL_COUNT installed tool definitions and a 2 KiB JSON-schema response
    format, as the broker takes it (`call`) and as the openai SDK sends it (`sent`, what the broker sends)."""

    catalog: ToolCatalog
    schema: dict[str, Any]
    call: LlmCall
    sent: dict[str, Any]
    max_output_chars: int = 24000


def tools_call(state: BenchState) -> ToolsCall:
    host = SandboxHost(env=state.env)
    try:
        pack = lookup_toolpack(host.lockfile, state.llm_tools)
    finally:
        host.close()
    assert pack is not None
    catalog = build_catalog([(pack.slug, pack.manifest.tools)])
    if len(catalog.definitions) != LLM_TOOL_COUNT:
        raise RuntimeError(f"{len(catalog.definitions)} tool definitions, not {LLM_TOOL_COUNT}")
    schema = _schema_of_size(2048)
    call = LlmCall(
        messages=[{"role": "system", "content": "You are a bench agent."},
                  {"role": "user", "content": "Look up the records and answer as the schema says."}],
        tools=[d.name for d in catalog.definitions],
        response_format={"type": "json_schema", "name": "bench_answer",
                         "schema": json.dumps(schema, separators=(",", ":"))},
    )
    # What the broker sends (host/llm/providers.py: the adapter's request and its max_tokens for these caps).
    sent = {**openai_request(prepare(call, check_tools(call.tools, catalog))),
            "max_completion_tokens": min(16384, math.ceil(24000 / 3))}
    return ToolsCall(catalog, schema, call, sent)


def _schema_of_size(size: int) -> dict[str, Any]:
    """An object schema whose compact JSON text is at least `size` bytes: described string fields."""
    schema: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    i = 0
    while len(json.dumps(schema, separators=(",", ":"))) < size:
        schema["properties"][f"field_{i}"] = {"type": "string", "description": f"Part {i} of the answer."}
        schema["required"].append(f"field_{i}")
        i += 1
    return schema


def broker_tools(state: BenchState, n: int, warmup: int) -> dict[str, Any]:
    """The broker's own overhead on the broker_tools call (LLM_TOOL_COUNT installed tool definitions and a
    2 KiB JSON-schema response format), host-side: `LlmSession.call` / `.stream` against the openai SDK
    sending the very request the broker sends to the same fake provider, interleaved; the time to the first
    streamed text chunk likewise. (The `broker` section measures the same call from inside the sandbox.)"""
    import openai  # noqa: PLC0415 (only the broker sections need the SDK)

    tools = tools_call(state)
    call, catalog, sent = tools.call, tools.catalog, tools.sent
    llm = LlmBroker(load_config(state.env).agent_sandbox.llm, state.env)
    model = str(llm.describe()["model"])
    session = llm.session(LlmPolicy(enabled=True, max_calls=2 * (n + warmup), max_input_chars=64000,
                                    max_output_chars=tools.max_output_chars))
    session.use_tools(lambda: catalog)
    sdk = openai.OpenAI(api_key=FAKE_KEY, base_url=state.provider.base_url, max_retries=0, timeout=60)

    def direct_stream() -> Iterator[str | None]:
        with sdk.chat.completions.create(model=model, **sent, stream=True,
                                         stream_options={"include_usage": True}) as chunks:
            yield from (c.choices[0].delta.content for c in chunks if c.choices)

    def session_call() -> None:
        if not session.call(call).content:
            raise RuntimeError("the broker's completion has no JSON answer")

    paths: dict[str, Callable[[], float]] = {
        "direct_ms": lambda: timed(lambda: sdk.chat.completions.create(model=model, **sent)),
        "session_ms": lambda: timed(session_call),
        "direct_first_chunk_ms": lambda: first_chunk(direct_stream),
        "session_first_chunk_ms": lambda: first_chunk(
            lambda: (x for x in session.stream(call) if isinstance(x, str))),
    }
    try:
        samples = interleaved(paths, n=n, warmup=warmup)
    finally:
        sdk.close()
    schema_text = json.dumps(tools.schema, separators=(",", ":"))
    out: dict[str, Any] = {"tools": LLM_TOOL_COUNT, "schema_bytes": len(schema_text),
                           "request_bytes": len(json.dumps(sent, separators=(",", ":"))),
                           **{key: summary(v) for key, v in samples.items()}}
    direct, hosted = med(out["direct_ms"]), med(out["session_ms"])
    first_direct, first_hosted = med(out["direct_first_chunk_ms"]), med(out["session_first_chunk_ms"])
    out["overhead_ms"] = None if direct is None or hosted is None else round(hosted - direct, 3)
    out["first_chunk_overhead_ms"] = (None if first_direct is None or first_hosted is None
                                      else round(first_hosted - first_direct, 3))
    return out


__all__ = ["ToolsCall", "broker_tools", "tools_call"]
