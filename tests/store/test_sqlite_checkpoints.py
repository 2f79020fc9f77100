"""`SqliteStore`'s write-ahead log is checkpointed off the event loop, and stays bounded (W5)."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest

from tests.store.processes import child, go, next_line
from tests.store.test_sqlite_crash import acknowledged, texts
from trimtab import StoreUnavailableError
from trimtab.events import UserMessageData, UserMessageEvent
from trimtab.store import SqliteStore
from trimtab.store._checkpoints import Checkpointer

EVERY, LIMIT = 20, 300
"""A checkpoint every 20 writes, a restart from 300 frames: the defaults scaled down."""


def message(text: str) -> UserMessageEvent:
    return UserMessageEvent(data=UserMessageData(content=text))


def small_checkpoints(store: SqliteStore, *, every: int = EVERY) -> None:
    store._checkpoints = Checkpointer(store.path, timeout=store.timeout, every=every, limit=LIMIT)


def wal_frames(db: Path) -> int:
    """Frames the WAL file has room for: its size, which only a restart keeps from growing."""
    try:
        with db.with_name(db.name + "-wal").open("rb") as wal:
            header = wal.read(32)
            size = wal.seek(0, 2)
    except FileNotFoundError:
        return 0
    if len(header) < 32:
        return 0
    page_size = int.from_bytes(header[8:12], "big")  # the WAL header's page size
    return (size - 32) // (page_size + 24)  # each frame: a 24-byte header and a page


async def test_w5_commits_do_not_checkpoint(tmp_path: Path) -> None:
    """With the store's checkpointer idle, 1,500 commits (SQLite's own would checkpoint
    in the commit that reaches 1,000 pages, then start the WAL over) all stay in the WAL."""
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db)
    small_checkpoints(store, every=10**9)
    await store.create("s")
    for n in range(1500):
        await store.append("s", [message(str(n))], lease=None)

    with closing(sqlite3.connect(db)) as other:
        busy, frames, copied = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0
    assert frames == copied > 1500  # nothing was copied into the database file before this
    assert store._checkpoints._thread is None  # started by the first checkpoint only
    await store.close()


async def test_w5_steady_writes_keep_the_wal_bounded(tmp_path: Path) -> None:
    """Appends back to back, never a pause for a passive checkpoint to catch up: the WAL
    is still started over (a restart, writers waiting for it), and nothing is lost."""
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db)
    small_checkpoints(store)
    await store.create("s")
    largest = 0
    for n in range(10_000):
        await store.append("s", [message(str(n))], lease=None)
        if n % 100 == 0:
            largest = max(largest, wal_frames(db))

    # Without restarts the WAL holds every frame written, about 5 an append: 50,000. With
    # them, what the loop writes while the thread catches up (~2,700 on a quiet machine).
    assert largest < 10_000
    assert texts(await store.read("s")) == [str(n) for n in range(10_000)]
    await store.close()
    with closing(sqlite3.connect(db)) as check:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


async def test_w5_writes_wait_for_a_restart_without_blocking_the_loop(tmp_path: Path) -> None:
    """While the checkpointer restarts the WAL (holding SQLite's write lock), writes queue
    in call order, and other tasks, reads included, go on. Once it is over, the queue is
    written back to back, not one write per turn of the event loop (a queue that empties
    slower than a busy server adds to it never empties)."""
    store = SqliteStore(tmp_path / "trimtab.db")
    await store.create("s")
    store._checkpoints.restarting.set()

    writes = [
        asyncio.create_task(store.append("s", [message(str(n))], lease=None)) for n in range(100)
    ]
    for _ in range(5):
        await asyncio.sleep(0.01)
        assert (await store.get("s")).event_count == 0  # reads go on; the writes wait
    assert not any(write.done() for write in writes)

    store._checkpoints.restarting.clear()
    assert await asyncio.wait_for(writes[0], 5) == 1
    assert (await store.get("s")).event_count == 100  # all of them, as the first returned
    assert await asyncio.gather(*writes) == list(range(1, 101))
    assert texts(await store.read("s")) == [str(n) for n in range(100)]
    await store.close()


async def test_w5_writes_of_two_threads_queue_together(tmp_path: Path) -> None:
    """A store shared with another thread's event loop: its queued writes are run by the
    same drainer and answered on their own loop, each thread's in its call order."""
    store = SqliteStore(tmp_path / "trimtab.db")
    await store.create("s")
    store._checkpoints.restarting.set()

    async def appends(name: str) -> list[int]:
        return list(
            await asyncio.gather(
                *(store.append("s", [message(f"{name}:{n}")], lease=None) for n in range(50))
            )
        )

    here = asyncio.create_task(appends("here"))
    await asyncio.sleep(0.01)
    there = asyncio.get_running_loop().run_in_executor(None, asyncio.run, appends("there"))
    await asyncio.sleep(0.05)
    assert (await store.get("s")).event_count == 0

    store._checkpoints.restarting.clear()
    seqs = await asyncio.wait_for(asyncio.gather(here, there), 5)
    assert sorted(seqs[0] + seqs[1]) == list(range(1, 101))
    events = texts(await store.read("s"))
    for name, mine in zip(("here", "there"), seqs, strict=True):
        assert [events[seq - 1] for seq in mine] == [f"{name}:{n}" for n in range(50)]
    await store.close()


async def test_w5_a_write_that_stops_waiting_is_not_run(tmp_path: Path) -> None:
    """A queued write whose caller gave up (cancelled, or past the store's timeout, W1) is
    skipped; the writes behind it keep their order."""
    store = SqliteStore(tmp_path / "trimtab.db", timeout=0.2)
    await store.create("s")
    store._checkpoints.restarting.set()
    first = asyncio.create_task(store.append("s", [message("first")], lease=None))
    cancelled = asyncio.create_task(store.append("s", [message("cancelled")], lease=None))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    with pytest.raises(StoreUnavailableError):
        await first  # still waiting for the restart after the store's timeout
    last = asyncio.create_task(store.append("s", [message("last")], lease=None))

    store._checkpoints.restarting.clear()
    assert await asyncio.wait_for(last, 5) == 1
    assert cancelled.cancelled()
    assert texts(await store.read("s")) == ["last"]
    await store.close()


async def test_w5_writes_queued_when_the_store_closes_fail_at_once(tmp_path: Path) -> None:
    """Closing the store stops its checkpointer (which ends a restart); the writes still
    queued then raise that the store is closed, instead of waiting out their timeout."""
    store = SqliteStore(tmp_path / "trimtab.db")
    await store.create("s")
    store._checkpoints.restarting.set()  # as if a restart were running
    writes = [
        asyncio.create_task(store.append("s", [message(str(n))], lease=None)) for n in range(3)
    ]
    await asyncio.sleep(0.01)

    await store.close()
    store._checkpoints.restarting.clear()  # what the stopped thread's restart does as it ends

    results = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 1)
    assert [str(result) for result in results] == ["the store is closed"] * 3


