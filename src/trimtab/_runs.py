"""`RunLedger`: how each run of a session ended, told from its events alone.

A runtime that runs the session knows this from its own loop; one that follows a remote
session (spec R1) sees only the events, stored and ephemeral, and learns it here.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from trimtab.events import (
    AssistantMessageEvent,
    Event,
    SessionErrorEvent,
    SessionIdleEvent,
    UserMessageEvent,
)

__all__ = ["RunEnd", "RunLedger"]


@dataclass
class RunEnd:
    """How one run (one `send`) ended, as `session.sendAndWait` reports it."""

    message_id: str
    last_message: AssistantMessageEvent | None = None
    error: SessionErrorEvent | None = None
    idle: SessionIdleEvent | None = None


class RunLedger:
    """Follows a session's events to know when each run ended and what it answered.

    Runs are sequential and each ends in exactly one `session.idle` (spec E1), so the run in
    progress is the one whose user message came last; a seeded run after a clear belongs to
    the run that cleared (its `user.message` has source `context_cleared`).
    """

    _KEEP = 64
    """Ended runs remembered for a waiter that has not asked yet."""

    def __init__(self) -> None:
        self._current: RunEnd | None = None
        self._ended: OrderedDict[str, RunEnd] = OrderedDict()
        self._waiters: dict[str, asyncio.Future[RunEnd]] = {}

    def observe(self, event: Event) -> None:
        """Account for one event of the session, in log order."""
        match event:
            case UserMessageEvent() if event.data.source != "context_cleared":
                if event.data.message_id is not None:
                    self._current = RunEnd(event.data.message_id)
            case AssistantMessageEvent() if self._current is not None:
                if event.data.originating_message_id == self._current.message_id:
                    self._current.last_message = event
            case SessionErrorEvent() if self._current is not None:
                self._current.error = event
            case SessionIdleEvent():
                if self._current is not None:
                    self._current.idle = event
                    self._ended_run(self._current)
                self._current = None
            case _:
                pass

    def _ended_run(self, run: RunEnd) -> None:
        waiter = self._waiters.pop(run.message_id, None)
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(run)
            return
        self._ended[run.message_id] = run
        while len(self._ended) > self._KEEP:
            self._ended.popitem(last=False)

    async def wait(self, message_id: str) -> RunEnd:
        """The end of the run of `message_id` (already ended, or when it ends)."""
        if (run := self._ended.pop(message_id, None)) is not None:
            return run
        waiter = self._waiters.setdefault(message_id, asyncio.get_running_loop().create_future())
        try:
            return await waiter
        finally:
            self._waiters.pop(message_id, None)

    def close(self, reason: Exception) -> None:
        """Fail every waiter: the session is gone."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(reason)
        self._waiters.clear()
