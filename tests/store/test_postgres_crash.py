"""`PostgresStore` through a crash of the database server: what is durable when (spec P5),
and how a runtime that outlived the crash goes on with its sessions (P6)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Recorder, open_session, require_psycopg

require_psycopg()

import psycopg  # noqa: E402

from tests.pgcluster import PrivateCluster, private_cluster  # noqa: E402
from tests.server.conftest import (  # noqa: E402
    ServerProcess,
    assistant,
    conversation,
    provider,
    user,
)
from trimtab import Client, LeaseLostError, define_tool  # noqa: E402
from trimtab.events import Event, UserMessageEvent  # noqa: E402
from trimtab.providers import ModelRequest  # noqa: E402
from trimtab.store.postgres import PostgresStore  # noqa: E402
from trimtab.testing import ReplayServer, ScriptedModel, tool_call  # noqa: E402

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

        # Resumed, the session is recovered as after a crash of the runtime at that point
        # (P3): the call whose start survived is ended `cancelled`, never run again. (Let go,
        # it stores nothing: the snapshot it keeps, of the log it believed, is not used.)
        await session.disconnect()
        assert [e.type for e in await stored(cluster.dsn, session.session_id)] == types
        resumed = await client.resume_session(session.session_id, provider=model, tools=[tool])
        log = await resumed.get_events()
        assert chained(log)
        ends = [e for e in log if e.type == "tool.execution_complete"]
        assert [(e.data.tool_call_id, e.data.outcome) for e in ends] == [("c1", "cancelled")]
        assert runs == 1

        reply = await resumed.send_and_wait("next")
        assert reply is not None and reply.data.content == "again"
        assert chained(await stored(cluster.dsn, session.session_id))


async def test_p6_the_runtime_that_outlived_the_crash_goes_on_from_the_log_it_kept(
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
    async with Client(store=cluster.dsn, lease_ttl=600, store_timeout=20) as client:
        session = await open_session(client, model, tool)
        seen = Recorder(session)
        freeze_wal_writer(cluster)
        reply = await session.send_and_wait("go")
        assert reply is not None and reply.data.content == "done"
        await asyncio.to_thread(cluster.crash)
        kept = await stored(cluster.dsn, session.session_id)
        assert kept[-1].type == "tool.execution_start"  # what followed it is lost

        # No resume: the same session takes the next input, after it brought the run the
        # log left open to rest (its idle was delivered before the crash).
        reply = await session.send_and_wait("next")

        assert reply is not None and reply.data.content == "again"
        assert not session.is_remote
        log = await stored(cluster.dsn, session.session_id)
        assert chained(log) and [e.id for e in log[: len(kept)]] == [e.id for e in kept]
        rest = [e.type for e in log[len(kept) :]]
        assert rest[: rest.index("user.message")][-1] == "abort", rest
        ends = [e for e in log if e.type == "tool.execution_complete"]
        assert [(e.data.tool_call_id, e.data.outcome) for e in ends] == [("c1", "cancelled")]
        assert runs == 1
        assert len(seen.of("session.idle")) == 2  # one per run
        assert [e.id for e in await session.get_events()] == [e.id for e in log]

        # Let go, the session is free for any runtime.
        await session.disconnect()
        other = PostgresStore(cluster.dsn)
        try:
            assert await other.acquire_lease(session.session_id, "other", 30) is not None
        finally:
            await other.close()


async def test_p6_a_run_the_crash_cut_ends_as_under_a_failed_store_and_the_next_runs(
    crashable_postgres: PrivateCluster,
) -> None:
    cluster = crashable_postgres
    runs = 0

    async def once(text: str) -> str:
        nonlocal runs
        runs += 1
        return text

    async def crash_then_answer(request: ModelRequest) -> str:
        # The call's result is stored, not durably: the crash loses it.
        await asyncio.to_thread(cluster.crash)
        return "done"

    tool = define_tool("once", handler=once, description="has an effect")
    model = ScriptedModel([tool_call("once", {"text": "x"}, id="c1"), crash_then_answer, "again"])
    async with Client(store=cluster.dsn, lease_ttl=600, store_timeout=20) as client:
        session = await open_session(client, model, tool)
        seen = Recorder(session)
        freeze_wal_writer(cluster)

        # The run's next append follows an event the database lost: it is refused, and the
        # run ends as one whose store failed (W2). The session stays this runtime's.
        with pytest.raises(LeaseLostError, match="lost its last appends"):
            await session.send_and_wait("go")
        assert not session.is_remote
        kept = await stored(cluster.dsn, session.session_id)
        assert kept[-1].type == "tool.execution_start"

        reply = await session.send_and_wait("next")

        assert reply is not None and reply.data.content == "again"
        log = await stored(cluster.dsn, session.session_id)
        assert chained(log)
        ends = [e for e in log if e.type == "tool.execution_complete"]
        assert [(e.data.tool_call_id, e.data.outcome) for e in ends] == [("c1", "cancelled")]
        assert runs == 1
        assert len(seen.of("session.idle")) == 2
        assert [e.data.error_type for e in seen.of("session.error")] == ["store"]


async def test_p6_an_input_another_runtime_queued_after_the_crash_runs_once(
    crashable_postgres: PrivateCluster,
) -> None:
    cluster = crashable_postgres
    model = ScriptedModel(["hi", "second reply"])
    options: dict[str, Any] = {"lease_ttl": 600, "poll_interval": 0.1, "store_timeout": 20}
    async with Client(store=cluster.dsn, **options) as owner:
        session = await open_session(owner, model)
        seen = Recorder(session)
        freeze_wal_writer(cluster)
        reply = await session.send_and_wait("first")
        assert reply is not None and reply.data.content == "hi"
        await asyncio.to_thread(cluster.crash)
        kept = await stored(cluster.dsn, session.session_id)
        assert [e.type for e in kept][-2:] == ["user.message", "assistant.turn_start"]

        # Another runtime, which finds the session held, queues an input for its owner, which
        # runs it: once, as the run after the one the crash cut.
        async with Client(store=cluster.dsn, **options) as elsewhere:
            remote = await elsewhere.resume_session(session.session_id, provider=model)
            assert remote.is_remote
            watched = Recorder(remote)
            async with asyncio.timeout(30):
                reply = await remote.send_and_wait("second")

        assert reply is not None and reply.data.content == "second reply"
        log = await stored(cluster.dsn, session.session_id)
        assert chained(log)
        messages = [e.data.content for e in log if isinstance(e, UserMessageEvent)]
        assert messages == ["first", "second"]
        assert await pending(cluster.dsn, session.session_id) == []
        assert len(seen.of("session.idle")) == 2
        assert len(watched.of("session.idle")) == 2  # the cut run's, from the log (E5), and its own
        model.assert_done()


async def test_p6_a_runtime_that_followed_the_lost_tail_takes_over_from_the_log(
    crashable_postgres: PrivateCluster,
) -> None:
    cluster = crashable_postgres
    model = ScriptedModel(["hi", "hi again", "second reply"])
    options: dict[str, Any] = {"lease_ttl": 600, "poll_interval": 0.1, "store_timeout": 20}
    async with (
        Client(store=cluster.dsn, **options) as owner,
        Client(store=cluster.dsn, **options) as follower,
    ):
        session = await open_session(owner, model)
        remote = await follower.resume_session(session.session_id, provider=model)
        assert remote.is_remote
        watched = Recorder(remote)
        freeze_wal_writer(cluster)
        reply = await session.send_and_wait("first")
        assert reply is not None and reply.data.content == "hi"
        await watched.wait_for("assistant.message")  # the follower read it from the log
        await asyncio.to_thread(cluster.crash)

        # The owner lets go; the follower, whose view goes past the log's end, takes over
        # from the log as it is: the cut run goes on there (R1).
        await session.disconnect()
        # (A bound for a loaded machine: the pools reconnect to the restarted server with
        # a backoff, and only then is the lease taken.)
        async with asyncio.timeout(90):
            while remote.is_remote:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            reply = await remote.send_and_wait("second")

        assert reply is not None and reply.data.content == "second reply"
        log = await stored(cluster.dsn, session.session_id)
        assert chained(log)
        assert [e.data.content for e in log if isinstance(e, UserMessageEvent)] == [
            "first",
            "second",
        ]
        assert "session.resume" in [e.type for e in log]


async def pending(dsn: str, session_id: str) -> list[tuple[str, str]]:
    store = PostgresStore(dsn)
    try:
        return await store.pending_inputs(session_id)
    finally:
        await store.close()


async def test_p6_trimtab_serve_goes_on_after_the_crash_with_no_resume(
    crashable_postgres: PrivateCluster, tmp_path: Path
) -> None:
    cluster = crashable_postgres
    hi = conversation(user("Say hi"), assistant("Hi!"))
    # The first reply is lost with the log's tail: the model sees the run as aborted.
    again = conversation(user("Say hi"), user("Again"), assistant("Hello again"))
    async with ReplayServer([hi, again]) as model:
        server = ServerProcess(cluster.dsn, "--lease-ttl", "600", log=tmp_path / "server.log")
        try:
            async with server.remote() as client:
                session = await client.create_session(provider=provider(model))
                freeze_wal_writer(cluster)
                reply = await session.send_and_wait("Say hi")
                assert reply is not None and reply.data.content == "Hi!"
                await asyncio.to_thread(cluster.crash)

                # The same client, on the same connection, with no resume.
                reply = await session.send_and_wait("Again", timeout=30)

                assert reply is not None and reply.data.content == "Hello again"
                assert chained(await session.get_events())
        finally:
            server.stop()
