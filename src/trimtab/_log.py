"""`SessionLog`: the only writer of a session's log, and what the session knows from it.

Every event of a session passes here: stamped into the log's one chain (spec E3), stored
(unless ephemeral, E2), applied to the session's state (`SessionState`), then delivered to the
session's subscribers, in that order and one batch at a time. A runtime that only follows the
session (R1) feeds the owner's events through `follow` instead, which delivers each run's one
idle where the log says the run ended (E5).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeAlias, TypeGuard

from trimtab._errors import LeaseLostError, LogTailLostError, StoreUnavailableError
from trimtab._state import SessionState, state_of
from trimtab._subscribers import Subscribers
from trimtab.events import (
    AbortEvent,
    Event,
    EventType,
    SessionIdleData,
    SessionIdleEvent,
    UserMessageEvent,
)
from trimtab.store import CarriesLive, Lease, Store

__all__ = ["SessionLog", "Settle", "chained"]

log = logging.getLogger("trimtab")

Settle: TypeAlias = Callable[[SessionState], Sequence[Event]]
"""Events to store first, decided from the log's state once the writer holds it."""

DEFERRABLE: frozenset[EventType] = frozenset(
    {
        "assistant.turn_start",
        "assistant.message",
        "assistant.usage",
        "assistant.turn_end",
        "tool.execution_complete",
        "permission.requested",
        "permission.completed",
        "external_tool.requested",
        "external_tool.completed",
    }
)
"""The events whose append need not wait for the disk (spec P5): what a run produces between
the points something outside depends on. A crash of the database may lose a suffix of them,
which the log then shows as a run interrupted there (P3). Every other event is durable when
its append returns: a `user.message` (a send is acknowledged once it is stored, P4), a
`tool.execution_start` (the handler runs only after it, so a crash can never run it twice,
P3), and the rest (settings, aborts, errors, clears), which are rare."""

