"""`LiveSender`: the store's ephemeral events on their way to the live channel, in order.

A turn does not wait a round trip per delta: `publish` queues the event and returns. The
queue goes out as one batch (one statement), and the events published while it travels go
in the next. An append takes the queue into its own statement instead (`taken`), so that
the events published before it arrive before its doorbell, and a subscription waits for
those published before it began (`sent`).

The ordering rule, kept here whole: batches leave in the order their events were published,
and a batch leaves only once the one before it is sent (or given up on). So an append first
waits for the batch on its way; then it takes the queue, unless the sender took it
meanwhile, in which case it waits for that batch too (and not for events published later,
which other sessions may go on doing). A batch that fails to send is given up on (logged):
live events are a courtesy, the log is the record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import psycopg

from trimtab._errors import StoreUnavailableError

__all__ = ["LiveSender"]

log = logging.getLogger(__name__)


class _Batch:
    """Payloads that leave together, and a future done once they are sent (or given up)."""

    __slots__ = ("done", "payloads")

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    async def sent(self) -> None:
        """Wait until the batch is sent; shielded, so that a caller given up on (an append
        past its timeout) does not mark it sent."""
        if not self.done.done():
            await asyncio.shield(self.done)


class LiveSender:
    """Sends published payloads with `send` (one call per batch), in publish order."""

    def __init__(self, send: Callable[[list[str]], Awaitable[None]]) -> None:
        self._send = send
        self._queued: _Batch | None = None
        """Published, not on its way yet."""
        self._sending: _Batch | None = None
        """On its way, by the sender or in an append."""
        self._sender: asyncio.Task[None] | None = None

    def publish(self, payload: str) -> None:
        """Queue `payload`; it leaves with the next batch."""
        if self._queued is None:
            self._queued = _Batch()
        self._queued.payloads.append(payload)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_queued())

    async def _send_queued(self) -> None:
        # One turn of the event loop first: an append called right after the publish (its
        # task starts after this one) takes the events into its own statement instead.
        await asyncio.sleep(0)
        try:
            while (batch := self._queued) is not None:
                self._queued, self._sending = None, batch
                try:
                    await self._send(batch.payloads)
                except (StoreUnavailableError, psycopg.Error, RuntimeError) as error:
                    # RuntimeError: the store was closed meanwhile.
                    log.warning(
                        "trimtab could not publish %d live events: %s", len(batch.payloads), error
                    )
                finally:
                    batch.finish()
        finally:
            # Only when cancelled (the event loop is closing) is anything left: let no append
            # wait for it.
            if self._queued is not None:
                self._queued.finish()
                self._queued = None

    @asynccontextmanager
    async def taken(self) -> AsyncIterator[list[str]]:
        """The payloads published so far and not on their way yet, for an append to send in
        its statement, before its doorbell: marked sent when the block ends, whether the
        append stored anything or not. Empty when there are none, or when the sender took
        them meanwhile (they are sent, then, before the block begins)."""
        queued, sending = self._queued, self._sending
        if sending is not None:
            await sending.sent()
        if queued is None or self._queued is not queued:
            if queued is not None:  # the sender took them
                await queued.sent()
            yield []
            return
        self._queued, self._sending = None, queued
        try:
            yield queued.payloads
        finally:
            queued.finish()

    async def sent(self) -> None:
        """Wait until the payloads published so far are sent (or given up on), and not for
        those published meanwhile."""
        # The batches go in order: once the queued one is sent, so is the one on its way.
        waited = self._queued or self._sending
        if waited is not None:
            await waited.sent()