async def appends_until_a_restart(store: SqliteStore) -> tuple[int, asyncio.Task[int]]:
    """Append until the checkpointer's restart begins: the appends acknowledged, and the
    one in flight then, which may be waiting for the restart."""
    restart = asyncio.create_task(asyncio.to_thread(store._checkpoints.restarting.wait, 10))
    n = 0
    while True:
        write = asyncio.create_task(store.append("s", [message(str(n))], lease=None))
        await asyncio.wait([write, restart], return_when=asyncio.FIRST_COMPLETED)
        if restart.done():
            assert await restart, "no restart began"
            return n, write
        n += 1


async def acknowledged_then(n: int, write: asyncio.Task[int]) -> int:
    """How many appends are stored once the store closed: the one that waited for the
    restart ran as it ended, or found the store closed."""
    (outcome,) = await asyncio.gather(write, return_exceptions=True)
    assert outcome == n + 1 or str(outcome) == "the store is closed"
    return n + 1 if outcome == n + 1 else n


async def test_w5_close_waits_for_a_restart_without_blocking_the_loop(tmp_path: Path) -> None:
    """A restart held up by another connection's reader makes `close` wait for it (up to
    the store's timeout), on a thread: the loop's other tasks go on meanwhile."""
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db, timeout=10)
    small_checkpoints(store)
    await store.create("s")
    with closing(sqlite3.connect(db, isolation_level=None)) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchone()  # a snapshot of the WAL
        n, write = await appends_until_a_restart(store)
        closing_store = asyncio.create_task(store.close())

        ticks = 0
        for _ in range(10):
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 10 and not closing_store.done()  # the restart still waits
        reader.execute("COMMIT")
    await asyncio.wait_for(closing_store, 5)
    stored = await acknowledged_then(n, write)

    assert not store._checkpoints.restarting.is_set()
    store = SqliteStore(db)
    assert texts(await store.read("s")) == [str(k) for k in range(stored)]
    await store.close()


