"""The sessions a server has open, shared by the connections attached to them.

A session is opened once (create, or resume by the first connection that asks) and stays
open while any connection is attached; its events go to every attached connection as
`session.event` notifications, and any of them may answer its tool calls and permission
requests (protocol section 4.2: "answered by another client"). When the last connection
lets go, the session is disconnected: its run is aborted and its lease released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from trimtab import Client, Session, SessionNotFoundError, Tool, ToolError
from trimtab._keyed_locks import KeyedLocks
from trimtab.events import Event, UserMessageEvent
from trimtab.protocol.errors import SESSION_NOT_FOUND, session_not_open
from trimtab.protocol.jsonrpc import Connection, RpcError
from trimtab.protocol.wire import ResumeParams, SessionOptionsParams
from trimtab.server.auth import ANYONE, Identity
from trimtab.server.builtins import session_builtins
from trimtab.server.hooks import ClientHooks
from trimtab.server.options import PENDING_TIMEOUT
from trimtab.server.policy import HostPolicy
from trimtab.server.prompt import system_prompt
from trimtab.server.questions import ClientQuestions

__all__ = ["SessionHub", "SharedSession"]

log = logging.getLogger("trimtab.server")

NO_PROVIDER = (
    "no provider: the session names none and this server has no default; start it with"
    " `trimtab serve --provider NAME` (openai, anthropic, ollama, local, or a JSON config),"
    " or give the session a provider"
)
"""Why `session.create` without a provider fails on a server without `--provider` (spec S7)."""

TRANSFORM_TIMEOUT = 30.0
"""Seconds a client has to rewrite the system message's sections at create or resume."""


def _event_payload(event: Event) -> dict[str, Any]:
    return event.model_dump(by_alias=True, mode="json", exclude_none=True)


