"""core.store.grouped: puts made while a group is on its way go as the next group; what the
database refuses fails only its own put; nothing a caller waits on is left hanging."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from core.errors import StoreError
from core.models import InboundMessage, Sender
from core.store.base import InboxStatus, PutResult
from core.store.grouped import GroupedPuts, Put


def _put(session: str, n: int) -> Put:
    msg = InboundMessage(
        channel="telegram", conversation=session, sender=Sender(id="u"), platform_id=str(n)
    )
    return Put(session, msg, 100, False)


class FakeDb:
    """Stores each group at once, or after `gate` opens; refuses platform ids in `bad`."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.locked: dict[str, asyncio.Event] = {}  # platform id -> held until set
        self.bad: set[str] = set()
        self.down = False

    async def store_many(self, puts: Sequence[Put]) -> list[PutResult]:
        self.groups.append([f"{p.session}:{p.msg.platform_id}" for p in puts])
        if self.gate is not None:
            await self.gate.wait()
        for p in puts:
            if p.msg.platform_id in self.locked:
                await self.locked[p.msg.platform_id].wait()
        if self.down:
            raise StoreError("store operation failed: connection refused")
        if any(p.msg.platform_id in self.bad for p in puts):
            raise StoreError("store operation failed: refused") from ValueError("22021")
        return [PutResult(int(p.msg.platform_id), InboxStatus.PENDING) for p in puts]


def _refused(exc: StoreError) -> bool:
    return isinstance(exc.__cause__, ValueError)


@pytest.fixture
def db() -> FakeDb:
    return FakeDb()


