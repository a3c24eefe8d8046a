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
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = AsyncLimiter(self._rate, self._period)
        await limiter.acquire()
