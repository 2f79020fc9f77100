"""`LiveSender`'s ordering rule (`trimtab.store.postgres._live`), alone: what leaves when,
in which batch, and who waits for what. Its `send` here records each batch (the store's
sends one statement); the PostgreSQL tests check the same rule end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from tests.conftest import require_psycopg

require_psycopg()

from trimtab._errors import StoreUnavailableError  # noqa: E402
from trimtab.store.postgres._live import LiveSender  # noqa: E402

T = TypeVar("T")


class Wire:
    """The batches sent, in order. While `gated`, each batch stays on its way until
    `release()`: the one that left first is let through first."""

    def __init__(self, *, gated: bool = False) -> None:
        self.gated = gated
        self.batches: list[list[str]] = []
        self.failures: list[Exception] = []
        self._gates: list[asyncio.Event] = []
        self._started = asyncio.Condition()
        self.started = 0

    async def send(self, payloads: list[str]) -> None:
        async with self._started:
            self.started += 1
            self._started.notify_all()
        if self.gated:
            gate = asyncio.Event()
            self._gates.append(gate)
            await gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        self.batches.append(list(payloads))

    async def on_its_way(self, count: int) -> None:
        """Until `count` batches have left (are sent or on their way)."""
        async with self._started:
            await asyncio.wait_for(self._started.wait_for(lambda: self.started >= count), 1)

    def release(self) -> None:
        self._gates.pop(0).set()


async def settle() -> None:
    """Let every ready task run until none is (a few passes of the event loop)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def within(awaited: Awaitable[T], seconds: float = 1.0) -> T:
    return await asyncio.wait_for(awaited, seconds)


async def test_events_published_while_a_batch_travels_go_together_in_the_next() -> None:
    wire = Wire(gated=True)
    sender = LiveSender(wire.send)
    sender.publish("a")
    await wire.on_its_way(1)
    for payload in "bcd":
        sender.publish(payload)
    wire.release()
    await wire.on_its_way(2)
    wire.release()
    await within(sender.sent())

    assert wire.batches == [["a"], ["b", "c", "d"]]


async def test_an_append_right_after_a_publish_takes_the_event_into_its_statement() -> None:
    wire = Wire()
    sender = LiveSender(wire.send)
    sender.publish("a")
    async with sender.taken() as carried:
        assert carried == ["a"]
    await settle()

    assert wire.batches == []  # sent once: with the append


async def test_an_append_waits_for_the_batch_on_its_way_and_the_one_after() -> None:
    wire = Wire(gated=True)
    sender = LiveSender(wire.send)
    sender.publish("a")
    await wire.on_its_way(1)
    sender.publish("b")
    appended: list[list[str]] = []

    async def append() -> None:
        async with sender.taken() as carried:
            appended.append(list(carried))

    appending = asyncio.create_task(append())
    await settle()
    assert not appended  # "a" is on its way: the append's doorbell would overtake it
    wire.release()
    # The sender goes on with "b" the moment "a" is sent: the append waits for it too.
    await wire.on_its_way(2)
    await settle()
    assert not appended
    wire.release()
    await within(appending)

    assert wire.batches == [["a"], ["b"]]
    assert appended == [[]]


async def test_an_append_waits_for_what_was_queued_not_for_what_came_later() -> None:
    wire = Wire(gated=True)
    sender = LiveSender(wire.send)
    sender.publish("a")
    await wire.on_its_way(1)
    sender.publish("b")
    appending = asyncio.create_task(append_taking(sender))
    await settle()
    wire.release()  # "a" sent; "b" leaves
    await wire.on_its_way(2)
    sender.publish("later")  # while "b" travels
    wire.release()  # "b" sent; "later" leaves, and stays on its way

    assert await within(appending) == []
    await wire.on_its_way(3)
    assert wire.batches == [["a"], ["b"]]
    wire.release()
    await within(sender.sent())
    assert wire.batches == [["a"], ["b"], ["later"]]


async def append_taking(sender: LiveSender) -> list[str]:
    async with sender.taken() as carried:
        return list(carried)


async def test_what_an_append_took_counts_as_sent_when_it_ends_even_failed() -> None:
    wire = Wire()
    sender = LiveSender(wire.send)
    sender.publish("a")
    with pytest.raises(StoreUnavailableError):
        async with sender.taken() as carried:
            assert carried == ["a"]
            waiting = asyncio.create_task(sender.sent())
            await settle()
            assert not waiting.done()  # a subscription waits for the append's statement
            raise StoreUnavailableError("append: no answer")
    await within(waiting)
    sender.publish("b")
    await within(sender.sent())

    assert wire.batches == [["b"]]  # what the failed append took is not sent again


async def test_a_batch_that_fails_is_given_up_and_the_next_still_goes() -> None:
    wire = Wire(gated=True)
    sender = LiveSender(wire.send)
    wire.failures.append(StoreUnavailableError("notify: the server is away"))
    sender.publish("lost")
    await wire.on_its_way(1)
    sender.publish("next")
    wire.release()
    await wire.on_its_way(2)
    wire.release()
    await within(sender.sent())

    assert wire.batches == [["next"]]


async def test_sent_waits_for_what_was_published_before_not_after() -> None:
    wire = Wire(gated=True)
    sender = LiveSender(wire.send)
    sender.publish("a")
    await wire.on_its_way(1)
    waiting = asyncio.create_task(sender.sent())
    await settle()  # it waits
    sender.publish("b")
    await settle()
    assert not waiting.done()
    wire.release()  # "a" is sent; "b" leaves and stays on its way
    await within(waiting)

    assert wire.batches == [["a"]]
    await wire.on_its_way(2)
    wire.release()
    await within(sender.sent())
    assert wire.batches == [["a"], ["b"]]


async def test_an_append_in_a_task_started_after_the_publish_still_takes_the_event() -> None:
    wire = Wire()
    sender = LiveSender(wire.send)
    sender.publish("a")  # the sender's task starts first, and lets the append's go ahead
    appending = asyncio.create_task(append_taking(sender))

    assert await within(appending) == ["a"]
    await settle()
    assert wire.batches == []


async def test_sent_waits_for_a_batch_not_on_its_way_yet() -> None:
    wire = Wire(gated=True)
    sender = LiveSender(wire.send)
    sender.publish("a")
    waiting = asyncio.create_task(sender.sent())
    await wire.on_its_way(1)
    await settle()
    assert not waiting.done()
    wire.release()
    await within(waiting)

    assert wire.batches == [["a"]]