async def test_a_put_alone_goes_at_once_and_a_burst_goes_as_one_group(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    assert (await puts.put(_put("s", 1))).id == 1
    db.gate = asyncio.Event()
    first = asyncio.create_task(puts.put(_put("s", 2)))
    await asyncio.sleep(0)  # on its way, held at the gate
    rest = [asyncio.create_task(puts.put(_put(f"s{n % 3}", n))) for n in range(3, 9)]
    await asyncio.sleep(0)
    db.gate.set()
    results = await asyncio.gather(first, *rest)
    assert [r.id for r in results] == list(range(2, 9))
    assert db.groups[:2] == [["s:1"], ["s:2"]]
    # one group, in the order of its sessions, each session's puts in the order made
    assert db.groups[2:] == [["s0:3", "s0:6", "s1:4", "s1:7", "s2:5", "s2:8"]]


async def test_groups_are_no_larger_than_the_cap(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused, max_group=4)
    db.gate = asyncio.Event()
    tasks = [asyncio.create_task(puts.put(_put("s", n))) for n in range(1, 11)]
    await asyncio.sleep(0)
    db.gate.set()
    assert [r.id for r in await asyncio.gather(*tasks)] == list(range(1, 11))
    assert [len(g) for g in db.groups] == [1, 4, 4, 1]  # the first alone, at once


async def test_a_refused_put_fails_alone_and_the_others_are_stored(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.bad, db.gate = {"3"}, asyncio.Event()
    tasks = [asyncio.create_task(puts.put(_put("s", n))) for n in range(1, 6)]
    await asyncio.sleep(0)
    db.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [r.id if isinstance(r, PutResult) else "failed" for r in results] == [
        1,
        2,
        "failed",
        4,
        5,
    ]
    assert isinstance(results[2], StoreError)
    assert db.groups == [["s:1"], ["s:2", "s:3", "s:4", "s:5"], ["s:2"], ["s:3"], ["s:4"], ["s:5"]]


async def test_an_unreachable_database_fails_the_whole_group_at_once(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.down, db.gate = True, asyncio.Event()
    tasks = [asyncio.create_task(puts.put(_put("s", n))) for n in range(1, 6)]
    await asyncio.sleep(0)
    db.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, StoreError) for r in results)
    assert [len(g) for g in db.groups] == [1, 4]  # the first alone; the rest not one by one


async def _behind_a_first(
    puts: GroupedPuts, *numbers: int
) -> tuple[asyncio.Task[PutResult], list[asyncio.Task[PutResult]]]:
    """Put 1 made and on its way (the fake holds it, at its gate or on 1's lock), then the
    puts `numbers` made behind it."""
    first = asyncio.create_task(puts.put(_put("s", 1)))
    await asyncio.sleep(0)
    behind = [asyncio.create_task(puts.put(_put("s", n))) for n in numbers]
    await asyncio.sleep(0)
    return first, behind


async def _group_on_its_way(
    puts: GroupedPuts, db: FakeDb, *numbers: int
) -> list[asyncio.Task[PutResult]]:
    """The puts `numbers`, sent as one group, held at the fake's gate."""
    db.locked["1"] = asyncio.Event()
    first, group = await _behind_a_first(puts, *numbers)
    db.gate = asyncio.Event()
    db.locked["1"].set()
    assert (await first).id == 1
    await asyncio.sleep(0)
    assert db.groups[-1] == [f"s:{n}" for n in numbers]
    return group


async def test_a_put_cancelled_before_its_group_goes_is_not_stored(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.gate = asyncio.Event()
    first, (dropped, kept) = await _behind_a_first(puts, 2, 3)
    dropped.cancel()
    db.gate.set()
    assert (await first).id == 1
    assert (await kept).id == 3
    assert dropped.cancelled()
    assert db.groups == [["s:1"], ["s:3"]]


async def test_closing_fails_what_waits_and_leaves_what_is_on_its_way_to_its_caller(
    db: FakeDb,
) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.gate = asyncio.Event()
    first, (waiting,) = await _behind_a_first(puts, 2)  # the first from its own task
    await puts.aclose()
    with pytest.raises(StoreError, match="closed"):
        await waiting
    db.gate.set()
    assert (await first).id == 1
    db.groups = []
    assert (await puts.put(_put("s", 3))).id == 3  # usable again after a restart
    assert db.groups == [["s:3"]]


async def test_an_unexpected_error_tries_a_group_put_by_put_and_reaches_a_lone_caller(
    db: FakeDb,
) -> None:
    calls = 0

    async def flaky(group: Sequence[Put]) -> list[PutResult]:
        nonlocal calls
        calls += 1
        if calls == 2:
            return []  # the group's answer comes back short
        if calls == 5:
            raise ValueError("cannot serialize")
        return await db.store_many(group)

    puts = GroupedPuts(flaky, _refused)
    db.gate = asyncio.Event()
    first, grouped = await _behind_a_first(puts, 2, 3)
    db.gate.set()
    assert [(await t).id for t in (first, *grouped)] == [1, 2, 3]
    assert db.groups == [["s:1"], ["s:2"], ["s:3"]]  # the group's short answer: one by one
    with pytest.raises(ValueError, match="serialize"):
        await puts.put(_put("s", 4))
    assert (await puts.put(_put("s", 5))).id == 5


async def test_a_caller_gone_while_its_group_is_on_its_way_leaves_the_others_answered(
    db: FakeDb,
) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    group = await _group_on_its_way(puts, db, 2, 3, 4)
    group[1].cancel()
    db.gate.set()
    assert (await group[0]).id == 2
    assert (await group[2]).id == 4
    assert group[1].cancelled()


async def test_closing_with_a_group_on_its_way_fails_its_callers(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    group = await _group_on_its_way(puts, db, 2, 3)
    await puts.aclose()
    for task in group:
        with pytest.raises(StoreError, match="closed"):
            await task


async def test_a_put_left_on_its_way_by_a_close_does_not_touch_the_next_run(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.locked["1"] = asyncio.Event()
    old = asyncio.create_task(puts.put(_put("s", 1)))
    await asyncio.sleep(0)
    await puts.aclose()  # a restart, with put 1 still on its way from its caller's task
    db.locked["2"] = asyncio.Event()
    second = asyncio.create_task(puts.put(_put("s", 2)))
    await asyncio.sleep(0)
    third = asyncio.create_task(puts.put(_put("s", 3)))  # waits: 2 is on its way
    await asyncio.sleep(0)
    db.locked["1"].set()
    assert (await old).id == 1
    await asyncio.sleep(0.01)
    assert not third.done()  # the old put's return started no sender beside 2
    assert db.groups == [["s:1"], ["s:2"]]
    db.locked["2"].set()
    assert [(await second).id, (await third).id] == [2, 3]
    assert db.groups[2:] == [["s:3"]]


async def test_put_by_put_leaves_out_callers_already_gone(db: FakeDb) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.bad = {"3"}
    group = await _group_on_its_way(puts, db, 2, 3, 4)
    group[2].cancel()  # its caller goes
    await asyncio.sleep(0)
    db.gate.set()  # the group is refused (3): put by put, without 4
    assert (await group[0]).id == 2
    with pytest.raises(StoreError):
        await group[1]
    assert group[2].cancelled()
    assert sorted(db.groups[2:]) == [["s:2"], ["s:3"]]


async def test_a_cancelled_put_on_its_way_hands_those_behind_it_to_the_next_group(
    db: FakeDb,
) -> None:
    puts = GroupedPuts(db.store_many, _refused)
    db.gate = asyncio.Event()
    first, behind = await _behind_a_first(puts, 2, 3)
    first.cancel()
    await asyncio.sleep(0)
    db.gate.set()
    assert [(await t).id for t in behind] == [2, 3]
    assert db.groups == [["s:1"], ["s:2", "s:3"]]
