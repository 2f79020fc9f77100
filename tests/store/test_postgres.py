"""`PostgresStore` where only PostgreSQL can be tested: many processes and stores on one
database, `kill -9`, the doorbell, worker claims, idempotency keys and a server restart.

Every test runs in a fresh schema (`pg_dsn`, see conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_psycopg, restart_command

require_psycopg()

import psycopg  # noqa: E402

from tests.store.processes import child, go, next_line  # noqa: E402
from trimtab._errors import LeaseLostError, StoreUnavailableError  # noqa: E402
from trimtab.events import (  # noqa: E402
    AssistantMessageDeltaData,
    AssistantMessageDeltaEvent,
    Event,
    EventAdapter,
    SessionIdleEvent,
    UserMessageData,
    UserMessageEvent,
)
from trimtab.store import Lease, open_store, postgres  # noqa: E402
from trimtab.store.postgres import CHANNEL, SUBSCRIBE_POLL, PostgresStore, _listener  # noqa: E402

# A worker process on session "s": connects, prints "ready", waits for "go" on stdin (so that
# workers started together really overlap), then either appends `count` events `batch` per
# call, printing each returned count once acknowledged, or takes the lease and renews it
# every ttl/3 until killed, printing its fencing token.
WORKER = """
import asyncio, sys
from trimtab.events import UserMessageData, UserMessageEvent
from trimtab.store.postgres import PostgresStore

async def append(store, name, count, batch):
    for n in range(0, count, batch):
        events = [UserMessageEvent(data=UserMessageData(content=f"{name}:{n + i}"))
                  for i in range(batch)]
        print(await store.append("s", events, lease=None), flush=True)

async def hold(store, owner, ttl):
    lease = await store.acquire_lease("s", owner, ttl)
    print(lease.token, flush=True)
    while True:
        await asyncio.sleep(ttl / 3)
        assert await store.renew_leases(owner, ttl) == ["s"]

async def main(dsn, mode, name, *args):
    store = PostgresStore(dsn)
    await store.get("s")
    print("ready", flush=True)
    sys.stdin.readline()
    if mode == "append":
        await append(store, name, int(args[0]), int(args[1]))
    else:
        await hold(store, name, float(args[0]))
    await store.close()

asyncio.run(main(*sys.argv[1:]))
"""


def user(content: str) -> UserMessageEvent:
    return UserMessageEvent(data=UserMessageData(content=content, source="user"))


def message(content: str, message_id: str) -> UserMessageEvent:
    return UserMessageEvent(
        data=UserMessageData(content=content, message_id=message_id, source="user")
    )


def contents(events: list[Event]) -> list[str]:
    return [e.data.content for e in events if isinstance(e, UserMessageEvent)]


@asynccontextmanager
async def stores(dsn: str, count: int) -> AsyncIterator[list[PostgresStore]]:
    """`count` independent stores on one database, as separate runtimes would have."""
    opened = [PostgresStore(dsn) for _ in range(count)]
    try:
        yield opened
    finally:
        for store in opened:
            await store.close()


async def column(dsn: str, query: str) -> list[object]:
    """The first column of a query's rows, read behind the store's back."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return [row[0] for row in await (await conn.execute(query.encode())).fetchall()]


def worker(tmp_path: Path, *args: str) -> AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """A worker process (see `WORKER`), ready and waiting for "go"; killed on exit."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return child(script, *args)


async def poll_lease(store: PostgresStore, owner: str, *, within: float) -> Lease:
    """Session "s"'s lease for `owner`, as soon as it is free; fails after `within` s."""
    async with asyncio.timeout(within):
        while True:
            if (lease := await store.acquire_lease("s", owner, 30)) is not None:
                return lease
            await asyncio.sleep(0.01)


async def take(events: AsyncIterator[Event], count: int, within: float) -> list[Event]:
    async with asyncio.timeout(within):
        return [await anext(events) for _ in range(count)]


