"""AgentContext's LLM calls: call_llm and stream_llm through the host's broker, the tools a model may be
offered, and the runtime's tool loop (the wire mapping itself is sandbox_wrapper._llm)."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from sandbox_wrapper import _llm
from sandbox_wrapper._client import refusal
from sandbox_wrapper._errors import AgentLimitExceeded, LlmAccessError, ToolAccessError
from sandbox_wrapper._llm import Messages
from sandbox_wrapper._proto.agentnode.sandbox.v1 import llm_pb2
from sandbox_wrapper._strictjson import loads_finite
from sandbox_wrapper._types import LlmResult, ToolContext, ToolResult

_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # the tool call ids the host accepts in a conversation
_UNNAMED_CALL = "unnamed"  # the name a nameless model call is sent back under (the host needs one)


class LlmCalls:
    """AgentContext's LLM calls (one of its bases). The state it reads and keeps is the context's own, set up
    by AgentContext.__init__ and guarded by its lock; the tool loop runs tools as ToolCalls does."""

    _llm: Any  # llm_pb2_grpc.LlmServiceStub
    _lock: threading.Lock
    _system_prompt: str
    _allowed_packages: tuple[str, ...] | None
    _llm_calls_made: int
    _tool_specs: list[dict[str, Any]] | None
    _tool_specs_lock: threading.Lock

    if TYPE_CHECKING:  # ToolCalls' (AgentContext has both bases)

        def _run(
            self, slug: str, tool_name: str | None, arguments: Mapping[str, Any], retry: bool | None
        ) -> ToolResult: ...

    def allowed_tool_context(self) -> ToolContext:
        """The tools this run may offer a model: `tool_specs` from the host's list (ListTools: every declared
        tool of every installed pack on the run's effective allowlist, named `<slug>:<tool>`), asked for once
        per run. Never raises and never returns None: an empty allowlist, an older host without ListTools or
        any failure gives a context without specs (a failure other than an older host is asked again next
        time). `allowed_packages` is the allowlist, or, when the manifest declares none, the slugs of the
        listed tools."""
        try:
            if self._allowed_packages == ():
                return ToolContext()  # the runtime's llm_only case: nothing to ask the host
            specs = copy.deepcopy(self._listed_tools())
            if self._allowed_packages is not None:
                packages = list(self._allowed_packages)
            else:
                packages = list(dict.fromkeys(spec["name"].partition(":")[0] for spec in specs))
            return ToolContext(allowed_packages=packages, tool_specs=specs)
        except Exception:  # noqa: BLE001 - the runtime's contract: never raises
            return ToolContext(allowed_packages=list(self._allowed_packages or ()))

    def _listed_tools(self) -> list[dict[str, Any]]:
        """The host's tool specs for this run, cached after the first answer (an older host's too)."""
        with self._tool_specs_lock:
            if self._tool_specs is None:
                try:
                    response = self._llm.ListTools(llm_pb2.ListToolsRequest())
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self._tool_specs = []  # a host from before ListTools: it never offers tools
                    return []
                self._tool_specs = [_llm.tool_spec(t) for t in response.tools]
            return self._tool_specs

    def call_llm(
        self,
        messages: Messages,
        *,
        tool_context: ToolContext | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> LlmResult:
        """One completion from the host's broker; any refusal raises LlmAccessError with its reason.

        `messages` is a str (one user message) or message dicts: system/user/assistant/tool, an assistant
        message with the `tool_calls` an LlmResult carried (an LlmResult itself is one), a tool message with
        `tool_call_id` and the result as `content` (anything but a str is sent as its JSON). The manifest's
        system prompt goes first unless a system message is there. `tool_context` offers its `tool_specs`
        to the model, by name (see allowed_tool_context: the host offers its own declaration of each and
        refuses a name not on its list); `tool_choice` is "auto", "none", "required" or one offered tool
        (`{"type": "function", "function": {"name": ...}}`); `response_format` is OpenAI's (`{"type":
        "json_object"}`, `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`). Wrong
        types raise TypeError before anything is sent."""
        request = llm_pb2.CallLlmRequest(messages=self._chat(messages))
        _options(request, tool_context, response_format, tool_choice)
        try:
            response = self._llm.CallLlm(request)
        except grpc.RpcError as err:
            raise _llm_error(err) from None
        with self._lock:
            self._llm_calls_made += 1
        return LlmResult(
            content=response.content,
            finish_reason=_llm.FINISH_REASONS.get(response.finish_reason, ""),
            usage=_usage(response.usage),
            tool_calls=[_llm.tool_call_dict(c) for c in response.tool_calls] or None,
        )

    def call_llm_text(self, messages: Messages, **kwargs: Any) -> str:
        """The completion text alone (call_llm's keyword arguments apply)."""
        return self.call_llm(messages, **kwargs).content

    def run_llm_tool_loop(self, messages: Messages, *, max_rounds: int = 8) -> LlmResult:
        """The runtime's tool loop over allowed_tool_context(): call the model; while it calls tools, run
        each call (its name split at the first ':' into slug and tool) through the host's gate as try_tool
        does, feed the results back and call again, at most `max_rounds` calls in all. Returns the first
        result without tool calls, or the last one (its tool calls not run: nothing would read them).

        Each round appends the assistant message with its tool calls and one `tool` message per call with
        its `tool_call_id`, in the providers' wire format (the runtime's messages carry no ids). The host
        takes each id once per conversation, so a call whose id is missing, not `[A-Za-z0-9_-]{1,128}` or
        already used (in `messages` too, or earlier in the same answer) is sent back under a fresh one, in
        both messages. A result is sent as is when it is a str, else as JSON; a failure, a refusal,
        arguments that are not a JSON object, a name that is not `<slug>:<tool>` and a call the model was
        not offered (`refused`, never run) as `{"error": ...}`, whatever the model returned. A call not run
        for its name or arguments is sent back `refused` (arguments `{}`, a nameless one as "unnamed"), as
        the host itself returns such calls. AgentTerminated and LLM refusals raise, as in the runtime;
        `messages` and the results' tool calls are not modified.
        """
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int):
            raise TypeError("max_rounds must be an int")
        if max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        tools = self.allowed_tool_context()
        conversation: list[Mapping[str, Any]] = (
            [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        )
        used = _call_ids(conversation)
        for remaining in range(max_rounds - 1, -1, -1):
            result = self.call_llm(conversation, tool_context=tools)
            calls = result.tool_calls
            if not calls or remaining == 0:
                return result
            planned = [_loop_call(call, used) for call in calls]
            echoed = [sent for sent, _ in planned]
            conversation.append({"role": "assistant", "content": result.content, "tool_calls": echoed})
            for sent, plan in planned:
                output = plan if isinstance(plan, str) else self._loop_run(*plan)
                conversation.append({"role": "tool", "tool_call_id": sent["id"], "content": output})
        raise AssertionError("unreachable: the last round returns")

    def _loop_run(self, slug: str, tool_name: str, arguments: dict[str, Any]) -> str:
        """Run one of the model's calls as try_tool would; the text the model gets back."""
        try:
            result = self._run(slug, tool_name or None, arguments, None)
        except (ToolAccessError, AgentLimitExceeded) as exc:  # where try_tool returns None
            return _error_text(str(exc))
        except (ValueError, TypeError) as exc:  # a slug or tool name that cannot be sent; it was not run
            return _error_text(f"'{slug}:{tool_name}' could not be called: {exc}")
        if not result.success:
            return _error_text(result.error or "the tool failed")
        value = result.result
        return value if isinstance(value, str) else _llm.dumps(value, "the tool result")

    def stream_llm(
        self,
        messages: Messages,
        *,
        tool_context: ToolContext | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> LlmStream:
        """A streamed completion (call_llm's arguments): iterate it for the text as it arrives; when the
        iteration ends, its `result` is the LlmResult call_llm would have returned, with the tool calls the
        model made. At the output cap it raises LlmAccessError after the chunks that fit."""
        request = llm_pb2.StreamLlmRequest(messages=self._chat(messages))
        _options(request, tool_context, response_format, tool_choice)
        return LlmStream(lambda: self._llm.StreamLlm(request), self._count_llm_call)

    def _count_llm_call(self) -> None:
        with self._lock:
            self._llm_calls_made += 1

    def _chat(self, messages: Messages) -> list[llm_pb2.ChatMessage]:
        """Wire messages with the manifest's system prompt first, unless the agent sent a system message."""
        chat = _llm.chat_messages(messages)
        if self._system_prompt and not any(m.role == "system" for m in chat):
            chat.insert(0, llm_pb2.ChatMessage(role="system", content=self._system_prompt))
        return chat


def _options(
    request: llm_pb2.CallLlmRequest | llm_pb2.StreamLlmRequest,
    tool_context: ToolContext | None,
    response_format: Mapping[str, Any] | None,
    tool_choice: str | Mapping[str, Any] | None,
) -> None:
    """Tools, tool choice and response format on a request; with none of them it is a plain text request,
    exactly as hosts before tool calling received it."""
    choice, tools = _llm.tool_choice(tool_choice, _llm.tool_definitions(tool_context))
    fmt = _llm.response_format(response_format)
    request.tools.extend(tools)
    request.tool_choice = choice
    if fmt is not None:
        request.response_format.CopyFrom(fmt)


def _error_text(message: str) -> str:
    return _llm.dumps({"error": message}, "the error")


def _call_ids(messages: list[Mapping[str, Any]]) -> set[str]:
    """Every tool call id a conversation already holds, in assistant calls and tool answers alike."""
    used: set[str] = set()
    for message in messages:
        if not isinstance(message, Mapping):
            continue  # call_llm refuses it with a TypeError
        answer = message.get("tool_call_id")
        if isinstance(answer, str):
            used.add(answer)
        calls = message.get("tool_calls")
        if isinstance(calls, list | tuple):
            used.update(c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str))
    return used


def _loop_call(
    call: Mapping[str, Any], used: set[str]
) -> tuple[dict[str, Any], str | tuple[str, str, dict[str, Any]]]:
    """One of the model's calls in the tool loop: (the copy sent back, then the error text the model gets
    or the (slug, tool, arguments) to run). The copy has a fresh id unless its own is valid and unused (the
    id is then used), and is `refused` when its name or arguments rule it out, so the host takes it back."""
    sent = dict(call)
    call_id = sent.get("id")
    while not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id) or call_id in used:
        call_id = "call_" + os.urandom(12).hex()  # secrets.token_hex, without its imports in every boot
    used.add(call_id)
    sent["id"] = call_id
    name = call.get("name")
    name = name if isinstance(name, str) else ""
    slug, colon, tool_name = name.partition(":")
    if not (slug and colon):
        sent.update(name=name or _UNNAMED_CALL, refused=True)
    try:
        arguments = loads_finite(call.get("arguments") or "{}")
    except (TypeError, ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        sent.update(arguments="{}", refused=True)
    if call.get("refused"):
        return sent, _error_text(f"'{name}' is not one of the tools offered; it was not run")
    if not name:
        return sent, _error_text("the tool call has no name; it was not run")
    if not (slug and colon):
        return sent, _error_text(f"'{name}' is not a '<slug>:<tool>' tool name; it was not run")
    if not isinstance(arguments, dict):
        return sent, _error_text(f"the arguments for '{name}' are not a JSON object; it was not run")
    if "entry" in arguments:
        reserved = "'entry' is reserved by the agentnode runtime and cannot be passed to a tool"
        return sent, _error_text(reserved)
    return sent, (slug, tool_name, arguments)


class LlmStream(Iterator[str]):
    """A streamed completion: iterating it yields the text as it arrives (the request is sent on the
    first step). `result` is None until the host's final chunk, then the whole completion as call_llm
    returns it: content, `tool_calls` (the completed calls; deltas are put together here when the host
    lists none), usage and finish_reason. `close()` (or leaving a `with` block) cancels a stream that has
    not finished. A refusal raises LlmAccessError, at the output cap after the chunks that fit."""

    def __init__(self, start: Callable[[], Any], on_done: Callable[[], None]) -> None:
        self._result: LlmResult | None = None
        self._call: Any = None
        self._closed = False
        self._chunks = self._run(start, on_done)

    @property
    def result(self) -> LlmResult | None:
        return self._result

    def __iter__(self) -> LlmStream:
        return self

    def __next__(self) -> str:
        return next(self._chunks)

    def __enter__(self) -> LlmStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the stream (the host stops the provider's); iterating it afterwards yields nothing."""
        self._closed = True
        if self._call is not None and self._result is None:
            self._call.cancel()
        try:
            self._chunks.close()
        except ValueError:
            pass  # being iterated on another thread: the cancel ends it there

    def _run(self, start: Callable[[], Any], on_done: Callable[[], None]) -> Generator[str, None, None]:
        if self._closed:
            return
        self._call = call = start()
        text: list[str] = []
        deltas = _llm.ToolCallDeltas()
        try:
            for chunk in call:
                for delta in chunk.tool_call_deltas:
                    deltas.add(delta)
                if chunk.delta:
                    text.append(chunk.delta)
                    yield chunk.delta
                if chunk.done:
                    calls = [_llm.tool_call_dict(c) for c in chunk.tool_calls] or deltas.calls()
                    self._result = LlmResult(
                        content="".join(text),
                        finish_reason=_llm.FINISH_REASONS.get(chunk.finish_reason, ""),
                        usage=_usage(chunk.usage),
                        tool_calls=calls or None,
                    )
                    on_done()
        except grpc.RpcError as err:
            if self._closed:
                return
            raise _llm_error(err) from None
        finally:
            if self._result is None:
                call.cancel()


class AsyncLlmStream(AsyncIterator[str]):
    """stream_llm for `async for`: each chunk is awaited on a worker thread; `result` as in LlmStream."""

    def __init__(self, stream: LlmStream) -> None:
        self._stream = stream

    @property
    def result(self) -> LlmResult | None:
        return self._stream.result

    def __aiter__(self) -> AsyncLlmStream:
        return self

    async def __anext__(self) -> str:
        chunk = await asyncio.to_thread(next, self._stream, None)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def __aenter__(self) -> AsyncLlmStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel the stream, as LlmStream.close."""
        self._stream.close()


def _usage(usage: llm_pb2.Usage) -> dict[str, int]:
    """Token counts under the runtime's names and this wrapper's earlier ones, and the run's token budget
    left when the host reports one (a run without max_total_tokens keeps the earlier shape)."""
    counts = {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }
    if usage.HasField("tokens_remaining"):
        counts["tokens_remaining"] = usage.tokens_remaining
    return counts


def _llm_error(err: Any) -> LlmAccessError:
    """The LlmAccessError for a refused LLM RPC (HostUnavailableError propagates from refusal)."""
    reason, message = refusal(err)
    return LlmAccessError(message, reason=reason)
