"""Send-rate limits in front of a platform: per key (chat, channel, number) and overall."""

from __future__ import annotations

from aiolimiter import AsyncLimiter
from cachetools import LRUCache

__all__ = ["KeyedLimiter"]


class KeyedLimiter:
    """`rate` acquisitions per `period` seconds for each key, remembering the busiest
    `max_keys` keys (an idle key's bucket is empty again anyway)."""

    def __init__(self, rate: float, period: float, *, max_keys: int = 10_000) -> None:
        self._rate, self._period = rate, period
        self._limiters: LRUCache[str, AsyncLimiter] = LRUCache(max_keys)

    async def acquire(self, key: str) -> None:
        await self._limiter(key).acquire()

    async def take(self, key: str) -> float | None:
        """Acquire now if the key has room (None); else, without waiting, the seconds until it
        has room for one more (a full bucket leaks one every period / rate)."""
        limiter = self._limiter(key)
        if not limiter.has_capacity():
            return self._period / self._rate
        await limiter.acquire()  # there is room: it does not wait
        return None

    def _limiter(self, key: str) -> AsyncLimiter:
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = AsyncLimiter(self._rate, self._period)
        return limiter