async def test_w5_a_close_cancelled_while_it_waits_still_ends_the_subscribers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller of `close` gives up while a restart holds it: the store still closes
    once the restart ends, and its subscribers end then, not at their next poll."""
    monkeypatch.setattr("trimtab.store.sqlite.SUBSCRIBE_POLL", 60.0)
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db, timeout=10)
    small_checkpoints(store)
    await store.create("s")

    async def follow() -> int:
        return len([event async for event in store.subscribe("s")])

    with closing(sqlite3.connect(db, isolation_level=None)) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchone()
        n, write = await appends_until_a_restart(store)
        subscriber = asyncio.create_task(follow())
        closing_store = asyncio.create_task(store.close())
        await asyncio.sleep(0.05)
        closing_store.cancel()
        await asyncio.sleep(0.05)
        assert not subscriber.done()  # the store is not closed yet: the restart waits
        reader.execute("COMMIT")
    seen = await asyncio.wait_for(subscriber, 5)
    stored = await acknowledged_then(n, write)

    assert seen <= stored
    assert store._db is None
    store = SqliteStore(db)
    assert texts(await store.read("s")) == [str(k) for k in range(stored)]
    await store.close()


async def test_w5_close_stops_the_checkpointer_and_leaves_no_wal(tmp_path: Path) -> None:
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db)
    small_checkpoints(store)
    await store.create("s")
    for n in range(3 * EVERY):
        await store.append("s", [message(str(n))], lease=None)
    thread = store._checkpoints._thread
    assert thread is not None and thread.is_alive()

    await store.close()

    assert not thread.is_alive()
    # The last connection to close copied the WAL into the database file and removed it.
    assert not db.with_name(db.name + "-wal").exists()
    store = SqliteStore(db)
    assert texts(await store.read("s")) == [str(n) for n in range(3 * EVERY)]
    await store.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_w5_a_checkpointer_thread_that_died_is_started_again(tmp_path: Path) -> None:
    """Were its thread to die of an unexpected error, the WAL would grow without bound
    (commits no longer checkpoint): the next checkpoint starts a new one."""
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db)
    small_checkpoints(store)
    checkpoints = store._checkpoints
    checkpoint = checkpoints._checkpoint
    failures: list[threading.Thread] = []

    def fail_once(connection: sqlite3.Connection) -> None:
        if not failures:
            failures.append(threading.current_thread())
            raise MemoryError
        checkpoint(connection)

    checkpoints._checkpoint = fail_once  # type: ignore[method-assign,assignment]
    await store.create("s")
    for n in range(EVERY):
        await store.append("s", [message(str(n))], lease=None)
    first = checkpoints._thread
    assert first is not None
    first.join(5)
    assert failures == [first]

    for n in range(EVERY, 2000):
        await store.append("s", [message(str(n))], lease=None)
    thread = checkpoints._thread
    assert thread is not None and thread.is_alive() and thread is not first
    assert wal_frames(db) < 5_000  # without a thread: ~10,000
    await store.close()


# A writer with the store's own checkpoints: appends `count` events one per commit to
# session "s", printing each acknowledged count.
WRITER = """
import asyncio, sys
from trimtab import StoreUnavailableError
from trimtab.events import UserMessageData, UserMessageEvent
from trimtab.store import SqliteStore

