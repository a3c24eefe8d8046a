"""channels.order.Turns: one conversation's webhooks store in the order they came."""

from __future__ import annotations

import asyncio

from channels.order import Turns


async def test_turns_go_in_arrival_order_and_leave_no_lock_behind() -> None:
    turns, done = Turns(), []

    async def store(name: str, conversations: list[str], work_s: float) -> None:
        async with turns.of(conversations):
            await asyncio.sleep(work_s)
            done.append(name)

    first = asyncio.create_task(store("photo", ["a"], 0.2))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(store("text", ["a"], 0.0))
    other = asyncio.create_task(store("elsewhere", ["b"], 0.0))
    await asyncio.gather(first, second, other)
    assert done == ["elsewhere", "photo", "text"]
    assert len(turns) == 0


async def test_a_waiter_cancelled_leaves_the_holders_turn_alone() -> None:
    turns = Turns()
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with turns.of(["a", "b"]):
            held.set()
            await release.wait()

    task = asyncio.create_task(holder())
    await held.wait()
    waiter = asyncio.create_task(turns.of(["b", "a"]).__aenter__())
    await asyncio.sleep(0.01)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    async with asyncio.timeout(1):
        while len(turns) != 2:  # the holder's two, the waiter's share gone
            await asyncio.sleep(0.01)
    release.set()
    await task
    assert len(turns) == 0
    async with asyncio.timeout(1), turns.of(["a"]):  # free again
        pass
