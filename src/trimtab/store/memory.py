"""`MemoryStore`: the in-process backend, for tests and throwaway sessions.

It keeps the same semantics as `SqliteStore` (fencing, lease TTLs, the input queue) so that a
test passing against it says something about the durable backends too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from trimtab._errors import LeaseLostError, SessionNotFoundError
from trimtab.events import Event, SessionPrunedEvent
from trimtab.store._base import (
    DEFAULT_TIMEOUT,
    Lease,
    Listeners,
    SessionRecord,
    check_persistable,
    check_prune,
    check_rewrite,
    claimed_input,
    follow,
    holds_lease,
    owner_of,
    summarize,
    to_datetime,
)

__all__ = ["MemoryStore"]


@dataclass
class _Session:
    created_at: float
    updated_at: float
    events: list[Event] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)
    """Pending inputs: message id -> prompt, oldest first."""
    summary: str | None = None
    owner: str | None = None
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires_at: float = 0.0
    snapshot: tuple[int, str] | None = None
    hole: int = 0
    """Positions a prune left empty after the first event: `events[i]` is at position
    `i + 1`, plus `hole` from the second on (spec X8)."""

    @property
    def count(self) -> int:
        """The log's length in positions (its last event's)."""
        return len(self.events) + self.hole

    def index_after(self, after: int) -> int:
        """The index of the first event past position `after`."""
        return 0 if after <= 0 else max(1, after - self.hole)

    def at(self, position: int) -> tuple[int, Event | None]:
        """The index of the event at `position`, and that event (None if there is none)."""
        index = self.index_after(position - 1)
        found = index < len(self.events) and index + 1 + (self.hole if index else 0) == position
        return index, self.events[index] if found else None

    def live_owner(self, now: float) -> str | None:
        """The lease holder, unless the lease was released or has expired."""
        return self.lease_owner if self.lease_expires_at > now else None


class MemoryStore:
    """A `Store` held in a dict: fast, shared by nothing, gone when the process ends."""

    timeout: float = DEFAULT_TIMEOUT
    """Nominal: a call never waits for anything, so it never raises `StoreUnavailableError`."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._closed = False
        self._listeners = Listeners()
        """What `subscribe` waits on, per session: set when the session changed."""

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the store is closed")

    def _session(self, session_id: str) -> _Session:
        self._check_open()
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFoundError(session_id) from None

    async def create(self, session_id: str, events: Sequence[Event] = ()) -> None:
        """Create a log holding `events`; raises `ValueError` if the id exists."""
        self._check_open()
        check_persistable(events)
        if session_id in self._sessions:
            raise ValueError(f"session {session_id!r} already exists")
        now = time.time()
        self._sessions[session_id] = _Session(
            created_at=now,
            updated_at=now,
            events=list(events),
            summary=summarize(events),
            owner=owner_of(events),
        )

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
    ) -> int:
        """Append persisted events in order and return the new event count (see `Store`)."""
        check_persistable(events)
        session = self._session(session_id)
        now = time.time()
        if lease is not None:
            self._fence(session, session_id, lease, now)
        # An append here never has an unknown outcome, so a retry can only repeat the latest
        # batch: the log's tail is all there is to compare.
        if events and not _stored(events, session.events):
            session.events.extend(events)
            session.updated_at = now
            if session.summary is None:
                session.summary = summarize(events)
            for event in events:
                if (message_id := claimed_input(event)) is not None:
                    session.inputs.pop(message_id, None)
            self._listeners.ring(session_id, session.count)
        return session.count

    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        """The events with sequence number > `after` (1-based), oldest first."""
        session = self._session(session_id)
        return session.events[session.index_after(after) :]

    async def prune(
        self, session_id: str, marker: SessionPrunedEvent, *, lease: Lease | None
    ) -> int:
        """Replace the events from the second through the marker's position with it (see
        `Store`)."""
        session = self._session(session_id)
        now = time.time()
        if lease is not None:
            self._fence(session, session_id, lease, now)
        position = marker.data.position
        index, replaced = session.at(position)
        check_prune(
            marker,
            None if replaced is None else replaced.id,
            lease=lease,
            owner=session.live_owner(now),
            listeners=self._listeners,
            session_id=session_id,
        )
        session.events = [session.events[0], marker, *session.events[index + 1 :]]
        session.hole = position - 2
        return index  # (the events at indices 1 to `index`)

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        """Hand an ephemeral event to the session's subscribers (see `Store`)."""
        self._listeners.post(session_id, after, event)

    async def subscribe(
        self, session_id: str, *, after: int = 0, ready: asyncio.Event | None = None
    ) -> AsyncGenerator[Event, None]:
        """The events after `after` as they are stored: the log first, then live ones, with
        the published ephemeral events in their places (`ready`: see `Store`).

        The iterator never ends on its own: it ends when the store is closed, and raises
        `SessionNotFoundError` for an unknown (or deleted) session.
        """
        self._check_open()
        with self._listeners.listening_to(session_id) as listener:
            events = follow(
                listener,
                lambda n: self.read(session_id, after=n),
                after,
                closed=lambda: self._closed,
                poll=None,
                ready=ready,
            )
            async for event in events:
                yield event

    @staticmethod
    def _fence(session: _Session, session_id: str, lease: Lease, now: float) -> None:
        if not holds_lease(
            lease,
            session_id,
            owner=session.lease_owner,
            token=session.lease_token,
            expires_at=session.lease_expires_at,
            now=now,
        ):
            raise LeaseLostError(
                f"lease {lease.token} of {lease.owner!r} on {session_id!r} is lost"
            )

    async def get(self, session_id: str) -> SessionRecord:
        """The session's record; raises `SessionNotFoundError` for an unknown session."""
        return self._record(session_id, self._session(session_id), time.time())

    async def list_sessions(self) -> list[SessionRecord]:
        """Every session, most recently updated first."""
        self._check_open()
        now = time.time()
        ordered = sorted(
            self._sessions.items(), key=lambda item: (item[1].updated_at, item[0]), reverse=True
        )
        return [self._record(session_id, session, now) for session_id, session in ordered]

    async def delete(self, session_id: str) -> bool:
        """Remove a session, its log and its queued inputs; False if there was none."""
        self._check_open()
        self._listeners.ring(session_id)  # its subscribers fail as for an unknown session
        return self._sessions.pop(session_id, None) is not None

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the lease if it is free, expired or already `owner`'s; None if another holds it.

        A new acquisition bumps the fencing token; re-acquiring one's own live lease only
        extends it, so appends in flight with the same `Lease` stay valid.
        """
        session = self._session(session_id)
        now = time.time()
        holder = session.live_owner(now)
        if holder is not None and holder != owner:
            return None
        if holder is None:
            session.lease_token += 1
            session.lease_owner = owner
        session.lease_expires_at = now + ttl
        return Lease(session_id=session_id, owner=owner, token=session.lease_token)

    async def renew_leases(self, owner: str, ttl: float) -> list[str]:
        """Extend every live lease `owner` holds; returns their session ids, sorted."""
        self._check_open()
        now = time.time()
        renewed = []
        for session_id, session in sorted(self._sessions.items()):
            if session.live_owner(now) == owner:
                session.lease_expires_at = now + ttl
                renewed.append(session_id)
        return renewed

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up (no-op if it was already lost or the session is gone)."""
        self._check_open()
        session = self._sessions.get(lease.session_id)
        if session is None:
            return
        if session.lease_owner == lease.owner and session.lease_token == lease.token:
            # The token stays: the next acquisition bumps it, fencing out this holder.
            session.lease_owner = None
            session.lease_expires_at = 0.0

    async def claim_lease(self, session_id: str, owner: str, fence: int, ttl: float) -> Lease | int:
        """Take the lease with the fencing token `fence` (see `Store`)."""
        session = self._session(session_id)
        token = session.lease_token
        if fence < token or (fence == token and session.lease_owner != owner):
            return token
        session.lease_token, session.lease_owner = fence, owner
        session.lease_expires_at = time.time() + ttl
        return Lease(session_id=session_id, owner=owner, token=fence)

    async def enqueue_input(self, session_id: str, prompt: str, message_id: str) -> None:
        """Queue a message for the lease holder to deliver (see `Store`)."""
        self._session(session_id).inputs.setdefault(message_id, prompt)

    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        """Keep the session's latest snapshot."""
        self._session(session_id).snapshot = (event_count, data)

    async def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The latest snapshot, if any."""
        return self._session(session_id).snapshot

    async def pending_inputs(self, session_id: str) -> list[tuple[str, str]]:
        """The queued `(prompt, message_id)` pairs not yet claimed, oldest first."""
        return [
            (prompt, message_id) for message_id, prompt in self._session(session_id).inputs.items()
        ]

    async def sessions_with_inputs(self) -> set[str]:
        """The sessions with inputs pending (see `Store`)."""
        return {session_id for session_id, state in self._sessions.items() if state.inputs}

    async def discard_inputs(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """Remove the named inputs still pending (see `Store`)."""
        inputs = self._session(session_id).inputs
        return [m for m in dict.fromkeys(message_ids) if inputs.pop(m, None) is not None]

    async def rewrite_inputs(
        self, session_id: str, expected: Sequence[str], inputs: Sequence[tuple[str, str]]
    ) -> bool:
        """Reorder, reword and add pending inputs in one step (see `Store`)."""
        check_rewrite(expected, inputs)
        session = self._session(session_id)
        if list(session.inputs) != list(expected):
            return False
        session.inputs = {message_id: prompt for prompt, message_id in inputs}
        return True

    async def close(self) -> None:
        """Drop every session and end subscriptions; the store is unusable afterwards."""
        self._sessions.clear()
        self._closed = True
        self._listeners.ring_all()

    @staticmethod
    def _record(session_id: str, session: _Session, now: float) -> SessionRecord:
        return SessionRecord(
            session_id=session_id,
            created_at=to_datetime(session.created_at),
            updated_at=to_datetime(session.updated_at),
            event_count=session.count,
            lease_owner=session.live_owner(now),
            summary=session.summary,
            lease_expires_at=to_datetime(session.lease_expires_at)
            if session.live_owner(now) is not None
            else None,
            owner=session.owner,
        )


def _stored(batch: Sequence[Event], log: list[Event]) -> bool:
    """Whether `batch` is already the tail of `log` (a retried append)."""
    return len(log) >= len(batch) and log[len(log) - len(batch)].id == batch[0].id