async def main(path, name, count):
    store = SqliteStore(path)
    print("ready", flush=True)
    sys.stdin.readline()
    for n in range(count):
        event = UserMessageEvent(data=UserMessageData(content=f"{name}:{n}"))
        print(await store.append("s", [event], lease=None), flush=True)
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_w5_two_processes_writing_steadily_keep_the_wal_bounded(tmp_path: Path) -> None:
    """Two processes appending back to back, each with its checkpointer: one's restart makes
    the other's writes wait for SQLite's lock (W1). The sequence stays gapless, and the WAL
    bounded: with passive checkpoints only, it would keep every frame written (over 50,000)."""
    db, per_writer = tmp_path / "trimtab.db", 5000
    store = SqliteStore(db)
    await store.create("s")
    await store.close()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)

    largest = 0
    async with (
        child(script, str(db), "a", str(per_writer)) as a,
        child(script, str(db), "b", str(per_writer)) as b,
    ):
        go(a, b)
        outputs = asyncio.gather(a.communicate(), b.communicate())
        while not outputs.done():
            largest = max(largest, wal_frames(db))
            await asyncio.sleep(0.01)
        for proc, (_, stderr) in zip((a, b), outputs.result(), strict=True):
            assert proc.returncode == 0, stderr.decode()

    counts = [acknowledged(out) for out, _ in outputs.result()]
    assert sorted(counts[0] + counts[1]) == list(range(1, 2 * per_writer + 1))
    assert largest < 25_000  # 4,300-11,100 on a quiet machine
    with closing(sqlite3.connect(db)) as check:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


# Appends to session "s" without end, one event per commit, with the test's small checkpoints
# (so that the thread is checkpointing or restarting the WAL most of the time), printing each
# acknowledged count.
CHECKPOINTING_WRITER = f"""
import asyncio, sys
from trimtab.events import UserMessageData, UserMessageEvent
from trimtab.store import SqliteStore
from trimtab.store._checkpoints import Checkpointer

async def main(path):
    store = SqliteStore(path)
    store._checkpoints = Checkpointer(
        store.path, timeout=store.timeout, every={EVERY}, limit={LIMIT}
    )
    print("ready", flush=True)
    sys.stdin.readline()
    n = 0
    while True:
        event = UserMessageEvent(data=UserMessageData(content=f"w:{{n}}"))
        print(await store.append("s", [event], lease=None), flush=True)
        n += 1

asyncio.run(main(sys.argv[1]))
"""


async def test_w5_kill_9_while_checkpointing_keeps_every_acknowledged_event(
    tmp_path: Path,
) -> None:
    """P2 with the checkpointer at work: a writer killed among checkpoints and restarts of
    the WAL loses no acknowledged event, and SQLite finds no corruption."""
    db = tmp_path / "trimtab.db"
    store = SqliteStore(db)
    await store.create("s")
    await store.close()
    script = tmp_path / "writer.py"
    script.write_text(CHECKPOINTING_WRITER)

    async with child(script, str(db)) as proc:
        go(proc)
        last = 0
        while last < 3000:  # ~15,000 frames: restarts of a 300-frame limit, many times over
            last = int(await next_line(proc))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert proc.stdout is not None
        acked = max([last, *acknowledged(await proc.stdout.read())])

    store = SqliteStore(db)
    events = texts(await store.read("s"))
    assert len(events) >= acked
    assert events == [f"w:{n}" for n in range(len(events))]
    await store.close()
    with closing(sqlite3.connect(db)) as check:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