async def heard_elsewhere(
    dsn: str, count: int, act: Callable[[PostgresStore], Awaitable[object]]
) -> list[Event]:
    """The first `count` events of session "s" that a subscriber on a second store hears while
    `act(writer)` runs on the first, once the subscriber's listener is up."""
    async with stores(dsn, 2) as (writer, reader):
        await writer.create("s")
        async with aclosing(reader.subscribe("s")) as events:
            later = asyncio.create_task(take(events, count, within=5))
            await asyncio.sleep(0.2)  # the listener is up
            await act(writer)
            return await later


# --- one log, many writers ----------------------------------------------------------------


async def test_two_processes_appending_to_one_session_keep_seq_gapless(
    pg_dsn: str, tmp_path: Path
) -> None:
    per_writer, batches = 300, {"a": 1, "b": 3}
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")

    async with (
        worker(tmp_path, pg_dsn, "append", "a", str(per_writer), "1") as a,
        worker(tmp_path, pg_dsn, "append", "b", str(per_writer), "3") as b,
    ):
        go(a, b)
        outputs = await asyncio.gather(a.communicate(), b.communicate())
    for proc, (_, stderr) in zip((a, b), outputs, strict=True):
        assert proc.returncode == 0, stderr.decode()
    acks = {
        name: [int(n) for n in out.split()] for name, (out, _) in zip("ab", outputs, strict=True)
    }

    # The table holds seq 1..2N once each, and each acknowledged count ends the batch that
    # writer appended, in its order: no gap, no duplicate, no interleaving within a batch.
    assert await column(pg_dsn, "SELECT seq FROM session_events ORDER BY seq") == list(
        range(1, 2 * per_writer + 1)
    )
    async with stores(pg_dsn, 1) as (store,):
        events = contents(await store.read("s"))
        assert (await store.get("s")).event_count == len(events) == 2 * per_writer
    for name, counts in acks.items():
        batch = batches[name]
        stored = [events[last - batch + i] for last in counts for i in range(batch)]
        assert stored == [f"{name}:{n}" for n in range(per_writer)]


async def test_r1_appends_of_a_taken_over_lease_stop_before_the_new_holders(
    pg_dsn: str,
) -> None:
    async with stores(pg_dsn, 2) as (old_store, new_store):
        await old_store.create("s")
        old = await old_store.acquire_lease("s", "old", 0.3)
        assert old is not None

        async def append_until_fenced() -> int:
            appended = 0
            while True:
                try:
                    await old_store.append("s", [user(f"old {appended}")], lease=old)
                except LeaseLostError:
                    return appended
                appended += 1

        async def take_over() -> Lease:
            lease = await poll_lease(new_store, "new", within=5)
            await new_store.append("s", [user("new")], lease=lease)
            return lease

        appended, new = await asyncio.gather(append_until_fenced(), take_over())

        assert appended > 0
        assert new.token == old.token + 1
        assert await old_store.renew_leases("old", 30) == []
        # The audit column: every event the stale holder got in precedes the new holder's.
        tokens = await column(pg_dsn, "SELECT lease_token FROM session_events ORDER BY seq")
        assert tokens == [old.token] * appended + [new.token]
        assert await column(pg_dsn, "SELECT seq FROM session_events ORDER BY seq") == list(
            range(1, appended + 2)
        )


async def test_r1_kill_9_of_the_lease_holder_lets_another_take_over_after_the_ttl(
    pg_dsn: str, tmp_path: Path
) -> None:
    ttl, loop = 1.0, asyncio.get_running_loop()
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        async with worker(tmp_path, pg_dsn, "hold", "holder", str(ttl)) as holder:
            go(holder)
            token = int(await next_line(holder))
            # Alive, the holder renews: the lease stays refused for well past one TTL.
            refused_until = loop.time() + 1.5 * ttl
            while loop.time() < refused_until:
                assert await store.acquire_lease("s", "taker", ttl) is None
                await asyncio.sleep(0.1)
            holder.kill()
            await holder.wait()
        # Not free at once (the lease outlives its holder, unlike a session lock), but
        # within a TTL of the holder's last renewal.
        assert await store.acquire_lease("s", "taker", ttl) is None
        lease = await poll_lease(store, "taker", within=ttl + 1.0)

        assert lease.token == token + 1
        stale = Lease(session_id="s", owner="holder", token=token)
        with pytest.raises(LeaseLostError):
            await store.append("s", [user("zombie")], lease=stale)
        assert await store.append("s", [user("taker")], lease=lease) == 1


