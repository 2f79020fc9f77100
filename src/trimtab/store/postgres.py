"""`PostgresStore`: the scale-out backend, one PostgreSQL database shared by many runtimes.

The semantics are `SqliteStore`'s (the conformance suite runs against both); what differs is
how they hold across hosts (docs: scale-out.md, section 4):

- An append is one statement: it bumps the session's `last_seq` (the row lock serialises the
  session's appenders, so sequence numbers are gapless and in commit order), checks the lease
  and that the batch follows the log's last event in the same `WHERE` (fencing), inserts the
  events and rings the doorbell. An append that need not be durable (spec P5) commits with
  `synchronous_commit` off, set in that statement: commits reach the disk in their order, so a
  crash of the server loses at most a suffix of those, which the tail check then reveals.
- Leases live on the database clock (`now()`), never on the hosts' clocks.
- Fan-out: every append does `pg_notify('trimtab_events', '<session_id>:<last seq>')`. The
  notification is only a doorbell; subscribers read the events from the table by sequence, so
  a lost notification (a dropped listener connection) delays delivery but loses nothing.
- Ephemeral events (deltas, idle) are never stored: `publish` sends them whole with
  `pg_notify('trimtab_live', ...)`, and each runtime's listener hands them to its subscribers,
  placed after the stored events they followed. The sending is not waited for: the events
  published while one batch travels go in the next, one statement for them all, and an append
  sends those still queued in its own statement, before its doorbell (after waiting for the
  batch on its way), so that they arrive before it.
- Inputs queued for a session's lease holder wait in `session_inputs`, until the append of
  the `user.message` each becomes claims it.

Events are stored as their JSON (`event.model_dump_json()`, read by `event_from_json`) in a
`json` column, not `jsonb`: `jsonb` rewrites the document (it reorders keys, normalises
numbers, refuses `\\u0000`), and the log must give back exactly what was appended; `json`
still allows `payload->'data'` queries.

Connections come from a `psycopg_pool.AsyncConnectionPool` in autocommit mode, opened on first
use. A connection is checked when taken from the pool (or from the store's spares, connections
back from a call in good order), so after a server restart the next call reconnects instead
of failing on a dead socket.

Every call is bounded by the store's `timeout` (see `Store`): connecting, waiting for a pooled
connection and each statement (`statement_timeout`, `lock_timeout`, a little under the store's
timeout, so that a statement held up by a lock ends with the server's reason) are bounded
each, and the whole call runs in a task that the caller stops waiting for at `timeout`, so
that a server that accepted the connection and then stopped answering (a frozen host) cannot
hang it either. A call that fails there, or while the server goes away, raises
`StoreUnavailableError`; whether its write committed is then unknown, as with any database
client (an append can simply be retried: it is idempotent by event id). Its abandoned task is
cancelled: psycopg then cancels the statement in the server, or closes the connection if the
server does not answer (within 10 s), and the pool never hands out a connection returned in
the middle of a statement.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import select
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, Concatenate, Literal, ParamSpec, TypeAlias, TypeVar

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolClosed

from trimtab._durations import check_seconds
from trimtab._errors import LeaseLostError, SessionNotFoundError, StoreUnavailableError
from trimtab.events import Event, event_from_json, new_id
from trimtab.store._base import (
    DEFAULT_TIMEOUT,
    Lease,
    Listeners,
    SessionRecord,
    check_persistable,
    claimed_input,
    follow,
    holds_lease,
    record_of,
    summarize,
)

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)

CHANNEL = "trimtab_events"
"""The doorbell channel. Payload: `<session_id>:<last seq>` (0 when the session was deleted)."""

LIVE_CHANNEL = "trimtab_live"
"""The ephemeral events' channel. Payload: `["<session_id>", <after>]`, a newline, the event."""

_NOTIFY_LIMIT = 8000
"""PostgreSQL's limit on a NOTIFY payload, in bytes."""

SUBSCRIBE_POLL = 5.0
"""Seconds a subscriber waits for the doorbell before it reads the table anyway.

Only a safety net: NOTIFY is reliable while the listener is connected, and every subscriber
re-reads whenever the listener (re)connects.
"""

SERVER_TIMEOUT_SHARE = 0.9
"""The share of the store's timeout the server's `statement_timeout` and `lock_timeout` get."""

_MIGRATION_LOCK = 0x7472696D746162
"""`pg_advisory_xact_lock` key ("trimtab" in ASCII): one migrating runtime at a time."""

_Connection: TypeAlias = psycopg.AsyncConnection[tuple[Any, ...]]
_Cursor: TypeAlias = psycopg.AsyncCursor[tuple[Any, ...]]


class _PooledConnection(_Connection):
    """A pooled connection, which keeps one cursor for the store's appends and notifications.

    `execute` makes a cursor per statement, which looks up the dumpers of its parameters'
    types again: ~10 µs of CPU per statement. These statements return one short row, so the
    cursor holding on to its last result keeps nothing worth freeing.
    """

    _writes: _Cursor | None = None

    @property
    def writes(self) -> _Cursor:
        """The cursor of the appends and notifications (one statement at a time, as the
        connection itself)."""
        if self._writes is None:
            self._writes = self.cursor()
        return self._writes


