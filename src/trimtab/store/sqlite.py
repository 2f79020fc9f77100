"""`SqliteStore`: the default durable backend, one SQLite file shared by local processes.

Every method runs one short transaction on the stdlib `sqlite3` connection, synchronously:
it awaits nothing unless another process holds the lock it needs, so appends from concurrent
tasks of one event loop are stored in call order, and no task sees another's half-done write.
A lock held by another process is waited for `BUSY_SLICE` at a time inside SQLite (blocking
the event loop only that long), then by retrying the transaction between `asyncio.sleep`s,
until the store's `timeout`; writes that come meanwhile queue behind the waiting one, so that
call order still holds. A call that cannot get the lock in time raises `StoreUnavailableError`.

Durability (spec P2): every write commits before the method returns, and SQLite's WAL
commits are atomic, so an acknowledged event survives `kill -9` and a torn tail (a frame
written without its commit) is ignored by SQLite's recovery when the file is next opened.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from trimtab._durations import check_seconds
from trimtab._errors import LeaseLostError, SessionNotFoundError, StoreUnavailableError
from trimtab.events import Event, SessionPrunedEvent, event_from_json
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
    record_of,
    summarize,
)
from trimtab.store._checkpoints import Checkpointer
from trimtab.store._files import private_directory, private_file

__all__ = ["SqliteStore"]

T = TypeVar("T")

SCHEMA_VERSION = 5
"""Stored in `PRAGMA user_version`; bump it with a migration step when the schema changes."""

PAGE_CACHE_KIB = 128
"""SQLite's page cache per connection, in KiB."""

BUSY_SLICE = 0.02
"""Seconds SQLite itself waits for another process's lock, blocking the event loop, before the
store goes on waiting without blocking it (see the module's docstring). Covers the usual
case, a write of another process that takes well under a millisecond."""

_RETRY_DELAYS = (0.005, 0.1)
"""The first and the longest pause, in seconds, between tries of a call waiting for a lock."""

_RESTART_POLL = 0.002
"""Seconds between looks of the queued writes' drainer at whether a restart of the WAL by
the store's checkpointer is over."""

_WRITE = "BEGIN IMMEDIATE"
_READ = "BEGIN"

SUBSCRIBE_POLL = 0.1
"""Seconds between a subscriber's reads of the file, to see other processes' appends.

Appends through this store wake its subscribers at once.
"""

_SCHEMA_V1 = (
    """
    CREATE TABLE sessions (
        session_id        TEXT PRIMARY KEY,
        last_seq          INTEGER NOT NULL DEFAULT 0,
        lease_owner       TEXT,
        lease_token       INTEGER NOT NULL DEFAULT 0,
        lease_expires_at  REAL,
        summary           TEXT,
        created_at        REAL NOT NULL,
        updated_at        REAL NOT NULL
    )
    """,
    "CREATE INDEX sessions_by_update ON sessions (updated_at)",
    "CREATE INDEX sessions_by_lease_owner ON sessions (lease_owner)",
    """
    CREATE TABLE events (
        session_id  TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq         INTEGER NOT NULL,
        id          TEXT NOT NULL,
        type        TEXT NOT NULL,
        body        TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    )
    """,
    """
    CREATE TABLE inputs (
        id          INTEGER PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        prompt      TEXT NOT NULL,
        message_id  TEXT NOT NULL
    )
    """,
    "CREATE INDEX inputs_by_session ON inputs (session_id, id)",
)

_SCHEMA_V2 = (
    # Derived state, so that a session opens without replaying its whole log.
    """
    CREATE TABLE snapshots (
        session_id   TEXT PRIMARY KEY REFERENCES sessions (session_id) ON DELETE CASCADE,
        event_count  INTEGER NOT NULL,
        data         TEXT NOT NULL
    )
    """,
)

_SCHEMA_V3 = (
    # Appends are idempotent by event id; inputs stay until the message they become is stored.
    "CREATE UNIQUE INDEX events_by_id ON events (session_id, id)",
    "ALTER TABLE inputs ADD COLUMN claimed_seq INTEGER",
    "CREATE UNIQUE INDEX inputs_by_message ON inputs (session_id, message_id)",
)

_SCHEMA_V4 = (
    # The pending inputs of every session in one read (`sessions_with_inputs`).
    "CREATE INDEX inputs_pending ON inputs (session_id) WHERE claimed_seq IS NULL",
)

