"""`Calls`: the store's connections, and every call bounded by its timeout (spec W1).

Connections come from a `psycopg_pool.AsyncConnectionPool` in autocommit mode, opened (and
the schema migrated) on the first call. A connection is checked when taken from the pool, so
that after a server restart the next call reconnects instead of failing on a dead socket.

Every call is bounded by the store's `timeout`: connecting, waiting for a pooled connection
and each statement (`statement_timeout`, `lock_timeout`, a little under the store's timeout,
so that a statement held up by a lock ends with the server's reason) are bounded each, and
the whole call runs in a task that the caller stops waiting for at `timeout`, so that a
server that accepted the connection and then stopped answering (a frozen host) cannot hang
it either. A call that fails there, or while the server goes away, raises
`StoreUnavailableError`; whether its write committed is then unknown, as with any database
client (an append can simply be retried: it is idempotent by event id). Its abandoned task is
cancelled: psycopg then cancels the statement in the server, or closes the connection if the
server does not answer (within 10 s), and the pool never hands out a connection returned in
the middle of a statement.
"""

from __future__ import annotations

import asyncio
import functools
import math
import select
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, Protocol, TypeAlias, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolClosed

from trimtab._errors import StoreUnavailableError
from trimtab.store.postgres._schema import migrate

__all__ = ["Calls", "Connection", "PooledConnection", "bounded", "connect_options"]

SERVER_TIMEOUT_SHARE = 0.9
"""The share of the store's timeout the server's `statement_timeout` and `lock_timeout` get."""

Connection: TypeAlias = psycopg.AsyncConnection[tuple[Any, ...]]
_Cursor: TypeAlias = psycopg.AsyncCursor[tuple[Any, ...]]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class PooledConnection(Connection):
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


_Pool: TypeAlias = AsyncConnectionPool[PooledConnection]


class Calls:
    """The connections of one store, and its calls, each bounded by `timeout`."""

    def __init__(self, dsn: str, *, max_connections: int, timeout: float) -> None:
        self.dsn = dsn
        self.timeout = timeout
        self._max_connections = max_connections
        self._pool: _Pool | None = None
        self._opening = asyncio.Lock()
        self.closed = False
        self._abandoned: set[asyncio.Task[Any]] = set()
        """Calls the caller stopped waiting for, until their cancellation is done."""

    async def within_timeout(self, what: str, work: Coroutine[Any, Any, _R]) -> _R:
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
    async def connection(self) -> AsyncIterator[PooledConnection]:
        """A pooled autocommit connection; raises `RuntimeError` once the store is closed.

        Taken and returned with `getconn` and `putconn`: `pool.connection()` also ends the
        connection's transaction, of which an autocommit connection has none (`putconn`
        resets one left open by an error, or closes one left in the middle of a statement).
        """
        pool = self._pool or await self._open()
        try:
            conn = await pool.getconn()
        except PoolClosed:
            raise RuntimeError("the store is closed") from None
        try:
            yield conn
        finally:
            await pool.putconn(conn)

    async def _open(self) -> _Pool:
        """Migrate the schema and open the pool, once; a failed attempt is retried next call."""
        async with self._opening:
            if self.closed:
                raise RuntimeError("the store is closed")
            if self._pool is None:
                options = connect_options(self.dsn, self.timeout)
                # A direct first connection: a wrong DSN or a server that is down fails here
                # at once with its own error, rather than as a pool timeout.
                conn = await psycopg.AsyncConnection.connect(self.dsn, **options)
                async with conn:
                    await migrate(conn)
                pool: _Pool = AsyncConnectionPool(
                    self.dsn,
                    connection_class=PooledConnection,
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

    async def _configure(self, conn: Connection) -> None:
        """Bound every statement of a new pooled connection in the server too."""
        limit = str(round(self.timeout * SERVER_TIMEOUT_SHARE * 1000))  # milliseconds
        await conn.execute(
            "SELECT set_config('statement_timeout', %(ms)s, false),"
            " set_config('lock_timeout', %(ms)s, false)",
            {"ms": limit},
        )

    async def close(self) -> None:
        """Close the pool; calls abandoned at their timeout are waited for (up to `timeout`),
        so that none is left running."""
        self.closed = True
        async with self._opening:  # not while a first call is still opening the pool
            if self._pool is not None:
                await self._pool.close(timeout=self.timeout)
        if self._abandoned:
            await asyncio.wait(self._abandoned, timeout=self.timeout)


class _HasCalls(Protocol):
    @property
    def _calls(self) -> Calls: ...


_S = TypeVar("_S", bound=_HasCalls)


def bounded(
    method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _R]]:
    """Make a store method end within the store's `timeout` (`Calls.within_timeout`)."""
    what = method.__name__.lstrip("_")

    @functools.wraps(method)
    async def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await self._calls.within_timeout(what, method(self, *args, **kwargs))

    return call


class _NoAnswer(Exception):
    """A call's time ran out (see `Calls.within_timeout`)."""


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


def connect_options(dsn: str, timeout: float) -> dict[str, Any]:
    """The options of every connection: autocommit, and a connect timeout (libpq's whole
    seconds, at least 2) unless the DSN sets one."""
    options: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in conninfo_to_dict(dsn):
        options["connect_timeout"] = max(2, math.ceil(timeout))
    return options


async def _check_connection(conn: Connection) -> None:
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
