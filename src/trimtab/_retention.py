"""Retention: pruning a session's log before its window's base (spec X8).

The window never needs the log before its latest base (a clear, a compaction, a truncation:
section 6), and the session's state is a fold of the log. So the events from the second (the
session's start stays: its identity and configuration) to the one before the base can be
replaced by one `session.pruned` event that carries what they folded to: the state (without
the window's conversation, which the base sets), what they spent (`session.metrics()`), and
the epochs' markers among them. Replaying the pruned log gives the state and window that
replaying the whole one gave, and a long-lived session's storage stops growing with its age.

The marker takes the place of the last event it stands for: its position and its id. The
positions of the events after it, the log's length and the `parent_id` chain stay as they
were, so a reader's position (`read(after=)`, a cursor) stays valid: one behind the cut reads
the marker, then what follows.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from trimtab._metrics import metrics_of
from trimtab._state import state_of
from trimtab.events import (
    Event,
    PrunedBase,
    PrunedData,
    SessionCompactionCompleteEvent,
    SessionContextClearedEvent,
    SessionPrunedEvent,
    SessionTruncatedEvent,
)
from trimtab.store import Lease, Store
from trimtab.store._base import position_of

__all__ = ["PruneResult", "base_index", "position_after", "prune_log", "relocated"]


class PruneResult(BaseModel):
    """What a prune did."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    events_removed: int = 0
    """Events the store no longer holds (the one the marker replaced included); 0 when
    there was nothing before the window's base to prune."""
    position: int | None = None
    """The marker's position in the log, when there was something to prune."""


async def prune_log(store: Store, session_id: str, *, lease: Lease | None = None) -> PruneResult:
    """Prune the session's log before its window's base (see the module); `lease`, the
    caller's, when it runs the session. Refusals raise `PruneError` (`Store.prune`)."""
    events = await store.read(session_id)
    cut = base_index(events)
    if cut <= 1 or (cut == 2 and isinstance(events[1], SessionPrunedEvent)):
        return PruneResult()  # nothing (new) between the session's start and its base
    kept = events[:cut]
    state = state_of(kept)
    replaced = kept[-1]
    snapshot = state.snapshot().model_copy(update={"conversation": []})
    data = PrunedData(
        events_pruned=state.event_count - 1,
        position=state.event_count,
        state=snapshot.model_dump(mode="json"),
        metrics=metrics_of(kept).model_dump(mode="json"),
        bases=_bases(kept),
    )
    marker = SessionPrunedEvent(
        id=replaced.id,
        timestamp=replaced.timestamp,
        parent_id=events[0].id,
        context_epoch=replaced.context_epoch,
        data=data,
    )
    removed = await store.prune(session_id, marker, lease=lease)
    return PruneResult(events_removed=removed, position=data.position)


def base_index(events: Sequence[Event]) -> int:
    """The index of the window's base (the latest clear, successful compaction or
    truncation) in `events`, 0 when there is none."""
    return next((i for i in range(len(events) - 1, 0, -1) if _is_base(events[i])), 0)


def _is_base(event: Event) -> bool:
    if isinstance(event, SessionContextClearedEvent | SessionTruncatedEvent):
        return True
    return isinstance(event, SessionCompactionCompleteEvent) and event.data.success


def _bases(events: Sequence[Event]) -> list[PrunedBase]:
    """The epochs' markers among `events`, those of an earlier prune first."""
    bases: list[PrunedBase] = []
    for event in events:
        if isinstance(event, SessionPrunedEvent):
            bases += event.data.bases
        elif _is_base(event):
            bases.append(
                PrunedBase(
                    event_id=event.id,
                    type=event.type,
                    timestamp=event.timestamp,
                    context_epoch=event.context_epoch,
                )
            )
    return bases


def position_after(start: int, events: Sequence[Event]) -> int:
    """The position of the last of `events`, read after position `start`: each follows the
    one before it, but a marker stands at its own position."""
    position = start
    for event in events:
        position = position_of(event, position)
    return position


def relocated(event: Event, position: int) -> Event:
    """`event`, copied into another log at `position` (a fork): a marker stands for the
    events before it there."""
    if not isinstance(event, SessionPrunedEvent):
        return event
    return event.model_copy(update={"data": event.data.model_copy(update={"position": position})})
