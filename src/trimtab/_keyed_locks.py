"""`KeyedLocks`: one lock per key (a session id), for work that must not overlap per key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["KeyedLocks"]


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        """Tasks holding or waiting for the lock."""


class KeyedLocks:
    """One FIFO lock per key, kept only while someone holds or waits for it, so that any
    number of keys (ids a client chose) leave nothing behind."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold `key`'s lock for the block, after those who asked for it before."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._entries[key]

    def __len__(self) -> int:
        """The keys in use."""
        return len(self._entries)
