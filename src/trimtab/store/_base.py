"""The store seam: an append-only event log per session, plus session leases.

Every backend implements `Store` with the same semantics, checked by one conformance suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict

from trimtab._errors import PruneError
from trimtab.events import Event, SessionPrunedEvent, SessionStartEvent, UserMessageEvent

__all__ = [
    "CarriesLive",
    "EventLog",
    "Inbox",
    "Leases",
    "LiveFeed",
    "Snapshots",
    "DEFAULT_TIMEOUT",
    "Lease",
    "Listener",
    "Listeners",
    "SessionRecord",
    "Store",
    "claimed_input",
    "follow",
    "owner_of",
    "position_of",
    "record_of",
]

DEFAULT_TIMEOUT = 30.0
"""Seconds within which a store call completes or raises `StoreUnavailableError`, unless
configured otherwise (`timeout=` of the backends and `open_store`, `Client(store_timeout=)`)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof that one runtime runs a session's loop (spec R1).

    A slotted dataclass, not a model: every open session holds one, and nothing serialises
    it."""

    session_id: str
    owner: str
    token: int
    """Fencing token: grows on every acquisition, so a stale holder's appends are refused."""


class SessionRecord(BaseModel):
    """What `list_sessions` tells about a session without reading its log."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    created_at: datetime
    updated_at: datetime
    event_count: int
    lease_owner: str | None = None
    """The runtime holding the session's lease, if the lease is live."""
    summary: str | None = None
    """The first user message, shortened: a human-readable label."""
    lease_expires_at: datetime | None = None
    """When the live lease expires unless its holder renews it (None without a live lease)."""
    owner: str | None = None
    """Who the session belongs to: its `session.start`'s `owner` (spec S16)."""


class EventLog(Protocol):
    """The append-only event logs of sessions."""

    async def create(self, session_id: str, events: Sequence[Event] = ()) -> None:
        """Create a log holding `events` (a new session's first: its `session.start`) in one
        transaction: the session exists with them, or not at all. Raises `ValueError` if the
        id exists."""
        ...

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
    ) -> int:
        """Append persisted events in order and return the new event count.

        `durable=False` allows the append to commit without waiting for the disk (spec P5):
        it is stored and visible at once, and made durable by the next durable append (or the
        backend's own background flush) so that a crash of the database can only lose a
        suffix of such appends, never one between two that survive. Memory and SQLite, whose
        commits never wait for the disk (SQLite: WAL with `synchronous = NORMAL`), ignore it.

        With a lease, the append is fenced: it raises `LeaseLostError` unless the lease is
        still the session's current, unexpired one. A store whose database may lose the
        log's last appends (P5: PostgreSQL) also refuses a leased batch whose first event
        follows one (`parent_id`) that is not the log's last, with `LogTailLostError`. Raises
        `SessionNotFoundError` for an unknown session, and `StoreUnavailableError` when the
        outcome is unknown.

        Idempotent by event id: a batch whose first event is already in the log is the retry
        of an append that went through, and is not stored again. A `user.message` whose
        `message_id` is a queued input's claims that input in the same transaction.
        """
        ...

    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        """The events with sequence number > `after` (1-based), oldest first.

        A pruned log (see `prune`) keeps its events' positions: the events a prune removed
        are missing, and its marker stands at the position of the last of them."""
        ...

    async def prune(
        self, session_id: str, marker: SessionPrunedEvent, *, lease: Lease | None
    ) -> int:
        """Remove the events from the second (the first, the session's start, stays) through
        `marker.data.position`, and store `marker` at that position, in one transaction;
        the number of events removed (spec X8).

        The marker carries the id of the event it replaces at its position, so that the
        positions, the event count and the `parent_id` chain after it stay as they were.
        With a lease the prune is fenced as an append is (`LeaseLostError`); without one it
        is refused while any runtime holds the session's lease (`PruneError`
        `session_open`). It is refused with `log_changed` when the event at the marker's
        position is not the one it replaces (another prune came first), and with
        `follower_behind` while a subscription of this store has not read past that
        position. Raises `SessionNotFoundError` for an unknown session."""
        ...

    async def get(self, session_id: str) -> SessionRecord:
        """Raises `SessionNotFoundError` for an unknown session."""
        ...

    async def list_sessions(self) -> list[SessionRecord]:
        """Every session, most recently updated first."""
        ...

    async def delete(self, session_id: str) -> bool:
        """Remove a session and its log; False if there was none."""
        ...


