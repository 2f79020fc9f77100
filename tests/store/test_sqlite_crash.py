"""`SqliteStore` against real processes: concurrent writers and `kill -9` (spec P2)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from contextlib import AbstractAsyncContextManager, closing
from pathlib import Path

from tests.store.processes import child, go, next_line
from trimtab.events import Event, UserMessageData, UserMessageEvent
from trimtab.store import SqliteStore
from trimtab.store.sqlite import BUSY_SLICE, PAGE_CACHE_KIB, SCHEMA_VERSION

BATCH = 3
"""Events per append in the crash tests: a torn batch would show as a count not divisible by it."""

# Appends `count` events (forever if negative) to one session, `batch` per call, and prints
# the count each append returns once it has returned, i.e. once the events are acknowledged.
WRITER = """
import asyncio, sys
from trimtab.events import UserMessageData, UserMessageEvent
from trimtab.store import SqliteStore

async def main(path, session_id, name, count, batch):
    store = SqliteStore(path)
    print("ready", flush=True)
    sys.stdin.readline()  # wait for "go", so that writers started together really overlap
    n = 0
    while count < 0 or n < count:
        events = [
            UserMessageEvent(data=UserMessageData(content=f"{name}:{n + i}")) for i in range(batch)
        ]
        print(await store.append(session_id, events, lease=None), flush=True)
        n += batch
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
"""


def writer(
    tmp_path: Path, db: Path, name: str, *, count: int, batch: int
) -> AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """A writer process appending to session "s" of `db`, ready and waiting for "go"."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return child(script, str(db), "s", name, str(count), str(batch))


def acknowledged(output: bytes) -> list[int]:
    """The counts a writer printed in full (a line cut by the kill is not acknowledged)."""
    return [int(line) for line in output.decode().split("\n")[:-1]]


def texts(events: list[Event]) -> list[str]:
    return [e.data.content for e in events if isinstance(e, UserMessageEvent)]


async def new_session(db: Path) -> None:
    store = SqliteStore(db)
    await store.create("s")
    await store.close()


async def test_two_processes_appending_to_one_session_keep_seq_gapless(tmp_path: Path) -> None:
    db, per_writer = tmp_path / "trimtab.db", 500
    await new_session(db)

    async with (
        writer(tmp_path, db, "a", count=per_writer, batch=1) as a,
        writer(tmp_path, db, "b", count=per_writer, batch=1) as b,
    ):
        go(a, b)
        outputs = await asyncio.gather(a.communicate(), b.communicate())
        for proc, (_, stderr) in zip((a, b), outputs, strict=True):
            assert proc.returncode == 0, stderr.decode()
    acks = {name: acknowledged(out) for name, (out, _) in zip("ab", outputs, strict=True)}

    # Every count was returned exactly once across both writers: the sequence is gapless.
    assert sorted(acks["a"] + acks["b"]) == list(range(1, 2 * per_writer + 1))
    store = SqliteStore(db)
    events = texts(await store.read("s"))
    assert (await store.get("s")).event_count == len(events) == 2 * per_writer
    # The event at each acknowledged seq is the one that writer appended, in its order.
    for name, counts in acks.items():
        assert [events[seq - 1] for seq in counts] == [f"{name}:{n}" for n in range(per_writer)]
    await store.close()


async def kill_writer_mid_append(tmp_path: Path, db: Path) -> int:
    """Start an endless writer, `kill -9` it while it appends; the last acknowledged count."""
    await new_session(db)
    async with writer(tmp_path, db, "w", count=-1, batch=BATCH) as proc:
        go(proc)
        last = 0
        while last < 50 * BATCH:
            last = int(await next_line(proc))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert proc.stdout is not None
        acks = acknowledged(await proc.stdout.read())
    assert proc.returncode == -signal.SIGKILL
    return max([last, *acks])


async def assert_log_intact(db: Path, acked: int) -> None:
    """Every acknowledged event is there, no batch is torn, and SQLite finds no corruption."""
    store = SqliteStore(db)
    events = texts(await store.read("s"))
    assert len(events) >= acked
    assert len(events) % BATCH == 0
    assert events == [f"w:{n}" for n in range(len(events))]
    assert (await store.get("s")).event_count == len(events)
    await store.close()
    with closing(sqlite3.connect(db)) as check:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


async def test_p2_kill_9_mid_append_keeps_every_acknowledged_event(tmp_path: Path) -> None:
    db = tmp_path / "trimtab.db"

    acked = await kill_writer_mid_append(tmp_path, db)

    await assert_log_intact(db, acked)


async def test_p2_torn_wal_tail_is_dropped_on_open(tmp_path: Path) -> None:
    db = tmp_path / "trimtab.db"
    acked = await kill_writer_mid_append(tmp_path, db)
    wal = db.with_name(db.name + "-wal")
    assert wal.exists(), "the killed writer left its write-ahead log for recovery"

    with wal.open("ab") as tail:  # half a frame that never got its commit
        tail.write(os.urandom(2048))

    await assert_log_intact(db, acked)
    store = SqliteStore(db)  # and the recovered log goes on where it ended
    count = (await store.get("s")).event_count
    after = UserMessageEvent(data=UserMessageData(content="after"))
    assert await store.append("s", [after], lease=None) == count + 1
    await store.close()


async def test_p5_sqlite_settings_the_store_relies_on_are_in_force(tmp_path: Path) -> None:
    """P2, P5: WAL with `synchronous = NORMAL` (durable against a process crash, one commit
    each), read back from the connection the store writes with, on a new file and reopened;
    the journal mode is the file's, so a second connection reads it too."""
    db = tmp_path / "trimtab.db"
    settings = {
        "journal_mode": "wal",
        "synchronous": 1,  # NORMAL: OFF (0) loses commits to an OS crash; FULL (2) costs 18x
        "foreign_keys": 1,  # ON DELETE CASCADE of a session's events and inputs
        "busy_timeout": round(BUSY_SLICE * 1000),
        "cache_size": -PAGE_CACHE_KIB,
        "wal_autocheckpoint": 0,  # W5: commits never checkpoint; the store's thread does
        "user_version": SCHEMA_VERSION,
    }

    def read(connection: sqlite3.Connection) -> dict[str, object]:
        return {name: connection.execute(f"PRAGMA {name}").fetchone()[0] for name in settings}

    for session_id in ("on a new file", "reopened"):
        store = SqliteStore(db)
        assert store._db is not None  # the one connection every call of the store uses
        assert read(store._db) == settings
        await store.create(session_id)
        assert read(store._db) == settings  # (a write changes none of them)
        await store.close()
        with closing(sqlite3.connect(db)) as other:
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
