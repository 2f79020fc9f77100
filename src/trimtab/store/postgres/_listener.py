"""`Doorbell`: the store's one LISTEN connection, ringing its subscribers (scale-out.md 4.5).

Every append rings the doorbell channel with `<session_id>:<last seq>`; the notification is
only a doorbell: subscribers read the events from the table by sequence, so a lost
notification (a dropped listener connection) delays delivery but loses nothing. The live
channel carries ephemeral events whole, which the listener hands to the session's local
subscribers, placed after the stored events they followed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import psycopg

from trimtab._errors import StoreUnavailableError
from trimtab.events import event_from_json, new_id
from trimtab.store._base import Listeners
from trimtab.store.postgres._calls import Connection, connect_options
from trimtab.store.postgres._statements import CHANNEL, LIVE_CHANNEL

__all__ = ["SUBSCRIBE_POLL", "Doorbell"]

log = logging.getLogger(__name__)

SUBSCRIBE_POLL = 5.0
"""Seconds a subscriber waits for the doorbell before it reads the table anyway.

Only a safety net: NOTIFY is reliable while the listener is connected, and every subscriber
re-reads whenever the listener (re)connects.
"""


class Doorbell:
    """The LISTEN connection of one store, and the subscribers it rings.

    It reconnects (with backoff) whenever the connection drops, and then rings every
    subscriber, since notifications sent meanwhile are lost. A server that goes silent sends
    no error either (a frozen or vanished host): after `SUBSCRIBE_POLL` seconds without a
    notification the connection is checked with a query, bounded by the store's timeout.
    """

    def __init__(self, dsn: str, timeout: float) -> None:
        self._dsn = dsn
        self._timeout = timeout
        self.listeners = Listeners()
        self._ready = asyncio.Event()
        self._markers: dict[str, asyncio.Future[None]] = {}
        """Markers sent to the live channel and waited for (`heard_so_far`)."""
        self._task = asyncio.get_running_loop().create_task(
            self._listen(), name="trimtab-postgres-listener"
        )

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    options = connect_options(self._dsn, self._timeout)
                    conn = await psycopg.AsyncConnection.connect(self._dsn, **options)
                async with conn:
                    async with asyncio.timeout(self._timeout):
                        await conn.execute(f"LISTEN {CHANNEL}; LISTEN {LIVE_CHANNEL}")
                    delay = 0.1
                    # Rung before it says it listens: see `PostgresStore.subscribe`.
                    self.listeners.ring_all()
                    self._ready.set()
                    await self._dispatch_until_silent(conn)
            except (psycopg.Error, TimeoutError) as error:
                reason = str(error) or f"no answer within {self._timeout} s"
                log.warning("trimtab listener: %s; reconnecting in %.1f s", reason, delay)
            self._ready.clear()
            self._give_up_markers()  # what was sent meanwhile is lost to this connection
            await asyncio.sleep(delay)
            delay = min(delay * 2, SUBSCRIBE_POLL)

    async def _dispatch_until_silent(self, conn: Connection) -> None:
        """Dispatch notifications until the server stops answering (raises)."""
        while True:
            heard = False
            async for notify in conn.notifies(timeout=SUBSCRIBE_POLL):
                heard = True
                self._dispatch(notify.channel, notify.payload)
            if not heard:
                async with asyncio.timeout(self._timeout):
                    await conn.execute("SELECT 1")

    @property
    def up(self) -> bool:
        """Whether the connection listens now."""
        return self._ready.is_set()

    async def listening(self, timeout: float) -> None:
        """Wait until the connection listens, at most `timeout` seconds (then go on: the
        subscribers poll meanwhile)."""
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        except TimeoutError:
            pass

    async def heard_so_far(self, notify: Callable[[list[str]], Awaitable[None]]) -> None:
        """Wait until the listener has handled every notification sent before: it hears
        them in the order they were sent, so once it hears one more of its own, a marker
        that no subscriber follows, sent with `notify`. Bounded by the store's timeout,
        then gone on."""
        marker = f"sync:{new_id()}"
        heard = self._markers[marker] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(self._timeout):
                await notify([f"{json.dumps([marker, 0, 'sync'])}\n"])
                await heard
        except (StoreUnavailableError, TimeoutError) as error:
            log.warning("trimtab subscription: the listener did not answer: %s", error)
        finally:
            self._markers.pop(marker, None)

    def _give_up_markers(self) -> None:
        """End every wait for a marker: none will be heard on this connection any more."""
        for heard in self._markers.values():
            if not heard.done():
                heard.set_result(None)

    def _dispatch(self, channel: str, payload: str) -> None:
        try:
            self._deliver(channel, payload)
        except (ValueError, TypeError) as error:
            # Anyone who can connect may NOTIFY these channels, and a newer trimtab sharing
            # the database may publish an event type this one does not know: skipped, not
            # the end of the listener (and of every subscription's live events with it).
            log.warning("trimtab listener: skipped a notification it cannot read: %s", error)

    def _deliver(self, channel: str, payload: str) -> None:
        if channel == CHANNEL:
            session_id, _, seq = payload.rpartition(":")
            # 0: the session was deleted, which its subscribers learn by reading.
            self.listeners.ring(session_id, int(seq) or None)
            return
        head, _, body = payload.partition("\n")
        session_id, after, event_type = json.loads(head)
        if (heard := self._markers.get(session_id)) is not None:
            if not heard.done():
                heard.set_result(None)
            return
        if self.listeners.listening(session_id):  # parsed only when someone here wants it
            self.listeners.post(session_id, after, event_from_json(body, event_type))

    async def close(self, timeout: float) -> None:
        """Stop listening and wake every subscriber (they see the store closed and end)."""
        self._task.cancel()
        # Cancelling its query in a server that does not answer takes psycopg a while.
        await asyncio.wait((self._task,), timeout=timeout)
        self._give_up_markers()
        self.listeners.ring_all()