class LiveFeed(Protocol):
    """Events as they happen: stored ones and ephemeral ones, to subscribers."""

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        """Hand an ephemeral event (a delta, an idle) to the session's live subscribers, in its
        place after the session's first `after` events. Never stored: a subscriber that is not
        listening misses it. Best effort: a delivery failure is logged, not raised. Returns
        without waiting (queue what must be sent): the runtime publishes a streamed delta on
        its way to the session's own handlers.

        Memory and SQLite reach the subscribers of this process; PostgreSQL those of every
        runtime sharing the database.
        """
        ...

    def subscribe(
        self, session_id: str, *, after: int = 0, ready: asyncio.Event | None = None
    ) -> AsyncGenerator[Event, None]:
        """The events after `after`, then each new one as it is stored, by any process,
        with the published ephemeral events in their places.

        Like any generator it starts on its first `anext`: `ready`, if given, is set once
        it listens, and every ephemeral event published from then on is delivered (spec E6).
        Wait for it with a bound: it is never set for a subscription that cannot listen
        (PostgreSQL: its listener did not connect within the store's timeout; such a
        subscription still reads the stored events, by polling).

        Never ends on its own: it ends when the store is closed, and raises
        `SessionNotFoundError` for an unknown (or deleted) session.
        """
        ...


class CarriesLive(Protocol):
    """A store that sends the ephemeral events among a batch (after its first stored event)
    with the batch's append, in one round trip, where publishing them after it would cost
    one more (PostgreSQL). An optional capability: on any other store the runtime appends up
    to such an event and publishes it after that append."""

    carries_live: Literal[True]

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
        live: Sequence[tuple[int, Event]] = (),
    ) -> int:
        """`EventLog.append`, publishing `live` once the batch is stored: ephemeral events,
        each with the number of the log's events it follows (as `after` in `publish`), which
        may count events of this batch."""
        ...


class Leases(Protocol):
    """Which runtime runs each session (spec R1)."""

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the lease if it is free, expired or already `owner`'s; None if another holds it."""
        ...

    async def renew_leases(self, owner: str, ttl: float) -> list[str]:
        """Extend every live lease `owner` holds; returns their session ids."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up (no-op if it was already lost)."""
        ...

    async def claim_lease(self, session_id: str, owner: str, fence: int, ttl: float) -> Lease | int:
        """Take the lease with the fencing token `fence`, whoever holds it and whether or not
        it expired: for an engine that decides by itself who runs the session (spec EN3),
        which hands each attempt a greater fence than the last.

        Succeeds when `fence` is greater than the session's token, or equal to it with the
        lease already `owner`'s (a repeated claim); the token becomes `fence`, so that the
        appends of every earlier holder are refused from then on. Returns the lease, or, when
        refused, the session's token (the engine goes on from above it). Raises
        `SessionNotFoundError` for an unknown session.
        """
        ...