@dataclass(eq=False)
class SharedSession:
    """One open session, its open questions to the clients and the connections attached to it."""

    session: Session
    questions: ClientQuestions
    owner: str | None = None
    """Whom the session belongs to (spec S16)."""
    hooks: ClientHooks | None = None
    """The hooks of the client that asked for them, if one did."""
    peers: list[Connection] = field(default_factory=list)
    _tools: dict[Connection, frozenset[str]] = field(default_factory=dict)
    """The tools each attached connection declared (and so can run)."""
    _offered: dict[Connection, list[Tool]] = field(default_factory=dict)
    """The tools a connection that joined the open session brought that it has not: offered
    to the model while that connection is attached (spec D5)."""
    _buffer: list[Event] | None = field(default_factory=list)
    _unsubscribe: Callable[[], None] | None = None
    lingering: asyncio.Task[None] | None = None
    """Closes the session once its runs end, after its last connection went away."""
    on_summary: Callable[[str], None] | None = None
    """Told the session's id when it gets its summary (its first user message)."""
    _orphaned: asyncio.TimerHandle | None = None
    """Fails the calls a dropped client left unanswered, unless a client answers them first."""

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
        if isinstance(event, UserMessageEvent) and self.on_summary is not None:
            self.on_summary(self.session_id)
            self.on_summary = None  # the summary is the first one's

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
        own = {tool.name for tool in self.session.options().tools or ()}
        offered: list[Tool] = [
            self.questions.tool(t.definition())
            for t in params.tools or ()
            if t.name not in own and params.offers(t.name)
        ]
        before = self._offered.pop(peer, [])
        if offered:
            self._offered[peer] = offered
        if offered or before:
            self._offer()
        if params.hooks and self.hooks is not None:
            self.hooks.target = peer
        if params.request_user_input:
            self.questions.asker = peer

    def _offer(self) -> None:
        """Offer the model the tools of every joined connection (the first one's, of a name
        two declare)."""
        union: dict[str, Tool] = {}
        for tools in self._offered.values():
            for tool in tools:
                union.setdefault(tool.name, tool)
        self.session.offer_tools(list(union.values()))

    def redeliver(self, peer: Connection) -> None:
        """Send `peer` the tool calls still waiting for an answer: a client that resumes the
        session runs those of its tools, or answers them by request id (spec D6)."""
        for event in self.questions.unanswered_tool_requests():
            peer.notify(
                "session.event", {"sessionId": self.session_id, "event": _event_payload(event)}
            )

    def release(self, peer: Connection, *, grace: float | None = None) -> bool:
        """Detach `peer`; True when no connection is left.

        The calls of tools no attached client declares fail at once, or, with `grace` (the
        connection dropped), after that many seconds unless a client answers them first.
        """
        if peer in self.peers:
            self.peers.remove(peer)
        self._tools.pop(peer, None)
        if self._offered.pop(peer, None):
            self._offer()  # its tools go with it
        # The last one out keeps the hooks until the session is let go (sessionEnd).
        if self.hooks is not None and self.hooks.target is peer and self.peers:
            self.hooks.target = None
        if self.questions.asker is peer:
            self.questions.asker = None
        if grace is None:
            self.questions.abandon_unprovided()
        else:
            if self._orphaned is not None:
                self._orphaned.cancel()
            loop = asyncio.get_running_loop()
            self._orphaned = loop.call_later(grace, self._orphan)
        return not self.peers

    def _orphan(self) -> None:
        """No client came back in time: fail what the dropped ones left unanswered."""
        self.questions.abandon_unprovided()
        if not self.peers:
            self.questions.abandon_permissions()

    def close(self) -> None:
        """Stop following the session and fail whoever still waits on it."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._orphaned is not None:
            self._orphaned.cancel()
        self.questions.close(RpcError(SESSION_NOT_FOUND, f"session {self.session_id} was closed"))


class SessionHub:
    """Opens, shares and closes the sessions of one server's `Client`."""

    def __init__(
        self,
        client: Client,
        *,
        policy: HostPolicy,
        pending_timeout: float = PENDING_TIMEOUT,
        has_provider: bool = False,
    ) -> None:
        self.client = client
        self.policy = policy
        """What the clients may make the host do (spec S11)."""
        self.pending_timeout = pending_timeout
        """Seconds a dropped client's unanswered tool calls wait for another client."""
        self.has_provider = has_provider
        """The server has a default provider (`--provider`) for sessions that bring none."""
        self._open: dict[str, SharedSession] = {}
        self._connections: dict[Connection, Identity] = {}
        """The authenticated connections, and who each is."""
        self._locks = KeyedLocks()

    def join(self, peer: Connection, identity: Identity = ANYONE) -> None:
        """Tell `peer`, which is `identity`, of its sessions created, updated and deleted from
        now on."""
        self._connections[peer] = identity

    def leave(self, peer: Connection) -> None:
        """Stop telling `peer` (its connection closed)."""
        self._connections.pop(peer, None)

    def sees(self, peer: Connection, owner: str | None) -> bool:
        """Whether a session of `owner` exists for `peer` (spec S16): not for a connection
        that has not authenticated."""
        identity = self._connections.get(peer)
        return identity is not None and identity.sees(owner)

    def _lifecycle(self, kind: str, session_id: str, owner: str | None) -> None:
        """`session.lifecycle` to every client that sees the session (spec D8, S16): what
        `session.list` shows them."""
        params = {"type": kind, "sessionId": session_id}
        for peer, identity in self._connections.items():
            if identity.sees(owner):
                peer.notify("session.lifecycle", params)

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
        self,
        peer: Connection,
        params: SessionOptionsParams,
        *,
        resume: bool,
        identity: Identity = ANYONE,
    ) -> SharedSession:
        """Create or resume a session and attach `peer` (which is `identity`) to it.

        A session already open here for other connections, or running, is shared: the new
        connection is attached, and its tools and options are not applied (the runtime's
        tool set is fixed while open). Otherwise it is opened again with the new options.
        A session of another owner is not found (spec S16); options the host policy refuses
        are refused before anything else (spec S15).
        """
        session_id = params.session_id
        # Checked before anything is closed or opened; what the host policy refuses is
        # refused before anything else (spec S15).
        options = self.policy.check_session(params.options())
        ask = partial(self._ask_user, session_id)
        builtins = session_builtins(self.policy, params, ask)  # refused here too (S13)
        async with self._locks.hold(session_id):
            shared = self._open.get(session_id)
            if shared is not None:
                if not resume:
                    raise ValueError(f"a session with id {session_id!r} already exists")
                if not identity.sees(shared.owner):
                    raise SessionNotFoundError(session_id)
                if shared.peers not in ([], [peer]) or shared.session.busy:
                    shared.attach(peer, params)
                    pending = isinstance(params, ResumeParams) and params.continue_pending_work
                    # Shared as it is (its options are not applied); the resume is logged.
                    await self.client.resume_session(session_id, continue_pending_work=pending)
                    shared.redeliver(peer)
                    return shared
                # Nobody else uses it and nothing runs: opened again, so that this resume's
                # options (system message, provider, tools) apply (spec D5).
                await self._close(shared)
            since, owner = 0, identity.name
            if resume:
                record = await self.client.get_session_record(session_id)
                if not identity.sees(record.owner):
                    raise SessionNotFoundError(session_id)  # as if it were not stored
                since, owner = record.event_count, record.owner
            questions = ClientQuestions(session_id)
            hooks = ClientHooks(session_id, peer) if params.hooks else None
            if not resume and options.provider is None and not self.has_provider:
                raise ValueError(NO_PROVIDER)
            # What the server makes of the client's: its tools and permissions are asked of
            # the client, and its system message is composed here.
            made: dict[str, Any] = {
                "tools": [
                    *(
                        questions.tool(t.definition())
                        for t in params.tools or ()
                        if params.offers(t.name)
                    ),
                    *builtins,
                ],
                "on_permission_request": questions.ask_permission,
                "hooks": None if hooks is None else hooks.handlers(),
            }
            if params.creates or params.system_message is not None:
                # Resumed without one, a session keeps the system message it was created with.
                transform = partial(_transform, peer, session_id)
                message = params.system_message_config()
                made["system_message"] = await system_prompt(message, transform)
            if resume:
                pending = isinstance(params, ResumeParams) and params.continue_pending_work
                session = await self.client.resume_session(
                    session_id, options, continue_pending_work=pending, **made
                )
            else:
                session = await self.client.create_session(
                    options, session_id=session_id, owner=owner, **made
                )
            # Registered before any further await, so that a connection closing meanwhile
            # still finds (and releases) the session.
            shared = self._open[session_id] = SharedSession(session, questions, owner, hooks)
            if not resume:  # (a resumed session mostly has its summary already)
                shared.on_summary = partial(self._updated, owner=owner)
            shared.attach(peer, params)
            await shared.catch_up(since)
            if not resume:
                self._lifecycle("session.created", session_id, owner)
        return shared

    def _updated(self, session_id: str, *, owner: str | None) -> None:
        self._lifecycle("session.updated", session_id, owner)

    async def _ask_user(
        self, session_id: str, question: str, choices: list[str], allow_freeform: bool
    ) -> tuple[str, bool]:
        """`ask_user` of the session open here under that id: its client's user answers."""
        shared = self._open.get(session_id)
        if shared is None:
            raise ToolError("No connected client answers questions to the user.")
        return await shared.questions.ask_user(question, choices, allow_freeform)

    async def release(self, peer: Connection, session_id: str, *, linger: bool = False) -> None:
        """Detach `peer`; the last one out disconnects the session (its log stays).

        With `linger`, a session with a run in progress stays open until its queued runs
        have ended, unless a connection attaches to it again meanwhile.
        """
        async with self._locks.hold(session_id):
            shared = self._open.get(session_id)
            if shared is None or peer not in shared.peers:
                return
            if shared.release(peer, grace=self.pending_timeout if linger else None):
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

    async def delete(self, session_id: str, identity: Identity = ANYONE) -> None:
        """Disconnect the session if it is open, then delete its log; a session `identity`
        does not see is not found (`SessionNotFoundError`), as one not stored."""
        async with self._locks.hold(session_id):
            owner = (await self.client.get_session_record(session_id)).owner
            if not identity.sees(owner):
                raise SessionNotFoundError(session_id)
            shared = self._open.get(session_id)
            if shared is not None:
                shared.peers.clear()
                await self._close(shared)
            await self.client.delete_session(session_id)
        self._lifecycle("session.deleted", session_id, owner)

    async def shut_down(self, session_id: str, shut: Callable[[Session], Awaitable[None]]) -> None:
        """Run `shut` on the open session (it ends it), then let go of it for every
        connection attached (their clients heard the end in its events)."""
        async with self._locks.hold(session_id):
            shared = self._open.get(session_id)
            if shared is None:
                return
            await shut(shared.session)  # refused (a remote session): it stays open
            shared.peers.clear()
            await self._close(shared)

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


async def _transform(peer: Connection, session_id: str, sections: dict[str, str]) -> dict[str, str]:
    """The sections as the client rewrote them (`systemMessage.transform`, spec D2)."""
    params = {"sessionId": session_id, "sections": {s: {"content": t} for s, t in sections.items()}}
    try:
        answer = await peer.request("systemMessage.transform", params, timeout=TRANSFORM_TIMEOUT)
    except (TimeoutError, ConnectionError):
        raise ValueError(
            f"systemMessage.transform: no answer from the client within {TRANSFORM_TIMEOUT:g} s"
        ) from None
    rewritten = answer.get("sections") if isinstance(answer, dict) else None
    if not isinstance(rewritten, dict):
        raise ValueError("systemMessage.transform: the client answered without sections")
    return {
        section: value["content"]
        for section, value in rewritten.items()
        if isinstance(value, dict) and isinstance(value.get("content"), str)
    }
