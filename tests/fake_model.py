"""A model server that answers any conversation, for tests whose histories cannot be recorded
in advance (runs cut by `kill -9` at random moments, a model that never stops calling tools).

`ReplayServer` answers only conversations it holds; `FakeModel` answers every Chat Completions
request (`POST .../chat/completions`, streamed or not) by a rule: a call of its `tool` when
the conversation's last message is the user's (or always, with `always_call`), else `reply`,
each after `delay` seconds. It is real HTTP on 127.0.0.1, so that the providers, the server
and the processes under test run as in production; only the model's mind is fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from typing import Any, Self

__all__ = ["FakeModel", "LocalServer"]


class LocalServer:
    """A TCP server on 127.0.0.1 for one test, as an async context manager: each connection
    is served by `serve_connection` in a task of its own, cancelled when the test leaves.
    With `tls` (a server context) it speaks HTTPS."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._tls = tls

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0, ssl=self._tls)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    @property
    def port(self) -> int:
        assert self._server is not None, "use the server as an async context manager"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def root_url(self) -> str:
        """`http://127.0.0.1:PORT`, or `https://` with TLS."""
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        raise NotImplementedError

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self.serve_connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class FakeModel(LocalServer):
    """A Chat Completions server on 127.0.0.1 that answers by rule (see the module).

    Args:
        reply: The text of every answer that calls no tool.
        delay: Seconds each answer takes to come.
        tool: The tool to call after each user message (None: never call one).
        always_call: Call `tool` whatever the conversation's last message is: a model that
            never ends a run by itself.
        tls: A server context: answer over HTTPS.
    """

    def __init__(
        self,
        *,
        reply: str = "done",
        delay: float = 0.0,
        tool: str | None = None,
        always_call: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if always_call and tool is None:
            raise ValueError("always_call needs a tool")
        super().__init__(tls=tls)
        self.reply = reply
        self.delay = delay
        self.tool = tool
        self.always_call = always_call
        self.requests: list[dict[str, Any]] = []
        """The JSON body of every request, in order."""
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        """The API root a provider config names, such as `http://127.0.0.1:PORT/v1`."""
        return f"{self.root_url}/v1"

    def provider(self) -> dict[str, Any]:
        """A provider config pointed at this server."""
        return {"type": "openai", "base_url": self.base_url, "api_key": "test-key"}

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while await self._answer_one(reader, writer):
            pass

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; False once the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        headers = dict(
            line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line
        )
        length = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
        body: dict[str, Any] = json.loads(await reader.readexactly(length)) if length else {}
        self.requests.append(body)
        await self.arrived(body)
        await asyncio.sleep(self.delay)
        message = self._message(body.get("messages") or [])
        finish = "tool_calls" if "tool_calls" in message else "stop"
        if body.get("stream"):
            delta = {**message}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": 0, **delta["tool_calls"][0]}]
            chunks = [
                {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
            ]
            events = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                + events
                + b"data: [DONE]\n\n"
            )
            await writer.drain()
            return False
        completion = {
            "id": f"cmpl-{next(self._ids)}",
            "object": "chat.completion",
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        payload = json.dumps(completion).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        return True

    async def arrived(self, body: dict[str, Any]) -> None:
        """Called as each request arrives, before it is answered (a subclass may hold it)."""

    def _message(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        last = messages[-1].get("role") if messages else None
        if self.tool is not None and (self.always_call or last == "user"):
            call = {
                "id": f"call_{next(self._ids)}",
                "type": "function",
                "function": {"name": self.tool, "arguments": "{}"},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": self.reply}
