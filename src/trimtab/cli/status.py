"""What state a stored session is in, from the last events of its log and its lease.

Listing sessions must stay fast, so only a tail of each log is read (`TAIL` events). A run
leaves no stored end marker (`session.idle` is ephemeral, spec E2); it has ended when its last
turn has (`assistant.turn_end`, with no seed of a clear still to deliver), or in
`session.error` or `abort`. A run that has not ended is `running` while a process holds the
session's lease, and `interrupted` once none does (the lease expired, or its holder is known to
have exited): the process running it stopped, and the next resume finds the turn unfinished
(spec P3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

from trimtab import Event
from trimtab.events import (
    AbortEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    SessionContextClearedEvent,
    SessionErrorEvent,
)

__all__ = ["TAIL", "Status", "session_status"]

Status: TypeAlias = Literal["idle", "running", "failed", "interrupted"]

TAIL = 64
"""Events read from the end of each log: enough to reach the last run's end in practice."""

_IN_A_RUN = frozenset(
    {
        "user.message",
        "assistant.turn_start",
        "assistant.message",
        "tool.execution_start",
        "tool.execution_complete",
        "external_tool.requested",
        "external_tool.completed",
        "permission.requested",
        "permission.completed",
        "session.context_cleared",
    }
)
"""Events that only a run appends: the last of them, with no end after it, is an open run."""


def session_status(tail: Sequence[Event], *, held: bool) -> Status:
    """The session's state, from `tail` (the last events of its log) and whether a live
    process holds its lease."""
    match _last_run(tail):
        case "failed":
            return "failed"
        case "open":
            return "running" if held else "interrupted"
        case _:
            return "idle"


def _last_run(tail: Sequence[Event]) -> Literal["ended", "failed", "open"]:
    """How the last run in `tail` stands, reading backwards to its first decisive event."""
    for index in range(len(tail) - 1, -1, -1):
        event = tail[index]
        match event:
            case SessionErrorEvent():
                return "failed"
            case AbortEvent():
                return "ended"
            case AssistantTurnEndEvent():
                # A clear ends its turn and the run goes on with the seed (spec C8).
                return "open" if _clears(tail[:index]) else "ended"
            case _ if event.type in _IN_A_RUN:
                return "open"
            case _:
                continue  # session.start, resume, warnings, compaction between runs, ...
    return "ended"


def _clears(before: Sequence[Event]) -> bool:
    """Whether the turn that ends right after `before` cleared the context."""
    for event in reversed(before):
        if isinstance(event, SessionContextClearedEvent):
            return True
        if isinstance(event, AssistantTurnStartEvent | AssistantTurnEndEvent):
            return False
    return False
