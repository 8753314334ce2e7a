"""A scriptable local LLM provider so broker tests drive the real openai/anthropic SDK clients offline.

Speaks enough of the OpenAI chat-completions and Anthropic messages wire formats (JSON and SSE) for the
SDKs, records every request, and can answer with errors, garbage or silence on demand.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

# Planted in every error body: a test that finds it in a refusal, log or audit record has found a leak.
SECRET_IN_ERROR_BODY = "sk-provider-body-LEAK-7f3a internal https://internal.provider.example/trace"
# How long a `hang` behaviour stalls at most; shutdown wakes it early.
HANG_SECONDS = 5.0


@dataclass(frozen=True)
class Behaviour:
    """How the fake answers one request."""

    text: str = "fake reply"
    chunks: int = 3  # text pieces in a streamed answer
    status: int | None = None  # answer with this error status and a body holding SECRET_IN_ERROR_BODY
    garbage: bool = False  # answer 200 with a body no SDK can parse
    hang: bool = False  # say nothing for HANG_SECONDS (longer than any test's client timeout)
    delay: float = 0.0  # seconds to wait before answering
    chunk_delay: float = 0.0  # seconds to wait between streamed pieces
    finish: str | None = None  # provider-native finish/stop reason; None -> "stop" / "end_turn"


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
    """A deterministic stand-in for prompt tokens: the characters of every message and system text."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    total = sum(len(m.get("content", "")) for m in messages if isinstance(m, dict))
    system = body.get("system", "") if isinstance(body, dict) else ""
    return total + (len(system) if isinstance(system, str) else 0)


class FakeLlmServer:
    """A threaded HTTP server on 127.0.0.1 (ephemeral port) impersonating OpenAI and Anthropic."""

    def __init__(self, port: int = 0) -> None:
        self.default = Behaviour()
        self.disconnects = 0  # streams the client closed before the fake finished writing
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
            if behaviour.delay:
                server._pause(behaviour.delay)
            if self.path not in ("/v1/chat/completions", "/v1/messages"):
                self._send(404, "application/json", b'{"error": {"message": "no such route"}}')
            elif behaviour.status is not None:
                error = {"message": SECRET_IN_ERROR_BODY, "type": "fake_error", "code": "fake"}
                self._send(
                    behaviour.status,
                    "application/json",
                    json.dumps({"type": "error", "error": error}).encode(),
                )
            elif behaviour.garbage:
                stream = isinstance(body, dict) and body.get("stream") is True
                ctype = "text/event-stream" if stream else "application/json"
                self._send(200, ctype, b"data: {<<not json " + SECRET_IN_ERROR_BODY.encode() + b"\n\n")
            elif isinstance(body, dict) and body.get("stream") is True:
                self._stream(body, behaviour)
            else:
                self._send(200, "application/json", json.dumps(self._complete(body, behaviour)).encode())

        def _send(self, status: int, ctype: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _complete(self, body: Any, b: Behaviour) -> dict[str, Any]:
            model, prompt, completion = body.get("model", ""), _prompt_tokens(body), len(b.text)
            if self.path == "/v1/chat/completions":
                message = {"role": "assistant", "content": b.text}
                return {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": b.finish or "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                }
            return {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": b.text}],
                "stop_reason": b.finish or "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": completion},
            }

        def _stream(self, body: dict[str, Any], b: Behaviour) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            events = (
                self._openai_events(body, b)
                if self.path == "/v1/chat/completions"
                else (self._anthropic_events(body, b))
            )
            try:
                for event in events:
                    self.wfile.write(event.encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                server._note_disconnect()

        def _openai_events(self, body: dict[str, Any], b: Behaviour) -> Iterator[str]:
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

            for piece in server._paced(_pieces(b.text, b.chunks), b.chunk_delay):
                yield chunk(
                    [{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}]
                )
            yield chunk([{"index": 0, "delta": {}, "finish_reason": b.finish or "stop"}])
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": len(b.text),
                    "total_tokens": prompt + len(b.text),
                }
                yield chunk([], usage=usage)
            yield "data: [DONE]\n\n"

        def _anthropic_events(self, body: dict[str, Any], b: Behaviour) -> Iterator[str]:
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
            yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            for piece in server._paced(_pieces(b.text, b.chunks), b.chunk_delay):
                yield event(
                    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}}
                )
            yield event("content_block_stop", {"index": 0})
            yield event(
                "message_delta",
                {
                    "delta": {"stop_reason": b.finish or "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": len(b.text)},
                },
            )
            yield event("message_stop", {})

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve until killed, printing `FAKE_LLM_URL=...` so a demo script can point a host at it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = any free port)")
    args = parser.parse_args(argv)
    with FakeLlmServer(args.port) as srv:
        print(f"FAKE_LLM_URL={srv.base_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