class Inbox(Protocol):
    """Inputs queued for a session's runtime (spec P4, R1)."""

    async def enqueue_input(self, session_id: str, prompt: str, message_id: str) -> None:
        """Queue a message for the lease holder to deliver (a `send` on a remote session).

        Idempotent by `message_id`: queuing the same message again (a retried send) is a
        no-op.
        """
        ...

    async def pending_inputs(self, session_id: str) -> list[tuple[str, str]]:
        """The queued `(prompt, message_id)` pairs not yet claimed, oldest first.

        Reading them takes nothing: an input stays pending until the `user.message` it becomes
        is appended, so the input of a holder that crashed before appending it is delivered by
        the next holder.
        """
        ...

    async def sessions_with_inputs(self) -> set[str]:
        """The sessions that have inputs pending, whoever holds them: what a runtime's upkeep
        reads once, rather than each session's inbox in turn (a read per idle session per
        tick). An input is pending only until its message is stored, so this reads little."""
        ...

    async def discard_inputs(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """Remove the named inputs that are still pending, in one atomic step; the ids removed.

        An input already claimed (its `user.message` appended) is never removed: its run has
        begun. Unknown ids are ignored.
        """
        ...

    async def rewrite_inputs(
        self, session_id: str, expected: Sequence[str], inputs: Sequence[tuple[str, str]]
    ) -> bool:
        """Make the pending inputs `inputs` (`(prompt, message_id)` pairs, in their new
        order), in one atomic step, provided they are `expected` now (message ids, oldest
        first); else change nothing and return False (spec K18).

        An edit of the queue in place: it moves inputs, changes their prompts and adds new
        ones, never removes one (`discard_inputs` does). `inputs` must hold each id of
        `expected`, and no id twice, else `ValueError`; a new id must be one never queued.
        An input keeps its identity through the edit: an append that claims it either came
        first (this returns False) or claims it, moved, after it. A crash leaves the inputs
        as they were before the edit or after it, never between.
        """
        ...


class Snapshots(Protocol):
    """Derived state that saves a replay of the whole log (spec P1)."""

    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        """Keep `data`, a session's state after its first `event_count` events (replacing any
        earlier snapshot). A snapshot is derived from the log, never a second truth: it only
        lets a session open without replaying the whole log."""
        ...

    async def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The latest `(event_count, data)` saved for the session, if any."""
        ...


@runtime_checkable
class Store(EventLog, LiveFeed, Leases, Inbox, Snapshots, Protocol):
    """Durable event logs with their live feed, leases, inbox and snapshots: what every
    backend implements. Appends are atomic: all of a batch is stored, or none of it.

    Every call is bounded: it completes, or raises `StoreUnavailableError` within `timeout`
    seconds when the store cannot be reached or is held up (a locked row or file, a database
    that is down or stopped answering). Whether a write that raised it went through is then
    unknown; an append can be repeated safely (it is idempotent by event id). A subscription
    is the exception, as it follows the log until closed: it retries its reads instead.
    """

    timeout: float
    """Seconds within which every call completes or raises `StoreUnavailableError`."""

    async def close(self) -> None:
        """Release resources; the store is unusable afterwards."""
        ...


SUMMARY_LENGTH = 80
"""The longest `SessionRecord.summary`, ellipsis included."""

# --- rules every backend shares, so that they cannot drift --------------------------------


def summarize(events: Sequence[Event]) -> str | None:
    """The label of a session: its first non-blank user message on one line, shortened.

    Returns None when `events` holds no such message.
    """
    for event in events:
        if isinstance(event, UserMessageEvent) and (text := " ".join(event.data.content.split())):
            if len(text) > SUMMARY_LENGTH:
                text = text[: SUMMARY_LENGTH - 1].rstrip() + "…"
            return text
    return None


def owner_of(events: Sequence[Event]) -> str | None:
    """The owner a new log's `session.start` names (`SessionRecord.owner`), if any."""
    first = events[0] if events else None
    return first.data.owner if isinstance(first, SessionStartEvent) else None


def claimed_input(event: Event) -> str | None:
    """The message id of the queued input that `event` delivers, if it is a user message."""
    return event.data.message_id if isinstance(event, UserMessageEvent) else None


def check_prune(
    marker: SessionPrunedEvent,
    at_position: str | None,
    *,
    lease: Lease | None,
    owner: str | None,
    listeners: Listeners,
    session_id: str,
) -> None:
    """The checks every backend makes before a prune (see `EventLog.prune`): the live
    lease's `owner` (None without one), the id of the event at the marker's position
    (`at_position`), and the subscriptions of this store."""
    if lease is None and owner is not None:
        raise PruneError(
            "session_open", f"session {session_id} is open in a runtime ({owner}): prune it there"
        )
    position = marker.data.position
    if position < 2 or at_position != marker.id:
        raise PruneError(
            "log_changed",
            f"event {position} of session {session_id} is not the one the prune was made for",
        )
    if listeners.behind(session_id, position):
        raise PruneError(
            "follower_behind",
            f"a subscription to session {session_id} has not read past event {position} yet",
        )


def position_of(event: Event, before: int) -> int:
    """The position of a stored event read right after position `before`: the next one,
    unless it is a prune's marker, which stands at its own (spec X8)."""
    return event.data.position if isinstance(event, SessionPrunedEvent) else before + 1


def check_rewrite(expected: Sequence[str], inputs: Sequence[tuple[str, str]]) -> None:
    """Raise `ValueError` unless `inputs` keeps every input of `expected`, each once
    (`Inbox.rewrite_inputs`): an edit of the queue never drops or doubles an input."""
    ids = [message_id for _, message_id in inputs]
    if len(set(ids)) != len(ids):
        raise ValueError("an edit of the queue names an input twice")
    if missing := set(expected) - set(ids):
        raise ValueError(f"an edit of the queue may not drop inputs: {sorted(missing)}")


def check_persistable(events: Sequence[Event]) -> None:
    """Raise `ValueError` if any event is ephemeral: those are delivered live, never stored (E2)."""
    for event in events:
        if event.ephemeral:
            raise ValueError(f"ephemeral {event.type!r} event {event.id} cannot be appended")


def holds_lease(
    lease: Lease,
    session_id: str,
    *,
    owner: str | None,
    token: int,
    expires_at: float | None,
    now: float,
) -> bool:
    """The fencing check: whether `lease` is still the session's current, unexpired lease."""
    return (
        lease.session_id == session_id
        and lease.owner == owner
        and lease.token == token
        and expires_at is not None
        and expires_at > now
    )


def to_datetime(moment: float | datetime) -> datetime:
    """A stored time as an aware UTC datetime: unix seconds (memory, SQLite), or a
    `timestamptz` in the database server's time zone (PostgreSQL)."""
    if isinstance(moment, datetime):
        return moment.astimezone(UTC)
    return datetime.fromtimestamp(moment, UTC)


def record_of(row: Sequence[Any]) -> SessionRecord:
    """The `SessionRecord` of a row of the SQL backends: session id, creation and update
    times, last sequence number, live lease owner, summary, the live lease's expiry and the
    session's owner."""
    session_id, created_at, updated_at, last_seq, lease_owner, summary, expires_at, owner = row
    return SessionRecord(
        session_id=session_id,
        created_at=to_datetime(created_at),
        updated_at=to_datetime(updated_at),
        event_count=last_seq,
        lease_owner=lease_owner,
        summary=summary,
        lease_expires_at=None if lease_owner is None else to_datetime(expires_at),
        owner=owner,
    )


Notice: TypeAlias = tuple[int | None, Event | None]
"""What a subscriber is told: `(seq, None)`, the session's events up to `seq` are stored (None:
it may have changed in any way); `(after, event)`, the ephemeral `event`, published after the
session's first `after` events."""


class Listener:
    """One subscription's wake-up call, the notices that woke it, in order, and how far it
    has read."""

    __slots__ = ("loop", "notices", "position", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.woken = asyncio.Event()
        self.notices: list[Notice] = []
        self.position = 0
        """The position of the last stored event it delivered (or it started after)."""

    def tell(self, notice: Notice) -> None:
        self.notices.append(notice)
        self.woken.set()


class Listeners:
    """The subscriptions a store serves in this process, by session: told when a session may
    have new events or an ephemeral event was published. Thread-safe to tell (SQLite's
    appends may come from another thread); each listener is woken on the loop it waits on."""

    __slots__ = ("_by_session",)

    def __init__(self) -> None:
        self._by_session: dict[str, set[Listener]] = {}

    @contextmanager
    def listening_to(self, session_id: str) -> Iterator[Listener]:
        """A listener told of every change of `session_id`, until the block exits."""
        listener = Listener(asyncio.get_running_loop())
        self._by_session.setdefault(session_id, set()).add(listener)
        try:
            yield listener
        finally:
            listeners = self._by_session.get(session_id, set())
            listeners.discard(listener)
            if not listeners:
                self._by_session.pop(session_id, None)

    def listening(self, session_id: str) -> bool:
        """Whether any subscriber follows the session here."""
        return session_id in self._by_session

    def behind(self, session_id: str, position: int) -> bool:
        """Whether a subscriber of the session here has not read past `position` yet (one
        that has not read at all counts as behind)."""
        return any(
            listener.position < position for listener in self._by_session.get(session_id, ())
        )

    def ring(self, session_id: str, seq: int | None = None) -> None:
        """Wake the subscribers of one session: its events up to `seq` are stored (None: it
        may have changed in any way)."""
        self._push(session_id, (seq, None))

    def post(self, session_id: str, after: int, event: Event) -> None:
        """Hand an ephemeral event to the session's subscribers, to come after its first
        `after` persisted events."""
        self._push(session_id, (after, event))

    def ring_all(self) -> None:
        """Wake every subscriber (the store closed, or its notifications were interrupted)."""
        for session_id in list(self._by_session):
            self.ring(session_id)

    def _push(self, session_id: str, notice: Notice) -> None:
        for listener in list(self._by_session.get(session_id, ())):
            if not listener.loop.is_closed():
                listener.loop.call_soon_threadsafe(listener.tell, notice)


class _Ahead:
    """A subscription's events read from the log, held back behind an ephemeral event, with
    their positions (a prune's marker stands at its own, X8)."""

    __slots__ = ("_closed", "_events", "_listener", "_read")

    def __init__(
        self,
        listener: Listener,
        read: Callable[[int], Awaitable[list[Event]]],
        closed: Callable[[], bool],
    ) -> None:
        self._listener, self._read, self._closed = listener, read, closed
        self._events: list[tuple[int, Event]] = []

    def end(self) -> int:
        """The position of the last event read (or delivered)."""
        return self._events[-1][0] if self._events else self._listener.position

    async def more(self) -> bool:
        """Read on from the log; False once the store is closed."""
        at = self.end()
        try:
            events = await self._read(at)
        except RuntimeError:
            if self._closed():
                return False
            raise
        for event in events:
            at = position_of(event, at)
            self._events.append((at, event))
        return True

    def through(self, seq: int | None) -> list[tuple[int, Event]]:
        """Take the events read up to position `seq` (all of them: None)."""
        held = self._events
        count = len(held) if seq is None else sum(1 for at, _ in held if at <= seq)
        taken = held[:count]
        del held[:count]
        return taken


async def follow(
    listener: Listener,
    read: Callable[[int], Awaitable[list[Event]]],
    after: int,
    *,
    closed: Callable[[], bool],
    poll: float | None,
    ready: asyncio.Event | None = None,
) -> AsyncGenerator[Event, None]:
    """A subscription's events: the log after `after`, then stored and ephemeral events as
    `listener` is told of them, each ephemeral one in its place among the stored ones.

    `listener` is told of the session's changes already: `ready` (see `LiveFeed.subscribe`)
    is set as this begins, before its first read, and every notice told from then on counts.
    `read(n)` returns the stored events after the first `n`. Without any announcement for
    `poll` seconds the log is read anyway (other processes' appends may not ring here).
    """
    listener.position = max(after, 0)
    ahead = _Ahead(listener, read, closed)
    # Wake-ups told before the first read are covered by it. Read again later, once more is
    # stored, they would let a stored event overtake ephemeral ones published before it.
    listener.notices = [notice for notice in listener.notices if notice[1] is not None]
    if ready is not None:
        ready.set()
    # The log first, held back until the ephemeral events told while it was read are in
    # their places: that read may have seen events stored after them.
    if not await ahead.more():
        return
    notices: list[Notice] = [*listener.notices, (ahead.end(), None)]
    listener.notices = []
    while not closed():
        for seq, ephemeral in notices:
            if (seq is None or seq > ahead.end()) and not await ahead.more():
                return
            for position, event in ahead.through(seq):
                listener.position = position  # (delivered: a prune may not take it, X8)
                yield event
            if ephemeral is not None:
                yield ephemeral
        listener.woken.clear()
        if not listener.notices:
            try:
                async with asyncio.timeout(poll):
                    await listener.woken.wait()
            except TimeoutError:
                pass
        notices, listener.notices = listener.notices or [(None, None)], []
