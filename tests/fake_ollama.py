"""A fake Ollama server on a free port of 127.0.0.1: `GET /api/tags` as Ollama answers it, and
one streamed Chat Completions reply. Tests that choose a provider point `TRIMTAB_OLLAMA_URL` at
it, and never touch a real Ollama on 127.0.0.1:11434."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = ["FakeOllama", "not_ollama", "ollama"]


class FakeOllama(ThreadingHTTPServer):
    """Answers `GET /api/tags` like Ollama, and chat completions with one reply (streamed when
    asked for)."""

    def __init__(self, *, tags_status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _OllamaHandler)
        self.tags_status = tags_status
        self.tags_requests = 0
        """How many times it was probed."""
        self.chat_requests: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _OllamaHandler(BaseHTTPRequestHandler):
    server: FakeOllama

    def do_GET(self) -> None:
        if self.path == "/api/tags":
            self.server.tags_requests += 1
        if self.path != "/api/tags" or self.server.tags_status != 200:
            self._send(self.server.tags_status if self.path == "/api/tags" else 404, b"{}")
            return
        self._send(200, json.dumps({"models": [{"name": "fake-model:1b"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.chat_requests.append(body)
        reply = {"role": "assistant", "content": "Hello from Ollama"}
        head = {"id": "c1", "created": 0, "model": "m"}
        if not body.get("stream"):
            answer = {
                **head,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            }
            self._send(200, json.dumps(answer).encode())
            return
        chunk = {**head, "object": "chat.completion.chunk"}
        stream = [
            {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            for delta, finish in [(reply, None), ({}, "stop")]
        ]
        text = "".join(f"data: {json.dumps(event)}\n\n" for event in stream) + "data: [DONE]\n\n"
        self._send(200, text.encode(), "text/event-stream")

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test output clean


def _serve(server: FakeOllama) -> Iterator[FakeOllama]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    yield from _serve(FakeOllama())


@pytest.fixture
def not_ollama() -> Iterator[FakeOllama]:
    """Some other service on the port: it answers HTTP, but not Ollama's API."""
    yield from _serve(FakeOllama(tags_status=404))