_STORE_RETRY_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between tries of an append while the store is unavailable (a database restart),
the last one repeated, for as long as the store's `timeout` allows in all; past that the run
ends in a `store` error (and the lease may be gone)."""


class SessionLog:
    """A session's log, as this runtime writes or follows it."""

    __slots__ = (
        "_end_logged",
        "_halted",
        "_idle_delivered",
        "idle_given",
        "_unsure",
        "_writing",
        "claimed",
        "lease",
        "session_id",
        "state",
        "store",
        "subscribers",
    )

    def __init__(
        self, session_id: str, store: Store, lease: Lease | None, state: SessionState
    ) -> None:
        self.session_id = session_id
        self.store = store
        self.lease = lease
        """This runtime's lease: it may write the log while it holds one (spec R1)."""
        self.state = state
        self.subscribers = Subscribers()
        self.claimed: set[str] | None = None
        """Inputs queued here from the store's inbox whose user message is not stored yet
        (None rather than an empty set while there are none)."""
        self._writing = asyncio.Lock()
        """Held while events are stamped, stored and delivered: one chain (E3) however many
        tool calls finish at once, whatever the store awaits."""
        self._unsure = False
        """An append was given up on: the log may hold more than the state has applied."""
        self._idle_delivered = False
        """While following: the idle of the owner's last run was delivered from its log."""
        self._end_logged = False
        """The last event stored here ended a run: every follower delivers that run's idle
        from the log (E5), so the owner's own is not published to them."""
        self.idle_given: str | None = None
        """A run of this runtime whose idle was delivered here before its end was in the log
        (the lease was lost under it, or the database lost its end, P6): the end, when it
        comes, brings no second one (E1)."""
        self._halted = False

    def halt(self) -> None:
        """Stop writing, silently: every later batch is dropped (neither stored nor applied
        nor delivered), so that the log reads as if this runtime had stopped right here. What
        an engine does to a run it parks (spec EN5): the run is then let go of, and whatever
        its stopping would log (cancelled calls, an abort, its idle) is never written."""
        self._halted = True
        self.lease = None

    @property
    def writable(self) -> bool:
        return self.lease is not None

    async def emit(self, event: Event) -> Event:
        """Stamp, store (unless ephemeral), then deliver one event."""
        if event.ephemeral and not self._writing.locked():
            # A streamed delta's path to the handlers: with nothing to store there is nothing
            # to leave half done (the stores' `publish` does not wait), and a free writer is
            # taken at once, in this task, so the delta goes out without a task of its own
            # and the loop cycle it would wait for.
            async with self._writing:
                return (await self.emit_unlocked((event,)))[0]
        return (await self.emit_all((event,)))[0]

    async def emit_all(
        self, events: Sequence[Event], *, first: Settle | None = None
    ) -> list[Event]:
        """`emit` for events that must be stored together (one atomic append) and in a row.

        Never half done: an abort that cancels the caller meanwhile takes effect once the
        events are stored and delivered (a call's start without its end, or an end that is
        stored but not known here, would break O1 and E3)."""
        emitting = asyncio.ensure_future(self._emit_locked(events, first))
        try:
            return await asyncio.shield(emitting)
        except asyncio.CancelledError:
            while not emitting.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([emitting])
            if not emitting.cancelled():
                emitting.exception()  # the cancellation wins; a store failure is read, not warned
            raise

    async def _emit_locked(self, events: Sequence[Event], first: Settle | None) -> list[Event]:
        async with self._writing:
            return await self.emit_unlocked(events, first=first)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the writer for several steps (a takeover): emit with `emit_unlocked` inside."""
        async with self._writing:
            yield

    async def emit_unlocked(
        self, events: Sequence[Event], *, first: Settle | None = None
    ) -> list[Event]:
        """`emit_all`, with the writer held by the caller (`exclusive`).

        `first` gives events to store before `events`, from the state as the log holds it
        (after an append given up on is caught up with)."""
        if self._halted:
            state = self.state
            return chained(events, state.last_id, state.epoch)
        if self._unsure and self.lease is not None and not all(e.ephemeral for e in events):
            believed = self.state
            await self.catch_up()
            if self.state is not believed:
                # (`first` and the caller's events were made for the log as it was believed.)
                raise LogTailLostError(f"the log of session {self.session_id} lost its tail")
        state = self.state
        if first is not None:
            events = (*first(state), *events)
        stamped = chained(events, state.last_id, state.epoch)
        if self.lease is None and not all(e.ephemeral for e in stamped):
            raise LeaseLostError(
                f"session {self.session_id} is remote: this runtime cannot write it"
            )
        carries = _carries(self.store)
        begin = 0
        while begin < len(stamped):
            # One append per part: the whole batch on a store that sends the ephemeral events
            # among it with it, else up to the first one that follows a stored event (its
            # place for other runtimes is after that append).
            end = len(stamped) if carries else _part_end(stamped, begin)
            await self._store(stamped[begin:end], carries)
            begin = end
        return stamped

    async def _store(self, events: Sequence[Event], carries: bool) -> None:
        """Store, apply and deliver one part of a batch (see `emit_unlocked`)."""
        state = self.state
        stored = [e for e in events if not e.ephemeral]
        published = 0
        if stored:
            # Ephemeral events ahead of the first stored one are published before the append,
            # still in their place for other runtimes: a store may send them with it
            # (PostgreSQL: in the append's statement, one round trip for both).
            while events[published].ephemeral:
                await self.store.publish(
                    self.session_id, events[published], after=state.event_count
                )
                published += 1
            live = _placed(events[published:], state.event_count) if carries else ()
            await self._append(
                stored, durable=any(e.type not in DEFERRABLE for e in stored), live=live
            )
            if live:
                published = len(events)  # the store sent them with the append
        for index, event in enumerate(events):
            if not event.ephemeral:
                self._end_logged = state.apply(event)
                if self.claimed and isinstance(event, UserMessageEvent):
                    self.claimed.discard(event.data.message_id or "")
            elif self.lease is not None and index >= published:
                if isinstance(event, SessionIdleEvent) and self._end_logged:
                    # Followers deliver this idle where the log ended its run (E5): sending
                    # it would cost a round trip per run (PostgreSQL) for them to drop.
                    self._end_logged = False
                else:
                    # Hosts following this session from other runtimes see its live events.
                    await self.store.publish(self.session_id, event, after=state.event_count)
            self.subscribers.deliver(event)

    async def _append(
        self, events: Sequence[Event], *, durable: bool, live: Sequence[tuple[int, Event]]
    ) -> None:
        """Store events, riding out a short store outage (a database restart) for at most the
        store's `timeout` in all: appends are idempotent by event id, so a try whose outcome
        was unknown is simply repeated."""
        assert self.lease is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        for attempt in itertools.count():
            tried = loop.time()
            try:
                if live and _carries(self.store):
                    await self.store.append(
                        self.session_id, events, lease=self.lease, durable=durable, live=live
                    )
                else:
                    await self.store.append(
                        self.session_id, events, lease=self.lease, durable=durable
                    )
                return
            except LogTailLostError:
                # The database lost the log's last appends (P5): the state is read again from
                # the log now (by the next append if the store fails meanwhile), so that what
                # comes next is decided from the log as it is (P6).
                self._unsure = True
                with contextlib.suppress(StoreUnavailableError):
                    await self.catch_up()
                raise
            except LeaseLostError:
                # Fenced out (a lost tail, its subclass, is handled above): another runtime
                # (or an engine's later attempt) holds the session now. Said here, where it
                # happens: the run that wrote may be stopping anyway, and then nothing else
                # reports it.
                log.warning("session %s: an append was refused, the lease is lost", self.session_id)
                raise
            except StoreUnavailableError:
                delay = _STORE_RETRY_DELAYS[min(attempt, len(_STORE_RETRY_DELAYS) - 1)]
                # Retried only while a try as long as this one still fits: one that waited
                # out the store's own bound (a held lock) would take the run past it.
                took = loop.time() - tried
                if loop.time() + delay + took >= started + self.store.timeout:
                    # Given up, but it may still land (a frozen server that wakes): the next
                    # append first reads the log's tail, so that it follows whatever did.
                    self._unsure = True
                    raise
                log.warning("store unavailable for session %s; retrying", self.session_id)
                await asyncio.sleep(delay)

    async def catch_up(self) -> None:
        """Apply (and deliver) the events stored after what this session knows: appends given
        up on that landed after all, or another runtime's before a takeover (E3).

        A log that no longer holds the last event applied here lost its last appends in a
        crash of the database (P5): the state is then rebuilt from the log as it is, and the
        session goes on from there (P6)."""
        state = self.state
        events = await self.store.read(self.session_id, after=state.event_count - 1)
        if not events or events[0].id != state.last_id:
            await self._reread()
            return
        for event in events[1:]:
            state.apply(event)
            self.subscribers.deliver(event)
        self._unsure = False

    async def _reread(self) -> None:
        """Rebuild the state from the whole log, which lost events applied here (spec P6).

        A run the log now leaves open that was over here had its idle delivered here: the
        end stored for it later brings no second one (`idle_given`, E1)."""
        believed = self.state
        self.state = state = state_of(await self.store.read(self.session_id))
        if state.run_id is not None and state.run_id != believed.run_id:
            self.idle_given = state.run_id
        self._unsure = self._end_logged = False
        log.warning(
            "the log of session %s ends at event %d, not %d: its database lost the last"
            " appends in a crash (spec P5); the session goes on from the log (P6)",
            self.session_id,
            state.event_count,
            believed.event_count,
        )

    def follow(self, event: Event) -> None:
        """Deliver one of the owner's events, with exactly one idle per run (spec E1, E5):
        the log tells when a run ended, so the idle is delivered then; the owner's own idle,
        where the store carries it here at all, comes right after and is dropped."""
        if isinstance(event, SessionIdleEvent) and self._idle_delivered:
            self._idle_delivered = False
            return
        run = self.state.run_id
        ended = not event.ephemeral and self.state.apply(event)
        if not event.ephemeral:
            # (A live notice of no run, such as the queue's, may come between a run's end
            # and the owner's idle: that idle is still the one already delivered.)
            self._idle_delivered = False
        self.subscribers.deliver(event)
        if ended and run is not None and run == self.idle_given:
            self.idle_given = None
            self._idle_delivered = True  # (so is the owner's, if it comes)
        elif ended:
            aborted = isinstance(event, AbortEvent) or None
            self.subscribers.deliver(SessionIdleEvent(data=SessionIdleData(aborted=aborted)))
            self._idle_delivered = True


def _carries(store: Store) -> TypeGuard[CarriesLive]:
    """Whether `store` publishes the live events of a batch with its append."""
    return getattr(store, "carries_live", False) is True


def _part_end(events: Sequence[Event], begin: int) -> int:
    """Where the part of `events` from `begin` that one append stores ends: at the first
    ephemeral event after a stored one (or the end)."""
    seen_stored = False
    for index in range(begin, len(events)):
        if not events[index].ephemeral:
            seen_stored = True
        elif seen_stored:
            return index
    return len(events)


def _placed(events: Sequence[Event], count: int) -> list[tuple[int, Event]]:
    """The ephemeral ones of `events` (a batch stored after the log's first `count`), each
    with the number of stored events it follows once the batch is stored."""
    placed: list[tuple[int, Event]] = []
    for event in events:
        if event.ephemeral:
            placed.append((count, event))
        else:
            count += 1
    return placed


def chained(events: Sequence[Event], parent: str | None, epoch: int) -> list[Event]:
    """`events` stamped to follow the stored event `parent` in context epoch `epoch`: each
    stored one links to the one before it (E3), and a clear starts the next epoch (C9)."""
    stamped: list[Event] = []
    for event in events:
        epoch += event.type == "session.context_cleared"
        stamped.append(event.model_copy(update={"parent_id": parent, "context_epoch": epoch}))
        if not event.ephemeral:
            parent = event.id
    return stamped
