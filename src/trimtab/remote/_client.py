"""`RemoteClient`: the `Client` API for a runtime in another process (`trimtab serve`).

It speaks the same Copilot-protocol JSON-RPC as the official SDK clients, so everything a
remote client does, an official client can do too; trimtab adds only `developerMessages`
and a few fields in results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Unpack
from urllib.parse import urlsplit

from trimtab import SessionNotFoundError, SessionOptions, TrimtabError
from trimtab.events import new_id
from trimtab.providers import Provider, ProviderConfig
from trimtab.remote._session import RemoteSession, error_from_rpc
from trimtab.server.rpc import METHOD_NOT_FOUND, Connection, Params, RpcError
from trimtab.server.wire import PROTOCOL_VERSION
from trimtab.store import SessionRecord

__all__ = ["RemoteClient"]

_SUPPORTED = frozenset(
    {
        "model",
        "provider",
        "system_message",
        "developer_messages",
        "tools",
        "on_permission_request",
        "streaming",
    }
)


class RemoteClient:
    """A trimtab runtime in another process, over JSON-RPC; made by `Client.connect`.

    ```python
    async with Client.connect("tcp://127.0.0.1:8765") as client:
        session = await client.create_session(provider={...}, tools=[...])
    ```

    Tool handlers and the permission handler run in this process; the model, the loop and
    the event log live in the server.

    Args:
        url: `tcp://HOST:PORT` of a `trimtab serve` server.
        token: The server's connection token, if it has one.
    """

    def __init__(self, url: str, *, token: str | None = None) -> None:
        self._host, self._port = _address(url)
        self._token = token
        self._conn: Connection | None = None
        self._runner: asyncio.Task[None] | None = None
        self._sessions: dict[str, RemoteSession] = {}

    async def __aenter__(self) -> RemoteClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect and shake hands; called by `async with` and on first use.

        Raises:
            TrimtabError: The server refused the token or speaks another protocol version.
            OSError: The server cannot be reached.
        """
        if self._conn is not None:
            return
        reader, writer = await asyncio.open_connection(self._host, self._port)
        conn = Connection(reader, writer)
        self._runner = asyncio.get_running_loop().create_task(
            conn.run(self._dispatch, on_notification=self._notified)
        )
        self._conn = conn
        try:
            result = await conn.request(
                "connect", {} if self._token is None else {"token": self._token}
            )
        except RpcError as exc:
            await self.stop()
            raise TrimtabError(f"the server refused the connection: {exc.message}") from None
        if result.get("protocolVersion") != PROTOCOL_VERSION:
            await self.stop()
            raise TrimtabError(f"the server speaks protocol {result.get('protocolVersion')}")

    async def stop(self) -> None:
        """Let go of every session, then close the connection."""
        for session in list(self._sessions.values()):
            try:
                await session.disconnect()
            except (TrimtabError, ConnectionError):
                pass  # the connection is going anyway
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        self._runner = self._conn = None

    async def _connection(self) -> Connection:
        await self.start()
        assert self._conn is not None
        return self._conn

    # --- sessions ------------------------------------------------------------------------

    async def create_session(
        self, *, session_id: str | None = None, **options: Unpack[SessionOptions]
    ) -> RemoteSession:
        """Create a session on the server, as `Client.create_session`."""
        return await self._open("session.create", session_id or new_id(), options)

    async def resume_session(
        self, session_id: str, **options: Unpack[SessionOptions]
    ) -> RemoteSession:
        """Open a stored session on the server, as `Client.resume_session`; pass the tools
        and permission handler again, as in-process."""
        if (open_session := self._sessions.get(session_id)) is not None:
            return open_session
        return await self._open("session.resume", session_id, options)

    async def _open(
        self, method: str, session_id: str, options: Mapping[str, Any]
    ) -> RemoteSession:
        conn = await self._connection()
        params = {"sessionId": session_id, **_wire_options(options)}
        tools = {tool.name: tool for tool in options.get("tools", [])}
        # Registered before the request: the server streams events while it opens the session.
        session = self._sessions[session_id] = RemoteSession(
            session_id,
            conn,
            tools=tools,
            permission_handler=options.get("on_permission_request"),
            on_close=self._forget,
        )
        try:
            await conn.request(method, params)
        except BaseException as exc:
            self._sessions.pop(session_id, None)
            if isinstance(exc, RpcError):
                raise error_from_rpc(exc) from None
            raise
        return session

    async def list_sessions(self) -> list[SessionRecord]:
        """Every session the server stores, most recently active first."""
        result = await self._request("session.list", {})
        return [_record(entry) for entry in result.get("sessions", [])]

    async def delete_session(self, session_id: str) -> None:
        """Delete a session on the server (`SessionNotFoundError` if there is none)."""
        result = await self._request("session.delete", {"sessionId": session_id})
        if not result.get("success"):
            raise SessionNotFoundError(session_id)
        if (session := self._sessions.get(session_id)) is not None:
            session._close()

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        conn = await self._connection()
        try:
            result = await conn.request(method, params)
        except RpcError as exc:
            raise error_from_rpc(exc) from None
        return result if isinstance(result, dict) else {}

    def _forget(self, session: RemoteSession) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]

    # --- from the server -----------------------------------------------------------------

    def _notified(self, method: str, params: Params) -> None:
        if method == "session.event" and isinstance(params, dict):
            session = self._sessions.get(params.get("sessionId", ""))
            if session is not None:
                session._deliver(params.get("event"))

    async def _dispatch(self, method: str, params: Params) -> Any:
        # No hooks or other client-side services are offered (the server then goes on
        # without them).
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"expected a server address like tcp://127.0.0.1:8765, got {url!r}")
    return parts.hostname, parts.port


def _wire_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`session.create` / `session.resume` params for `SessionOptions`."""
    unknown = set(options) - _SUPPORTED
    if unknown:
        raise TypeError(f"not available on a remote session (yet): {', '.join(sorted(unknown))}")
    params: dict[str, Any] = {"requestPermission": True}
    for key, wire in (("model", "model"), ("streaming", "streaming")):
        if key in options:
            params[wire] = options[key]
    if "developer_messages" in options:
        params["developerMessages"] = list(options["developer_messages"])
    if (message := options.get("system_message")) is not None:
        params["systemMessage"] = {
            "content": message if isinstance(message, str) else message.get("content")
        }
    if (provider := options.get("provider")) is not None:
        if isinstance(provider, Provider):
            raise TypeError("a Provider object cannot be sent to a server: pass its config dict")
        # Checked here, so that a typo fails in the caller, not as a server error.
        config = ProviderConfig.model_validate(provider)
        params["provider"] = config.model_dump(by_alias=True, exclude_none=True)
    if "tools" in options:
        params["tools"] = [
            tool.definition.model_dump(by_alias=True, exclude_none=True, exclude={"timeout"})
            for tool in options["tools"]
        ]
    return params


def _record(entry: dict[str, Any]) -> SessionRecord:
    return SessionRecord(
        session_id=entry["sessionId"],
        created_at=datetime.fromisoformat(entry["startTime"]),
        updated_at=datetime.fromisoformat(entry["modifiedTime"]),
        event_count=entry.get("eventCount", 0),
        lease_owner=entry.get("leaseOwner"),
        summary=entry.get("summary"),
    )
