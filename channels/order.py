"""Arrival order per conversation while a message's files download.

A webhook stores its message only after fetching the message's files, so a text sent right
after a photo could be stored, and answered, first. Each webhook holds its conversations' turns
from before the downloads until it has stored: one that comes meanwhile waits (for
`media_timeout_s` at most). A conversation's lock exists only while someone holds or awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

__all__ = ["Turns"]


class Turns:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # lock, holders and waiters

    @contextlib.asynccontextmanager
    async def of(self, names: Iterable[str]) -> AsyncIterator[None]:
        """Hold the turn of every conversation named (taken in one order: no deadlock)."""
        wanted = sorted(set(names))
        for name in wanted:
            lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
            self._locks[name] = (lock, users + 1)
        acquired: list[asyncio.Lock] = []
        try:
            for name in wanted:
                lock = self._locks[name][0]
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for name in wanted:
                lock, users = self._locks[name]
                if users > 1:
                    self._locks[name] = (lock, users - 1)
                else:
                    del self._locks[name]

    def __len__(self) -> int:
        return len(self._locks)
