"""Inbound messages stored in groups: the puts made while one put or group is on its way to
the database go together as the next group, in one round trip and one transaction
(PostgreSQL: one commit, one WAL flush). A put alone goes at once; under a burst, the groups
grow.

PostgreSQL serializes the commits of transactions that NOTIFY (each holds one lock over the
notification queue through its commit), and every stored message notifies the other replicas;
so, one transaction per webhook, a burst waited on one WAL flush after another.

One put or group is on its way at a time, so a session's puts are stored in the order made,
even when made at once; one waiting on a row lock holds up those behind it, for as long as the
store lets a lock be waited on. A group's puts for one session keep their order, and the group
goes in the order of its session keys, so groups lock session rows in one order and never
deadlock each other. When the database refuses a group (a value it will not take, a lock
waited on too long), each of its puts is tried alone (each session's in order, the sessions
side by side), so one bad message fails only itself; when it cannot be reached, all fail at
once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from core.errors import StoreError
from core.models import InboundMessage
from core.store.base import PutResult

__all__ = ["MAX_GROUP", "GroupedPuts", "Put"]

MAX_GROUP = 256  # puts in one transaction


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

    A put made while nothing is on its way goes at once, from its caller's task (as a plain
    store call would: its caller's cancellation cancels it alone). Those made meanwhile wait,
    and once it is back a task of ours sends them together."""

    def __init__(
        self,
        store_many: StoreMany,
        refused: Callable[[StoreError], bool],
        *,
        max_group: int = MAX_GROUP,
    ) -> None:
        self._store_many, self._refused, self._max = store_many, refused, max_group
        self._busy = False  # a put or a group is on its way
        self._waiting: list[_Waiting] = []
        self._sender: asyncio.Task[None] | None = None
        self._run = 0  # counts closes: what a close left on its way does not touch the next run

    async def put(self, put: Put) -> PutResult:
        """Cancelled before its group is sent: not stored."""
        if self._busy:
            done: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
            self._waiting.append((put, done))
            return await done
        self._busy, run = True, self._run
        try:
            return (await self._store_many([put]))[0]
        finally:
            if run == self._run:
                self._back()

    async def aclose(self) -> None:
        """Fail what waits; a put on its way from its caller's task is its caller's."""
        self._run += 1
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        _settle_all(self._waiting, StoreError("store closed"))  # never sent
        self._waiting.clear()
        self._busy = False

    def _back(self) -> None:
        """What was on its way is back: send what waits, or be free."""
        if self._waiting:
            self._sender = asyncio.create_task(
                self._send_all(self._run), name="store: inbound puts"
            )
        else:
            self._busy = False

    async def _send_all(self, run: int) -> None:
        try:
            while self._waiting:
                group = [w for w in self._waiting[: self._max] if not w[1].done()]
                del self._waiting[: self._max]
                if group:
                    await self._send(sorted(group, key=_session))  # stable: order kept
        finally:
            if run == self._run:
                self._sender, self._busy = None, False

    async def _send(self, group: list[_Waiting]) -> None:
        try:
            results = await self._store_many([put for put, _ in group])
            outcomes = list(zip(group, results, strict=True))
        except Exception as exc:
            # refused, or a value that would not serialize: put by put finds the one it was
            refused = not isinstance(exc, StoreError) or self._refused(exc)
            if len(group) > 1 and refused:
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
