"""`RemoteClient`: the `Client` API for a runtime in another process (`trimtab serve`).

It speaks the same Copilot-protocol JSON-RPC as the official SDK clients, so everything a
remote client does, an official client can do too; trimtab adds only the session options it
has and the protocol has not (`developerMessages`, `maxTurns`, `modelLimits`, spec D15) and a
few fields in results.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel

from trimtab import SessionNotFoundError, SessionOptions, TrimtabError
from trimtab._durations import check_seconds
from trimtab._options import options_of
from trimtab.events import new_id
from trimtab.protocol.errors import error_from_rpc
from trimtab.protocol.jsonrpc import METHOD_NOT_FOUND, Connection, Params, RpcError
from trimtab.protocol.wire import (
    PROTOCOL_VERSION,
    ConnectParams,
    ConnectResult,
    CreateParams,
    ResumeParams,
    SessionListResult,
    SessionParams,
    SuccessResult,
    dump,
    record_of,
)
from trimtab.remote._session import RemoteSession
from trimtab.store import SessionRecord

__all__ = ["RemoteClient"]

_Result = TypeVar("_Result", bound=BaseModel)


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
        heartbeat: Seconds within which the server must answer: connecting and the handshake
            get twice that, and while a call waits (a model call may take minutes) the server
            is asked for a `ping` every `heartbeat` seconds. One it does not answer in as long
            means the server is gone (frozen, or its host unreachable): the connection closes
            and every call waiting on it raises `ConnectionError` (spec W4).
    """

    def __init__(self, url: str, *, token: str | None = None, heartbeat: float = 15.0) -> None:
        check_seconds("heartbeat", heartbeat)
        if token is not None and not isinstance(token, str):
            raise ValueError(f"token must be a string, got {type(token).__name__}")
        self._host, self._port = _address(url)
        self._token = token
        self._heartbeat = heartbeat
        self._conn: Connection | None = None
        self._runner: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
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
        async with asyncio.timeout(2 * self._heartbeat):
            reader, writer = await asyncio.open_connection(self._host, self._port)
        conn = Connection(reader, writer)
        loop = asyncio.get_running_loop()
        self._runner = loop.create_task(conn.run(self._dispatch, on_notification=self._notified))
        self._watcher = loop.create_task(self._watch(conn))
        self._conn = conn
        try:
            params = dump(ConnectParams(token=self._token))
            answer = await conn.request("connect", params, timeout=2 * self._heartbeat)
            result = ConnectResult.model_validate(answer)
        except (RpcError, ValueError) as exc:
            await self.stop()
            raise TrimtabError(f"the server refused the connection: {exc}") from None
        except BaseException:
            await self.stop()
            raise
        if result.protocol_version != PROTOCOL_VERSION:
            await self.stop()
            raise TrimtabError(f"the server speaks protocol {result.protocol_version}")

    async def stop(self) -> None:
        """Let go of every session, then close the connection."""
        for session in list(self._sessions.values()):
            try:
                await session.disconnect()
            except (TrimtabError, ConnectionError):
                pass  # the connection is going anyway
        for task in (self._watcher, self._runner):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._runner = self._watcher = self._conn = None

    async def _watch(self, conn: Connection) -> None:
        """Ask the server for a `ping` while calls wait on it, and drop the connection when it
        does not answer one (see `heartbeat`): an idle client may stay silent."""
        while not conn.closed:
            await asyncio.sleep(self._heartbeat)
            if not conn.awaiting_answers:
                continue
            try:
                await conn.request("ping", {"message": "heartbeat"}, timeout=self._heartbeat)
            except TimeoutError:
                conn.abort(f"the server did not answer a ping within {self._heartbeat} s")
                return
            except RpcError:
                continue  # an error is an answer: the server is alive (one without `ping`)
            except ConnectionError:
                return  # closed meanwhile

    async def _connection(self) -> Connection:
        await self.start()
        assert self._conn is not None
        return self._conn

    # --- sessions ------------------------------------------------------------------------

    async def create_session(
        self,
        options: SessionOptions | None = None,
        *,
        session_id: str | None = None,
        **keywords: Any,
    ) -> RemoteSession:
        """Create a session on the server, as `Client.create_session`.

        Raises:
            TypeError: An option that has no wire form yet (`hooks`), or a `Provider` object.
        """
        opts = options_of(options, keywords)
        params = CreateParams.of(session_id or new_id(), opts)
        return await self._open("session.create", params, opts)

    async def resume_session(
        self, session_id: str, options: SessionOptions | None = None, **keywords: Any
    ) -> RemoteSession:
        """Open a stored session on the server, as `Client.resume_session`; pass the tools
        and permission handler again, as in-process."""
        if (open_session := self._sessions.get(session_id)) is not None:
            return open_session
        opts = options_of(options, keywords)
        return await self._open("session.resume", ResumeParams.of(session_id, opts), opts)

    async def _open(
        self, method: str, params: CreateParams | ResumeParams, options: SessionOptions
    ) -> RemoteSession:
        conn = await self._connection()
        session_id = params.session_id
        tools = {tool.name: tool for tool in options.tools or ()}
        # Registered before the request: the server streams events while it opens the session.
        session = self._sessions[session_id] = RemoteSession(
            session_id,
            conn,
            tools=tools,
            permission_handler=options.on_permission_request,
            on_close=self._forget,
        )
        try:
            await conn.request(method, dump(params))
        except BaseException as exc:
            self._sessions.pop(session_id, None)
            if isinstance(exc, RpcError):
                raise error_from_rpc(exc) from None
            raise
        return session

    async def list_sessions(self) -> list[SessionRecord]:
        """Every session the server stores, most recently active first."""
        result = await self._request("session.list", {}, SessionListResult)
        return [record_of(entry) for entry in result.sessions]

    async def delete_session(self, session_id: str) -> None:
        """Delete a session on the server (`SessionNotFoundError` if there is none)."""
        params = dump(SessionParams(session_id=session_id))
        result = await self._request("session.delete", params, SuccessResult)
        if not result.success:
            raise SessionNotFoundError(session_id)
        if (session := self._sessions.get(session_id)) is not None:
            session._close()

    async def _request(self, method: str, params: dict[str, Any], result: type[_Result]) -> _Result:
        conn = await self._connection()
        try:
            return result.model_validate(await conn.request(method, params))
        except RpcError as exc:
            raise error_from_rpc(exc) from None

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
