"""`Subscribers`: the `on()` handlers of a session, local or remote, and their delivery."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

from trimtab._errors import contained
from trimtab.events import EVENT_TYPES, Event, EventType

__all__ = ["EventHandler", "Subscribers"]

log = logging.getLogger("trimtab")

EventHandler = Callable[[Event], object]


class Subscribers:
    """Handlers of every event, or of one event type, called in delivery order."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        # A tuple, replaced on change: the empty one is shared by every session nobody
        # watches, and a delivery needs no copy to survive a handler that unsubscribes.
        self._entries: tuple[tuple[EventType | None, EventHandler], ...] = ()

    def add(
        self, first: EventType | EventHandler, handler: EventHandler | None
    ) -> Callable[[], None]:
        """Register `handler` (or `first`, for all events); returns the function that removes it."""
        if isinstance(first, str):
            if handler is None:
                raise TypeError("on(event_type, handler) needs a handler")
            if first not in EVENT_TYPES:
                # A typo would subscribe to nothing, silently.
                raise ValueError(f"unknown event type {first!r}: one of {sorted(EVENT_TYPES)}")
            entry: tuple[EventType | None, EventHandler] = (first, handler)
        else:
            entry = (None, first)
        if not callable(entry[1]) or inspect.iscoroutinefunction(entry[1]):
            raise TypeError("an event handler must be a plain (non-async) callable")
        self._entries = (*self._entries, entry)

        def unsubscribe() -> None:
            if entry in self._entries:
                entries = list(self._entries)
                entries.remove(entry)
                self._entries = tuple(entries)

        return unsubscribe

    def deliver(self, event: Event) -> None:
        """Call every handler that wants `event`; a failing handler is logged and skipped."""
        for wanted, handler in self._entries:
            if wanted is None or wanted == event.type:
                try:
                    handler(event)
                except BaseException as exc:
                    if not contained(exc):
                        raise
                    # A subscriber's bug must not break the run or starve other subscribers.
                    log.exception("event handler %r failed on %s", handler, event.type)