_SCHEMA_V5 = (
    # Who each session belongs to (its `session.start`'s owner), for a server's listings.
    "ALTER TABLE sessions ADD COLUMN owner TEXT",
)

# The lease owner is reported only while the lease is live; `?` is the current time.
_RECORD_COLUMNS = """
    session_id, created_at, updated_at, last_seq,
    CASE WHEN lease_expires_at > ? THEN lease_owner END, summary, lease_expires_at, owner
"""


class SqliteStore:
    """A `Store` in one SQLite file (WAL mode), safe to share between local processes.

    Args:
        path: The database file. If missing, it is created with mode 0600, and its missing
            parent directories with mode 0700 (an existing file or directory keeps its mode).
        timeout: Seconds a call may wait for a lock held by another process before it raises
            `StoreUnavailableError`; opening the file waits as long, then raises
            `sqlite3.OperationalError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        check_seconds("timeout", timeout)
        self.path = Path(path).expanduser()
        """Where the database lives."""
        self.timeout = timeout
        """Seconds within which every call completes or raises `StoreUnavailableError`."""
        private_directory(self.path.parent)
        # SQLite gives the -wal and -shm files the mode of the database file.
        private_file(self.path)
        self._db: sqlite3.Connection | None = _connect(self.path, timeout)
        self._checkpoints = Checkpointer(self.path, timeout=timeout)
        # Guards the connection for callers on other threads (a sync facade, `to_thread`):
        # one sqlite3 connection must not interleave two transactions.
        self._lock = threading.Lock()
        # Writes waiting for a lock (another process's, or the checkpointer's), oldest first:
        # later writes queue behind them, so that they still commit in call order. The
        # drainer runs them (`_drain`).
        self._waiting: deque[_Queued[Any]] = deque()
        self._drainer: asyncio.Task[None] | None = None
        # Whether a drainer runs, and the queue it empties, as one (callers on two threads).
        self._draining = threading.Lock()
        # What `subscribe` waits on, per session, with the loop each subscriber runs on:
        # an append may come from another thread.
        self._listeners = Listeners()

    async def _run(self, work: Callable[[sqlite3.Connection], T], begin: str = _WRITE) -> T:
        """`work` in one transaction (see `_transaction`), committed before this returns.

        Raises:
            StoreUnavailableError: Another process held the lock for `timeout` seconds.
        """
        deadline = time.monotonic() + self.timeout
        write = begin == _WRITE
        if not (write and (self._waiting or self._checkpoints.restarting.is_set())):
            try:
                return self._attempt(work, begin)
            except _Busy:
                if not write:
                    return await self._retry_read(work, deadline)
                return await self._queue(work, deadline, busy=True)
        return await self._queue(work, deadline, busy=False)

    def _attempt(self, work: Callable[[sqlite3.Connection], T], begin: str) -> T:
        with self._lock:
            if self._db is None:
                raise RuntimeError("the store is closed")
            try:
                with _transaction(self._db, begin) as db:
                    done = work(db)
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise _Busy from error
                raise
            if begin == _WRITE:
                self._checkpoints.wrote()
            return done

    async def _queue(
        self, work: Callable[[sqlite3.Connection], T], deadline: float, *, busy: bool
    ) -> T:
        """Queue a write behind those waiting for a lock; `_drain` runs it in its turn.

        `busy`: it just found the lock held, so a drainer it starts pauses before trying.
        """
        loop = asyncio.get_running_loop()
        queued = _Queued(work, loop, loop.create_future())
        with self._draining:
            self._waiting.append(queued)
            drainer = self._drainer
            if drainer is None or drainer.done() or drainer.get_loop().is_closed():
                self._drainer = loop.create_task(self._drain(busy))
        try:
            # A timeout or a cancel cancels `queued.done`, and `_drain` then skips the write.
            return await asyncio.wait_for(queued.done, deadline - time.monotonic())
        except TimeoutError:
            raise self._unavailable() from None

    async def _drain(self, busy: bool) -> None:
        """Run the queued writes in call order, each once the lock is free, back to back.

        Back to back: a queue handed from one waiting task to the next would run one write
        per turn of the event loop, and on a busy server grow faster than it empties.
        While the store's own checkpointer restarts the WAL, which holds the write lock for
        that (see `Checkpointer`), it does not try, and looks again every `_RESTART_POLL`.
        """
        delay, longest = _RETRY_DELAYS
        while True:
            with self._draining:
                if not self._waiting:
                    if self._drainer is asyncio.current_task():
                        self._drainer = None
                    return
            if busy:
                await asyncio.sleep(delay)
                delay, busy = min(2 * delay, longest), False
            queued = self._waiting[0]
            if queued.done.done():  # its caller stopped waiting
                self._waiting.popleft()
                continue
            if self._checkpoints.restarting.is_set():
                await asyncio.sleep(_RESTART_POLL)
                continue
            try:
                result = self._attempt(queued.work, _WRITE)
            except _Busy:
                busy = True
                continue
            except Exception as error:
                self._waiting.popleft()
                queued.settle(error=error)
            else:
                self._waiting.popleft()
                queued.settle(result)
            delay = _RETRY_DELAYS[0]

    async def _retry_read(self, work: Callable[[sqlite3.Connection], T], deadline: float) -> T:
        """Try a read until the lock is free, yielding to the event loop in between."""
        delay, longest = _RETRY_DELAYS
        while (left := deadline - time.monotonic()) > BUSY_SLICE:
            await asyncio.sleep(min(delay, left - BUSY_SLICE))
            delay = min(2 * delay, longest)
            try:
                return self._attempt(work, _READ)
            except _Busy:
                pass
        raise self._unavailable()

    def _unavailable(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"the database {self.path} stayed locked by another process for {self.timeout} s"
        )

    async def create(self, session_id: str, events: Sequence[Event] = ()) -> None:
        """Create a log holding `events`, in one transaction; raises `ValueError` if the id
        exists."""
        check_persistable(events)
        now = time.time()
        rows = [(session_id, n, e.id, e.type, e.model_dump_json()) for n, e in enumerate(events, 1)]

        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO sessions"
                " (session_id, created_at, updated_at, last_seq, summary, owner)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, now, now, len(rows), summarize(events), owner_of(events)),
            )
            db.executemany(
                "INSERT INTO events (session_id, seq, id, type, body) VALUES (?, ?, ?, ?, ?)",
                rows,
            )

        try:
            await self._run(insert)
        except sqlite3.IntegrityError:
            raise ValueError(f"session {session_id!r} already exists") from None

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
    ) -> int:
        """Append persisted events in order, in one transaction; returns the new event count.

        With a lease, the fencing check runs inside the same transaction as the insert, so a
        lease taken over by another runtime can never let a stale write through.
        """
        check_persistable(events)
        # Serialise before taking the write lock, to hold it as briefly as possible. Each event
        # by its own model: the same JSON as `EventAdapter`'s, without building the union's
        # schema (see `event_from_json`).
        rows = [(event.id, event.type, event.model_dump_json()) for event in events]
        claims = [
            (n, message_id) for n, e in enumerate(events, 1) if (message_id := claimed_input(e))
        ]
        summary = summarize(events)

        def insert(db: sqlite3.Connection) -> int:
            last_seq = self._fenced_last_seq(db, session_id, lease)
            if not rows:
                return last_seq
            try:
                db.executemany(
                    "INSERT INTO events (session_id, seq, id, type, body) VALUES (?, ?, ?, ?, ?)",
                    [(session_id, last_seq + n, *row) for n, row in enumerate(rows, start=1)],
                )
            except sqlite3.IntegrityError:
                raise _Repeated from None  # rolls the transaction back
            if claims:
                db.executemany(
                    "UPDATE inputs SET claimed_seq = ?"
                    " WHERE session_id = ? AND message_id = ? AND claimed_seq IS NULL",
                    [(last_seq + n, session_id, message_id) for n, message_id in claims],
                )
            last_seq += len(rows)
            db.execute(
                "UPDATE sessions SET last_seq = ?, updated_at = ?,"
                " summary = COALESCE(summary, ?) WHERE session_id = ?",
                (last_seq, time.time(), summary, session_id),
            )
            return last_seq

        def retried(db: sqlite3.Connection) -> int | None:
            last_seq = self._fenced_last_seq(db, session_id, lease)
            return last_seq if _stored(db, session_id, rows[0][0]) else None

        try:
            last_seq = await self._run(insert)
        except _Repeated:
            # An event id is in the log already: a retry when it is the batch's first (then it
            # was all stored at once), else a mistake.
            stored = await self._run(retried, _READ)
            if stored is None:
                raise ValueError(f"an event of the batch is already in {session_id!r}") from None
            return stored
        if rows:
            self._listeners.ring(session_id, last_seq)
        return last_seq

    @staticmethod
    def _fenced_last_seq(db: sqlite3.Connection, session_id: str, lease: Lease | None) -> int:
        """The session's `last_seq`, after checking that `lease` (if any) still holds."""
        row = db.execute(
            "SELECT last_seq, lease_owner, lease_token, lease_expires_at"
            " FROM sessions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        last_seq, owner, token, expires_at = row
        if lease is not None and not holds_lease(
            lease, session_id, owner=owner, token=token, expires_at=expires_at, now=time.time()
        ):
            raise LeaseLostError(
                f"lease {lease.token} of {lease.owner!r} on {session_id!r} is lost"
            )
        return int(last_seq)

    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        """The events with sequence number > `after` (1-based), oldest first."""

        # A read transaction, so that the existence check and the rows come from one snapshot.
        def select(db: sqlite3.Connection) -> list[tuple[str, str]]:
            _require(db, session_id)
            return db.execute(
                "SELECT type, body FROM events WHERE session_id = ? AND seq > ? ORDER BY seq",
                (session_id, after),
            ).fetchall()

        rows = await self._run(select, _READ)
        return [event_from_json(body, event_type) for event_type, body in rows]

    async def prune(
        self, session_id: str, marker: SessionPrunedEvent, *, lease: Lease | None
    ) -> int:
        """Replace the events from the second through the marker's position with it, in one
        transaction (see `Store`). The file does not shrink: SQLite reuses the freed pages
        for what is appended next."""
        body, position = marker.model_dump_json(), marker.data.position

        def replace(db: sqlite3.Connection) -> int:
            self._fenced_last_seq(db, session_id, lease)
            owner = db.execute(
                "SELECT lease_owner FROM sessions WHERE session_id = ?"
                " AND lease_owner IS NOT NULL AND lease_expires_at > ?",
                (session_id, time.time()),
            ).fetchone()
            at = db.execute(
                "SELECT id FROM events WHERE session_id = ? AND seq = ?", (session_id, position)
            ).fetchone()
            check_prune(
                marker,
                None if at is None else str(at[0]),
                lease=lease,
                owner=None if owner is None else str(owner[0]),
                listeners=self._listeners,
                session_id=session_id,
            )
            removed = db.execute(
                "DELETE FROM events WHERE session_id = ? AND seq BETWEEN 2 AND ?",
                (session_id, position),
            ).rowcount
            db.execute(
                "INSERT INTO events (session_id, seq, id, type, body) VALUES (?, ?, ?, ?, ?)",
                (session_id, position, marker.id, marker.type, body),
            )
            return int(removed)

        return await self._run(replace)

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        """Hand an ephemeral event to the session's subscribers in this process (see `Store`):
        other processes sharing the file see the stored events only."""
        self._listeners.post(session_id, after, event)

    async def subscribe(
        self, session_id: str, *, after: int = 0, ready: asyncio.Event | None = None
    ) -> AsyncGenerator[Event, None]:
        """The events after `after` as they are stored: the log first, then live ones, with
        this process's published ephemeral events in their places (`ready`: see `Store`).

        The iterator never ends on its own: it ends when the store is closed, and raises
        `SessionNotFoundError` for an unknown (or deleted) session. Appends through this
        store wake it at once; those of other processes within `SUBSCRIBE_POLL` seconds.
        """
        if self._db is None:
            raise RuntimeError("the store is closed")

        async def read(after: int) -> list[Event]:
            try:
                return await self.read(session_id, after=after)
            except StoreUnavailableError:
                return []  # locked for long: keep the cursor and read again at the next poll

        with self._listeners.listening_to(session_id) as listener:
            events = follow(
                listener,
                read,
                after,
                closed=lambda: self._db is None,
                poll=SUBSCRIBE_POLL,
                ready=ready,
            )
            async for event in events:
                yield event

    async def get(self, session_id: str) -> SessionRecord:
        """The session's record; raises `SessionNotFoundError` for an unknown session."""

        def select(db: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = db.execute(
                f"SELECT {_RECORD_COLUMNS} FROM sessions WHERE session_id = ?",
                (time.time(), session_id),
            ).fetchone()
            return row

        row = await self._run(select, _READ)
        if row is None:
            raise SessionNotFoundError(session_id)
        return record_of(row)

    async def list_sessions(self) -> list[SessionRecord]:
        """Every session, most recently updated first."""

        def select(db: sqlite3.Connection) -> list[tuple[object, ...]]:
            return db.execute(
                f"SELECT {_RECORD_COLUMNS} FROM sessions ORDER BY updated_at DESC, session_id DESC",
                (time.time(),),
            ).fetchall()

        return [record_of(row) for row in await self._run(select, _READ)]

    async def delete(self, session_id: str) -> bool:
        """Remove a session, its log and its queued inputs; False if there was none."""

        def delete(db: sqlite3.Connection) -> bool:
            # The foreign keys cascade to `events` and `inputs`.
            cursor = db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            return cursor.rowcount > 0

        deleted = await self._run(delete)
        self._listeners.ring(session_id)  # its subscribers fail as for an unknown session
        return deleted

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the lease if it is free, expired or already `owner`'s; None if another holds it.

        A new acquisition bumps the fencing token; re-acquiring one's own live lease only
        extends it, so appends in flight with the same `Lease` stay valid.
        """

        def take(db: sqlite3.Connection) -> int | None:
            now = time.time()
            # SET expressions all see the row as it was, so the CASE tests the old owner.
            rows = db.execute(
                """
                UPDATE sessions SET
                    lease_token = CASE WHEN lease_owner = :owner AND lease_expires_at > :now
                                       THEN lease_token ELSE lease_token + 1 END,
                    lease_owner = :owner,
                    lease_expires_at = :expires
                WHERE session_id = :session_id
                  AND (lease_owner IS NULL OR lease_owner = :owner OR lease_expires_at <= :now)
                RETURNING lease_token
                """,
                {"owner": owner, "now": now, "expires": now + ttl, "session_id": session_id},
            ).fetchall()
            if not rows:
                _require(db, session_id)
                return None
            return int(rows[0][0])

        token = await self._run(take)
        return None if token is None else Lease(session_id=session_id, owner=owner, token=token)

    async def claim_lease(self, session_id: str, owner: str, fence: int, ttl: float) -> Lease | int:
        """Take the lease with the fencing token `fence` (see `Store`)."""

        def claim(db: sqlite3.Connection) -> tuple[bool, int]:
            row = db.execute(
                "SELECT lease_token, lease_owner FROM sessions WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise SessionNotFoundError(session_id)
            token, holder = int(row[0]), row[1]
            if fence < token or (fence == token and holder != owner):
                return False, token
            db.execute(
                "UPDATE sessions SET lease_token = ?, lease_owner = ?, lease_expires_at = ?"
                " WHERE session_id = ?",
                (fence, owner, time.time() + ttl, session_id),
            )
            return True, fence

        claimed, token = await self._run(claim)
        return Lease(session_id=session_id, owner=owner, token=fence) if claimed else token

    async def renew_leases(self, owner: str, ttl: float) -> list[str]:
        """Extend every live lease `owner` holds; returns their session ids, sorted.

        A lease that has already expired is not renewed: another runtime may have read the
        session as free, so the holder must treat it as lost.
        """

        def renew(db: sqlite3.Connection) -> list[tuple[str]]:
            now = time.time()
            return db.execute(
                "UPDATE sessions SET lease_expires_at = ?"
                " WHERE lease_owner = ? AND lease_expires_at > ? RETURNING session_id",
                (now + ttl, owner, now),
            ).fetchall()

        return sorted(session_id for (session_id,) in await self._run(renew))

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up (no-op if it was already lost or the session is gone)."""

        def release(db: sqlite3.Connection) -> None:
            # The token stays: the next acquisition bumps it, fencing out this holder.
            db.execute(
                "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL"
                " WHERE session_id = ? AND lease_owner = ? AND lease_token = ?",
                (lease.session_id, lease.owner, lease.token),
            )

        await self._run(release)

    async def enqueue_input(self, session_id: str, prompt: str, message_id: str) -> None:
        """Queue a message for the lease holder to deliver (see `Store`)."""

        def insert(db: sqlite3.Connection) -> None:
            _require(db, session_id)
            db.execute(
                "INSERT OR IGNORE INTO inputs (session_id, prompt, message_id) VALUES (?, ?, ?)",
                (session_id, prompt, message_id),
            )

        await self._run(insert)

    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        """Keep the session's latest snapshot."""

        def save(db: sqlite3.Connection) -> None:
            _require(db, session_id)
            db.execute(
                "INSERT OR REPLACE INTO snapshots (session_id, event_count, data) VALUES (?, ?, ?)",
                (session_id, event_count, data),
            )

        await self._run(save)

    async def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The latest snapshot, if any."""

        def load(db: sqlite3.Connection) -> tuple[int, str] | None:
            _require(db, session_id)
            row: tuple[int, str] | None = db.execute(
                "SELECT event_count, data FROM snapshots WHERE session_id = ?", (session_id,)
            ).fetchone()
            return row

        return await self._run(load, _READ)

    async def pending_inputs(self, session_id: str) -> list[tuple[str, str]]:
        """The queued `(prompt, message_id)` pairs not yet claimed, oldest first."""

        def select(db: sqlite3.Connection) -> list[tuple[str, str]]:
            _require(db, session_id)
            return db.execute(
                "SELECT prompt, message_id FROM inputs"
                " WHERE session_id = ? AND claimed_seq IS NULL ORDER BY id",
                (session_id,),
            ).fetchall()

        return [(prompt, message_id) for prompt, message_id in await self._run(select, _READ)]

    async def sessions_with_inputs(self) -> set[str]:
        """The sessions with inputs pending (see `Store`), by the index of pending inputs."""

        def select(db: sqlite3.Connection) -> set[str]:
            rows = db.execute("SELECT DISTINCT session_id FROM inputs WHERE claimed_seq IS NULL")
            return {session_id for (session_id,) in rows}

        return await self._run(select, _READ)

    async def discard_inputs(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """Remove the named inputs still pending, in one transaction (see `Store`)."""

        def delete(db: sqlite3.Connection) -> list[str]:
            _require(db, session_id)
            return [
                m
                for m in dict.fromkeys(message_ids)
                if db.execute(
                    "DELETE FROM inputs"
                    " WHERE session_id = ? AND message_id = ? AND claimed_seq IS NULL",
                    (session_id, m),
                ).rowcount
            ]

        return await self._run(delete)

    async def rewrite_inputs(
        self, session_id: str, expected: Sequence[str], inputs: Sequence[tuple[str, str]]
    ) -> bool:
        """Reorder, reword and add pending inputs in one transaction (see `Store`). Each
        input keeps its row, renumbered past every input so far in its new order."""
        check_rewrite(expected, inputs)

        def rewrite(db: sqlite3.Connection) -> bool:
            _require(db, session_id)
            pending = db.execute(
                "SELECT message_id FROM inputs"
                " WHERE session_id = ? AND claimed_seq IS NULL ORDER BY id",
                (session_id,),
            ).fetchall()
            if [m for (m,) in pending] != list(expected):
                return False
            (top,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM inputs").fetchone()
            kept = set(expected)
            try:
                for n, (prompt, message_id) in enumerate(inputs, start=top + 1):
                    if message_id in kept:
                        db.execute(
                            "UPDATE inputs SET id = ?, prompt = ?"
                            " WHERE session_id = ? AND message_id = ?",
                            (n, prompt, session_id, message_id),
                        )
                    else:
                        db.execute(
                            "INSERT INTO inputs (id, session_id, prompt, message_id)"
                            " VALUES (?, ?, ?, ?)",
                            (n, session_id, prompt, message_id),
                        )
            except sqlite3.IntegrityError:
                raise ValueError("an edit of the queue adds an input queued before") from None
            return True

        return await self._run(rewrite)

    async def close(self) -> None:
        """Close the connection and end subscriptions; the store is unusable afterwards.

        Closing twice is a no-op.
        """
        # On a thread: both steps may wait on the disk or on another process, and the
        # loop's other tasks (another client's sessions) must not wait with them (W5).
        await asyncio.to_thread(self._close_files)

    def _close_files(self) -> None:
        # The checkpointer first: it may be running a checkpoint, which it finishes (up to
        # `timeout`). Then the connection, whose close, as the file's last, copies the WAL.
        self._checkpoints.close()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
        # Only now, from this thread: a subscriber woken before would find the store open
        # and wait again (a `close` cancelled while it waits still gets here).
        self._listeners.ring_all()


def _connect(path: Path, timeout: float) -> sqlite3.Connection:
    """Open the database, set the connection up and bring its schema up to date.

    Opening waits up to `timeout` for another process's lock, blocking; every later call of
    the connection only `BUSY_SLICE` (see `SqliteStore._run`).
    """
    # isolation_level=None: the sqlite3 module opens no implicit transactions; every
    # transaction is one explicit BEGIN ... COMMIT in `_transaction`.
    # timeout is SQLite's busy_timeout: two processes share the file by waiting for the lock.
    # check_same_thread=False: the store's own lock serialises access instead.
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        # WAL: readers never block the writer, and a commit is one atomic append to the log.
        _set_wal(db, timeout)
        # NORMAL skips the fsync per commit. In WAL mode that is still durable against a
        # process crash or kill -9 (the committed frames are in the OS page cache), which is
        # the contract (spec P2); only a power loss or OS crash may drop the last commits,
        # never corrupt the file. FULL costs ~18x in single-event appends (scale-out.md 3.2).
        db.execute("PRAGMA synchronous = NORMAL")
        # Off by default in SQLite; needed for ON DELETE CASCADE.
        db.execute("PRAGMA foreign_keys = ON")
        # Reads go by index to a session's tail and appends to the WAL: a small page cache
        # serves them (docs/performance.md, a long-running server's memory).
        db.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
        # Commits never checkpoint the WAL (SQLite's default, on the event loop's thread):
        # the store's `Checkpointer` does, on a thread of its own (spec W5).
        db.execute("PRAGMA wal_autocheckpoint = 0")
        _migrate(db)
        db.execute(f"PRAGMA busy_timeout = {round(BUSY_SLICE * 1000)}")
    except BaseException:
        db.close()
        raise
    return db


def _set_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch to WAL. Two processes opening a new file at once can make the switch fail with
    "database is locked" without SQLite's busy handler being called, so retry it here."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _migrate(db: sqlite3.Connection) -> None:
    """Create the schema in a fresh file; refuse a file written by a newer trimtab."""
    # IMMEDIATE: two processes opening a new file at once must not both create the tables.
    with _transaction(db, "BEGIN IMMEDIATE"):
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"the database has schema version {version}, newer than this trimtab's"
                f" {SCHEMA_VERSION}: upgrade trimtab"
            )
        for number, statements in enumerate(
            (_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3, _SCHEMA_V4, _SCHEMA_V5), start=1
        ):
            if version < number:
                for statement in statements:
                    db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


@contextmanager
def _transaction(db: sqlite3.Connection, begin: str) -> Iterator[sqlite3.Connection]:
    """One transaction, committed before the caller goes on, rolled back on any error.

    Writes use `BEGIN IMMEDIATE`: the write lock is taken up front, so two processes never
    read the same `last_seq` and interleave a session's sequence, and a busy database is
    waited for at BEGIN rather than failing halfway through. Reads use a
    plain `BEGIN`, so that all their statements see one snapshot.
    """
    db.execute(begin)
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


@dataclass(frozen=True)
class _Queued(Generic[T]):
    """A write waiting in `SqliteStore._waiting`, and how to tell its caller it ran: on the
    caller's event loop, which may be another thread's."""

    work: Callable[[sqlite3.Connection], T]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[T]

    def settle(self, result: T | None = None, *, error: Exception | None = None) -> None:
        """Hand the caller `result`, or raise `error` in it (called on the drainer's loop)."""

        def settle() -> None:
            if self.done.done():  # (cancelled meanwhile)
                return
            if error is not None:
                self.done.set_exception(error)
            else:
                self.done.set_result(cast(T, result))

        if asyncio.get_running_loop() is self.loop:
            settle()
        elif not self.loop.is_closed():  # (else nobody waits there any more)
            self.loop.call_soon_threadsafe(settle)


class _Repeated(Exception):
    """An append met an event id already in the log."""


class _Busy(Exception):
    """Another process held the lock a transaction needed (for `BUSY_SLICE`)."""


def _stored(db: sqlite3.Connection, session_id: str, event_id: str) -> bool:
    """Whether the event is in the session's log already (the append is a retry)."""
    found = db.execute(
        "SELECT 1 FROM events WHERE session_id = ? AND id = ?", (session_id, event_id)
    ).fetchone()
    return found is not None


def _require(db: sqlite3.Connection, session_id: str) -> None:
    """Raise `SessionNotFoundError` unless the session exists."""
    if db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFoundError(session_id)
