"""What the model saw at each model call, rebuilt from the log.

The window of model call N is the replay of the log up to the N-th `assistant.turn_start`:
the runtime builds each request from the same replay (compaction, when due, is logged before
the turn starts), so this is the request the model got, message for message. Each clear,
compaction and truncation before that call closes a column: the window as it was just before
the operation, its messages marked with what the operation did to them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from trimtab._state import state_of
from trimtab.events import (
    AssistantTurnStartEvent,
    Event,
    Message,
    SessionCompactionCompleteEvent,
    SessionContextClearedEvent,
    SessionPrunedEvent,
    SessionTruncatedEvent,
    UserMessageEvent,
)
from trimtab.inspect.digest import Withdrawals

__all__ = ["Column", "Mark", "Shown", "WindowView", "window_view"]

Mark: TypeAlias = Literal["", "removed", "kept", "summary", "seed", "restored"]
"""What happened to a message: removed by the operation that closed its column; kept
verbatim, or written (the summary), by a compaction; the seed of a clear; brought back by a
truncation."""

_HEAD = ("system", "developer")


@dataclass(frozen=True, slots=True)
class Shown:
    message: Message
    mark: Mark


@dataclass(frozen=True, slots=True)
class Column:
    """One segment's window: as the operation that closed it found it, or (the last column)
    as the model call saw it."""

    title: str
    epoch: int
    messages: list[Shown]
    closed_by: str | None
    """What closed the segment (None for the window of the call itself)."""


@dataclass(frozen=True, slots=True)
class WindowView:
    call: int
    epoch: int
    columns: list[Column]
    hidden: int
    """Earlier columns left out (the page shows the last few)."""

    @property
    def window(self) -> list[Message]:
        """The messages of the model call."""
        return [shown.message for shown in self.columns[-1].messages]


def _operation(event: Event, withdrawn: bool) -> tuple[str, str] | None:
    """The name of the context operation `event` commits, if it is one, and what it did
    (`withdrawn`: it withdraws an aborted run, `Withdrawals`)."""
    match event:
        case SessionContextClearedEvent():
            return "clear", f"cleared {event.data.messages_cleared} messages"
        case SessionCompactionCompleteEvent() if event.data.success:
            return "compaction", f"compaction removed {event.data.messages_removed} messages"
        case SessionTruncatedEvent() if withdrawn:
            return "withdrawal", f"aborted run withdrawn: {event.data.events_removed} events"
        case SessionTruncatedEvent():
            return "truncation", f"truncated: {event.data.events_removed} events forgotten"
        case _:
            return None


def _title(epoch: int, opened_by: str) -> str:
    return f"epoch {epoch}" + ("" if opened_by == "start" else f" · after {opened_by}")


def window_view(events: Iterable[Event], call: int, *, columns: int = 4) -> WindowView | None:
    """The window of model call `call` (1-based) and the columns before it (at most
    `columns` in all); None if the log has fewer calls."""
    state = state_of(())
    earlier: deque[Column] = deque(maxlen=max(columns - 1, 0))
    hidden, calls = 0, 0
    marks: dict[Message, Mark] = {}
    opened_by = "start"
    withdrawals = Withdrawals()
    for event in events:
        withdrawn = withdrawals.see(event)
        if isinstance(event, SessionPrunedEvent):
            state.apply(event)
            calls = state.turns  # (the calls among the events it stands for, X8)
            continue
        if isinstance(event, AssistantTurnStartEvent):
            calls += 1
            if calls == call:
                shown = [Shown(m, marks.get(m, "")) for m in state.window()]
                current = Column(_title(state.epoch, opened_by), state.epoch, shown, None)
                return WindowView(call, state.epoch, [*earlier, current], hidden)
        operation = _operation(event, withdrawn)
        if operation is None:
            state.apply(event)
            if isinstance(event, UserMessageEvent) and event.data.source == "context_cleared":
                marks[state.window()[-1]] = "seed"
            continue
        name, what = operation
        before, epoch = state.window(), state.epoch
        title = _title(epoch, opened_by)
        state.apply(event)
        after = state.window()
        kept = set(after)
        column = Column(
            title,
            epoch,
            [Shown(m, marks.get(m, "") if m in kept else "removed") for m in before],
            what,
        )
        hidden += len(earlier) == earlier.maxlen
        earlier.append(column)
        marks = _carried(marks, before, after, name)
        opened_by = name
    return None


def _carried(
    marks: dict[Message, Mark], before: list[Message], after: list[Message], operation: str
) -> dict[Message, Mark]:
    """The marks of the messages of the window an operation left."""
    prior = set(before)
    carried: dict[Message, Mark] = {}
    for message in after:
        if message in prior:
            unchanged = operation in ("truncation", "withdrawal") or message.role in _HEAD
            carried[message] = marks.get(message, "") if unchanged else "kept"
        else:
            carried[message] = "summary" if operation == "compaction" else "restored"
    return carried