async def test_r1_of_concurrent_acquirers_on_many_stores_exactly_one_wins(pg_dsn: str) -> None:
    async with stores(pg_dsn, 4) as opened:
        await opened[0].create("s")
        for round_ in range(5):
            leases = await asyncio.gather(
                *(store.acquire_lease("s", f"w{n}", 30) for n, store in enumerate(opened))
            )

            won = [lease for lease in leases if lease is not None]
            assert len(won) == 1
            assert won[0].token == round_ + 1
            await opened[0].release_lease(won[0])


# --- the doorbell -------------------------------------------------------------------------


async def test_subscriber_on_another_store_catches_up_then_hears_the_doorbell(
    pg_dsn: str,
) -> None:
    async with stores(pg_dsn, 2) as (writer, reader):
        await writer.create("s")
        await writer.append("s", [user("old 1"), user("old 2")], lease=None)

        async with aclosing(reader.subscribe("s", after=1)) as events:
            assert contents(await take(events, 1, within=5)) == ["old 2"]
            for n in range(10):
                await writer.append("s", [user(f"live {n}")], lease=None)
                # Far sooner than the fallback poll: the notification woke the reader.
                live = await take(events, 1, within=SUBSCRIBE_POLL / 5)
                assert contents(live) == [f"live {n}"]


async def test_ephemeral_events_reach_a_subscriber_on_another_store_in_their_place(
    pg_dsn: str,
) -> None:
    idle = SessionIdleEvent()
    stored: list[Event] = []

    async def act(writer: PostgresStore) -> None:
        await writer.append("s", [user("a")], lease=None)
        await writer.publish("s", idle, after=1)
        await writer.append("s", [user("b")], lease=None)
        stored.extend(await writer.read("s"))

    got = await heard_elsewhere(pg_dsn, 3, act)
    assert [e.type for e in got] == ["user.message", "session.idle", "user.message"]
    assert got[1] == idle
    assert len(stored) == 2


@pytest.mark.parametrize(
    ("channel", "payload"),
    [
        (postgres.CHANNEL, "no sequence"),
        (postgres.CHANNEL, "s:not-a-number"),
        (postgres.LIVE_CHANNEL, "not json\n{}"),
        (postgres.LIVE_CHANNEL, '["s", 0]\n{}'),
        (postgres.LIVE_CHANNEL, '["s", 0, "session.from_a_newer_trimtab"]\n{}'),
        (postgres.LIVE_CHANNEL, '["s", 0, "session.idle"]\n{"not": "an event"'),
    ],
)
async def test_e6_a_notification_it_cannot_read_does_not_end_the_listener(
    pg_dsn: str, channel: str, payload: str
) -> None:
    async def act(writer: PostgresStore) -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
        await writer.publish("s", SessionIdleEvent(), after=0)
        await writer.append("s", [user("after")], lease=None)

    got = await heard_elsewhere(pg_dsn, 2, act)
    # Live events still arrive (the idle comes only through the listener).
    assert [e.type for e in got] == ["session.idle", "user.message"]


def deafen_to_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener never hears a subscription's marker (a slow or lossy peer)."""
    dispatch = _listener.Doorbell._dispatch

    def deaf(doorbell: Any, channel: str, payload: str) -> None:
        if "sync:" not in payload:
            dispatch(doorbell, channel, payload)

    monkeypatch.setattr(_listener.Doorbell, "_dispatch", deaf)


