"""`PostgresStore` through a crash of the database server: what is durable when (spec P5)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from tests.conftest import open_session, require_psycopg

require_psycopg()

import psycopg  # noqa: E402

from tests.pgcluster import PrivateCluster, private_cluster  # noqa: E402
from trimtab import Client, LeaseLostError, define_tool  # noqa: E402
from trimtab.events import Event  # noqa: E402
from trimtab.store.postgres import PostgresStore  # noqa: E402
from trimtab.testing import ScriptedModel, tool_call  # noqa: E402

# Nothing flushes the WAL but the commits that wait for it: the WAL writer is frozen by the
# test, and nothing else runs (no autovacuum, no background writer, no checkpoint).
SETTINGS = (
    "synchronous_commit=on",
    "wal_writer_delay=10s",
    "autovacuum=off",
    "bgwriter_lru_maxpages=0",
    "checkpoint_timeout=1h",
)


@pytest.fixture(scope="module")
def crashable_postgres() -> Iterator[PrivateCluster]:
    with private_cluster(*SETTINGS) as cluster:
        yield cluster


def freeze_wal_writer(cluster: PrivateCluster) -> None:
    """Stop the WAL writer (until the crash kills it): an asynchronous commit then stays in
    the server's memory until a durable commit flushes the WAL past it."""
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
    assert row is not None
    os.kill(row[0], signal.SIGSTOP)


async def stored(dsn: str, session_id: str) -> list[Event]:
    store = PostgresStore(dsn)
    try:
        return await store.read(session_id)
    finally:
        await store.close()


def chained(log: list[Event]) -> bool:
    """E3: each stored event links to the one before it."""
    return all(after.parent_id == before.id for before, after in zip(log, log[1:], strict=False))


async def test_p5_a_server_crash_keeps_sends_and_tool_starts_and_a_lost_tail_is_a_crash(
    crashable_postgres: PrivateCluster,
) -> None:
    cluster = crashable_postgres
    runs = 0

    async def once(text: str) -> str:
        nonlocal runs
        runs += 1
        return text

    tool = define_tool("once", handler=once, description="has an effect")
    model = ScriptedModel([tool_call("once", {"text": "x"}, id="c1"), "done", "again"])
    # A lease that is not renewed during the test: its renewal would be a durable commit.
    async with Client(store=cluster.dsn, lease_ttl=600, store_timeout=20) as client:
        session = await open_session(client, model, tool)
        freeze_wal_writer(cluster)

        reply = await session.send_and_wait("go")

        assert reply is not None and reply.data.content == "done"
        ran = [e.type for e in await session.get_events()]
        assert ran.count("assistant.turn_end") == 2 and runs == 1
        await asyncio.to_thread(cluster.crash)

        # The send and the tool's start were durable; what followed was not, and is lost.
        log = await stored(cluster.dsn, session.session_id)
        types = [e.type for e in log]
        assert types[-1] == "tool.execution_start", types
        assert "user.message" in types and chained(log)

        # The runtime that outlived the crash cannot write after the hole: its next append is
        # refused, and nothing is stored.
        with pytest.raises(LeaseLostError, match="lost its last appends"):
            await session.send_and_wait("next")
        assert [e.type for e in await stored(cluster.dsn, session.session_id)] == types

        # Resumed, the session is recovered as after a crash of the runtime at that point
        # (P3): the call whose start survived is ended `cancelled`, never run again.
        await session.disconnect()
        resumed = await client.resume_session(session.session_id, provider=model, tools=[tool])
        log = await resumed.get_events()
        assert chained(log)
        ends = [e for e in log if e.type == "tool.execution_complete"]
        assert [(e.data.tool_call_id, e.data.outcome) for e in ends] == [("c1", "cancelled")]
        assert runs == 1

        reply = await resumed.send_and_wait("next")
        assert reply is not None and reply.data.content == "again"
        assert chained(await stored(cluster.dsn, session.session_id))