_Pool: TypeAlias = AsyncConnectionPool[_PooledConnection]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# Versioned schema: version n is _MIGRATIONS[n - 1]. Append a script; never edit one.
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        session_id        text COLLATE "C" PRIMARY KEY,  -- byte order, like SQLite and memory
        last_seq          bigint      NOT NULL DEFAULT 0,  -- the row lock serialises appends
        lease_owner       text,
        lease_token       bigint      NOT NULL DEFAULT 0,  -- fencing token, +1 per acquisition
        lease_expires_at  timestamptz,
        summary           text,
        created_at        timestamptz NOT NULL DEFAULT now(),
        updated_at        timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX sessions_by_update ON sessions (updated_at);
    CREATE INDEX sessions_by_lease_owner ON sessions (lease_owner) WHERE lease_owner IS NOT NULL;

    CREATE TABLE session_events (
        session_id   text COLLATE "C" NOT NULL REFERENCES sessions ON DELETE CASCADE,
        seq          bigint NOT NULL,
        id           text   NOT NULL,
        type         text   NOT NULL,
        payload      json   NOT NULL,
        idem_key     text,               -- client message id, tool call id: dedups retries
        lease_token  bigint,             -- the lease that wrote it (audit)
        created_at   timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (session_id, seq)
    );
    CREATE UNIQUE INDEX session_events_idem_key
        ON session_events (session_id, idem_key) WHERE idem_key IS NOT NULL;

    CREATE TABLE session_inputs (
        id          bigserial PRIMARY KEY,
        session_id  text COLLATE "C" NOT NULL REFERENCES sessions ON DELETE CASCADE,
        message_id  text NOT NULL,
        body        json NOT NULL,       -- {"prompt": ...}: json, as text refuses NUL
        created_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX session_inputs_by_session ON session_inputs (session_id, id);
    """,
    # 2: derived state, so that a session opens without replaying its whole log.
    """
    CREATE TABLE session_snapshots (
        session_id   text COLLATE "C" PRIMARY KEY REFERENCES sessions ON DELETE CASCADE,
        event_count  bigint NOT NULL,
        data         json NOT NULL
    );
    """,
    # 3: appends idempotent by event id; inputs stay until the message they become is stored.
    """
    CREATE UNIQUE INDEX session_events_by_id ON session_events (session_id, id);
    ALTER TABLE session_events DROP COLUMN idem_key;
    ALTER TABLE session_inputs ADD COLUMN claimed_seq bigint;
    CREATE UNIQUE INDEX session_inputs_by_message ON session_inputs (session_id, message_id);
    CREATE INDEX session_inputs_pending ON session_inputs (session_id, id)
        WHERE claimed_seq IS NULL;
    """,
)

# The fenced append (scale-out.md 4.3). With no lease (`token` NULL) it is unfenced. It stores
# nothing, and returns no row, when the session is unknown, the lease is not the session's
# current live one, the batch's first event is already in the log (the batch is a retry), or
# the batch follows an event (`parent`, leased appends only) that is not the log's last: a
# crash of the server lost appends this runtime made (spec P5). A user message claims the
# queued input it delivers, in the same statement. `sync` is the commit's
# `synchronous_commit`: 'off' for an append that need not wait for the disk, else the
# connection's own setting (set_config's local value is read at the commit, which ends the
# statement's own transaction). The ephemeral events published before the append and not sent
# yet (`live`) go in the same statement, before its doorbell: the aggregate over them is done
# before the join yields the row whose select list rings it. Those that follow events of this
# batch (`carried`, `CarriesLive`) are sent by the select list itself, before the doorbell,
# so only when the batch is stored: a listener reads the events they follow first.
#
# The batch (`events`: `[id, type, payload, claimed message id]` per event) and `live` come as
# one JSON text each, not as arrays: psycopg dumps a list element by element in Python, which
# cost more of this process's CPU than the rest of the statement. Each payload travels as a
# JSON string, so that `->>` gives back its exact text (a nested value would be re-read by the
# server, which refuses `\u0000` in it).
_APPEND = f"""
    WITH new AS (
        SELECT e->>0 AS id, e->>1 AS type, (e->>2)::json AS payload, e->>3 AS message_id, n
        FROM json_array_elements(%(events)s::json) WITH ORDINALITY AS batch (e, n)
    ),
    session AS (
        UPDATE sessions
        SET last_seq = last_seq + %(count)s,
            updated_at = now(),
            summary = COALESCE(summary, %(summary)s)
        WHERE session_id = %(session_id)s
          AND (%(token)s::bigint IS NULL
               OR (%(lease_session)s = session_id
                   AND lease_owner = %(owner)s
                   AND lease_token = %(token)s
                   AND lease_expires_at > now()))
          AND NOT EXISTS (
              SELECT FROM session_events
              WHERE session_id = %(session_id)s AND id = %(first_id)s)
          AND (%(token)s::bigint IS NULL OR %(parent)s::text IS NULL OR EXISTS (
              SELECT FROM session_events
              WHERE session_id = %(session_id)s AND seq = sessions.last_seq
                AND id = %(parent)s))
        RETURNING last_seq
    ),
    claimed AS (
        UPDATE session_inputs i SET claimed_seq = session.last_seq - %(count)s + new.n
        FROM session, new
        WHERE i.session_id = %(session_id)s AND i.message_id = new.message_id
          AND i.claimed_seq IS NULL
    ),
    stored AS (
        INSERT INTO session_events (session_id, seq, id, type, payload, lease_token)
        SELECT %(session_id)s, session.last_seq - %(count)s + new.n,
               new.id, new.type, new.payload, %(token)s
        FROM session, new
    )
    SELECT last_seq,
           (SELECT count(pg_notify('{LIVE_CHANNEL}', payload))
            FROM json_array_elements_text(%(carried)s::json) AS payload),
           pg_notify('{CHANNEL}', %(session_id)s || ':' || last_seq),
           set_config('synchronous_commit',
                      COALESCE(%(sync)s, current_setting('synchronous_commit')), true)
    FROM session,
         (SELECT count(pg_notify('{LIVE_CHANNEL}', payload))
          FROM json_array_elements_text(%(live)s::json) AS payload) AS live
"""

# Why an append stored nothing (or, for an empty batch, the count it returns).
_APPEND_STATE = """
    SELECT last_seq, lease_owner, lease_token,
           extract(epoch FROM lease_expires_at)::float8, extract(epoch FROM now())::float8,
           EXISTS (SELECT FROM session_events e
                   WHERE e.session_id = s.session_id AND e.id = %(first_id)s),
           (SELECT e.id FROM session_events e
            WHERE e.session_id = s.session_id AND e.seq = s.last_seq)
    FROM sessions s
    WHERE session_id = %(session_id)s
"""

# The lease owner is reported only while the lease is live.
_RECORD_COLUMNS = """
    session_id, created_at, updated_at, last_seq,
    CASE WHEN lease_expires_at > now() THEN lease_owner END, summary, lease_expires_at
"""

# One row per session id: NULL when another runtime holds the lease; no row for an unknown
# session (the outer SELECT reads the snapshot from before the UPDATE).
_ACQUIRE = """
    WITH taken AS (
        UPDATE sessions SET
            -- SET expressions all see the old row, so the CASE tests the previous owner.
            lease_token = CASE WHEN lease_owner = %(owner)s AND lease_expires_at > now()
                               THEN lease_token ELSE lease_token + 1 END,
            lease_owner = %(owner)s,
            lease_expires_at = now() + make_interval(secs => %(ttl)s)
        WHERE session_id = %(session_id)s
          AND (lease_owner IS NULL OR lease_owner = %(owner)s OR lease_expires_at <= now())
        RETURNING lease_token
    )
    SELECT (SELECT lease_token FROM taken) FROM sessions WHERE session_id = %(session_id)s
"""

# An engine's claim (see `Store.claim_lease`): the outer SELECT reads the row as it was
# before the update, so a refused claim still learns the token it was refused by.
_CLAIM_FENCED = """
    WITH taken AS (
        UPDATE sessions SET
            lease_token = %(fence)s,
            lease_owner = %(owner)s,
            lease_expires_at = now() + make_interval(secs => %(ttl)s)
        WHERE session_id = %(session_id)s
          AND (lease_token < %(fence)s
               OR (lease_token = %(fence)s AND lease_owner IS NOT DISTINCT FROM %(owner)s))
        RETURNING lease_token
    )
    SELECT (SELECT lease_token FROM taken), lease_token FROM sessions
    WHERE session_id = %(session_id)s
"""

# The least recently updated session with pending input and no live lease, locked so that
# concurrent claimers skip it rather than wait (scale-out.md 4.4).
_CLAIM = """
    WITH candidate AS (
        SELECT s.session_id FROM sessions s
        WHERE EXISTS (SELECT FROM session_inputs i
                      WHERE i.session_id = s.session_id AND i.claimed_seq IS NULL)
          AND (s.lease_owner IS NULL OR s.lease_expires_at <= now())
        ORDER BY s.updated_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    UPDATE sessions s SET
        lease_owner = %(owner)s,
        lease_token = s.lease_token + 1,
        lease_expires_at = now() + make_interval(secs => %(ttl)s)
    FROM candidate
    WHERE s.session_id = candidate.session_id
    RETURNING s.session_id, s.lease_token
"""

# No row: unknown session. One row of NULL: nothing removed. Else the ids removed.
_DISCARD_INPUTS = """
    WITH gone AS (
        DELETE FROM session_inputs
        WHERE session_id = %(s)s AND message_id = ANY(%(ids)s) AND claimed_seq IS NULL
        RETURNING message_id
    )
    SELECT g.message_id FROM sessions s LEFT JOIN gone g ON true WHERE s.session_id = %(s)s
"""

# No row: unknown session. One row of NULLs: nothing pending. Else the inputs, oldest first.
_PENDING_INPUTS = """
    SELECT i.body::text, i.message_id
    FROM sessions s
    LEFT JOIN session_inputs i ON i.session_id = s.session_id AND i.claimed_seq IS NULL
    WHERE s.session_id = %(session_id)s
    ORDER BY i.id
"""


# No row: unknown session. One row with a NULL payload: no events after the cursor.
_READ = """
    SELECT e.type, e.payload::text
    FROM sessions s LEFT JOIN session_events e ON e.session_id = s.session_id AND e.seq > %s
    WHERE s.session_id = %s
    ORDER BY e.seq
"""


def _bounded(
    method: Callable[Concatenate[PostgresStore, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[PostgresStore, _P], Coroutine[Any, Any, _R]]:
    """Make a store call end within the store's `timeout` (see the module's docstring)."""

    @functools.wraps(method)
    async def bounded(self: PostgresStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        what = method.__name__.lstrip("_")
        return await self._within_timeout(what, method(self, *args, **kwargs))

    return bounded


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
        self._dsn = dsn
        self._max_connections = max_connections
        self.timeout = timeout
        """Seconds within which every call completes or raises `StoreUnavailableError`."""
        self._pool: _Pool | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._append_order = _KeyedLock()
        self._doorbell: _Doorbell | None = None
        self._abandoned: set[asyncio.Task[Any]] = set()
        """Calls the caller stopped waiting for, until their cancellation is done."""
        self._live: list[str] = []
        """Ephemeral events' payloads published and not yet being sent."""
        self._live_queued: asyncio.Future[None] | None = None
        """Done once `_live` is sent (or given up on)."""
        self._live_sending: asyncio.Future[None] | None = None
        """Done once the batch on its way is sent (or given up on)."""
        self._live_sender: asyncio.Task[None] | None = None
        self._spare: list[_PooledConnection] = []
        """Connections back from a call in good order, kept for the next call rather than
        returned to the pool, whose checkout and return cost ~25 µs of CPU a statement."""
        self._waiting = 0
        """Calls waiting for the pool: a connection back from a call goes to them."""

    # --- connections ----------------------------------------------------------------------

    async def _within_timeout(self, what: str, work: Coroutine[Any, Any, _R]) -> _R:
        """The result of `work`, run in a task of its own so that the caller can stop waiting
        for it at `timeout` whatever it waits for; a server error that leaves the outcome
        unknown becomes `StoreUnavailableError`.

        The task hands its outcome over itself (`_deliver`), so that the caller resumes in the
        event loop's next pass: waiting for the task with `asyncio.wait` takes two more (its
        done callback, then the waiter's), at every statement.
        """
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[_R] = loop.create_future()
        task = loop.create_task(_deliver(work, outcome))
        timer = loop.call_later(self.timeout, _give_up, outcome)
        try:
            return await outcome
        except _NoAnswer:
            raise StoreUnavailableError(
                f"{what}: no answer from the PostgreSQL server within {self.timeout} s"
            ) from None
        except psycopg.OperationalError as error:
            raise StoreUnavailableError(f"{what}: {error}") from error
        finally:
            timer.cancel()
            if not task.done():  # timed out, or the caller was cancelled
                self._abandon(task)

    def _abandon(self, task: asyncio.Task[Any]) -> None:
        """Cancel a call nobody waits for any more, keeping it until it is done: psycopg may
        take a while to cancel its statement in a server that does not answer."""
        task.cancel()
        self._abandoned.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._abandoned.discard(task)
            if not task.cancelled():
                task.exception()  # seen: not reported as "never retrieved"

        task.add_done_callback(done)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[_PooledConnection]:
        """A pooled autocommit connection; raises `RuntimeError` once the store is closed.

        Taken and returned with `getconn` and `putconn`: `pool.connection()` also ends the
        connection's transaction, of which an autocommit connection has none (`putconn`
        resets one left open by an error, or closes one left in the middle of a statement).
        One back in good order is kept as a spare for the next call instead, unless a call
        waits for the pool.
        """
        pool = self._pool or await self._open()
        conn = await self._spare_connection(pool)
        if conn is None:
            self._waiting += 1
            try:
                conn = await pool.getconn()
            except PoolClosed:
                raise RuntimeError("the store is closed") from None
            finally:
                self._waiting -= 1
        try:
            yield conn
        finally:
            idle = conn.pgconn.transaction_status == TransactionStatus.IDLE
            if idle and not self._waiting and not self._closed:
                self._spare.append(conn)
            else:  # someone waits for the pool, or closing, or left in a statement
                await pool.putconn(conn)

    async def _spare_connection(self, pool: _Pool) -> _PooledConnection | None:
        """A spare connection, checked as the pool checks one (`_check_connection`)."""
        while self._spare:
            conn = self._spare.pop()
            if not conn.closed and not _readable(conn.fileno()):
                return conn
            await pool.putconn(conn)  # the server went away, or wrote: the pool checks it
        return None

    async def _open(self) -> _Pool:
        """Migrate the schema and open the pool, once; a failed attempt is retried next call."""
        async with self._opening:
            if self._closed:
                raise RuntimeError("the store is closed")
            if self._pool is None:
                options = _connect_options(self._dsn, self.timeout)
                # A direct first connection: a wrong DSN or a server that is down fails here
                # at once with its own error, rather than as a pool timeout.
                conn = await psycopg.AsyncConnection.connect(self._dsn, **options)
                async with conn:
                    await _migrate(conn)
                pool: _Pool = AsyncConnectionPool(
                    self._dsn,
                    connection_class=_PooledConnection,
                    min_size=1,
                    max_size=self._max_connections,
                    kwargs=options,
                    configure=self._configure,
                    check=_check_connection,
                    timeout=self.timeout,
                    open=False,
                    name="trimtab",
                )
                await pool.open(wait=False)
                self._pool = pool
            return self._pool

    async def _configure(self, conn: _Connection) -> None:
        """Bound every statement of a new pooled connection in the server too."""
        limit = str(round(self.timeout * SERVER_TIMEOUT_SHARE * 1000))  # milliseconds
        await conn.execute(
            "SELECT set_config('statement_timeout', %(ms)s, false),"
            " set_config('lock_timeout', %(ms)s, false)",
            {"ms": limit},
        )

    # --- the log --------------------------------------------------------------------------

    @_bounded
    async def create(self, session_id: str, events: Sequence[Event] = ()) -> None:
        """Create a log holding `events`, in one transaction; raises `ValueError` if the id
        exists."""
        check_persistable(events)
        async with self._connection() as conn:
            try:
                async with conn.transaction():
                    await conn.execute(
                        "INSERT INTO sessions (session_id) VALUES (%s)", (session_id,)
                    )
                    if events:
                        await conn.execute(_APPEND, _append_params(session_id, events, None))
            except errors.UniqueViolation:
                raise ValueError(f"session {session_id!r} already exists") from None

    @_bounded
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
        `LeaseLostError`: the server lost the last appends in a crash (spec P5), so this
        runtime's view of the log is no longer the log.

        `durable=False` commits with `synchronous_commit` off: no wait for the WAL flush.
        `live` is published in the same statement (see `CarriesLive`).
        """
        check_persistable(events)
        if not events:
            await self._live_sent()
            async with self._append_order.hold(session_id):
                return await self._append_state(session_id, lease, None, stored_nothing=False)
        params = _append_params(session_id, events, lease, durable)
        if carried := [p for n, e in live if (p := _live_payload(session_id, e, n))]:
            params["carried"] = _json_text(carried)
        queued, taken = await self._take_live()
        if queued:
            params["live"] = _json_text(queued)
        try:
            async with self._append_order.hold(session_id):
                conflict = False
                try:
                    async with self._connection() as conn:
                        row = await (await conn.writes.execute(_APPEND, params)).fetchone()
                except errors.UniqueViolation as error:
                    # Only a concurrent append of the same batch (from another store) gets here.
                    if error.diag.constraint_name != "session_events_by_id":
                        raise
                    row, conflict = None, True
        finally:
            if taken is not None and not taken.done():
                taken.set_result(None)  # sent with the append, or given up on with it
        if row is None:
            return await self._append_state(
                session_id, lease, events[0], stored_nothing=True, conflict=conflict
            )
        return int(row[0])

    async def _append_state(
        self,
        session_id: str,
        lease: Lease | None,
        first: Event | None,
        *,
        stored_nothing: bool,
        conflict: bool = False,
    ) -> int:
        """The event count after the fencing check, or the error an append that stored nothing
        (`stored_nothing`) has to raise; a batch stored already is no error."""
        first_id = first.id if first else None
        async with self._connection() as conn:
            cursor = await conn.execute(
                _APPEND_STATE, {"session_id": session_id, "first_id": first_id}
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
        if stored_nothing and not duplicate and lease is not None and first is not None:
            if first.parent_id is not None and first.parent_id != last_id:
                raise LeaseLostError(
                    f"the log of {session_id!r} no longer ends with the events this runtime"
                    f" stored (it ends at event {last_seq}): the database lost its last"
                    " appends in a crash; resume the session to recover it (spec P5)"
                )
        if stored_nothing and not duplicate:
            if conflict:
                raise ValueError(f"an event of the batch is already in {session_id!r}")
            # Neither lease nor retry explains it: the session was missing when the append
            # ran (it has been created again since).
            raise SessionNotFoundError(session_id)
        return int(last_seq)

    @_bounded
    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        """The events with sequence number > `after` (1-based), oldest first.

        Read after this store's appends to the session, those whose caller stopped waiting
        included: one given up on may still land (a frozen server that wakes), and a session
        catching up with its log must see it before it appends again (E3)."""
        async with self._append_order.hold(session_id), self._connection() as conn:
            rows = await (await conn.execute(_READ, (after, session_id))).fetchall()
        if not rows:
            raise SessionNotFoundError(session_id)
        return [event_from_json(payload, kind) for kind, payload in rows if payload is not None]

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        """Hand an ephemeral event to the session's subscribers in every runtime sharing the
        database (see `Store`), through `NOTIFY` on the live channel.

        Returns before it is sent: a turn does not wait a round trip per delta, and the
        events published meanwhile share one (see the module's docstring).

        NOTIFY payloads are limited to 8000 bytes: a larger event (a long delta) is not sent;
        the stored message that follows it carries its text anyway.
        """
        if self._closed:
            raise RuntimeError("the store is closed")
        payload = _live_payload(session_id, event, after)
        if payload is None:
            return
        loop = asyncio.get_running_loop()
        self._live.append(payload)
        if self._live_queued is None:
            self._live_queued = loop.create_future()
        if self._live_sender is None or self._live_sender.done():
            self._live_sender = loop.create_task(self._send_live())

    async def _send_live(self) -> None:
        # One turn of the event loop first: an append called right after the publish (its
        # task starts after this one) takes the events into its own statement instead.
        await asyncio.sleep(0)
        try:
            while self._live:
                payloads, self._live = self._live, []
                sent, self._live_queued = self._live_queued, None
                self._live_sending = sent
                try:
                    await self._notify_all(LIVE_CHANNEL, payloads)
                except (StoreUnavailableError, psycopg.Error, RuntimeError) as error:
                    # RuntimeError: the store was closed meanwhile.
                    log.warning(
                        "trimtab could not publish %d live events: %s", len(payloads), error
                    )
                finally:
                    if sent is not None and not sent.done():
                        sent.set_result(None)
        finally:
            # Only when cancelled (the event loop is closing) is anything left: let no append
            # wait for it.
            queued, self._live_queued, self._live = self._live_queued, None, []
            if queued is not None and not queued.done():
                queued.set_result(None)

    async def _take_live(self) -> tuple[list[str], asyncio.Future[None] | None]:
        """The ephemeral events published so far and not on their way yet, for an append to
        send before its doorbell (with the future to resolve once it is done), after waiting
        for the batch on its way. If the sender took them meanwhile, it waits for them to be
        sent instead, and not for those published later."""
        queued, sending = self._live_queued, self._live_sending
        if sending is not None and not sending.done():
            await asyncio.shield(sending)
        if queued is None:
            return [], None
        if self._live_queued is not queued:  # the sender took them
            if not queued.done():
                await asyncio.shield(queued)
            return [], None
        payloads, self._live, self._live_queued = self._live, [], None
        self._live_sending = queued
        return payloads, queued

    async def _live_sent(self) -> None:
        """Wait until the ephemeral events published so far are sent (or given up on), and
        not for those published meanwhile, which other sessions may go on doing."""
        # The batches go in order: once the queued one is sent, so is the one on its way.
        waited = self._live_queued or self._live_sending
        if waited is not None and not waited.done():
            # Shielded: an append given up on must not mark the events sent.
            await asyncio.shield(waited)

    @_bounded
    async def _notify_all(self, channel: str, payloads: list[str]) -> None:
        async with self._connection() as conn:
            # One row per payload, in their order: NOTIFY delivers in the order it was called.
            await conn.writes.execute(
                "SELECT pg_notify(%s, payload) FROM json_array_elements_text(%s::json) AS payload",
                (channel, _json_text(payloads)),
            )

    async def subscribe(self, session_id: str, *, after: int = 0) -> AsyncGenerator[Event, None]:
        """The events after `after` as they are stored: the log first, then live ones, with
        the published ephemeral events in their places.

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
        await self._live_sent()
        doorbell = self._doorbell or self._start_doorbell()
        if doorbell.up:
            await self._heard_so_far(doorbell)

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
            # `follow` drops that ring, which its first read covers.
            events = follow(listener, read, after, closed=lambda: self._closed, poll=SUBSCRIBE_POLL)
            async for event in events:
                yield event

    async def _heard_so_far(self, doorbell: _Doorbell) -> None:
        """Wait until the listener has handled every notification sent before: it hears
        them in the order they were sent, so once one more of its own (a marker that no
        subscriber follows) arrives. Bounded by the store's timeout, then gone on."""
        marker = f"sync:{new_id()}"
        heard = doorbell.expect(marker)
        try:
            async with asyncio.timeout(self.timeout):
                await self._notify_all(LIVE_CHANNEL, [f"{json.dumps([marker, 0, 'sync'])}\n"])
                await heard
        except (StoreUnavailableError, TimeoutError) as error:
            log.warning("trimtab subscription: the listener did not answer: %s", error)
        finally:
            doorbell.forget(marker)

    def _start_doorbell(self) -> _Doorbell:
        self._doorbell = _Doorbell(self._dsn, self.timeout)
        return self._doorbell

    # --- sessions -------------------------------------------------------------------------

    @_bounded
    async def get(self, session_id: str) -> SessionRecord:
        """The session's record; raises `SessionNotFoundError` for an unknown session."""
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM sessions WHERE session_id = %s", (session_id,)
            )
            row = await cursor.fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        return record_of(row)

    @_bounded
    async def list_sessions(self) -> list[SessionRecord]:
        """Every session, most recently updated first."""
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM sessions ORDER BY updated_at DESC, session_id DESC"
            )
            rows = await cursor.fetchall()
        return [record_of(row) for row in rows]

    @_bounded
    async def delete(self, session_id: str) -> bool:
        """Remove a session, its log and its queued inputs; False if there was none.

        Subscribers to the session (on any runtime) are woken, and fail as for an unknown id.
        """
        async with self._connection() as conn:
            # The foreign keys cascade to `session_events` and `session_inputs`.
            cursor = await conn.execute(
                "WITH gone AS (DELETE FROM sessions WHERE session_id = %(id)s RETURNING 1)"
                " SELECT pg_notify(%(channel)s, %(id)s || ':0') FROM gone",
                {"id": session_id, "channel": CHANNEL},
            )
            return cursor.rowcount > 0

    # --- leases ---------------------------------------------------------------------------

    @_bounded
    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the lease if it is free, expired or already `owner`'s; None if another holds it.

        A new acquisition bumps the fencing token; re-acquiring one's own live lease only
        extends it, so appends in flight with the same `Lease` stay valid.
        """
        params = {"session_id": session_id, "owner": owner, "ttl": ttl}
        async with self._connection() as conn:
            row = await (await conn.execute(_ACQUIRE, params)).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        (token,) = row
        return None if token is None else Lease(session_id=session_id, owner=owner, token=token)

    @_bounded
    async def claim_lease(self, session_id: str, owner: str, fence: int, ttl: float) -> Lease | int:
        """Take the lease with the fencing token `fence` (see `Store`)."""
        params = {"session_id": session_id, "owner": owner, "fence": fence, "ttl": ttl}
        async with self._connection() as conn:
            row = await (await conn.execute(_CLAIM_FENCED, params)).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        taken, token = row
        return token if taken is None else Lease(session_id=session_id, owner=owner, token=fence)

    @_bounded
    async def renew_leases(self, owner: str, ttl: float) -> list[str]:
        """Extend every live lease `owner` holds; returns their session ids, sorted.

        A lease that has already expired is not renewed: another runtime may have read the
        session as free, so the holder must treat it as lost.
        """
        async with self._connection() as conn:
            cursor = await conn.execute(
                "UPDATE sessions SET lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE lease_owner = %s AND lease_expires_at > now() RETURNING session_id",
                (ttl, owner),
            )
            rows = await cursor.fetchall()
        return sorted(session_id for (session_id,) in rows)

    @_bounded
    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up (no-op if it was already lost or the session is gone)."""
        async with self._connection() as conn:
            # The token stays: the next acquisition bumps it, fencing out this holder.
            await conn.execute(
                "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL"
                " WHERE session_id = %s AND lease_owner = %s AND lease_token = %s",
                (lease.session_id, lease.owner, lease.token),
            )

    @_bounded
    async def enqueue_input(self, session_id: str, prompt: str, message_id: str) -> None:
        """Queue a message for the lease holder to deliver (see `Store`)."""
        async with self._connection() as conn:
            try:
                await conn.execute(
                    "INSERT INTO session_inputs (session_id, message_id, body)"
                    " VALUES (%s, %s, %s::json) ON CONFLICT DO NOTHING",
                    (session_id, message_id, json.dumps({"prompt": prompt})),
                )
            except errors.ForeignKeyViolation:
                raise SessionNotFoundError(session_id) from None

    @_bounded
    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        """Keep the session's latest snapshot."""
        async with self._connection() as conn:
            try:
                await conn.execute(
                    "INSERT INTO session_snapshots (session_id, event_count, data)"
                    " VALUES (%(s)s, %(n)s, %(d)s) ON CONFLICT (session_id)"
                    " DO UPDATE SET event_count = EXCLUDED.event_count, data = EXCLUDED.data",
                    {"s": session_id, "n": event_count, "d": data},
                )
            except errors.ForeignKeyViolation:
                raise SessionNotFoundError(session_id) from None

    @_bounded
    async def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The latest snapshot, if any."""
        async with self._connection() as conn:
            cursor = await conn.execute(
                "SELECT s.session_id, p.event_count, p.data::text FROM sessions s"
                " LEFT JOIN session_snapshots p USING (session_id) WHERE s.session_id = %(s)s",
                {"s": session_id},
            )
            row = await cursor.fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        return None if row[1] is None else (int(row[1]), str(row[2]))

    @_bounded
    async def pending_inputs(self, session_id: str) -> list[tuple[str, str]]:
        """The queued `(prompt, message_id)` pairs not yet claimed, oldest first."""
        async with self._connection() as conn:
            cursor = await conn.execute(_PENDING_INPUTS, {"session_id": session_id})
            rows = await cursor.fetchall()
        if not rows:
            raise SessionNotFoundError(session_id)
        return [
            (json.loads(body)["prompt"], message_id)
            for body, message_id in rows
            if body is not None
        ]

    @_bounded
    async def sessions_with_inputs(self) -> set[str]:
        """The sessions with inputs pending (see `Store`), by the partial index of pending
        inputs (`session_inputs_pending`)."""
        async with self._connection() as conn:
            cursor = await conn.execute(
                "SELECT DISTINCT session_id FROM session_inputs WHERE claimed_seq IS NULL"
            )
            return {session_id for (session_id,) in await cursor.fetchall()}

    @_bounded
    async def discard_inputs(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """Remove the named inputs still pending, in one statement (see `Store`)."""
        async with self._connection() as conn:
            cursor = await conn.execute(
                _DISCARD_INPUTS, {"s": session_id, "ids": list(message_ids)}
            )
            rows = await cursor.fetchall()
        if not rows:
            raise SessionNotFoundError(session_id)
        removed = {str(row[0]) for row in rows if row[0] is not None}
        return [m for m in dict.fromkeys(message_ids) if m in removed]

    async def close(self) -> None:
        """Close the pool and the listener, ending subscriptions; closing twice is a no-op.

        Calls abandoned at their timeout are waited for (up to `timeout`), so that none is
        left running.
        """
        if self._closed:
            return
        await self._live_sent()
        self._closed = True
        async with self._opening:  # not while a first call is still opening the pool
            if self._doorbell is not None:
                await self._doorbell.close(self.timeout)
            if self._pool is not None:
                spare, self._spare = self._spare, []
                for conn in spare:
                    await self._pool.putconn(conn)
                await self._pool.close(timeout=self.timeout)
        if self._abandoned:
            await asyncio.wait(self._abandoned, timeout=self.timeout)


# --- helpers ------------------------------------------------------------------------------


class _NoAnswer(Exception):
    """A store call's time ran out (see `PostgresStore._within_timeout`)."""


