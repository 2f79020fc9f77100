"""A fake OpenAI Chat Completions server that answers instantly, for benchmarks.

An asyncio HTTP/1.1 server on 127.0.0.1 (keep-alive, TCP_NODELAY) that answers
`POST .../chat/completions` with canned bodies, so that what a benchmark measures is the
client's own work:

- the last message is a tool result: a plain reply ("done");
- the last user message contains `ECHO` and the request offers a tool named `echo`: one call
  of `echo` with `{"text": "hi"}`;
- the last user message is `STREAM <n> <gap_ms>` and the request streams: `n` text deltas,
  `gap_ms` apart, each holding the time it was written (`t<time.perf_counter_ns()>;`, the
  system-wide monotonic clock on Linux), for measuring how late deltas reach their readers;
- anything else: a plain reply.

`"stream": true` is answered with server-sent events (the Copilot CLI streams); everything
else with one JSON body. `GET .../models` lists the one model, `GET /stats` counts requests.

    python bench/fake_model.py [--port 0]    # prints "PORT <n>" once it listens
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from typing import Any

MODEL = "fake-model"
TOOL_MARKER = "ECHO"
"""A prompt containing this asks for a tool turn."""
STREAM_MARKER = "STREAM"
"""A prompt `STREAM <n> <gap_ms>` asks for `n` time-stamped deltas."""
REPLY = "done"
BACKLOG = 1024
"""The listening socket's accept queue (asyncio's default is 100)."""

_STATUS = {200: "OK", 400: "Bad Request", 404: "Not Found"}


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts
                return " ".join(
                    str(part.get("text", "")) for part in content if isinstance(part, dict)
                )
            return ""
    return ""


def _offers_echo(tools: list[dict[str, Any]]) -> bool:
    return any((tool.get("function") or {}).get("name") == "echo" for tool in tools)


def wants_tool_call(request: dict[str, Any]) -> bool:
    """Whether to answer `request` with a call of `echo` (else with a plain reply)."""
    messages = request.get("messages") or []
    if not messages or messages[-1].get("role") == "tool":
        return False
    return TOOL_MARKER in _last_user_text(messages) and _offers_echo(request.get("tools") or [])


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}


def completion(tool: bool, counter: int) -> dict[str, Any]:
    """A non-streamed Chat Completions body."""
    message: dict[str, Any] = {"role": "assistant", "content": None if tool else REPLY}
    if tool:
        message["tool_calls"] = [
            {
                "id": f"call_{counter}",
                "type": "function",
                "function": {"name": "echo", "arguments": '{"text":"hi"}'},
            }
        ]
    return {
        "id": f"chatcmpl-{counter}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool else "stop",
                "logprobs": None,
            }
        ],
        "usage": _usage(),
    }


def chunks(tool: bool, counter: int) -> list[dict[str, Any]]:
    """The same answer as `completion`, as stream chunks (the last one carries the usage)."""
    base = {
        "id": f"chatcmpl-{counter}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
    }
    if tool:
        call = {
            "index": 0,
            "id": f"call_{counter}",
            "type": "function",
            "function": {"name": "echo", "arguments": '{"text":"hi"}'},
        }
        delta: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    else:
        delta = {"role": "assistant", "content": REPLY}
    finish = "tool_calls" if tool else "stop"
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {**base, "choices": [], "usage": _usage()},
    ]


class _Http(asyncio.Protocol):
    """One keep-alive connection: parse requests as bytes arrive, answer each at once."""

    def __init__(self, server: FakeModel) -> None:
        self._server = server
        self._buffer = bytearray()
        self._head: tuple[str, str, dict[str, str]] | None = None
        """The request line and headers of the request whose body is still arriving."""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Without it the reply's second segment waits for the client's delayed ACK:
            # ~40 ms per response on Linux.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (request := self._parse()) is not None:
            method, path, body = request
            self._respond(method, path, body)

    def _parse(self) -> tuple[str, str, bytes] | None:
        # Large bodies arrive in many segments: the head is parsed once, and the body is
        # only sliced off once complete, so that a long conversation costs O(n), not O(n^2).
        if self._head is None:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return None
            lines = self._buffer[:head_end].decode("latin-1").split("\r\n")
            del self._buffer[: head_end + 4]
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self._head = (method, path, headers)
        method, path, headers = self._head
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = _dechunk(bytes(self._buffer))
            if parsed is None:
                return None
            body, used = parsed
        else:
            length = int(headers.get("content-length", "0"))
            if len(self._buffer) < length:
                return None
            body, used = bytes(self._buffer[:length]), length
        del self._buffer[:used]
        self._head = None
        return method, path, body

    def _respond(self, method: str, path: str, body: bytes) -> None:
        server = self._server
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/stats":
            self._send(200, json.dumps({"requests": server.requests}).encode())
        elif method == "GET" and path.endswith("/models"):
            models = {"object": "list", "data": [_model_entry()]}
            self._send(200, json.dumps(models).encode())
        elif method == "POST" and path.endswith("/chat/completions"):
            try:
                request = json.loads(body)
            except ValueError:
                self._send(400, b'{"error": {"message": "bad json"}}')
                return
            server.requests += 1
            tool = wants_tool_call(request)
            stamped = _stamped(request)
            if stamped is not None and request.get("stream"):
                self._stream_stamped(server.requests, *stamped)
            elif request.get("stream"):
                events = b"".join(
                    b"data: " + json.dumps(chunk).encode() + b"\n\n"
                    for chunk in chunks(tool, server.requests)
                )
                self._send(200, events + b"data: [DONE]\n\n", "text/event-stream")
            else:
                self._send(200, json.dumps(completion(tool, server.requests)).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def _stream_stamped(self, counter: int, count: int, gap: float) -> None:
        """Answer with `count` deltas, each written `gap` seconds after the previous one and
        stamped with the time it was written; HTTP chunked, as the length is not known."""
        assert self._transport is not None
        transport = self._transport
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
        )

        def chunk(data: bytes) -> bytes:
            return b"%x\r\n%s\r\n" % (len(data), data)

        def event(payload: dict[str, Any]) -> bytes:
            return chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

        async def send() -> None:
            base = {
                "id": f"chatcmpl-{counter}",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": MODEL,
            }
            for _ in range(count):
                await asyncio.sleep(gap)
                if transport.is_closing():
                    return
                delta = {"role": "assistant", "content": f"t{time.perf_counter_ns()};"}
                choice = {"index": 0, "delta": delta, "finish_reason": None}
                transport.write(event({**base, "choices": [choice]}))
            finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
            transport.write(
                event({**base, "choices": [finish]})
                + event({**base, "choices": [], "usage": _usage()})
                + chunk(b"data: [DONE]\n\n")
                + b"0\r\n\r\n"
            )

        task = asyncio.get_running_loop().create_task(send())
        self._server.streams.add(task)
        task.add_done_callback(self._server.streams.discard)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        assert self._transport is not None
        head = (
            f"HTTP/1.1 {status} {_STATUS[status]}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: keep-alive\r\n\r\n"
        )
        # One write: header and body leave in one segment when they fit.
        self._transport.write(head.encode() + body)


def _stamped(request: dict[str, Any]) -> tuple[int, float] | None:
    """`(count, gap in seconds)` of a `STREAM <n> <gap_ms>` request, else None."""
    messages = request.get("messages") or []
    if not messages or messages[-1].get("role") != "user":
        return None
    words = _last_user_text(messages).split()
    if len(words) != 3 or words[0] != STREAM_MARKER:
        return None
    return int(words[1]), float(words[2]) / 1000


def _model_entry() -> dict[str, Any]:
    return {"id": MODEL, "object": "model", "created": 0, "owned_by": "bench"}


def _dechunk(data: bytes) -> tuple[bytes, int] | None:
    """A chunked body and the bytes it used, or None while it is incomplete."""
    body, pos = b"", 0
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(data[pos:line_end].split(b";")[0], 16)
        start = line_end + 2
        if size == 0:
            end = data.find(b"\r\n\r\n", line_end)
            return (body, end + 4) if end >= 0 else None
        if len(data) < start + size + 2:
            return None
        body += data[start : start + size]
        pos = start + size + 2


class FakeModel:
    """The server; `await start()` then use `base_url`."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.requests = 0
        self.streams: set[asyncio.Task[None]] = set()
        """Stamped streams being written (kept, so that they are not collected)."""
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # A load test opens hundreds of connections at once: with a short accept queue the
        # kernel drops connection attempts, and clients stall for a second per retry.
        self._server = await loop.create_server(
            lambda: _Http(self), "127.0.0.1", self.port, backlog=BACKLOG
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _serve(port: int) -> None:
    server = FakeModel(port)
    await server.start()
    print(f"PORT {server.port}", flush=True)
    # Serve until stdin closes (the parent exited or closed the pipe) or a signal kills us.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(_serve(args.port))


if __name__ == "__main__":
    main()
