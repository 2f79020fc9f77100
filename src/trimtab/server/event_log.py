"""`session.eventLog.*`: a session's stored events read by cursor, with a bounded long-poll
(spec K11).

A cursor is the number of stored events it stands after, as text: the log only grows, so a
cursor never goes stale. Interest registrations are kept per connection and bounded; trimtab
emits every event type whether or not anyone registered for it, so they only acknowledge.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from trimtab import Session
from trimtab._retention import position_after
from trimtab.protocol.jsonrpc import Connection
from trimtab.protocol.session_wire import (
    CursorResult,
    EventLogReadParams,
    EventLogReadResult,
    InterestParams,
    InterestResult,
    ReleaseInterestParams,
)
from trimtab.protocol.wire import SessionParams, SuccessResult, event_payload
from trimtab.server.hub import SessionHub

__all__ = ["MAX_INTERESTS", "MAX_WAIT_MS", "EventLogRpc"]

MAX_WAIT_MS = 60_000
"""The longest a read waits for an event, whatever `waitMs` asks: every wait has a bound."""

MAX_INTERESTS = 256
"""Interest registrations one connection may hold at once."""


class EventLogRpc:
    """The event-log methods of one connection."""

    def __init__(self, hub: SessionHub, conn: Connection) -> None:
        self._hub = hub
        self._conn = conn
        self._interests: dict[str, tuple[str, str]] = {}
        """Handle -> (session id, event type)."""

    def _session(self, session_id: str) -> Session:
        return self._hub.get(self._conn, session_id).session

    async def tail(self, params: dict[str, Any]) -> CursorResult:
        session = self._session(SessionParams.model_validate(params).session_id)
        return CursorResult(cursor=str(position_after(0, await session.get_events())))

    async def read(self, params: dict[str, Any]) -> EventLogReadResult:
        request = EventLogReadParams.model_validate(params)
        session = self._session(request.session_id)
        start = _position(request.cursor)
        wanted = None if request.types in (None, "*") else frozenset(request.types)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(request.wait_ms, MAX_WAIT_MS) / 1000
        arrived = asyncio.Event()
        # Subscribed before the first read: an event stored meanwhile wakes the wait.
        unsubscribe = session.on(lambda event: None if event.ephemeral else arrived.set())
        try:
            while True:
                arrived.clear()
                events = await session.get_events(after=start)
                matched, scanned = [], 0
                for event in events:
                    scanned += 1
                    if wanted is None or event.type in wanted:
                        matched.append(event)
                        if len(matched) == request.max:
                            break
                # (A pruned log keeps its positions: its marker says where it stands, X8.)
                start = position_after(start, events[:scanned])
                has_more = scanned < len(events)
                if matched or has_more or loop.time() >= deadline:
                    return EventLogReadResult(
                        events=[event_payload(e) for e in matched],
                        cursor=str(start),
                        has_more=has_more,
                    )
                try:
                    async with asyncio.timeout_at(deadline):
                        await arrived.wait()
                except TimeoutError:
                    pass  # one last read, then the (empty) answer
        finally:
            unsubscribe()

    async def register_interest(self, params: dict[str, Any]) -> InterestResult:
        request = InterestParams.model_validate(params)
        self._session(request.session_id)  # open on this connection
        if len(self._interests) >= MAX_INTERESTS:
            raise ValueError(
                f"this connection holds {MAX_INTERESTS} interest registrations, the limit:"
                " release some first"
            )
        handle = str(uuid.uuid4())
        self._interests[handle] = (request.session_id, request.event_type)
        return InterestResult(handle=handle)

    async def release_interest(self, params: dict[str, Any]) -> SuccessResult:
        # Idempotent: releasing an unknown or released handle succeeds too.
        self._interests.pop(ReleaseInterestParams.model_validate(params).handle, None)
        return SuccessResult(success=True)


def _position(cursor: str | None) -> int:
    """The number of stored events a cursor stands after."""
    if cursor is None:
        return 0
    # ASCII digits only: `isdecimal` (and `int`) also take "٣", "３" and "𝟛".
    if not (cursor.isascii() and cursor.isdecimal()) or len(cursor) > 18:
        raise ValueError(f"not a cursor of this server: {cursor[:40]!r}")
    return int(cursor)
