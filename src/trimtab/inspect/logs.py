"""`Logs`: the sessions' logs as the inspector has read them, through the public `Store`.

A session's events and their `Timeline` stay in memory after its page was shown, so that the
next page of the same session reads only the events appended since (`Store.read(after=)`).
Both caches are bounded: the logs by their total number of events (the least recently shown
go first; the one being shown always stays), the index's summaries by count.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from trimtab.events import Event
from trimtab.inspect.digest import Summary, summarize
from trimtab.inspect.timeline import Timeline
from trimtab.store import SessionRecord, Store

__all__ = ["Logs", "SessionLog"]

MAX_CACHED_EVENTS = 100_000
"""Events kept in memory across sessions (about 2 KB each once parsed)."""
MAX_SUMMARIES = 4096
"""Summaries kept for the sessions page."""


@dataclass(slots=True)
class SessionLog:
    """One session's events read so far, folded into its timeline."""

    events: list[Event] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def position(self) -> int:
        """The position of its last event in the log (a pruned log keeps its positions)."""
        return self.timeline.digest.event_count

    def extend(self, events: Sequence[Event]) -> None:
        for event in events:
            self.timeline.add(event)
        self.events.extend(events)


class Logs:
    """Reads logs from `store`, keeping what it read (see the module's docstring)."""

    def __init__(self, store: Store, *, max_events: int = MAX_CACHED_EVENTS) -> None:
        self.store = store
        self._max_events = max_events
        self._logs: OrderedDict[str, SessionLog] = OrderedDict()
        self._summaries: OrderedDict[str, Summary] = OrderedDict()
        self._lock = asyncio.Lock()
        """One reader at a time: two pages of one session must not fold its events twice."""

    async def load(self, session_id: str) -> SessionLog:
        """The session's log, brought up to date. Raises `SessionNotFoundError`."""
        async with self._lock:
            log = self._logs.pop(session_id, None) or SessionLog()
            if log.events:
                # From its last event: one that is no longer there (the log was pruned up to
                # it, or lost its tail) means reading it all again.
                fresh = await self.store.read(session_id, after=log.position - 1)
                if fresh and fresh[0].id == log.events[-1].id:
                    fresh = fresh[1:]
                else:
                    log, fresh = SessionLog(), await self.store.read(session_id)
            else:
                fresh = await self.store.read(session_id)
            log.extend(fresh)
            self._logs[session_id] = log
            self._evict()
            return log

    def _evict(self) -> None:
        total = sum(len(log.events) for log in self._logs.values())
        while total > self._max_events and len(self._logs) > 1:
            _, oldest = self._logs.popitem(last=False)
            total -= len(oldest.events)

    async def summary(self, record: SessionRecord) -> Summary:
        """The session's figures at the length `record` tells. Raises `SessionNotFoundError`."""
        known = self._summaries.get(record.session_id)
        if known is None or known.event_count != record.event_count:
            cached = self._logs.get(record.session_id)
            if cached is not None and cached.position == record.event_count:
                known = cached.timeline.digest.summary()
            else:
                known = summarize(await self.store.read(record.session_id))
            self._summaries[record.session_id] = known
            while len(self._summaries) > MAX_SUMMARIES:
                self._summaries.popitem(last=False)
        self._summaries.move_to_end(record.session_id)
        return known

    def forget(self, session_id: str) -> None:
        """Drop what is kept of a session (it was deleted)."""
        self._logs.pop(session_id, None)
        self._summaries.pop(session_id, None)
