"""How runs end: `RunEnd`, the one result of a run, and `RunLedger`, which tells it from a
session's events alone.

A run ends in exactly one `session.idle` (spec E1), delivered by the runtime that ran it, or,
to a runtime that follows the session (R1), at the point where the log says it ended. So the
events a session delivers are enough to know each run's end, wherever it ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from trimtab._errors import TrimtabError
from trimtab.events import (
    AssistantMessageEvent,
    Event,
    OutputResult,
    PendingMessagesModifiedEvent,
    SessionErrorEvent,
    SessionIdleEvent,
    ToolExecutionCompleteEvent,
    UserMessageData,
    UserMessageEvent,
)

__all__ = ["RunEnd", "RunLedger", "results_of"]

_UNSEEN = ""
"""The message id of a run whose start a ledger did not see (it began following later)."""

_SAME_RUN = frozenset({"context_cleared", "agent_stop", "hook", "immediate", "output"})
"""Sources of user messages that go on with the run in progress rather than start one."""


@dataclass
class RunEnd:
    """How one run (one `send`) ended."""

    message_id: str
    """The id of the `send` that started it."""
    last_message: AssistantMessageEvent | None = None
    """Its last `assistant.message` as stored (after a clear, the seeded run's, spec C8)."""
    error: SessionErrorEvent | None = None
    """The `session.error` it ended with, if it failed."""
    aborted: bool = False
    """It was stopped by `abort()`."""
    idle: SessionIdleEvent | None = None
    """Its one `session.idle`."""
    output: OutputResult | None = None
    """Its typed result (spec OUT4), when it was asked for one and got it."""


class RunLedger:
    """Follows a session's events to know when each run ended and what it answered.

    Runs are sequential and each ends in exactly one `session.idle`, so the run in progress
    is the one whose user message came last; a seeded run after a clear belongs to the run
    that cleared (its `user.message` has source `context_cleared`).
    """

    __slots__ = ("_current", "_ended", "_removed", "_steered", "_waiters")

    _KEEP = 64
    """Ended runs remembered for a waiter that has not asked yet."""

    def __init__(self) -> None:
        self._current: RunEnd | None = None
        self._ended: OrderedDict[str, RunEnd] = OrderedDict()
        self._waiters: dict[str, asyncio.Future[RunEnd]] = {}
        self._removed: OrderedDict[str, None] = OrderedDict()
        """Messages taken off the queue before a waiter asked (a clear right after a send)."""
        self._steered: list[str] = []
        """Steering messages the run in progress took (X6): their sends end with it."""

    def _message(self, data: UserMessageData) -> None:
        """A user message: the start of a run, or a steering message the run took (X6)."""
        if data.message_id is None:
            return
        if data.source not in _SAME_RUN or (
            # (the seed of a clear the host made between runs starts one, X4)
            self._current is None and data.source == "context_cleared"
        ):
            self._current = RunEnd(data.message_id)
            self._steered = []
        elif data.source == "immediate":
            # (A run whose start this ledger did not see: it follows it from here.)
            self._current = self._current or RunEnd(_UNSEEN)
            self._steered.append(data.message_id)

    def observe(self, event: Event) -> None:
        """Account for one event of the session, in delivery order."""
        match event:
            case UserMessageEvent():
                self._message(event.data)
            case AssistantMessageEvent() if self._current is not None:
                run = self._current.message_id
                if event.data.originating_message_id == run or run == _UNSEEN:
                    self._current.last_message = event
                    self._current.output = event.data.output or self._current.output
            case ToolExecutionCompleteEvent() if self._current is not None:
                self._current.output = event.data.output or self._current.output
            case SessionErrorEvent() if self._current is not None and not event.data.logged:
                self._current.error = event
            case PendingMessagesModifiedEvent() if event.data.removed:
                for message_id in event.data.removed:
                    if message_id in self._waiters:
                        self.fail(message_id, _removed_error())
                    else:
                        self._removed[message_id] = None
                        while len(self._removed) > self._KEEP:
                            self._removed.popitem(last=False)
            case SessionIdleEvent():
                if self._current is not None:
                    self._current.idle, self._current.aborted = event, bool(event.data.aborted)
                    self._ended_run(self._current)
                    for message_id in self._steered:
                        self._ended_run(dataclasses.replace(self._current, message_id=message_id))
                self._current, self._steered = None, []
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
        if message_id in self._removed:
            del self._removed[message_id]
            raise _removed_error()
        waiter = self._waiters.setdefault(message_id, asyncio.get_running_loop().create_future())
        try:
            return await waiter
        finally:
            self._waiters.pop(message_id, None)

    def fail(self, message_id: str, reason: Exception) -> None:
        """Fail whoever waits for the run of `message_id`, which will not run here."""
        waiter = self._waiters.pop(message_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(reason)

    def close(self, reason: Exception) -> None:
        """Fail every waiter: the session is gone."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(reason)
        self._waiters.clear()


def _removed_error() -> TrimtabError:
    return TrimtabError("the message was removed from the queue before it ran")


def results_of(events: Iterable[Event]) -> dict[str, OutputResult]:
    """The typed results of a log's runs, by the message id of the send that asked for each
    (spec OUT4), in the order the runs ended; the last result of a run is its result."""
    results: dict[str, OutputResult] = {}
    run: str | None = None
    for event in events:
        match event:
            case UserMessageEvent() if event.data.source not in _SAME_RUN:
                run = event.data.message_id
            case AssistantMessageEvent() | ToolExecutionCompleteEvent() if run is not None:
                if event.data.output is not None:
                    results.pop(run, None)
                    results[run] = event.data.output
            case _:
                pass
    return results
