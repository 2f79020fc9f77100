"""A lean JSON-RPC load client for `trimtab serve`: the Copilot protocol by hand, many
sessions per connection, so that the load costs little CPU of the machine it shares.

It speaks what the official clients speak (`connect`, `session.create` with a client-side
tool, `session.sendAndWait`, `session.event` notifications, and the answers to
`permission.requested` and `external_tool.requested`), and nothing else: no models, no
validation, one `json.loads` per frame.

    conn = await Connection.open(port, token)
    session = await conn.create_session(tools=True)
    reply = await session.turn("Say done.")           # the final assistant.message's content
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import common

ECHO_TOOL = {
    "name": "echo",
    "description": common.TOOL_DESCRIPTION,
    "parameters": common.ECHO_SCHEMA,
}


class RpcFailure(RuntimeError):
    pass


class Connection:
    """One TCP connection to a server, shared by any number of sessions."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self.sessions: dict[str, Session] = {}
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, port: int, token: str | None) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**22)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(reader, writer)
        await conn.call("connect", {"token": token} if token else {})
        return conn

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, separators=(",", ":")).encode()
        self._writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        request_id = next(self._ids)
        future = self._pending[request_id] = asyncio.get_running_loop().create_future()
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await future

    def fire(self, method: str, params: dict[str, Any]) -> None:
        """A request whose answer nobody waits for (tool results, permission decisions)."""
        request_id = next(self._ids)
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})

    async def _read(self) -> None:
        reader = self._reader
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = int(header.split(b":", 1)[1].split(b"\r\n", 1)[0])
                message = json.loads(await reader.readexactly(length))
                if "method" in message:
                    if message["method"] == "session.event":
                        params = message["params"]
                        session = self.sessions.get(params["sessionId"])
                        if session is not None:
                            session.on_event(params["event"])
                    continue
                future = self._pending.pop(message.get("id"), None)
                if future is None or future.done():
                    continue
                if "error" in message:
                    future.set_exception(RpcFailure(str(message["error"])))
                else:
                    future.set_result(message.get("result"))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the server closed the connection"))

    async def create_session(self, *, tools: bool = False, streaming: bool = False) -> Session:
        session_id = str(uuid.uuid4())
        session = self.sessions[session_id] = Session(self, session_id)
        params: dict[str, Any] = {
            "sessionId": session_id,
            "model": common.MODEL,
            "systemMessage": {"mode": "append", "content": common.SYSTEM},
        }
        if tools:
            params["tools"] = [ECHO_TOOL]
        if streaming:
            params["streaming"] = True
        await self.call("session.create", params)
        return session

    async def close(self) -> None:
        self._writer.close()
        try:
            async with asyncio.timeout(5):
                await self._writer.wait_closed()
        except (TimeoutError, ConnectionError, OSError):
            pass
        self._task.cancel()


class Session:
    """One session on a connection; answers its permission requests and tool calls itself."""

    def __init__(self, conn: Connection, session_id: str) -> None:
        self.conn = conn
        self.session_id = session_id
        self.listener: Callable[[dict[str, Any], float], None] | None = None
        """Called with every event and its arrival time (`time.perf_counter()`)."""

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "permission.requested":
            self.conn.fire(
                "session.permissions.handlePendingPermissionRequest",
                {
                    "sessionId": self.session_id,
                    "requestId": event["data"]["requestId"],
                    "result": {"kind": "approved"},
                },
            )
        elif kind == "external_tool.requested":
            data = event["data"]
            self.conn.fire(
                "session.tools.handlePendingToolCall",
                {
                    "sessionId": self.session_id,
                    "requestId": data["requestId"],
                    "result": common.echo(**data["arguments"]),
                },
            )
        if self.listener is not None:
            self.listener(event, time.perf_counter())

    async def turn(self, prompt: str) -> str:
        """`session.sendAndWait`: the reply's text once the run is over."""
        result = await self.conn.call(
            "session.sendAndWait", {"sessionId": self.session_id, "prompt": prompt}
        )
        response = (result or {}).get("response") or {}
        return str((response.get("data") or {}).get("content", ""))
