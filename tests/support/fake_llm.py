"""A scriptable local LLM provider so broker tests drive the real openai/anthropic SDK clients offline.

Speaks enough of the OpenAI chat-completions and Anthropic messages wire formats (JSON and SSE) for the
SDKs, records every request, and can answer with errors, garbage or silence on demand.

It speaks tool calls and JSON output too. A Behaviour with `tool_calls` answers a request that defines
tools with those calls (a name the request defines, matched loosely: `word-tools:reverse_words` finds the
function the host named `word-tools__reverse_words`; any other name is sent as written, a call of an
undefined tool), and answers with its `text` once the conversation ends in tool results: one behaviour
drives a whole model-driven tool loop. A request that asks for JSON (OpenAI `response_format`; an
Anthropic tool choice that forces a tool, or `any` with `answer_tool` defined) gets `json_value` (default
`{"answer": text}`) as JSON text or as that tool's input. Requests are checked the way the real APIs
check them (function names, tool schemas, tool calls answered by id right after, roles); a request that
breaks a rule is answered 400 and the rule is recorded in `problems`, so a test can assert that the host
only ever sent well-formed requests.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

# Planted in every error body: a test that finds it in a refusal, log or audit record has found a leak.
SECRET_IN_ERROR_BODY = "sk-provider-body-LEAK-7f3a internal https://internal.provider.example/trace"
# How long a `hang` behaviour stalls at most; shutdown wakes it early.
HANG_SECONDS = 5.0
ANSWER_TOOL = "json_response"
"""The tool an Anthropic JSON answer goes through when the request offers it (the host's response tool)."""

_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call the fake makes: `name` is matched against the request's tools (see the module doc);
    `arguments` a JSON value (sent as JSON text to OpenAI, as a dict to Anthropic), or raw text sent as is
    when `raw` (OpenAI only: malformed arguments)."""

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None
    raw: bool = False


@dataclass(frozen=True)
class Behaviour:
    """How the fake answers one request."""

    text: str = "fake reply"
    chunks: int = 3  # text pieces in a streamed answer (and argument pieces of each streamed tool call)
    status: int | None = None  # answer with this error status and a body holding SECRET_IN_ERROR_BODY
    garbage: bool = False  # answer 200 with a body no SDK can parse
    hang: bool = False  # say nothing for HANG_SECONDS (longer than any test's client timeout)
    reset: bool = False  # read the whole request, then reset the connection without a byte of answer
    delay: float = 0.0  # seconds to wait before answering
    chunk_delay: float = 0.0  # seconds to wait between streamed pieces
    finish: str | None = None  # provider-native finish/stop reason; None -> "stop" / "end_turn" (or tools)
    tool_calls: tuple[FakeToolCall, ...] = ()  # call these unless the conversation ends in tool results
    echo_results: bool = False  # the final text is `text` + ": " + the tool results, joined by " | "
    json_value: Any = None  # the JSON answer when one is asked for; None -> {"answer": text}
    answer_tool: str = ANSWER_TOOL


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it; header names are lower-case."""

    path: str
    headers: dict[str, str]
    body: Any


def _pieces(text: str, chunks: int) -> list[str]:
    """`text` cut into at most `chunks` consecutive, non-empty pieces."""
    size = max(1, math.ceil(len(text) / max(1, chunks)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _prompt_tokens(body: Any) -> int:
    """A deterministic stand-in for prompt tokens: the characters of every message and system text (a
    content that is not text, such as a list of blocks, counts as its JSON)."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    total = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        total += len(content) if isinstance(content, str) else len(json.dumps(content)) if content else 0
    system = body.get("system", "") if isinstance(body, dict) else ""
    return total + (len(system) if isinstance(system, str) else 0)


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _defined(path: str, body: dict[str, Any]) -> list[str]:
    """The function names a request defines."""
    tools = body.get("tools") or []
    if path == "/v1/chat/completions":
        return [t.get("function", {}).get("name", "") for t in tools if isinstance(t, dict)]
    return [t.get("name", "") for t in tools if isinstance(t, dict)]


def resolve_name(name: str, defined: list[str]) -> str:
    """The defined function `name` means: itself, or the one equal to it ignoring case and every character
    but letters and digits; else `name` unchanged (a call of a tool the request does not define)."""
    if name in defined:
        return name
    return next((d for d in defined if _squash(d) == _squash(name)), name)


def tool_results(path: str, body: dict[str, Any]) -> list[str] | None:
    """The tool results the conversation ends with, as text, or None when it does not end with any."""
    messages = body.get("messages") or []
    if path == "/v1/chat/completions":
        out: list[str] = []
        for m in reversed(messages):
            if not isinstance(m, dict) or m.get("role") != "tool":
                break
            out.insert(0, str(m.get("content")))
        return out or None
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "user" or not isinstance(last.get("content"), list):
        return None
    found = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    return [str(b.get("content")) for b in found] or None


def wants_json(path: str, body: dict[str, Any], b: Behaviour) -> str | None:
    """How the request asks for JSON: "content" (OpenAI), the tool to answer through (Anthropic), or None."""
    if path == "/v1/chat/completions":
        kind = (body.get("response_format") or {}).get("type")
        return "content" if kind in ("json_object", "json_schema") else None
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        return str(choice.get("name"))
    if choice.get("type") == "any" and b.answer_tool in _defined(path, body):
        return b.answer_tool
    return None


def problems_in(path: str, body: Any) -> list[str]:
    """What the real API would refuse in this request (a subset of its rules: the ones tool calling needs)."""
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    found: list[str] = []
    defined = _defined(path, body)
    for name in defined:
        if not _FUNCTION_NAME.fullmatch(name):
            found.append(f"function name {name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
    if len(set(defined)) != len(defined):
        found.append("function names are not unique")
    if path == "/v1/chat/completions":
        found += _openai_problems(body)
    elif path == "/v1/messages":
        found += _anthropic_problems(body, defined)
    return found


def _openai_problems(body: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for t in body.get("tools") or []:
        fn = t.get("function", {})
        if t.get("type") != "function" or not isinstance(fn.get("parameters", {}), dict):
            found.append("a tool is not a function with an object of parameters")
        elif fn.get("parameters", {}).get("type", "object") != "object":
            found.append("a function's parameters are not an object schema")
    pending: set[str] = set()
    for m in body.get("messages") or []:
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                found.append("a tool message answers no tool call of the assistant message before it")
            pending.discard(m.get("tool_call_id"))
            continue
        if pending:
            found.append("an assistant message with tool_calls is not followed by a tool message for each")
            pending = set()
        if role not in ("system", "user", "assistant", "developer"):
            found.append(f"unknown role {role!r}")
        for c in m.get("tool_calls") or []:
            fn = c.get("function") or {}
            if role != "assistant" or c.get("type") != "function" or not isinstance(fn.get("arguments"), str):
                found.append("a tool call is not an assistant's function call with arguments as text")
            pending.add(c.get("id"))
    if pending:
        found.append("the conversation ends with unanswered tool calls")
    fmt = body.get("response_format") or {}
    said = any("json" in str(m.get("content") or "").lower() for m in body["messages"])
    if fmt.get("type") == "json_object" and not said:
        found.append("'messages' must contain the word 'json' to use response_format json_object")
    if fmt.get("type") == "json_schema" and not isinstance(fmt.get("json_schema", {}).get("schema"), dict):
        found.append("json_schema needs a schema object")
    return found


def _anthropic_problems(body: dict[str, Any], defined: list[str]) -> list[str]:
    found: list[str] = []
    for t in body.get("tools") or []:
        if not isinstance(t.get("input_schema"), dict) or t["input_schema"].get("type") != "object":
            found.append("tools.input_schema: the type must be 'object'")
    uses_tools = False
    pending: set[str] = set()
    for m in body.get("messages") or []:
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            found.append(f"unexpected role {role!r}: only user and assistant (system is a parameter)")
        blocks = content if isinstance(content, list) else []
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if pending:
            if role != "user" or set(results) != pending:
                found.append("tool_use ids were found without tool_result blocks immediately after")
            lead = blocks[: len(results)]
            if any(b.get("type") != "tool_result" for b in lead):
                found.append("tool_result blocks must come first in the user message")
        elif results:
            found.append("a tool_result block answers no tool_use of the message before it")
        pending = set()
        for b in blocks:
            if b.get("type") == "tool_use":
                uses_tools = True
                if role != "assistant" or not isinstance(b.get("input"), dict):
                    found.append("a tool_use block is not an assistant's with an input object")
                if not re.fullmatch(r"[a-zA-Z0-9_-]+", str(b.get("id"))):
                    found.append("tool_use.id does not match ^[a-zA-Z0-9_-]+$")
                pending.add(b.get("id"))
            uses_tools = uses_tools or b.get("type") == "tool_result"
    if pending:
        found.append("the conversation ends with unanswered tool_use blocks")
    if uses_tools and not defined:
        found.append("requests which include tool_use or tool_result blocks must define tools")
    choice = body.get("tool_choice")
    if choice is not None:
        if choice.get("type") not in ("auto", "any", "none", "tool"):
            found.append("unknown tool_choice type")
        if choice.get("type") == "tool" and choice.get("name") not in defined:
            found.append("tool_choice names a tool the request does not define")
    return found


class FakeLlmServer:
    """A threaded HTTP server on 127.0.0.1 (ephemeral port) impersonating OpenAI and Anthropic."""

    def __init__(self, port: int = 0) -> None:
        self.default = Behaviour()
        self.disconnects = 0  # streams the client closed before the fake finished writing
        self.problems: list[str] = []  # what requests broke of the real APIs' rules (each answered 400)
        self._ids = 0
        self._lock = threading.Lock()
        self._queue: collections.deque[Behaviour] = collections.deque()
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="fake-llm", daemon=True
        )

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """Scheme, host and port."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url_openai(self) -> str:
        """What an OpenAI client takes as base_url (the SDK appends /chat/completions)."""
        return f"{self.base_url}/v1"

    @property
    def base_url_anthropic(self) -> str:
        """What an Anthropic client takes as base_url (the SDK appends /v1/messages)."""
        return self.base_url

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next requests; once used up, `default` answers."""
        with self._lock:
            self._queue.extend(behaviours)

    def start(self) -> FakeLlmServer:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Wake hung handlers, stop serving and release the port."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeLlmServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _record(self, request: RecordedRequest) -> Behaviour:
        with self._lock:
            self._requests.append(request)
            return self._queue.popleft() if self._queue else self.default

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_fake{self._ids}"

    def _note_problems(self, found: list[str]) -> None:
        with self._lock:
            self.problems.extend(found)

    def _note_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1

    def _pause(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _paced(self, pieces: list[str], delay: float) -> Iterator[str]:
        """`pieces`, waiting `delay` before each one after the first."""
        for i, piece in enumerate(pieces):
            if i and delay:
                self._pause(delay)
            yield piece


@dataclass(frozen=True)
class _Plan:
    """What one answer holds: text, tool calls as (id, name, arguments text), or a JSON answer."""

    text: str = ""
    calls: tuple[tuple[str, str, str], ...] = ()
    json_text: str | None = None
    json_tool: str | None = None  # Anthropic: the tool the JSON answer goes through


def _plan(server: FakeLlmServer, path: str, body: dict[str, Any], b: Behaviour) -> _Plan:
    openai = path == "/v1/chat/completions"
    results = tool_results(path, body)
    defined = _defined(path, body)
    choice = body.get("tool_choice")
    forced = not openai and isinstance(choice, dict) and choice.get("type") == "tool"
    no_calls = choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none")
    if b.tool_calls and defined and results is None and not forced and not no_calls:
        calls = []
        for c in b.tool_calls:
            arguments = c.arguments if c.raw and isinstance(c.arguments, str) else json.dumps(c.arguments)
            call_id = c.id or server._next_id("call" if openai else "toolu")
            calls.append((call_id, resolve_name(c.name, defined), arguments))
        return _Plan(calls=tuple(calls))
    text = b.text
    if b.echo_results and results:
        text = f"{text}: {' | '.join(results)}"
    target = wants_json(path, body, b)
    if target is None:
        return _Plan(text=text)
    answer = json.dumps(b.json_value if b.json_value is not None else {"answer": text})
    return _Plan(json_text=answer, json_tool=None if openai else target)


def _handler_for(server: FakeLlmServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Stay quiet: test output is not the place for request lines."""

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            behaviour = server._record(RecordedRequest(self.path, headers, body))
            if behaviour.hang:
                server._pause(HANG_SECONDS)
                return
            if behaviour.reset:  # the request reached the provider, the answer never comes: RST, not FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if behaviour.delay:
                server._pause(behaviour.delay)
            if self.path not in ("/v1/chat/completions", "/v1/messages"):
                self._send(404, "application/json", b'{"error": {"message": "no such route"}}')
            elif behaviour.status is not None:
                self._error(behaviour.status, SECRET_IN_ERROR_BODY)
            elif behaviour.garbage:
                stream = isinstance(body, dict) and body.get("stream") is True
                ctype = "text/event-stream" if stream else "application/json"
                self._send(200, ctype, b"data: {<<not json " + SECRET_IN_ERROR_BODY.encode() + b"\n\n")
            elif found := problems_in(self.path, body):
                server._note_problems(found)
                self._error(400, "; ".join(found) + " " + SECRET_IN_ERROR_BODY)
            elif body.get("stream") is True:
                self._stream(body, behaviour)
            else:
                self._send(200, "application/json", json.dumps(self._complete(body, behaviour)).encode())

        def _error(self, status: int, message: str) -> None:
            error = {"message": message, "type": "fake_error", "code": "fake"}
            self._send(status, "application/json", json.dumps({"type": "error", "error": error}).encode())

        def _send(self, status: int, ctype: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _complete(self, body: Any, b: Behaviour) -> dict[str, Any]:
            plan = _plan(server, self.path, body, b)
            model, prompt = body.get("model", ""), _prompt_tokens(body)
            completion = len(plan.text) + len(plan.json_text or "") + sum(len(a) for _, _, a in plan.calls)
            if self.path == "/v1/chat/completions":
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": plan.json_text or plan.text or None,
                }
                if plan.calls:
                    message["tool_calls"] = [
                        {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                        for i, n, a in plan.calls
                    ]
                finish = "tool_calls" if plan.calls else b.finish or "stop"
                return {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                }
            content: list[dict[str, Any]] = [
                {"type": "tool_use", "id": i, "name": n, "input": json.loads(a)} for i, n, a in plan.calls
            ]
            if plan.json_tool is not None and plan.json_text is not None:
                answer = json.loads(plan.json_text)
                content.append(
                    {
                        "type": "tool_use",
                        "id": server._next_id("toolu"),
                        "name": plan.json_tool,
                        "input": answer,
                    }
                )
            if not content:
                content.append({"type": "text", "text": plan.text})
            return {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": "tool_use" if content[0]["type"] == "tool_use" else b.finish or "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": completion},
            }

        def _stream(self, body: dict[str, Any], b: Behaviour) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            plan = _plan(server, self.path, body, b)
            events = (
                self._openai_events(body, b, plan)
                if self.path == "/v1/chat/completions"
                else (self._anthropic_events(body, b, plan))
            )
            try:
                for event in events:
                    self.wfile.write(event.encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                server._note_disconnect()

        def _openai_events(self, body: dict[str, Any], b: Behaviour, plan: _Plan) -> Iterator[str]:
            model, prompt = body.get("model", ""), _prompt_tokens(body)

            def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
                data = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": choices,
                    **extra,
                }
                return f"data: {json.dumps(data)}\n\n"

            def delta(d: dict[str, Any]) -> str:
                return chunk([{"index": 0, "delta": d, "finish_reason": None}])

            text = plan.json_text or plan.text
            for piece in server._paced(_pieces(text, b.chunks), b.chunk_delay):
                yield delta({"role": "assistant", "content": piece})
            for n, (call_id, name, arguments) in enumerate(plan.calls):
                head = {
                    "index": n,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                yield delta({"role": "assistant", "tool_calls": [head]})
                for piece in server._paced(_pieces(arguments, b.chunks), b.chunk_delay):
                    yield delta({"tool_calls": [{"index": n, "function": {"arguments": piece}}]})
            finish = "tool_calls" if plan.calls else b.finish or "stop"
            yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}])
            if (body.get("stream_options") or {}).get("include_usage"):
                completion = len(text) + sum(len(a) for _, _, a in plan.calls)
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                }
                yield chunk([], usage=usage)
            yield "data: [DONE]\n\n"

        def _anthropic_events(self, body: dict[str, Any], b: Behaviour, plan: _Plan) -> Iterator[str]:
            def event(name: str, data: dict[str, Any]) -> str:
                return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

            message = {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", ""),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": _prompt_tokens(body), "output_tokens": 1},
            }
            yield event("message_start", {"message": message})
            uses: list[tuple[str, str, str]] = list(plan.calls)
            if plan.json_tool is not None and plan.json_text is not None:
                uses.append((server._next_id("toolu"), plan.json_tool, plan.json_text))
            for index, (call_id, name, arguments) in enumerate(uses):
                block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                yield event("content_block_start", {"index": index, "content_block": block})
                for piece in server._paced(_pieces(arguments, b.chunks), b.chunk_delay):
                    yield event(
                        "content_block_delta",
                        {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}},
                    )
                yield event("content_block_stop", {"index": index})
            if not uses:
                yield event(
                    "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
                )
                for piece in server._paced(_pieces(plan.text, b.chunks), b.chunk_delay):
                    yield event(
                        "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}}
                    )
                yield event("content_block_stop", {"index": 0})
            output = len(plan.text) + sum(len(a) for _, _, a in uses)
            yield event(
                "message_delta",
                {
                    "delta": {
                        "stop_reason": "tool_use" if uses else b.finish or "end_turn",
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": output},
                },
            )
            yield event("message_stop", {})

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve until killed, printing `FAKE_LLM_URL=...` so a demo script can point a host at it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = any free port)")
    parser.add_argument(
        "--tool-call",
        metavar="NAME",
        help="answer with a call of this tool (e.g. word-tools:reverse_words) until the conversation ends "
        "in tool results, then with the text and the results",
    )
    parser.add_argument(
        "--tool-arguments", metavar="JSON", default="{}", help="the call's arguments (a JSON object)"
    )
    parser.add_argument(
        "--text", default=None, help="the reply text (with --tool-call: the final answer, before the results)"
    )
    args = parser.parse_args(argv)
    with FakeLlmServer(args.port) as srv:
        text = args.text if args.text is not None else "done" if args.tool_call else Behaviour.text
        if args.tool_call:
            call = FakeToolCall(args.tool_call, json.loads(args.tool_arguments))
            srv.default = Behaviour(text=text, tool_calls=(call,), echo_results=True)
        else:
            srv.default = Behaviour(text=text)
        print(f"FAKE_LLM_URL={srv.base_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
