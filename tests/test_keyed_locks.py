"""`KeyedLocks`: one FIFO lock per key, which leaves nothing behind (the hub's sessions and
the PostgreSQL store's appends use it)."""

from __future__ import annotations

import asyncio

from trimtab._keyed_locks import KeyedLocks


async def test_holders_of_one_key_take_turns_in_the_order_they_asked() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str) -> None:
        async with locks.hold("s"):
            order.append(f"{name} in")
            await release.wait()
            order.append(f"{name} out")

    tasks = [asyncio.create_task(hold(name)) for name in "abc"]
    await asyncio.sleep(0.01)
    assert order == ["a in"]
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)

    assert order == ["a in", "a out", "b in", "b out", "c in", "c out"]
    assert len(locks) == 0


async def test_other_keys_are_not_held_up() -> None:
    locks = KeyedLocks()
    async with locks.hold("a"):
        await asyncio.wait_for(_enter_and_leave(locks, "b"), 1)
        assert len(locks) == 1


async def test_a_waiter_cancelled_leaves_nothing_behind() -> None:
    locks = KeyedLocks()
    async with locks.hold("s"):
        waiter = asyncio.create_task(_enter_and_leave(locks, "s"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert len(locks) == 1
    assert len(locks) == 0


async def _enter_and_leave(locks: KeyedLocks, key: str) -> None:
    async with locks.hold(key):
        pass
