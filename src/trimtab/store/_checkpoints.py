"""`Checkpointer`: copies a SQLite store's write-ahead log into its database file on a thread.

By default SQLite checkpoints inside the commit that fills the WAL to 1,000 pages: that
commit copies the pages into the database file and syncs it. `SqliteStore` commits on the
event loop's thread, so every turn in flight waited for it, sometimes 100 ms and more
(docs/performance.md item 22). The store turns that off (`wal_autocheckpoint = 0`) and tells
a `Checkpointer` about its writes instead, which checkpoints on a connection and thread of
its own (spec W5).

A `PASSIVE` checkpoint waits for no one, but SQLite starts the WAL over only at a write that
finds every frame already copied, which under steady writes never happens: the WAL would
grow without bound. So once it holds `limit` frames, the checkpointer follows with a
`RESTART` checkpoint, which holds the write lock while it copies what is left; `restarting`
is set meanwhile, so that the store's writes wait for it by yielding to the event loop
instead of inside SQLite.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

__all__ = ["Checkpointer"]

CHECKPOINT_EVERY = 250
"""Write transactions between checkpoints: about SQLite's own 1,000 pages at a few pages each."""

WAL_LIMIT = 2000
"""Frames (pages) in the WAL from which a checkpoint makes writers wait to start it over: 8 MiB
of 4 KiB pages. Not more: a longer WAL keeps more of its shared-memory index resident
(docs/performance.md item 22)."""


class Checkpointer:
    """Checkpoints the WAL of `path` every `every` writes (see `wrote`), on its own thread.

    The thread and its connection start with the first checkpoint, so a store that writes
    little never has them. Waits inside SQLite are bounded by `timeout` seconds.
    """

    def __init__(
        self,
        path: Path,
        *,
        timeout: float,
        every: int = CHECKPOINT_EVERY,
        limit: int = WAL_LIMIT,
    ) -> None:
        self._path = path
        self._timeout = timeout
        self._every = every
        self._limit = limit
        self._writes = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.restarting = threading.Event()
        """Set while a `RESTART` checkpoint holds (or waits for) the write lock."""

    def wrote(self) -> None:
        """Count one committed write transaction; start a checkpoint every `every` of them."""
        self._writes += 1
        if self._writes < self._every or self._closed:
            return
        self._writes = 0
        if self._thread is None or not self._thread.is_alive():  # (or it died of an error)
            self._thread = threading.Thread(
                target=self._work, name="trimtab-sqlite-checkpoints", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread after the checkpoint it is running, waiting for it up to `timeout`."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self._timeout)

    def _work(self) -> None:
        # timeout: a RESTART waits that long for the write lock and for readers of the WAL.
        db = sqlite3.connect(
            self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
        )
        try:
            # A checkpoint copies frames without the page cache: keep SQLite's 2 MiB one small.
            db.execute("PRAGMA cache_size = -64")
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._closed:
                    return
                self._checkpoint(db)
        finally:
            db.close()

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        try:
            _, frames, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames < self._limit:
                return
            self.restarting.set()
            try:
                db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            finally:
                self.restarting.clear()
        except sqlite3.Error:
            # A checkpoint is an optimisation of the file, never needed for correctness:
            # whatever stopped this one (another process's lock held past the timeout, a
            # closed or removed file), the next one, or the last connection's close, redoes it.
            pass
