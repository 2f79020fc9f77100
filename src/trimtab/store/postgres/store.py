"""`PostgresStore`: the scale-out backend, one PostgreSQL database shared by many runtimes.

The semantics are `SqliteStore`'s (the conformance suite runs against both); what differs is
how they hold across hosts (docs: scale-out.md, section 4):

- An append is one statement (`_statements.APPEND`): it bumps the session's `last_seq` (the
  row lock serialises the session's appenders, so sequence numbers are gapless and in commit
  order), checks the lease and that the batch follows the log's last event in the same
  `WHERE` (fencing), inserts the events and rings the doorbell. An append that need not be
  durable (spec P5) commits with `synchronous_commit` off, set in that statement: commits
  reach the disk in their order, so a crash of the server loses at most a suffix of those,
  which the tail check then reveals.
- Leases live on the database clock (`now()`), never on the hosts' clocks.
- Fan-out: every append does `pg_notify('trimtab_events', '<session_id>:<last seq>')`, a
  doorbell its subscribers answer by reading the table (`_listener`).
- Ephemeral events (deltas, idle) are never stored: `publish` sends them whole on the live
  channel, batched and in order (`_live`), and each runtime's listener hands them to its
  subscribers, placed after the stored events they followed.
- Inputs queued for a session's lease holder wait in `session_inputs`, until the append of
  the `user.message` each becomes claims it.

Every call is bounded by the store's `timeout` (`_calls`, spec W1).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Literal

from psycopg import errors

from trimtab._durations import check_seconds
from trimtab._errors import (
    LeaseLostError,
    LogTailLostError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from trimtab._keyed_locks import KeyedLocks
from trimtab.events import Event, SessionPrunedEvent, event_from_json
from trimtab.store._base import (
    DEFAULT_TIMEOUT,
    Lease,
    Listeners,
    SessionRecord,
    check_persistable,
    check_prune,
    check_rewrite,
    follow,
    holds_lease,
    owner_of,
    record_of,
)
from trimtab.store.postgres import _listener
from trimtab.store.postgres import _statements as sql
from trimtab.store.postgres._calls import Calls, bounded
from trimtab.store.postgres._listener import Doorbell
from trimtab.store.postgres._live import LiveSender

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)


class PostgresStore:
    """A `Store` in a PostgreSQL database, shared by any number of runtimes and hosts.

    Nothing connects until the first call, which opens the pool and brings the schema up to
    date. Put the tables in a schema of their own with the DSN's `options`, e.g.
    `postgresql://host/db?options=-csearch_path%3Dtrimtab` (the schema must exist).

    Args:
        dsn: A libpq connection string or `postgresql://` URL. Its `connect_timeout`, if
            any, applies to each connection attempt (default: `timeout`).
        max_connections: The most pooled connections; subscriptions use one more, shared.
        timeout: Seconds within which every call completes or raises
            `StoreUnavailableError`, the first one included (which migrates the schema: give
            a one-off upgrade of a large database more).
    """

    carries_live: Literal[True] = True
    """A batch's trailing ephemeral events go in its append's statement (`CarriesLive`)."""

    def __init__(
        self, dsn: str, *, max_connections: int = 10, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        check_seconds("timeout", timeout)
        self._calls = Calls(dsn, max_connections=max_connections, timeout=timeout)
        """The connections, and every call bounded by `timeout`."""
        self._closed = False
        self._append_order = KeyedLocks()
        """Concurrent appends to one session from this store are stored in call order, as
        with the other backends; a read comes after the appends called before it."""
        self._live = LiveSender(self._notify_live)
        self._doorbell: Doorbell | None = None

    @property
    def timeout(self) -> float:
        """Seconds within which every call completes or raises `StoreUnavailableError`."""
        return self._calls.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._calls.timeout = seconds

    # --- the log --------------------------------------------------------------------------

    @bounded
    async def create(self, session_id: str, events: Sequence[Event] = ()) -> None:
        """Create a log holding `events`, in one transaction; raises `ValueError` if the id
        exists."""
        check_persistable(events)
        async with self._calls.connection() as conn:
            try:
                async with conn.transaction():
                    await conn.execute(
                        "INSERT INTO sessions (session_id, owner) VALUES (%s, %s)",
                        (session_id, sql.text(owner_of(events))),
                    )
                    if events:
                        params = sql.append_params(session_id, events, None)
                        await conn.execute(sql.APPEND, params)
            except errors.UniqueViolation:
                raise ValueError(f"session {session_id!r} already exists") from None

    @bounded
    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
        live: Sequence[tuple[int, Event]] = (),
    ) -> int:
        """Append persisted events in order, in one statement; returns the new event count.

        With a lease, the fencing check is part of the same statement, so a lease taken over
        by another runtime can never let a stale write through. A batch whose first event is
        stored already is a retry and stores nothing (see `Store`). With a lease, a batch
        whose first event follows one (`parent_id`) that is not the log's last is refused with
        `LogTailLostError` (a `LeaseLostError`): the server lost the last appends in a crash
        (spec P5), so this runtime's view of the log is no longer the log (P6).

        `durable=False` commits with `synchronous_commit` off: no wait for the WAL flush.
        `live` is published in the same statement (see `CarriesLive`).
        """
        check_persistable(events)
        if not events:
            await self._live.sent()
            async with self._append_order.hold(session_id):
                return await self._append_state(session_id, lease, None)
        params = sql.append_params(session_id, events, lease, durable)
        if carried := [p for n, e in live if (p := sql.live_payload(session_id, e, n))]:
            params["carried"] = sql.json_text(carried)
        async with self._live.taken() as queued:
            if queued:
                params["live"] = sql.json_text(queued)
            async with self._append_order.hold(session_id):
                row, conflict = await self._append_row(params)
        if row is None:
            return await self._append_state(session_id, lease, events[0], conflict=conflict)
        return int(row[0])

    async def _append_row(self, params: dict[str, Any]) -> tuple[Any, bool]:
        """The append's row (None when it stored nothing), and whether a concurrent append
        of the same batch (from another store) stored it first."""
        try:
            async with self._calls.connection() as conn:
                return await (await conn.writes.execute(sql.APPEND, params)).fetchone(), False
        except errors.UniqueViolation as error:
            if error.diag.constraint_name != "session_events_by_id":
                raise
            return None, True

    async def _append_state(
        self, session_id: str, lease: Lease | None, first: Event | None, *, conflict: bool = False
    ) -> int:
        """The event count after the fencing check; for an append that stored nothing (its
        `first` event given), the error it raises, unless the batch was stored already."""
        first_id = first.id if first else None
        async with self._calls.connection() as conn:
            cursor = await conn.execute(
                sql.APPEND_STATE, {"session_id": session_id, "first_id": first_id}
            )
            row = await cursor.fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        last_seq, owner, token, expires_at, now, duplicate, last_id = row
        if lease is not None and not holds_lease(
            lease, session_id, owner=owner, token=token, expires_at=expires_at, now=now
        ):
            raise LeaseLostError(
                f"lease {lease.token} of {lease.owner!r} on {session_id!r} is lost"
            )
        if first is None or duplicate:
            return int(last_seq)
        if lease is not None and first.parent_id is not None and first.parent_id != last_id:
            raise LogTailLostError(
                f"the log of {session_id!r} no longer ends with the events this runtime"
                f" stored (it ends at event {last_seq}): the database lost its last"
                " appends in a crash (spec P5)"
            )
        if conflict:
            raise ValueError(f"an event of the batch is already in {session_id!r}")
        # Neither lease nor retry explains it: the session was missing when the append ran
        # (it has been created again since).
        raise SessionNotFoundError(session_id)

    @bounded
    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        """The events with sequence number > `after` (1-based), oldest first.

        Read after this store's appends to the session, those whose caller stopped waiting
        included: one given up on may still land (a frozen server that wakes), and a session
        catching up with its log must see it before it appends again (E3)."""
        async with self._append_order.hold(session_id), self._calls.connection() as conn:
            rows = await (await conn.execute(sql.READ, (after, session_id))).fetchall()
        if not rows:
            raise SessionNotFoundError(session_id)
        return [event_from_json(payload, kind) for kind, payload in rows if payload is not None]

    @bounded
    async def prune(
        self, session_id: str, marker: SessionPrunedEvent, *, lease: Lease | None
    ) -> int:
        """Replace the events from the second through the marker's position with it, in one
        transaction with the session's row locked (see `Store`). The table's freed rows are
        reclaimed by PostgreSQL's (auto)vacuum."""
        params: dict[str, Any] = {"session_id": session_id, "position": marker.data.position}
        async with self._append_order.hold(session_id), self._calls.connection() as conn:
            async with conn.transaction():
                row = await (await conn.execute(sql.PRUNE_STATE, params)).fetchone()
                if row is None:
                    raise SessionNotFoundError(session_id)
                owner, token, expires_at, now, at = row
                if lease is not None and not holds_lease(
                    lease, session_id, owner=owner, token=token, expires_at=expires_at, now=now
                ):
                    raise LeaseLostError(
                        f"lease {lease.token} of {lease.owner!r} on {session_id!r} is lost"
                    )
                live = owner if expires_at is not None and expires_at > now else None
                listeners = self._doorbell.listeners if self._doorbell else Listeners()
                check_prune(
                    marker,
                    at,
                    lease=lease,
                    owner=live,
                    listeners=listeners,
                    session_id=session_id,
                )
                removed = (await conn.execute(sql.PRUNE, params)).rowcount
                marked = {
                    **params,
                    "id": marker.id,
                    "type": marker.type,
                    "payload": marker.model_dump_json(),
                    "token": None if lease is None else lease.token,
                }
                await conn.execute(sql.PRUNE_MARKER, marked)
        return int(removed)

    # --- live events ----------------------------------------------------------------------

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        """Hand an ephemeral event to the session's subscribers in every runtime sharing the
        database (see `Store`), through `NOTIFY` on the live channel.

        Returns before it is sent: a turn does not wait a round trip per delta, and the
        events published meanwhile share one (`LiveSender`).

        NOTIFY payloads are limited to 8000 bytes: a larger event (a long delta) is not sent;
        the stored message that follows it carries its text anyway.
        """
        if self._closed:
            raise RuntimeError("the store is closed")
        if (payload := sql.live_payload(session_id, event, after)) is not None:
            self._live.publish(payload)

    @bounded
    async def _notify_live(self, payloads: list[str]) -> None:
        async with self._calls.connection() as conn:
            await conn.writes.execute(sql.NOTIFY_ALL, (sql.LIVE_CHANNEL, sql.json_text(payloads)))

    async def subscribe(
        self, session_id: str, *, after: int = 0, ready: asyncio.Event | None = None
    ) -> AsyncGenerator[Event, None]:
        """The events after `after` as they are stored: the log first, then live ones, with
        the published ephemeral events in their places (`ready`: see `Store`; set once this
        runtime's listener is up, which a first subscription waits for).

        The iterator never ends on its own: it ends when the store is closed, and raises
        `SessionNotFoundError` for an unknown (or deleted) session. Notifications from any
        runtime sharing the database wake it; it then reads the new events by sequence.
        Close it with `contextlib.aclosing` when breaking out of the loop early.
        """
        if self._closed:
            raise RuntimeError("the store is closed")
        # Publishing is not waited for: an event published here before this subscription is
        # sent first, and heard by a listener already up, before the subscription listens
        # (spec E6). A listener that is not up yet listens after it was sent: it never hears it.
        await self._live.sent()
        doorbell = self._doorbell or self._start_doorbell()
        if doorbell.up:
            await doorbell.heard_so_far(self._notify_live)

        async def read(after: int) -> list[Event]:
            try:
                return await self.read(session_id, after=after)
            except StoreUnavailableError as error:
                # The server is away (a restart, a failover, a freeze): keep the cursor and
                # read again once the listener is back (it rings) or at the next poll.
                log.warning("trimtab subscription to %r: %s; retrying", session_id, error)
                return []

        with doorbell.listeners.listening_to(session_id) as listener:
            # Ephemeral events published before the listener is up would be missed.
            await doorbell.listening(self.timeout)
            # The listener rang every subscriber as it connected, before `listening` returned:
            # `follow` drops that ring, which its first read covers. One that did not connect
            # within the timeout leaves the subscription polling, not listening: not ready.
            events = follow(
                listener,
                read,
                after,
                closed=lambda: self._closed,
                poll=_listener.SUBSCRIBE_POLL,
                ready=ready if doorbell.up else None,
            )
            async for event in events:
                yield event

    def _start_doorbell(self) -> Doorbell:
        self._doorbell = Doorbell(self._calls.dsn, self.timeout)
        return self._doorbell

    # --- sessions -------------------------------------------------------------------------

    @bounded
    async def get(self, session_id: str) -> SessionRecord:
        """The session's record; raises `SessionNotFoundError` for an unknown session."""
        async with self._calls.connection() as conn:
            row = await (await conn.execute(sql.GET, (session_id,))).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        return record_of(row)

    @bounded
    async def list_sessions(self) -> list[SessionRecord]:
        """Every session, most recently updated first."""
        async with self._calls.connection() as conn:
            rows = await (await conn.execute(sql.LIST_SESSIONS)).fetchall()
        return [record_of(row) for row in rows]

    @bounded
    async def delete(self, session_id: str) -> bool:
        """Remove a session, its log and its queued inputs; False if there was none.

        Subscribers to the session (on any runtime) are woken, and fail as for an unknown id.
        """
        async with self._calls.connection() as conn:
            return (await conn.execute(sql.DELETE, {"id": session_id})).rowcount > 0

    # --- leases ---------------------------------------------------------------------------

    @bounded
    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the lease if it is free, expired or already `owner`'s; None if another holds it.

        A new acquisition bumps the fencing token; re-acquiring one's own live lease only
        extends it, so appends in flight with the same `Lease` stay valid.
        """
        params = {"session_id": session_id, "owner": owner, "ttl": ttl}
        async with self._calls.connection() as conn:
            row = await (await conn.execute(sql.ACQUIRE, params)).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        (token,) = row
        return None if token is None else Lease(session_id=session_id, owner=owner, token=token)

    @bounded
    async def claim_lease(self, session_id: str, owner: str, fence: int, ttl: float) -> Lease | int:
        """Take the lease with the fencing token `fence` (see `Store`)."""
        params = {"session_id": session_id, "owner": owner, "fence": fence, "ttl": ttl}
        async with self._calls.connection() as conn:
            row = await (await conn.execute(sql.CLAIM_FENCED, params)).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        taken, token = row
        return token if taken is None else Lease(session_id=session_id, owner=owner, token=fence)

    @bounded
    async def renew_leases(self, owner: str, ttl: float) -> list[str]:
        """Extend every live lease `owner` holds; returns their session ids, sorted.

        A lease that has already expired is not renewed: another runtime may have read the
        session as free, so the holder must treat it as lost.
        """
        async with self._calls.connection() as conn:
            rows = await (await conn.execute(sql.RENEW, (ttl, owner))).fetchall()
        return sorted(session_id for (session_id,) in rows)

    @bounded
    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up (no-op if it was already lost or the session is gone)."""
        async with self._calls.connection() as conn:
            await conn.execute(sql.RELEASE, (lease.session_id, lease.owner, lease.token))

    # --- the inbox and snapshots ----------------------------------------------------------

    @bounded
    async def enqueue_input(self, session_id: str, prompt: str, message_id: str) -> None:
        """Queue a message for the lease holder to deliver (see `Store`)."""
        body = json.dumps({"prompt": prompt})
        async with self._calls.connection() as conn:
            try:
                await conn.execute(sql.ENQUEUE_INPUT, (session_id, message_id, body))
            except errors.ForeignKeyViolation:
                raise SessionNotFoundError(session_id) from None

    @bounded
    async def pending_inputs(self, session_id: str) -> list[tuple[str, str]]:
        """The queued `(prompt, message_id)` pairs not yet claimed, oldest first."""
        async with self._calls.connection() as conn:
            params = {"session_id": session_id}
            rows = await (await conn.execute(sql.PENDING_INPUTS, params)).fetchall()
        if not rows:
            raise SessionNotFoundError(session_id)
        return [
            (json.loads(body)["prompt"], message_id)
            for body, message_id in rows
            if body is not None
        ]

    @bounded
    async def sessions_with_inputs(self) -> set[str]:
        """The sessions with inputs pending (see `Store`)."""
        async with self._calls.connection() as conn:
            rows = await (await conn.execute(sql.SESSIONS_WITH_INPUTS)).fetchall()
        return {session_id for (session_id,) in rows}

    @bounded
    async def discard_inputs(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """Remove the named inputs still pending, in one statement (see `Store`)."""
        params = {"s": session_id, "ids": list(message_ids)}
        async with self._calls.connection() as conn:
            rows = await (await conn.execute(sql.DISCARD_INPUTS, params)).fetchall()
        if not rows:
            raise SessionNotFoundError(session_id)
        removed = {str(row[0]) for row in rows if row[0] is not None}
        return [m for m in dict.fromkeys(message_ids) if m in removed]

    @bounded
    async def rewrite_inputs(
        self, session_id: str, expected: Sequence[str], inputs: Sequence[tuple[str, str]]
    ) -> bool:
        """Reorder, reword and add pending inputs in one transaction (see `Store`)."""
        check_rewrite(expected, inputs)
        edit = json.dumps([[m, json.dumps({"prompt": p})] for p, m in inputs])
        async with self._calls.connection() as conn, conn.transaction():
            if (await conn.execute(sql.LOCK_SESSION, (session_id,))).rowcount == 0:
                raise SessionNotFoundError(session_id)
            pending = await (await conn.execute(sql.PENDING_IDS, (session_id,))).fetchall()
            if [m for (m,) in pending] != list(expected):
                return False
            params = {"s": session_id, "inputs": edit, "kept": list(expected)}
            try:
                await conn.execute(sql.REWRITE_INPUTS, params)
            except errors.UniqueViolation:
                raise ValueError("an edit of the queue adds an input queued before") from None
        return True

    @bounded
    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        """Keep the session's latest snapshot."""
        params = {"s": session_id, "n": event_count, "d": data}
        async with self._calls.connection() as conn:
            try:
                await conn.execute(sql.SAVE_SNAPSHOT, params)
            except errors.ForeignKeyViolation:
                raise SessionNotFoundError(session_id) from None

    @bounded
    async def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The latest snapshot, if any."""
        async with self._calls.connection() as conn:
            row = await (await conn.execute(sql.LOAD_SNAPSHOT, {"s": session_id})).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        return None if row[1] is None else (int(row[1]), str(row[2]))

    async def close(self) -> None:
        """Close the pool and the listener, ending subscriptions; closing twice is a no-op.

        Calls abandoned at their timeout are waited for (up to `timeout`), so that none is
        left running.
        """
        if self._closed:
            return
        await self._live.sent()
        self._closed = True
        if self._doorbell is not None:
            await self._doorbell.close(self.timeout)
        await self._calls.close()
