"""The sessions a server has open, shared by the connections attached to them.

A session is opened once (create, or resume by the first connection that asks) and stays
open while any connection is attached; its events go to every attached connection as
`session.event` notifications, and any of them may answer its tool calls and permission
requests (protocol section 4.2: "answered by another client"). When the last connection
lets go, the session is disconnected: its run is aborted and its lease released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from trimtab import Client, Session, SessionNotFoundError
from trimtab.events import Event
from trimtab.protocol.errors import SESSION_NOT_FOUND, session_not_open
from trimtab.protocol.jsonrpc import Connection, RpcError
from trimtab.protocol.wire import ResumeParams, SessionOptionsParams
from trimtab.server.hooks import ClientHooks
from trimtab.server.questions import ClientQuestions

__all__ = ["SessionHub", "SharedSession"]

log = logging.getLogger("trimtab.server")


def _event_payload(event: Event) -> dict[str, Any]:
    return event.model_dump(by_alias=True, mode="json", exclude_none=True)


@dataclass(eq=False)
class SharedSession:
    """One open session, its open questions to the clients and the connections attached to it."""

    session: Session
    questions: ClientQuestions
    hooks: ClientHooks | None = None
    """The hooks of the client that asked for them, if one did."""
    peers: list[Connection] = field(default_factory=list)
    _tools: dict[Connection, frozenset[str]] = field(default_factory=dict)
    """The tools each attached connection declared (and so can run)."""
    _buffer: list[Event] | None = field(default_factory=list)
    _unsubscribe: Callable[[], None] | None = None
    lingering: asyncio.Task[None] | None = None
    """Closes the session once its runs end, after its last connection went away."""

    def __post_init__(self) -> None:
        self._unsubscribe = self.session.on(self._on_event)
        self.questions.provided = lambda name: any(name in t for t in self._tools.values())

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.session.session_id

    def _on_event(self, event: Event) -> None:
        self.questions.observe(event)  # first: a question is open before a client hears of it
        if self._buffer is not None:
            self._buffer.append(event)  # held until the catch-up of `open` is sent
        else:
            self._fan_out(event)

    def _fan_out(self, event: Event) -> None:
        params = {"sessionId": self.session_id, "event": _event_payload(event)}
        for peer in self.peers:
            peer.notify("session.event", params)

    async def catch_up(self, since: int) -> None:
        """Send the events logged from position `since` on (those emitted while the session
        was being opened, before anyone was subscribed), then switch to live delivery."""
        logged: list[Event] = []
        try:
            logged = (await self.session.get_events())[since:]
        finally:
            held, self._buffer = self._buffer or [], None
            sent = {event.id for event in logged}
            for event in [*logged, *(e for e in held if e.id not in sent)]:
                self._fan_out(event)

    def attach(self, peer: Connection, params: SessionOptionsParams) -> None:
        """Send the session's events to `peer` too; note its tools and hooks."""
        if peer not in self.peers:
            self.peers.append(peer)
        self._tools[peer] = frozenset(t.name for t in params.tools or ())
        if params.hooks and self.hooks is not None:
            self.hooks.target = peer

    def release(self, peer: Connection) -> bool:
        """Detach `peer`; True when no connection is left."""
        if peer in self.peers:
            self.peers.remove(peer)
        self._tools.pop(peer, None)
        # The last one out keeps the hooks until the session is let go (sessionEnd).
        if self.hooks is not None and self.hooks.target is peer and self.peers:
            self.hooks.target = None
        self.questions.abandon_unprovided()
        return not self.peers

    def close(self) -> None:
        """Stop following the session and fail whoever still waits on it."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.questions.close(RpcError(SESSION_NOT_FOUND, f"session {self.session_id} was closed"))


class SessionHub:
    """Opens, shares and closes the sessions of one server's `Client`."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._open: dict[str, SharedSession] = {}
        self._locks = _KeyedLocks()

    def get(self, peer: Connection, session_id: str) -> SharedSession:
        """The session `peer` has attached, else a `SESSION_NOT_FOUND` error."""
        shared = self._open.get(session_id)
        if shared is None or peer not in shared.peers:
            raise session_not_open(session_id)
        return shared

    def runs(self, session_id: str) -> bool:
        """Whether this server runs the session (open here, and holding its lease)."""
        shared = self._open.get(session_id)
        return shared is not None and not shared.session.is_remote

    def attached(self, peer: Connection) -> list[SharedSession]:
        """The sessions `peer` is attached to."""
        return [shared for shared in self._open.values() if peer in shared.peers]

    async def open(
        self, peer: Connection, params: SessionOptionsParams, *, resume: bool
    ) -> SharedSession:
        """Create or resume a session and attach `peer` to it.

        A session already open here is shared: the new connection is attached, and its
        tools and options are not applied (the runtime's tool set is fixed while open).
        """
        session_id = params.session_id
        async with self._locks.hold(session_id):
            shared = self._open.get(session_id)
            if shared is not None:
                if not resume:
                    raise ValueError(f"a session with id {session_id!r} already exists")
                shared.attach(peer, params)
                return shared
            since = await self._event_count(session_id) if resume else 0
            questions = ClientQuestions(session_id)
            hooks = ClientHooks(session_id, peer) if params.hooks else None
            options = params.options()
            options["tools"] = [questions.tool(t.definition()) for t in params.tools or ()]
            options["on_permission_request"] = questions.ask_permission
            if hooks is not None:
                options["hooks"] = hooks.handlers()
            if resume:
                pending = isinstance(params, ResumeParams) and params.continue_pending_work
                session = await self.client.resume_session(
                    session_id, continue_pending_work=pending, **options
                )
            else:
                session = await self.client.create_session(session_id=session_id, **options)
            # Registered before any further await, so that a connection closing meanwhile
            # still finds (and releases) the session.
            shared = self._open[session_id] = SharedSession(session, questions, hooks)
            shared.attach(peer, params)
            await shared.catch_up(since)
        return shared

    async def _event_count(self, session_id: str) -> int:
        for record in await self.client.list_sessions():
            if record.session_id == session_id:
                return record.event_count
        raise SessionNotFoundError(session_id)

    async def release(self, peer: Connection, session_id: str, *, linger: bool = False) -> None:
        """Detach `peer`; the last one out disconnects the session (its log stays).

        With `linger`, a session with a run in progress stays open until its queued runs
        have ended, unless a connection attaches to it again meanwhile.
        """
        async with self._locks.hold(session_id):
            shared = self._open.get(session_id)
            if shared is None or peer not in shared.peers:
                return
            if shared.release(peer):
                if linger and shared.session.busy:
                    shared.lingering = asyncio.get_running_loop().create_task(
                        self._close_when_idle(shared)
                    )
                else:
                    await self._close(shared)

    async def _close_when_idle(self, shared: SharedSession) -> None:
        await shared.session.wait_idle()
        async with self._locks.hold(shared.session_id):
            if self._open.get(shared.session_id) is shared and not shared.peers:
                await self._close(shared)

    async def release_all(self, peer: Connection, *, linger: bool = False) -> None:
        """Detach `peer` from every session (its connection closed)."""
        for shared in self.attached(peer):
            await self.release(peer, shared.session_id, linger=linger)

    async def delete(self, session_id: str) -> None:
        """Disconnect the session if it is open, then delete its log."""
        async with self._locks.hold(session_id):
            shared = self._open.get(session_id)
            if shared is not None:
                shared.peers.clear()
                await self._close(shared)
            await self.client.delete_session(session_id)

    async def close_all(self) -> None:
        """Disconnect every open session (the server is stopping)."""
        for shared in list(self._open.values()):
            async with self._locks.hold(shared.session_id):
                if self._open.get(shared.session_id) is shared:
                    await self._close(shared)

    async def _close(self, shared: SharedSession) -> None:
        del self._open[shared.session_id]
        try:
            await shared.session.disconnect()
        finally:
            shared.close()


class _KeyedLocks:
    """One lock per session id, serialising open, release and delete of that session; a lock
    lives only while someone holds or waits for it, so arbitrary ids leave nothing behind."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._entries.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._entries[key]
