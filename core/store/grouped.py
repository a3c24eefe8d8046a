"""Inbound messages stored in groups: the puts made while one group is on its way to the
database go together as the next, in one round trip and one transaction (PostgreSQL: one
commit, one WAL flush). A put alone goes at once; under a burst, the groups grow.

PostgreSQL serializes the commits of transactions that NOTIFY (each holds one lock over the
notification queue through its commit), and every stored message notifies the other replicas;
so, one transaction per webhook, a burst waited on one WAL flush after another.

A group's puts for one session keep their order, and the group goes in the order of its
session keys, so two replicas' groups lock session rows in one order and never deadlock. When
the database refuses a group (it answered: a value it will not take, say), each of its puts is
tried alone, so one bad message fails only itself; when it cannot be reached, all fail.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    `answered(exc)` tells whether the database answered (refused) rather than was unreachable.

    A put made while nothing is on its way goes at once, from its caller's task (as a plain
    store call would: its caller's cancellation cancels it alone). Those made while something
    is on its way wait, and a task of ours sends them together once it is back."""

    def __init__(
        self, store_many: StoreMany, answered: Callable[[StoreError], bool], max_group: int
    ) -> None:
        self._store_many, self._answered, self._max = store_many, answered, max_group
        self._busy = False  # a put or a group is on its way
        self._waiting: list[_Waiting] = []
        self._sender: asyncio.Task[None] | None = None

    async def put(self, put: Put) -> PutResult:
        """Cancelled before its group is sent: not stored."""
        if self._busy:
            done: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
            self._waiting.append((put, done))
            return await done
        self._busy = True
        try:
            return (await self._store_many([put]))[0]
        finally:
            if self._waiting:
                self._sender = asyncio.create_task(self._send_all(), name="store: inbound puts")
            else:
                self._busy = False

    async def aclose(self) -> None:
        sender, self._sender = self._sender, None  # cancelled before it ran: no finally
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        _settle_all(self._waiting, StoreError("store closed"))  # never sent
        self._waiting.clear()
        self._busy = False

    async def _send_all(self) -> None:
        try:
            while self._waiting:
                group = [w for w in self._waiting[: self._max] if not w[1].done()]
                del self._waiting[: self._max]
                if group:
                    await self._send(sorted(group, key=_session))  # stable: order kept
        finally:
            if self._sender is asyncio.current_task():
                self._sender, self._busy = None, False

    async def _send(self, group: list[_Waiting]) -> None:
        try:
            results = await self._store_many([put for put, _ in group])
            outcomes = list(zip(group, results, strict=True))
        except StoreError as exc:
            if len(group) > 1 and self._answered(exc):
                await self._one_by_one(group)
            else:
                _settle_all(group, exc)
            return
        except Exception as exc:  # a bug: its callers hear of it, and the next group goes
            _settle_all(group, exc)
            return
        except BaseException:
            _settle_all(group, StoreError("store closed"))
            raise
        for (_, done), result in outcomes:
            _settle(done, result)

    async def _one_by_one(self, group: list[_Waiting]) -> None:
        try:
            for waiting in group:  # one refused put must not fail the others
                await self._send([waiting])
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
