"""Arrival order per conversation while a message's files download.

A webhook stores its message only after fetching the message's files, so a text sent right
after a photo could be stored, and answered, first. Each webhook holds its conversations' turns
from before the downloads until it has stored: one that comes meanwhile waits (for
`media_timeout_s` at most). A conversation's lock exists only while someone holds or awaits it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["Turns"]


class Turns:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # lock, holders and waiters

    def of(self, names: Iterable[str]) -> _Held:
        """Hold the turn of every conversation named (taken in one order: no deadlock)."""
        return _Held(self._locks, sorted(set(names)))

    def __len__(self) -> int:
        return len(self._locks)


class _Held:
    """Some conversations' turns: taken on entering, given back on leaving. (A class rather
    than an async generator: one is entered for every webhook, and costs less this way.)"""

    __slots__ = ("_acquired", "_locks", "_wanted")

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], wanted: list[str]) -> None:
        self._locks, self._wanted = locks, wanted
        self._acquired: list[asyncio.Lock] = []

    async def __aenter__(self) -> None:
        for name in self._wanted:
            lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
            self._locks[name] = (lock, users + 1)
        try:
            for name in self._wanted:
                lock = self._locks[name][0]
                await lock.acquire()
                self._acquired.append(lock)
        except BaseException:
            self._give_back()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._give_back()

    def _give_back(self) -> None:
        for lock in reversed(self._acquired):
            lock.release()
        for name in self._wanted:
            lock, users = self._locks[name]
            if users > 1:
                self._locks[name] = (lock, users - 1)
            else:
                del self._locks[name]