async def _deliver(work: Coroutine[Any, Any, _R], outcome: asyncio.Future[_R]) -> None:
    """Run `work`, handing its result or error to `outcome` unless nobody waits for it any
    more (then an error is dropped here, having been seen)."""
    try:
        result = await work
    except asyncio.CancelledError:
        outcome.cancel()
        raise
    except BaseException as error:
        if not outcome.done():
            outcome.set_exception(error)
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: not ours to hold
            raise
    else:
        if not outcome.done():
            outcome.set_result(result)


def _give_up(outcome: asyncio.Future[Any]) -> None:
    if not outcome.done():
        outcome.set_exception(_NoAnswer())


def _connect_options(dsn: str, timeout: float) -> dict[str, Any]:
    """The options of every connection: autocommit, and a connect timeout (libpq's whole
    seconds, at least 2) unless the DSN sets one."""
    options: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in conninfo_to_dict(dsn):
        options["connect_timeout"] = max(2, math.ceil(timeout))
    return options


async def _check_connection(conn: _Connection) -> None:
    """Raise if a pooled connection is dead, so the pool replaces it before it is used.

    An idle connection has nothing to read unless the server went away (a restart sends a
    FATAL message and closes the socket): only then is a round trip spent to find out.
    """
    if _readable(conn.fileno()):
        await AsyncConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    """Whether `fd` has input (or EOF) waiting, without blocking."""
    if hasattr(select, "poll"):  # select.select cannot take descriptors >= 1024
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # Windows


