"""Store calls are bounded (issue 14, item 4; spec W1): a held lock, or a server that stopped
answering, ends a call with `StoreUnavailableError` within the store's timeout, and the store
works again once the fault is gone.

PostgreSQL is frozen with SIGSTOP in a private cluster (`private_postgres`), never in the
shared one other test runs use. Session-level behaviour (the run ending in `session.error`)
is the session's to test: these tests stop at the store.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing, closing
from pathlib import Path

import pytest

from tests.conftest import require_psycopg
from tests.pgcluster import PrivateCluster
from trimtab import Client
from trimtab._errors import StoreUnavailableError
from trimtab.events import Event, UserMessageData, UserMessageEvent
from trimtab.store import DEFAULT_TIMEOUT, MemoryStore, SqliteStore, Store, open_store

TIMEOUT = 1.5
"""The stores' timeout in these tests."""

MARGIN = 3.0
"""How much longer than `TIMEOUT` a call may take to fail, on a loaded machine. Well under the
10 s psycopg alone takes to give up on a statement in a frozen server."""


def user(content: str) -> UserMessageEvent:
    return UserMessageEvent(data=UserMessageData(content=content, source="user"))


def contents(events: list[Event]) -> list[str]:
    return [e.data.content for e in events if isinstance(e, UserMessageEvent)]


async def unavailable(call: Awaitable[object]) -> float:
    """Seconds until `call` raised `StoreUnavailableError`; fails if it took past the bound."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        async with asyncio.timeout(TIMEOUT + MARGIN):
            await call
    return time.monotonic() - started


# --- the option -------------------------------------------------------------------------


def test_s1_the_timeout_defaults_to_30_s_and_open_store_passes_it_on(tmp_path: Path) -> None:
    assert DEFAULT_TIMEOUT == 30.0
    assert SqliteStore(tmp_path / "a.db").timeout == 30.0
    assert MemoryStore().timeout == 30.0
    assert open_store(tmp_path / "b.db", timeout=2.0).timeout == 2.0
    assert open_store(f"sqlite:///{tmp_path / 'c.db'}", timeout=2.0).timeout == 2.0
    with pytest.raises(ValueError, match="positive"):
        SqliteStore(tmp_path / "d.db", timeout=0)


@pytest.mark.parametrize("passed_in", [False, True], ids=["spec", "instance"])
async def test_s1_client_store_timeout_bounds_the_calls_of_the_store_it_opens(
    tmp_path: Path, passed_in: bool
) -> None:
    path = tmp_path / "trimtab.db"
    # A store passed in keeps its own timeout, whatever the client's option says.
    store = SqliteStore(path, timeout=TIMEOUT) if passed_in else path
    async with Client(store=store, store_timeout=60 if passed_in else TIMEOUT) as client:
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            await unavailable(client.create_session(provider={"type": "openai"}))
            other.execute("ROLLBACK")
        assert await client.list_sessions() == []
    if isinstance(store, SqliteStore):
        await store.close()  # the client closes only a store it opened


# --- SQLite: another process holds the write lock -----------------------------------------


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(tmp_path / "trimtab.db", timeout=TIMEOUT)
    await store.create("s")
    yield store
    await store.close()


def lock_holder(store: SqliteStore) -> closing[sqlite3.Connection]:
    """Another connection to the file, as another process would have; `BEGIN IMMEDIATE` on
    it takes the write lock."""
    return closing(sqlite3.connect(store.path, isolation_level=None))


async def test_s1_sqlite_held_write_lock_ends_an_append_within_the_timeout(
    sqlite: SqliteStore,
) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    batch = [user("held up")]
    with lock_holder(sqlite) as other:
        other.execute("BEGIN IMMEDIATE")
        ticker = asyncio.create_task(tick())
        await unavailable(sqlite.append("s", batch, lease=None))
        ticker.cancel()
        # The event loop went on while the append waited: SQLite did not block it.
        assert ticks > 10
        # Readers are not held up by a writer (WAL).
        assert contents(await sqlite.read("s")) == []
        other.execute("ROLLBACK")

    assert await sqlite.append("s", batch, lease=None) == 1
    assert contents(await sqlite.read("s")) == ["held up"]


async def test_s1_sqlite_appends_waiting_for_the_lock_keep_call_order(
    sqlite: SqliteStore,
) -> None:
    with lock_holder(sqlite) as other:
        other.execute("BEGIN IMMEDIATE")
        waiting = asyncio.gather(
            *(sqlite.append("s", [user(name)], lease=None) for name in "abc"),
            sqlite.acquire_lease("s", "w", 60),
        )
        await asyncio.sleep(0.3)  # all of them found the database locked
        other.execute("COMMIT")
        *counts, lease = await waiting

    assert counts == [1, 2, 3]
    assert lease is not None
    assert contents(await sqlite.read("s")) == ["a", "b", "c"]


# --- PostgreSQL: a held row lock ------------------------------------------------------------


@pytest.fixture
async def postgres(pg_dsn: str) -> AsyncIterator[Store]:
    from trimtab.store.postgres import PostgresStore

    store = PostgresStore(pg_dsn, timeout=TIMEOUT)
    await store.create("s")
    await store.append("s", [user("before")], lease=None)
    yield store
    await store.close()


async def test_s1_postgres_held_row_lock_ends_append_and_lease_within_the_timeout(
    postgres: Store, pg_dsn: str
) -> None:
    import psycopg

    batch = [user("held up")]
    # Another client holds the session's row, which an append and a lease take.
    async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
        await other.execute(b"SELECT 1 FROM sessions WHERE session_id = 's' FOR UPDATE")
        await unavailable(postgres.append("s", batch, lease=None))
        await unavailable(postgres.acquire_lease("s", "w", 60))
        assert contents(await postgres.read("s")) == ["before"]  # readers are not held up
        await other.rollback()

    assert await postgres.append("s", batch, lease=None) == 2
    assert contents(await postgres.read("s")) == ["before", "held up"]


# --- PostgreSQL: a frozen server ------------------------------------------------------------


async def test_s1_postgres_frozen_server_ends_every_call_within_the_timeout(
    private_postgres: PrivateCluster,
) -> None:
    require_psycopg()
    from trimtab.store.postgres import SUBSCRIBE_POLL, PostgresStore

    store, writer = (PostgresStore(private_postgres.dsn, timeout=TIMEOUT) for _ in range(2))
    try:
        await store.create("frozen")
        await store.append("frozen", [user("before")], lease=None)
        batch = [user("during")]
        async with aclosing(store.subscribe("frozen")) as events:
            assert contents([await anext(events)]) == ["before"]
            with private_postgres.frozen():
                frozen_at = time.monotonic()
                for call in (
                    store.append("frozen", batch, lease=None),
                    store.read("frozen"),
                    store.list_sessions(),
                    store.get("frozen"),
                    writer.acquire_lease("frozen", "w", 60),  # a store not connected yet
                ):
                    await unavailable(call)
                # Long enough for the listener to find its server silent.
                await asyncio.sleep(frozen_at + SUBSCRIBE_POLL + TIMEOUT - time.monotonic())

            # Thawed: the append whose outcome was unknown is repeated, and stored once; the
            # subscription, which waited through the freeze, hears of it.
            assert await store.append("frozen", batch, lease=None) == 2
            async with asyncio.timeout(SUBSCRIBE_POLL + TIMEOUT + MARGIN):
                assert contents([await anext(events)]) == ["during"]
        assert contents(await writer.read("frozen")) == ["before", "during"]
        assert [r.session_id for r in await writer.list_sessions()] == ["frozen"]
    finally:
        await store.close()
        await writer.close()
