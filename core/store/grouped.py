"""Inbound messages stored in groups: the puts made while every lane is busy go together as
the next group, in one round trip and one transaction (PostgreSQL: one commit, one WAL flush).
A put alone goes at once; under a burst, the groups grow.

PostgreSQL serializes the commits of transactions that NOTIFY (each holds one lock over the
notification queue through its commit), and every stored message notifies the other replicas;
so, one transaction per webhook, a burst waited on one WAL flush after another.

With one lane (as PostgresStore runs it), one put or group is on its way at a time, so a
session's puts are stored in the order made, even when made at once; one waiting on a row lock
holds up those behind it, for as long as the store lets a lock be waited on. More lanes let
that many go at once, unordered among themselves, as plain store calls are. A group's puts
for one session keep their order, and the group goes in the order of its session keys, so
groups lock session rows in one order and never deadlock each other. When the database
refuses a group (a value it will not take, a lock waited on too long), each of its puts is
tried alone (each session's in order, the sessions side by side), so one bad message fails
only itself; when it cannot be reached, all fail at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from core.errors import StoreError
from core.models import InboundMessage
from core.store.base import PutResult

__all__ = ["LANES", "MAX_GROUP", "GroupedPuts", "Put"]

MAX_GROUP = 256  # puts in one transaction
LANES = 1  # puts or groups on their way at once


@dataclass(frozen=True, slots=True)
class Put:
    session: str
    msg: InboundMessage
    max_pending: int
    unpaired: bool


StoreMany = Callable[[Sequence[Put]], Awaitable[list[PutResult]]]
_Waiting = tuple[Put, "asyncio.Future[PutResult]"]


class GroupedPuts:
    """`store_many` stores its puts in one transaction, in order, and returns their results;
    `refused(exc)` tells whether the database refused them (it answered) rather than could
    not be reached; any other exception is taken as a refusal too (a value that would not
    serialize).

    A put made while a lane is free goes at once, from its caller's task (as a plain store
    call would: its caller's cancellation cancels it alone). Those made while every lane is
    busy wait, and the first lane back sends them together from a task of ours."""

    def __init__(
        self,
        store_many: StoreMany,
        refused: Callable[[StoreError], bool],
        *,
        max_group: int = MAX_GROUP,
        lanes: int = LANES,
    ) -> None:
        self._store_many, self._refused = store_many, refused
        self._max, self._lanes = max_group, lanes
        self._busy = 0  # lanes with a put or a group on its way
        self._waiting: list[_Waiting] = []
        self._senders: set[asyncio.Task[None]] = set()
        self._run = 0  # counts closes: what a close left on its way does not touch the next run

    async def put(self, put: Put) -> PutResult:
        """Cancelled before its group is sent: not stored."""
        if self._busy >= self._lanes or self._waiting:
            done: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
            self._waiting.append((put, done))
            return await done
        self._busy += 1
        run = self._run
        try:
            return (await self._store_many([put]))[0]
        finally:
            if run == self._run:
                self._lane_free()

    async def aclose(self) -> None:
        """Fail what waits; a put on its way from its caller's task is its caller's."""
        self._run += 1
        senders, self._senders = self._senders, set()
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        _settle_all(self._waiting, StoreError("store closed"))  # never sent
        self._waiting.clear()
        self._busy = 0

    def _lane_free(self) -> None:
        """A lane is back: it takes what waits, or is free."""
        if self._waiting:
            task = asyncio.create_task(self._send_all(self._run), name="store: inbound puts")
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)
        else:
            self._busy -= 1

    async def _send_all(self, run: int) -> None:
        try:
            while self._waiting:
                group = [w for w in self._waiting[: self._max] if not w[1].done()]
                del self._waiting[: self._max]
                if group:
                    await self._send(sorted(group, key=_session))  # stable: order kept
        finally:
            if run == self._run:
                self._busy -= 1

    async def _send(self, group: list[_Waiting]) -> None:
        try:
            results = await self._store_many([put for put, _ in group])
            outcomes = list(zip(group, results, strict=True))
        except StoreError as exc:
            if len(group) > 1 and self._refused(exc):
                await self._one_by_one(group)
            else:
                _settle_all(group, exc)
            return
        except Exception as exc:  # a value that would not serialize, or a bug
            if len(group) > 1:
                await self._one_by_one(group)
            else:
                _settle_all(group, exc)
            return
        except BaseException:
            _settle_all(group, StoreError("store closed"))
            raise
        for (_, done), result in outcomes:
            _settle(done, result)

    async def _one_by_one(self, group: list[_Waiting]) -> None:
        """Each put alone: each session's in order, the sessions side by side (one waiting on
        a lock holds up no other); those whose callers have gone are left out."""
        sessions: dict[str, list[_Waiting]] = {}
        for waiting in group:
            sessions.setdefault(waiting[0].session, []).append(waiting)

        async def in_order(puts: list[_Waiting]) -> None:
            for waiting in puts:
                if not waiting[1].done():
                    await self._send([waiting])

        try:
            await asyncio.gather(*(in_order(puts) for puts in sessions.values()))
        finally:
            _settle_all(group, StoreError("store closed"))  # those not reached: closing


def _session(waiting: _Waiting) -> str:
    return waiting[0].session


def _settle_all(group: list[_Waiting], exc: BaseException) -> None:
    for _, done in group:
        _settle(done, exc)


def _settle(done: asyncio.Future[PutResult], outcome: PutResult | BaseException) -> None:
    if done.done():  # its caller was cancelled while the group was on its way
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