async def _migrate(conn: _Connection) -> None:
    """Apply the missing schema versions; refuse a database written by a newer trimtab."""
    async with conn.transaction():
        # Transaction-scoped: released at commit, and by the server if this process dies.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS trimtab_schema ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT coalesce(max(version), 0) FROM trimtab_schema")
        row = await cursor.fetchone()
        version = int(row[0]) if row else 0
        if version > len(_MIGRATIONS):
            raise RuntimeError(
                f"the database has schema version {version}, newer than this trimtab's"
                f" {len(_MIGRATIONS)}: upgrade trimtab"
            )
        for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
            log.info("migrating the trimtab schema to version %d", number)
            await conn.execute(script)  # no parameters: sent as one multi-statement script
            await conn.execute("INSERT INTO trimtab_schema (version) VALUES (%s)", (number,))


def _append_params(
    session_id: str, events: Sequence[Event], lease: Lease | None, durable: bool = True
) -> dict[str, Any]:
    """The parameters of `_APPEND`; events are serialised here, before any lock is taken."""
    return {
        "session_id": session_id,
        "count": len(events),
        "summary": _text(summarize(events)),
        "token": lease.token if lease else None,
        "owner": lease.owner if lease else None,
        "lease_session": lease.session_id if lease else None,
        "events": _json_text(
            [[e.id, e.type, e.model_dump_json(), claimed_input(e)] for e in events]
        ),
        "first_id": events[0].id,
        "parent": events[0].parent_id,
        "sync": None if durable else "off",
        "live": None,
        "carried": None,
    }


