"""`follow`, the subscription loop every store shares: ephemeral events keep their place among
the stored ones whatever order the wake-ups came in."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from trimtab.events import (
    AssistantMessageDeltaData,
    AssistantMessageDeltaEvent,
    Event,
    UserMessageData,
    UserMessageEvent,
)
from trimtab.store._base import Listener, follow


def _stored(text: str) -> Event:
    return UserMessageEvent(data=UserMessageData(content=text))


async def test_e3_a_wake_up_told_before_the_first_read_lets_no_stored_event_overtake() -> None:
    # A ring told before the subscription's first read (PostgreSQL's listener rings everyone
    # as it connects), then, while that read runs, an ephemeral event is published after the
    # first stored event and a second one is stored. Read again for the early ring, the log
    # would hand over the second stored event ahead of the ephemeral one.
    listener = Listener(asyncio.get_running_loop())
    listener.tell((None, None))
    log = [_stored("first")]
    delta = AssistantMessageDeltaEvent(
        data=AssistantMessageDeltaData(message_id="m", delta_content="live")
    )

    async def read(after: int) -> list[Event]:
        events = log[after:]
        if len(log) == 1:  # the owner goes on meanwhile
            listener.tell((1, delta))
            log.append(_stored("second"))
            listener.tell((2, None))
        return events

    got: list[Event] = []
    async with aclosing(follow(listener, read, 0, closed=lambda: False, poll=None)) as events:
        async with asyncio.timeout(5):
            async for event in events:
                got.append(event)
                if len(got) == 3:
                    break

    assert [e.id for e in got] == [log[0].id, delta.id, log[1].id]


async def test_e6_an_event_published_while_the_first_read_runs_keeps_its_place() -> None:
    # Ready, the subscription reads the log while the owner goes on: it publishes an
    # ephemeral event after the first stored event, then stores a second one, which that
    # read already sees. Handed over as read, the second would come before the ephemeral.
    listener = Listener(asyncio.get_running_loop())
    log = [_stored("first")]
    delta = AssistantMessageDeltaEvent(
        data=AssistantMessageDeltaData(message_id="m", delta_content="live")
    )

    async def read(after: int) -> list[Event]:
        if len(log) == 1:  # the owner goes on meanwhile
            listener.tell((1, delta))
            log.append(_stored("second"))
            listener.tell((2, None))
        return log[after:]

    got: list[Event] = []
    ready = asyncio.Event()
    events = follow(listener, read, 0, closed=lambda: False, poll=None, ready=ready)
    async with aclosing(events):
        async with asyncio.timeout(5):
            async for event in events:
                got.append(event)
                if len(got) == 3:
                    break

    assert ready.is_set()
    assert [e.id for e in got] == [log[0].id, delta.id, log[1].id]
