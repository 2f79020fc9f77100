"""`FaultyStore`: a store that crashes, yields and stalls on cue, for crash and race tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from trimtab._errors import StoreUnavailableError
from trimtab.events import Event, SessionPrunedEvent
from trimtab.store import Lease, SessionRecord, Store

__all__ = ["FaultyStore"]


class FaultyStore:
    """Wraps a `Store`: every call first awaits `pause` (yield to other tasks, sleep), and
    after `crash()` every call fails as if the process had died mid-way.

    A crash models `kill -9` of the runtime using this wrapper: nothing more it writes is
    stored, while the wrapped store keeps what was durable for a new runtime to open.

    ```python
    durable = MemoryStore()
    faulty = FaultyStore(durable, crash_at_write=7)      # the 7th write never returns
    async with Client(store=faulty) as doomed: ...        # runs until the crash
    async with Client(store=durable) as survivor: ...     # resumes what was stored
    ```

    Args:
        inner: The store that holds what is durable.
        crash_at_write: Crash on this write (1-based): a `create`, an `append` (a batch
            counts once) or a `rewrite_inputs` (an edit of the queue).
        durable: Whether that write is stored before the crash: the writer never hears
            back either way, as when a process dies between a commit and its return.
        pause: Awaited before every call (e.g. `asyncio.sleep(0)` a few times) to let
            other tasks interleave with the store's awaits.
    """

    def __init__(
        self,
        inner: Store,
        *,
        crash_at_write: int | None = None,
        durable: bool = False,
        pause: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.inner = inner
        self.timeout = inner.timeout
        """The wrapped store's bound on each call."""
        self.crash_at_write = crash_at_write
        self.durable = durable
        self.pause = pause
        self.writes = 0
        """Writes (creates, appends, prunes and edits of the queue) tried so far."""
        self.crashed = False

    def crash(self) -> None:
        """From now on every call fails at once: the runtime using this store is dead."""
        self.crashed = True
        self.timeout = 0.0  # nothing waits for a dead store (a session's retries included)

    async def _enter(self) -> None:
        if self.pause is not None:
            await self.pause()
        if self.crashed:
            raise StoreUnavailableError("the store's runtime crashed (simulated)")

    async def _write(self, write: Callable[[], Awaitable[int | None]]) -> int | None:
        await self._enter()
        self.writes += 1
        if self.writes == self.crash_at_write:
            if self.durable:
                await write()
            self.crash()
            raise StoreUnavailableError("the store's runtime crashed (simulated)")
        return await write()

    async def create(self, session_id: str, events: Sequence[Event] = ()) -> None:
        await self._write(lambda: self.inner.create(session_id, events))

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
    ) -> int:
        count = await self._write(
            lambda: self.inner.append(session_id, events, lease=lease, durable=durable)
        )
        assert count is not None
        return count

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        if not self.crashed:  # best effort, as the protocol says: a dead runtime's is lost
            await self.inner.publish(session_id, event, after=after)

    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        await self._enter()
        return await self.inner.read(session_id, after=after)

    async def subscribe(
        self, session_id: str, *, after: int = 0, ready: asyncio.Event | None = None
    ) -> AsyncGenerator[Event, None]:
        await self._enter()
        events = self.inner.subscribe(session_id, after=after, ready=ready)
        try:
            async for event in events:
                if self.crashed:
                    return
                yield event
        finally:
            await events.aclose()

    async def get(self, session_id: str) -> SessionRecord:
        await self._enter()
        return await self.inner.get(session_id)

    async def list_sessions(self) -> list[SessionRecord]:
        await self._enter()
        return await self.inner.list_sessions()

    async def delete(self, session_id: str) -> bool:
        await self._enter()
        return await self.inner.delete(session_id)

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        await self._enter()
        return await self.inner.acquire_lease(session_id, owner, ttl)

    async def renew_leases(self, owner: str, ttl: float) -> list[str]:
        await self._enter()
        return await self.inner.renew_leases(owner, ttl)

    async def release_lease(self, lease: Lease) -> None:
        await self._enter()
        await self.inner.release_lease(lease)

    async def claim_lease(self, session_id: str, owner: str, fence: int, ttl: float) -> Lease | int:
        await self._enter()
        return await self.inner.claim_lease(session_id, owner, fence, ttl)

    async def enqueue_input(self, session_id: str, prompt: str, message_id: str) -> None:
        await self._enter()
        await self.inner.enqueue_input(session_id, prompt, message_id)

    async def pending_inputs(self, session_id: str) -> list[tuple[str, str]]:
        await self._enter()
        return await self.inner.pending_inputs(session_id)

    async def sessions_with_inputs(self) -> set[str]:
        await self._enter()
        return await self.inner.sessions_with_inputs()

    async def discard_inputs(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        await self._enter()
        return await self.inner.discard_inputs(session_id, message_ids)

    async def prune(
        self, session_id: str, marker: SessionPrunedEvent, *, lease: Lease | None
    ) -> int:
        """A write like an append: the crash point counts it (spec X8)."""
        removed = await self._write(lambda: self.inner.prune(session_id, marker, lease=lease))
        assert removed is not None
        return removed

    async def rewrite_inputs(
        self, session_id: str, expected: Sequence[str], inputs: Sequence[tuple[str, str]]
    ) -> bool:
        async def write() -> int:
            return int(await self.inner.rewrite_inputs(session_id, expected, inputs))

        return bool(await self._write(write))

    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        await self._enter()
        await self.inner.save_snapshot(session_id, event_count, data)

    async def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        await self._enter()
        return await self.inner.load_snapshot(session_id)

    async def close(self) -> None:
        """Closes nothing: the wrapped store outlives the crashed runtime."""