def _live_payload(session_id: str, event: Event, after: int) -> str | None:
    """The live channel's payload of an ephemeral event; None when it is too large to send."""
    payload = f"{json.dumps([session_id, after, event.type])}\n{event.model_dump_json()}"
    if len(payload.encode()) >= _NOTIFY_LIMIT:
        log.debug("ephemeral %s of %r too large to publish", event.type, session_id)
        return None
    return payload


_json_text = json.JSONEncoder(
    ensure_ascii=False, check_circular=False, separators=(",", ":")
).encode
"""JSON text for a `::json` parameter (a list of strings, no cycles; non-ASCII kept as is)."""


def _text(value: str | None) -> str | None:
    """`value` fit for a `text` column, which cannot hold NUL: U+FFFD stands in for it."""
    return value.replace("\x00", "\ufffd") if value else value


class _KeyedLock:
    """One FIFO lock per key, dropped when unused: concurrent appends to one session from
    this store are stored in call order, as with the other backends."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class _Doorbell:
    """The store's one LISTEN connection, ringing the local subscribers of each session.

    It reconnects (with backoff) whenever the connection drops, and then rings every
    subscriber, since notifications sent meanwhile are lost. A server that goes silent sends
    no error either (a frozen or vanished host): after `SUBSCRIBE_POLL` seconds without a
    notification the connection is checked with a query, bounded by the store's timeout.
    """

    def __init__(self, dsn: str, timeout: float) -> None:
        self._dsn = dsn
        self._timeout = timeout
        self.listeners = Listeners()
        self._ready = asyncio.Event()
        self._markers: dict[str, asyncio.Future[None]] = {}
        """Markers the store sent to this channel and waits to hear (`_heard_so_far`)."""
        self._task = asyncio.get_running_loop().create_task(
            self._listen(), name="trimtab-postgres-listener"
        )

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    options = _connect_options(self._dsn, self._timeout)
                    conn = await psycopg.AsyncConnection.connect(self._dsn, **options)
                async with conn:
                    async with asyncio.timeout(self._timeout):
                        await conn.execute(f"LISTEN {CHANNEL}; LISTEN {LIVE_CHANNEL}")
                    delay = 0.1
                    # Rung before it says it listens: see `subscribe`.
                    self.listeners.ring_all()
                    self._ready.set()
                    await self._dispatch_until_silent(conn)
            except (psycopg.Error, TimeoutError) as error:
                reason = str(error) or f"no answer within {self._timeout} s"
                log.warning("trimtab listener: %s; reconnecting in %.1f s", reason, delay)
            self._ready.clear()
            self._give_up_markers()  # what was sent meanwhile is lost to this connection
            await asyncio.sleep(delay)
            delay = min(delay * 2, SUBSCRIBE_POLL)

    async def _dispatch_until_silent(self, conn: _Connection) -> None:
        """Dispatch notifications until the server stops answering (raises)."""
        while True:
            heard = False
            async for notify in conn.notifies(timeout=SUBSCRIBE_POLL):
                heard = True
                self._dispatch(notify.channel, notify.payload)
            if not heard:
                async with asyncio.timeout(self._timeout):
                    await conn.execute("SELECT 1")

    @property
    def up(self) -> bool:
        """Whether the connection listens now."""
        return self._ready.is_set()

    def expect(self, marker: str) -> asyncio.Future[None]:
        """A future resolved once `marker` is heard on the live channel."""
        self._markers[marker] = asyncio.get_running_loop().create_future()
        return self._markers[marker]

    def forget(self, marker: str) -> None:
        self._markers.pop(marker, None)

    def _give_up_markers(self) -> None:
        """End every wait for a marker: none will be heard on this connection any more."""
        for heard in self._markers.values():
            if not heard.done():
                heard.set_result(None)

    async def listening(self, timeout: float) -> None:
        """Wait until the connection listens, at most `timeout` seconds (then go on: the
        subscribers poll meanwhile)."""
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        except TimeoutError:
            pass

    def _dispatch(self, channel: str, payload: str) -> None:
        try:
            self._deliver(channel, payload)
        except (ValueError, TypeError) as error:
            # Anyone who can connect may NOTIFY these channels, and a newer trimtab sharing
            # the database may publish an event type this one does not know: skipped, not
            # the end of the listener (and of every subscription's live events with it).
            log.warning("trimtab listener: skipped a notification it cannot read: %s", error)

    def _deliver(self, channel: str, payload: str) -> None:
        if channel == CHANNEL:
            session_id, _, seq = payload.rpartition(":")
            # 0: the session was deleted, which its subscribers learn by reading.
            self.listeners.ring(session_id, int(seq) or None)
            return
        head, _, body = payload.partition("\n")
        session_id, after, event_type = json.loads(head)
        if (heard := self._markers.get(session_id)) is not None:
            if not heard.done():
                heard.set_result(None)
            return
        if self.listeners.listening(session_id):  # parsed only when someone here wants it
            self.listeners.post(session_id, after, event_from_json(body, event_type))

    async def close(self, timeout: float) -> None:
        """Stop listening and wake every subscriber (they see the store closed and end)."""
        self._task.cancel()
        # Cancelling its query in a server that does not answer takes psycopg a while.
        await asyncio.wait((self._task,), timeout=timeout)
        self._give_up_markers()
        self.listeners.ring_all()