async def test_e6_an_ephemeral_event_published_before_a_subscription_never_reaches_it(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E6: publishing is not waited for, yet a subscription started while an earlier event's
    NOTIFY is still on its way must not hear it (its listener would, once it listens)."""
    execute = psycopg.AsyncCursor.execute

    async def slow_notify(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if str(query).startswith("SELECT pg_notify(%s, payload)"):
            await asyncio.sleep(0.3)  # a slow round trip: the listener connects meanwhile
        return await execute(cursor, query, params, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", slow_notify)
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        await store.publish("s", SessionIdleEvent(), after=0)
        async with aclosing(store.subscribe("s")) as events:
            reader = asyncio.create_task(take(events, 1, within=5))
            await asyncio.sleep(0.5)  # the NOTIFY has gone out, the listener is up
            await store.append("s", [user("a")], lease=None)
            assert [e.type for e in await reader] == ["user.message"]


async def test_e6_a_listener_already_up_hears_an_earlier_event_before_a_new_subscription(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E6 with this runtime's listener already up (another subscription): the earlier event's
    notification may reach it after the new subscription began; it is not the new one's."""
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        async with aclosing(store.subscribe("s")) as first:
            first_events = asyncio.create_task(take(first, 2, within=5))
            await asyncio.sleep(0.2)  # the listener is up
            dispatch = _listener.Doorbell._dispatch
            loop = asyncio.get_running_loop()

            def late(doorbell: Any, channel: str, payload: str) -> None:
                # The listener handles what it hears 0.2 s late, in order.
                loop.call_later(0.2, dispatch, doorbell, channel, payload)

            monkeypatch.setattr(_listener.Doorbell, "_dispatch", late)
            await store.publish("s", SessionIdleEvent(), after=0)
            async with aclosing(store.subscribe("s")) as second:
                second_events = asyncio.create_task(take(second, 1, within=5))
                await asyncio.sleep(0.5)
                await store.append("s", [user("a")], lease=None)
                assert [e.type for e in await second_events] == ["user.message"]
            assert [e.type for e in await first_events] == ["session.idle", "user.message"]


async def test_e6_a_first_subscription_is_ready_only_once_its_listener_listens(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store's first subscription starts its listener, whose connection takes a while (a
    loaded server): `ready` waits for it, so that what is published at once is heard."""
    listen = _listener.Doorbell._listen

    async def slow(doorbell: Any) -> None:
        await asyncio.sleep(0.3)
        await listen(doorbell)

    monkeypatch.setattr(_listener.Doorbell, "_listen", slow)
    async with stores(pg_dsn, 2) as (writer, reader):
        await writer.create("s")
        ready = asyncio.Event()
        async with aclosing(reader.subscribe("s", ready=ready)) as events:
            heard = asyncio.create_task(take(events, 1, within=5))
            async with asyncio.timeout(5):
                await ready.wait()
            await writer.publish("s", SessionIdleEvent(), after=0)
            assert [e.type for e in await heard] == ["session.idle"]


async def test_e6_a_subscription_whose_listener_cannot_connect_is_never_ready(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not listening, it reads the stored events by polling, and says it is not ready."""

    async def deaf(doorbell: Any) -> None:
        await asyncio.Event().wait()  # never connects

    monkeypatch.setattr(_listener.Doorbell, "_listen", deaf)
    store = PostgresStore(pg_dsn, timeout=0.5)
    try:
        await store.create("s")
        await store.append("s", [user("a")], lease=None)
        ready = asyncio.Event()
        async with aclosing(store.subscribe("s", ready=ready)) as events:
            assert contents(await take(events, 1, within=5)) == ["a"]
            assert not ready.is_set()
    finally:
        await store.close()


async def test_e6_closing_the_store_ends_a_subscription_waiting_for_its_marker(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(pg_dsn)
    try:
        await store.create("s")
        async with aclosing(store.subscribe("s")) as first:
            first_events = asyncio.create_task(anext(first))
            await asyncio.sleep(0.2)  # the listener is up
            deafen_to_markers(monkeypatch)
            second = store.subscribe("s")
            waiting = asyncio.create_task(anext(second, None))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await store.close()
            # Ended at once, not at the store's timeout.
            assert await asyncio.wait_for(waiting, 2) is None
            with pytest.raises(StopAsyncIteration):
                await first_events
    finally:
        await store.close()


async def test_e6_a_marker_never_heard_holds_a_subscription_only_for_the_timeout(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(pg_dsn, timeout=1)
    try:
        await store.create("s")
        async with aclosing(store.subscribe("s")) as first:
            first_events = asyncio.create_task(take(first, 1, within=5))
            await asyncio.sleep(0.2)  # the listener is up
            deafen_to_markers(monkeypatch)
            async with aclosing(store.subscribe("s")) as second:
                second_events = asyncio.create_task(take(second, 1, within=5))
                await asyncio.sleep(1.5)  # past the store's timeout: it listens anyway
                await store.append("s", [user("a")], lease=None)
                assert contents(await second_events) == ["a"]
            assert contents(await first_events) == ["a"]
    finally:
        await store.close()


async def test_e6_a_dropped_listener_ends_a_subscription_s_wait_for_its_marker(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stores(pg_dsn, 1) as (store,):  # the default timeout: 30 s
        await store.create("s")
        async with aclosing(store.subscribe("s")) as first:
            first_events = asyncio.create_task(take(first, 1, within=10))
            await asyncio.sleep(0.2)  # the listener is up
            deafen_to_markers(monkeypatch)
            async with aclosing(store.subscribe("s")) as second:
                second_events = asyncio.create_task(take(second, 1, within=5))
                await asyncio.sleep(0.3)
                await column(
                    pg_dsn,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'",
                )
                await asyncio.sleep(0.5)  # the listener reconnects
                await store.append("s", [user("a")], lease=None)
                # Long before the store's timeout: what was sent before the drop is lost to
                # the listener, so no marker is waited for any more.
                assert contents(await second_events) == ["a"]
            assert contents(await first_events) == ["a"]


async def test_issue20_3_live_events_among_a_batch_go_in_its_append_in_their_places(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counted(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        statements.append(str(query))
        return await execute(cursor, query, params, **kwargs)

    idle = SessionIdleEvent()

    async def act(writer: PostgresStore) -> None:
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
        # After the first of the batch's two events: 0 stored before it, so after 1.
        await writer.append("s", [user("a"), user("b")], lease=None, live=[(1, idle)])

    got = await heard_elsewhere(pg_dsn, 3, act)

    assert [e.type for e in got] == ["user.message", "session.idle", "user.message"]
    assert contents([got[0], got[2]]) == ["a", "b"]
    # The events and the live one in one round trip (the reader's reads are counted too).
    assert sum("pg_notify" in statement for statement in statements) == 1


async def test_issue20_3_live_events_of_a_batch_not_stored_are_not_sent(pg_dsn: str) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        lease = await store.acquire_lease("s", "me", 30)
        assert lease is not None
        stale = Lease(session_id="s", owner="me", token=lease.token + 1)
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
            await listener.execute(f"LISTEN {postgres.LIVE_CHANNEL}")
            with pytest.raises(LeaseLostError):
                await store.append("s", [user("a")], lease=stale, live=[(1, SessionIdleEvent())])
            await store.append("s", [user("b")], lease=lease)
            delta = AssistantMessageDeltaEvent(
                data=AssistantMessageDeltaData(message_id="m", delta_content="x")
            )
            await store.publish("s", delta, after=1)
            async with asyncio.timeout(5):
                first = await anext(listener.notifies())

        # The first live event sent is the delta published after "b": the refused batch's
        # idle never was.
        assert first.payload.split("\n")[0] == '["s", 1, "assistant.message_delta"]'


async def test_issue20_3_a_retried_batch_does_not_send_its_live_events_again(pg_dsn: str) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        batch = [user("a")]
        idle = SessionIdleEvent()
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
            await listener.execute(f"LISTEN {postgres.LIVE_CHANNEL}")
            # The repeat of an append whose outcome was unknown stores nothing, and sends
            # nothing: its live events went with the first.
            assert await store.append("s", batch, lease=None, live=[(1, idle)]) == 1
            assert await store.append("s", batch, lease=None, live=[(1, idle)]) == 1
            delta = AssistantMessageDeltaEvent(
                data=AssistantMessageDeltaData(message_id="m", delta_content="x")
            )
            await store.publish("s", delta, after=1)
            heard: list[str] = []
            async with asyncio.timeout(5):
                async for notification in listener.notifies():
                    heard.append(notification.payload.split("\n")[0])
                    if "assistant.message_delta" in heard[-1]:
                        break

        assert heard == ['["s", 1, "session.idle"]', '["s", 1, "assistant.message_delta"]']


async def test_issue20_3_ephemeral_events_published_together_share_a_round_trip(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    execute = psycopg.AsyncCursor.execute

    async def counted(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if str(query).startswith("SELECT pg_notify(%s, payload)"):
            batches.append(len(json.loads(params[1])))
        elif isinstance(params, dict) and params.get("live"):  # sent with an append
            batches.append(len(json.loads(params["live"])))
        return await execute(cursor, query, params, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)

    async def act(writer: PostgresStore) -> None:
        await writer.append("s", [user("a")], lease=None)
        for n in range(20):
            delta = AssistantMessageDeltaEvent(
                data=AssistantMessageDeltaData(message_id="m", delta_content=str(n))
            )
            await writer.publish("s", delta, after=1)
        await writer.append("s", [user("b")], lease=None)

    got = await heard_elsewhere(pg_dsn, 22, act)

    # Each delta reaches the other runtime once, in order, before the append that followed it.
    assert [e.type for e in got] == ["user.message", *["assistant.message_delta"] * 20] + [
        "user.message"
    ]
    assert [e.data.delta_content for e in got[1:21]] == [str(n) for n in range(20)]  # type: ignore[union-attr]
    assert contents([got[0], got[21]]) == ["a", "b"]
    # Fewer statements than deltas: those published while one was sent went together (or
    # with the append that followed them).
    assert sum(batches) == 20
    assert len(batches) < 20


async def test_issue20_3_an_append_waits_for_earlier_live_events_not_for_later_ones(
    pg_dsn: str,
) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("streaming")
        await store.create("quiet")
        streaming = True

        async def stream() -> None:
            n = 0
            while streaming:
                delta = AssistantMessageDeltaEvent(
                    data=AssistantMessageDeltaData(message_id="m", delta_content=str(n))
                )
                await store.publish("streaming", delta, after=0)
                await asyncio.sleep(0)
                n += 1

        publisher = asyncio.create_task(stream())
        try:
            await asyncio.sleep(0.2)  # deltas are on their way, batch after batch
            # Another session's append is not held up by deltas published after it began.
            await asyncio.wait_for(store.append("quiet", [user("a")], lease=None), 5)
        finally:
            streaming = False
            await publisher
        assert contents(await store.read("quiet")) == ["a"]


async def test_an_ephemeral_event_too_large_for_notify_is_dropped_not_raised(
    pg_dsn: str,
) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        huge = AssistantMessageDeltaEvent(
            data=AssistantMessageDeltaData(message_id="m", delta_content="x" * 9000)
        )
        async with aclosing(store.subscribe("s")) as events:
            later = asyncio.create_task(take(events, 1, within=5))
            await asyncio.sleep(0.2)
            await store.publish("s", huge, after=0)
            await store.append("s", [user("a")], lease=None)
            assert [e.type for e in await later] == ["user.message"]


async def test_doorbell_payload_is_the_session_and_its_last_seq_never_the_event(
    pg_dsn: str,
) -> None:
    async with (
        stores(pg_dsn, 1) as (store,),
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener,
    ):
        await listener.execute(f"LISTEN {CHANNEL}".encode())
        await store.create("a:b")
        await store.append("a:b", [user("secret"), user("text")], lease=None)
        await store.delete("a:b")

        # The channel is the database's: other tests' sessions may ring it meanwhile.
        payloads = []
        async for note in listener.notifies(timeout=5):
            if note.payload.startswith("a:b:"):
                payloads.append(note.payload)
            if len(payloads) == 2:
                break

    assert payloads == ["a:b:2", "a:b:0"]


async def test_without_the_doorbell_a_subscriber_still_catches_up_by_polling(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_listener, "SUBSCRIBE_POLL", 0.2)
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        # The subscriber's first read fails, as during a failover: it must not end.
        failures = [StoreUnavailableError("read: the server is away")]
        read = store.read

        async def flaky_read(session_id: str, *, after: int = 0) -> list[Event]:
            if failures:
                raise failures.pop()
            return await read(session_id, after=after)

        monkeypatch.setattr(store, "read", flaky_read)
        async with aclosing(store.subscribe("s")) as events:
            reader = asyncio.create_task(take(events, 1, within=5))
            await asyncio.sleep(0.05)
            # An event stored behind the store's back, with no notification.
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
                await conn.execute(
                    b"WITH s AS (UPDATE sessions SET last_seq = 1 RETURNING session_id)"
                    b" INSERT INTO session_events (session_id, seq, id, type, payload)"
                    b" SELECT session_id, 1, 'e1', 'user.message', %s::json FROM s",
                    (EventAdapter.dump_json(user("quiet")).decode(),),
                )

            assert contents(await reader) == ["quiet"]
        assert not failures


# --- idempotency, schema ---------------------------------------------------------


async def test_a_retry_still_needs_the_lease(pg_dsn: str) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        lease = await store.acquire_lease("s", "w", 60)
        assert lease is not None
        batch = [user("hi")]
        await store.append("s", batch, lease=lease)
        await store.release_lease(lease)

        with pytest.raises(LeaseLostError):
            await store.append("s", batch, lease=lease)


async def test_p5_a_leased_append_after_an_event_the_log_lost_is_refused(pg_dsn: str) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        lease = await store.acquire_lease("s", "w", 60)
        assert lease is not None
        first = user("kept")
        await store.append("s", [first], lease=lease)
        # What a runtime that outlived the server's crash would append: its chain goes on
        # from an event the log no longer holds.
        after_lost = user("after the hole").model_copy(update={"parent_id": "lost"})

        with pytest.raises(LeaseLostError, match="lost its last appends"):
            await store.append("s", [after_lost], lease=lease, durable=False)
        assert contents(await store.read("s")) == ["kept"]

        # Following the log's last event, the same append goes through, durable or not.
        follows = user("next").model_copy(update={"parent_id": first.id})
        assert await store.append("s", [follows], lease=lease, durable=False) == 2
        assert contents(await store.read("s")) == ["kept", "next"]


async def test_more_concurrent_calls_than_connections_all_complete(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn, max_connections=2, timeout=5)
    try:
        names = [f"s{n}" for n in range(3)]
        for name in names:
            await store.create(name)

        async def busy(name: str) -> None:
            for n in range(10):
                await store.append(name, [user(f"{name}:{n}")], lease=None)
                await store.read(name)

        # Twelve callers at once over two connections: a connection back from a call goes
        # to whoever waits for one, never kept aside while a call waits out its timeout.
        async with asyncio.timeout(10):
            await asyncio.gather(*(busy(name) for name in names for _ in range(4)))
        for name in names:
            assert len(await store.read(name)) == 40
    finally:
        await store.close()


async def test_concurrent_appends_of_one_batch_from_two_stores_store_it_once(
    pg_dsn: str,
) -> None:
    async with stores(pg_dsn, 2) as (a, b):
        await a.create("s")
        for n in range(20):
            batch = [user(f"msg {n}")]
            counts = await asyncio.gather(
                a.append("s", batch, lease=None), b.append("s", batch, lease=None)
            )
            assert list(counts) == [n + 1, n + 1]

        assert contents(await a.read("s")) == [f"msg {n}" for n in range(20)]


async def test_an_append_cut_by_a_server_restart_is_unavailable_not_lost(pg_dsn: str) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
        await store.append("s", [user("before")], lease=None)
        await asyncio.to_thread(subprocess.run, restart_command(), check=True, capture_output=True)
        batch = [user("after")]
        try:
            await store.append("s", batch, lease=None)
        except StoreUnavailableError:
            await store.append("s", batch, lease=None)  # the retry the error invites

        assert contents(await store.read("s")) == ["before", "after"]


async def test_schema_is_created_once_by_concurrent_first_calls(pg_dsn: str) -> None:
    async with stores(pg_dsn, 4) as opened:
        await asyncio.gather(*(store.list_sessions() for store in opened))

    assert await column(pg_dsn, "SELECT version FROM trimtab_schema ORDER BY version") == [
        1,
        2,
        3,
        4,
    ]


async def test_a_newer_schema_is_refused(pg_dsn: str) -> None:
    async with stores(pg_dsn, 1) as (store,):
        await store.create("s")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(b"INSERT INTO trimtab_schema (version) VALUES (99)")

    async with stores(pg_dsn, 1) as (store,):
        with pytest.raises(RuntimeError, match="newer"):
            await store.get("s")


async def test_an_unreachable_server_fails_fast_and_the_store_stays_retryable() -> None:
    store = PostgresStore("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")

    for _ in range(2):
        with pytest.raises(StoreUnavailableError) as caught:
            await store.list_sessions()
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    await store.close()


async def test_open_store_takes_the_dsn_from_trimtab_store(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMTAB_STORE", pg_dsn)

    store = open_store(None)

    assert isinstance(store, PostgresStore)
    await store.create("s")
    assert [r.session_id for r in await store.list_sessions()] == ["s"]
    await store.close()


# --- a server restart ---------------------------------------------------------------------


async def test_store_recovers_after_a_server_restart_and_loses_nothing_acknowledged(
    pg_dsn: str,
) -> None:
    restart = restart_command()
    async with AsyncExitStack() as stack:
        writer, reader = await stack.enter_async_context(stores(pg_dsn, 2))
        await writer.create("s")
        acknowledged = [
            await writer.append("s", [user(f"before {n}")], lease=None) for n in range(5)
        ]
        events = await stack.enter_async_context(aclosing(reader.subscribe("s")))
        assert len(await take(events, 5, within=5)) == 5

        await asyncio.to_thread(
            subprocess.run, restart, check=True, capture_output=True, timeout=60
        )

        # The next call works (the pool replaces its dead connections), and so do the
        # subscriber's listener and reads: nothing acknowledged was lost.
        assert acknowledged == [1, 2, 3, 4, 5]
        assert await writer.append("s", [user("after")], lease=None) == 6
        assert contents(await writer.read("s")) == [*(f"before {n}" for n in range(5)), "after"]
        assert contents(await take(events, 1, within=SUBSCRIBE_POLL + 5)) == ["after"]
        await writer.append("s", [user("later")], lease=None)
        assert contents(await take(events, 1, within=SUBSCRIBE_POLL / 5)) == ["later"]


async def test_a_read_follows_the_appends_in_flight_to_its_session(pg_dsn: str) -> None:
    """A read waits for this store's appends to the session still on their way, also one
    whose caller stopped waiting (its time ran out: its cancellation is on its way too, and
    a frozen server that wakes may still commit it). A session catching up with its log
    (E3) then sees it rather than writing past it, which the next append's check would take
    for appends the database lost."""
    store = PostgresStore(pg_dsn, timeout=5.0)
    try:
        await store.create("s")
        async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
            await other.execute("SELECT 1 FROM sessions WHERE session_id = 's' FOR UPDATE")
            late = UserMessageEvent(data=UserMessageData(content="late"))
            appending = asyncio.ensure_future(store.append("s", [late], lease=None))
            await asyncio.sleep(0.2)  # the append waits for the row
            reading = asyncio.ensure_future(store.read("s"))
            await asyncio.sleep(0.2)
            assert not reading.done()
            await other.rollback()
        assert await appending == 1
        events = await reading
    finally:
        await store.close()
    assert [e.id for e in events] == [late.id]
